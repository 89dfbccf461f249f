"""Exercises of the chapter labelled ``kvzip`` (the one-knob ladder from the default press to KVzip), on the committed
rows of ``data/results/eval/peers/ladder.jsonl`` (tune documents only)."""
from __future__ import annotations

import math

from ._core import Exercise, integer, number

CHAPTER = "kvzip"
TOTAL_CELL = (1024, 0.5)  # exercise 1: KVzip (step L3) against the prompt press (step L0)
D_CELL = (1024, 0.95)  # exercise 2: step d against KVzip (step L3)


def _ladder():
    """``{"rows": the ladder rows, "steps": {step label: written-out spec}}``: every row of ``ladder.jsonl`` (one per
    tune document, prompt length, ratio and step, plus kvpress's own ``kvzip`` on the first document) and the specs
    of the steps as the ladder summary names them."""
    from jacap_lib.experiments.ladder import FILE
    from jacap_lib.results.loaders import load_eval_rows, load_ladder_summary
    from jacap_lib.results.paths import data_path

    rows = load_eval_rows("tune", path=data_path("results", "eval", "peers", FILE, must_exist=False))
    return {"rows": rows, "steps": dict(load_ladder_summary()["steps"])}


def _kl(step: str, cell: tuple[int, float]) -> dict:
    """``{document: KL}`` of ``step`` in ``cell`` (length, ratio)."""
    d = _ladder()
    spec, (length, ratio) = d["steps"][step], cell
    return {r["doc"]: r["kl"] for r in d["rows"]
            if r["method"] == spec and int(r["length"]) == length and math.isclose(float(r["ratio"]), ratio)}


def _total():
    from jacap_lib.verdicts.intervals import geometric_mean_ratio

    a, b = _kl("L3", TOTAL_CELL), _kl("L0", TOTAL_CELL)
    docs = sorted(set(a) & set(b))
    return geometric_mean_ratio([a[k] for k in docs], [b[k] for k in docs]).estimate


def _d_wins():
    a, b = _kl("d", D_CELL), _kl("L3", D_CELL)
    return sum(a[k] < b[k] for k in set(a) & set(b))


EXERCISES = [
    Exercise(
        "With d = exercises.data('kvzip.1'), rows = d['rows'] (the ladder's rows) and steps = d['steps'] (step label -> "
        "the method name its rows carry), compute KVzip's geometric-mean KL ratio to the prompt press at prompt 1024, "
        "c = 0.5: pair the rows of step 'L3' (KVzip) and step 'L0' (the prompt press) by document and take "
        "exp(mean(log(KL_L3 / KL_L0))).",
        _total,
        number(rtol=1e-6,
               hint="Keep the rows with length 1024 and ratio 0.5; per document, KL of steps['L3'] over KL of "
                    "steps['L0']; the geometric mean of those ratios, not mean(KL_L3) / mean(KL_L0)."),
        data=_ladder),
    Exercise(
        "Same data: at prompt 1024, c = 0.95, on how many tune documents does step 'd' (Algorithm 1 on KVzip's "
        "queries and global budget) keep a lower KL than step 'L3' (KVzip)?",
        _d_wins,
        integer(slips=[(lambda e: len(_kl("d", D_CELL)) - e, "That counts the documents where KVzip is lower.")],
                hint="Pair the two steps' rows of that cell by document and count KL_d < KL_L3."),
        data=_ladder),
]
