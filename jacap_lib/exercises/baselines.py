"""Exercises of the chapter labelled ``baselines`` (the comparison against kvpress's presses)."""
from __future__ import annotations

from ._core import Exercise, integer, number

CHAPTER = "baselines"
LENGTH, RATIO = 1024, 0.9


def _pair():
    """Per-document KL of TOVA and of SnapKV at its tuned setting, prompt 1024, c = 0.9, the dev documents
    of the evaluation (``data/results/eval/dev.jsonl``), in document order."""
    from jacap_lib.results.loaders import load_eval_choices, load_eval_rows

    snap = load_eval_choices()["chosen"]["snapkv"]
    rows = [r for r in load_eval_rows("dev") if r["length"] == LENGTH and r["ratio"] == RATIO]
    pick = lambda m: {r["doc"]: r["kl"] for r in rows if r["method"] == m}  # noqa: E731
    return {"a": pick("tova"), "b": pick(snap), "snapkv": snap}


def _logr():
    import math

    d = _pair()
    return [math.log(d["a"][k] / d["b"][k]) for k in sorted(d["a"])]


def _geo():
    from jacap_lib.verdicts.intervals import geometric_mean_ratio

    d = _pair()
    keys = sorted(d["a"])
    return geometric_mean_ratio([d["a"][k] for k in keys], [d["b"][k] for k in keys]).estimate


def _wins():
    return sum(x < 0 for x in _logr())


def _wilcoxon():
    from jacap_lib.verdicts.intervals import wilcoxon_p

    d = _pair()
    keys = sorted(d["a"])
    return wilcoxon_p([d["a"][k] for k in keys], [d["b"][k] for k in keys])


EXERCISES = [
    Exercise(
        "With d = exercises.data('baselines.1'), a, b = d['a'], d['b'] (per-document KL of TOVA and of SnapKV at its "
        "tuned setting d['snapkv'], prompt 1024, c = 0.9, the dev documents), compute the geometric mean of the "
        "per-document ratios a[k] / b[k].",
        _geo,
        number(rtol=1e-6, hint="exp(mean(log(a[k] / b[k]))) over the documents k; not mean(a) / mean(b)."),
        data=_pair),
    Exercise(
        "Same data: on how many of the dev documents does TOVA have the lower KL (its 'wins')?",
        _wins,
        integer(hint="Count the documents with a[k] < b[k]."),
        data=_pair),
    Exercise(
        "Same data: the two-sided Wilcoxon signed-rank p-value of the per-document log ratios "
        "(scipy.stats.wilcoxon).",
        _wilcoxon,
        number(rtol=1e-6, hint="scipy.stats.wilcoxon([log(a[k] / b[k]) for k in sorted(a)]).pvalue"),
        data=_pair),
]
