"""Exercises of the chapter labelled ``fair-comparison`` (how the evaluation compares eviction methods): one cell's
verdict computed from the committed dev rows, and how much of a budget Algorithm 1 tuned's score decides."""
from __future__ import annotations

from ._core import Exercise, custom, integer, number

CHAPTER = "fair-comparison"
#: the cell of exercises 1 and 2 (the default against the best baseline picked on tune)
LENGTH, RATIO = 512, 0.95
#: the cell of exercise 3 (Algorithm 1 tuned's budget)
SPLIT_LENGTH, SPLIT_RATIO = 2048, 0.9
WORDS = ("better", "worse", "no detectable difference")


def _cell():
    """The two settings and the cell of exercises 1 and 2: the default ``JacapPromptPress()`` (the tune choice of
    ``jacap_obs``) and the best baseline of the cell picked on tune, both as the dev rows name them, with the number
    of cells the summary judges together."""
    from jacap_lib.results.loaders import load_eval_choices, load_eval_summary

    choices = load_eval_choices()
    base = choices["best_baseline"]["cells"][f"{LENGTH}/{RATIO}"]["spec"]
    cells = len(load_eval_summary()["cells_measured"])
    return {"setting": choices["chosen"]["jacap_obs"], "baseline": base, "length": LENGTH, "ratio": RATIO,
            "cells_judged": cells}


def _summary_row():
    """The summary's row of the default against the best baseline picked on tune in the exercise's cell."""
    from jacap_lib.results.loaders import load_eval_summary
    from jacap_lib.verdicts.rows import is_prompt_default

    fam = next(f for f in load_eval_summary()["families"]
               if f["picked_on"] == "tune" and f["role"].startswith("tuned ") and is_prompt_default(f["setting"]))
    return next(r for r in fam["rows"] if int(r["length"]) == LENGTH and float(r["ratio"]) == RATIO)


def _kl_ratio():
    """The library's own geometric-mean KL ratio of the cell (the estimate behind the summary's verdict)."""
    from jacap_lib.experiments.protocol import compare_settings
    from jacap_lib.results.loaders import load_eval_rows

    d = _cell()
    rows = [r for r in load_eval_rows("dev") if int(r["length"]) == LENGTH and float(r["ratio"]) == RATIO]
    return compare_settings(rows, d["setting"], d["baseline"])[0]["gm_ratio"]


def _verdict():
    from jacap_lib.verdicts.words import verdict_word

    return verdict_word(_summary_row()["verdict"])


def _grade_word(answer, expected):
    if not isinstance(answer, str):
        raise ValueError(f"answer must be one of {list(WORDS)} (a str), got {type(answer).__name__}")
    a = " ".join(answer.lower().replace(".", "").split())
    if a not in WORDS:
        return False, f"Answer with one of {list(WORDS)}."
    if a == expected:
        return True, ""
    if a == "no detectable difference":
        return False, ("Does your whole interval lie on one side of 1? Use the adjusted level 1 - 0.05 / m for the "
                       "m cells judged together, not 95 %.")
    return False, ("Check the side: the ratio is the prompt press's KL over the baseline's, so above 1 means the "
                   "default moved the predictions more (worse).")


def _scored():
    from ..presses.registry import press_from_spec
    from jacap_lib.results.loaders import load_eval_choices

    spec = load_eval_choices()["chosen"]["jacap_prompt"]
    return press_from_spec(spec, SPLIT_RATIO).budget_split(SPLIT_LENGTH)["scored"]


EXERCISES = [
    Exercise(
        "With d = exercises.data('fair-comparison.1') and rows = R.load_eval_rows('dev'), take the rows of the cell "
        "prompt d['length'], c = d['ratio'] whose method is d['setting'] (the prompt press) or d['baseline'] (the best "
        "baseline picked on tune). Compute the KL ratio: the geometric mean over the documents of the per-document "
        "ratio KL(default) / KL(baseline).",
        _kl_ratio,
        number(rtol=1e-6, hint="Pair the two rows of each document (key 'doc'), then exp(mean(log(a / b))); not "
                               "mean(a) / mean(b)."),
        data=_cell),
    Exercise(
        "Same cell: bootstrap the KL ratio (resample the documents with replacement, at least 2000 times; a "
        "percentile interval is enough) at the adjusted level 1 - 0.05 / d['cells_judged']. Which verdict does the "
        "interval give: 'better', 'worse' or 'no detectable difference'?",
        _verdict,
        custom(_grade_word, "the same verdict word as the summary's adjusted interval"),
        data=_cell),
    Exercise(
        "Algorithm 1 tuned keeps 4 sinks and a 128-token recent window. At prompt 2048 and c = 0.9, how many of the "
        "kept tokens per KV head does its score choose?",
        _scored,
        integer(slips=[(lambda e: e + 128 - 16, "That is the prompt press's 16-token window; Algorithm 1 tuned protects "
                                                "128 recent tokens."),
                       (lambda e: e + 4, "Do not forget the 4 attention sinks.")],
                hint="kvpress keeps floor((1 - c) * L) tokens; take the sinks and the window away."),
    ),
]
