"""Exercises of the chapter labelled ``baselines`` (the comparison against kvpress's presses)."""
from __future__ import annotations

from ._core import Exercise, integer, number

CHAPTER = "baselines"


def _pair():
    """Per-segment KL of TOVA and of SnapKV with a 32-token window, prompt 1024, c = 0.9, test segments
    (from the committed grid)."""
    from ..results.loaders import load_grid_rows

    rows = [r for r in load_grid_rows("grid") if r["length"] == 1024 and r["ratio"] == 0.9 and r["split"] == "test"]
    pick = lambda m: {r["segment"]: r["kl"] for r in rows if r["method"] == m}  # noqa: E731
    return {"a": pick("tova"), "b": pick("snapkv[window_size=32]")}


def _paired(key):
    from ..results.quality import paired

    return lambda: paired(**_pair())[key]


EXERCISES = [
    Exercise(
        "With a, b = exercises.data('baselines.1')['a'], [...]['b'] (per-segment KL of TOVA and of SnapKV with a "
        "32-token observation window, prompt 1024, c = 0.9, the 9 test segments), compute the geometric mean of "
        "the per-segment ratios a[s] / b[s].",
        _paired("geo_mean_ratio"),
        number(rtol=1e-6, hint="exp(mean(log(a[s] / b[s]))) over the segments s; not mean(a) / mean(b)."),
        data=_pair),
    Exercise(
        "Same data: on how many of the 9 segments does TOVA have the lower KL (its 'wins')?",
        _paired("wins"),
        integer(hint="Count the segments with a[s] < b[s]."),
        data=_pair),
    Exercise(
        "Same data: the two-sided Wilcoxon signed-rank p-value of the per-segment log ratios "
        "(scipy.stats.wilcoxon).",
        _paired("wilcoxon_p"),
        number(rtol=1e-6, hint="scipy.stats.wilcoxon([log(a[s] / b[s]) for s in sorted(a)]).pvalue"),
        data=_pair),
]
