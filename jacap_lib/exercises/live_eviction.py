"""Exercises of the chapter labelled ``live-eviction`` (live eviction on a real model).

These exercises are about a model run the chapter has made, so ``check`` is given that run
(an :class:`~jacap_lib.measure.eviction.EvictionInspection`) and computes the expected answer from it."""
from __future__ import annotations

from ._core import Exercise, custom, integer, number

CHAPTER = "live-eviction"


def _kept_per_head(inspection):
    return int(inspection.kept.shape[-1])


def _last_token_kept(inspection):
    return float(inspection.keep_fraction()[-1])


def _layer_keeping_most(inspection):
    return int(inspection.n_kept.sum(-1).argmax())


def _spread(alpha) -> float:
    """Median over (layer, head) caches of max/min of alpha."""
    return float((alpha.amax(-1) / alpha.amin(-1)).median())


def _flatter_or_sharper(cool, hot):
    return "flatter" if _spread(hot.alpha) < _spread(cool.alpha) else "sharper"


def _grade_word(answer, expected):
    if not isinstance(answer, str) or answer.strip().lower() not in ("flatter", "sharper"):
        raise ValueError(f"answer must be 'flatter' or 'sharper', got {answer!r}")
    if answer.strip().lower() == expected:
        return True, ""
    return False, "The logits are divided by tau: a larger tau pulls every alpha towards 1/N."


EXERCISES = [
    Exercise(
        "How many prompt tokens does each KV head keep when the demo text is compressed at c = 0.9? "
        "(inspection = the chapter's inspection at c = 0.9)",
        _kept_per_head,
        integer(slips=[(lambda e: e + 1, "One too many: kvpress rounds (1 - c) N down.")],
                hint="kvpress keeps max(1, floor(N (1 - c))) tokens per head."),
        given=("inspection",)),
    Exercise(
        "With window=8 at c = 0.75, what fraction of all (layer, KV head) caches keep the last prompt token? "
        "(inspection = that windowed inspection)",
        _last_token_kept,
        number(rtol=0.0, atol=1e-6, hint="The window protects the last 8 prompt tokens in every cache."),
        given=("inspection",)),
    Exercise(
        "With the tempered centre (centre='tempered'), raise tau from the default to 100. Does alpha-bar get "
        "'flatter' or 'sharper'? (cool, hot = the tempered-centre inspections at the default tau and at tau = 100)",
        _flatter_or_sharper,
        custom(_grade_word, "exact word"),
        given=("cool", "hot")),
    Exercise(
        "The default JacapPress() hides the lowest-scoring entries of the whole model. At c = 0.5 on the demo text, "
        "which layer keeps the most tokens, summed over its KV heads? (inspection = the default's inspection)",
        _layer_keeping_most,
        integer(hint="n_kept is (layers, KV heads): sum over the heads first, then take the layer with the "
                     "largest sum (layers count from 0)."),
        given=("inspection",)),
]
