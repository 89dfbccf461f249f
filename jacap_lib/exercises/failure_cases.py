"""Exercises of the chapter labelled ``failure-cases`` (three ways eviction fails)."""
from __future__ import annotations

from ._core import Exercise, number

CHAPTER = "failure-cases"


def _old_phase():
    from ..stats import ema_weights

    return float(ema_weights(40, 0.9)[:30].sum())


def _lag():
    return {"beta": 0.99}


EXERCISES = [
    Exercise(
        "An EMA with beta = 0.9 has seen 30 queries of an old phase and then 10 of a new one. What fraction of "
        "its weight is still on the old phase?",
        _old_phase,
        number(rtol=1e-4, slips={10.0: "That is the weight of the last query alone, not of the old phase."},
               hint="The last 10 queries carry 1 - beta^10 of the weight."),
    ),
    Exercise(
        "How many queries after a phase change does an EMA with beta = 0.99 (exercises.data('failure-cases.2')) "
        "need before the new phase carries half of its weight? Give the real solution of beta^n = 1/2.",
        lambda: __import__("math").log(0.5) / __import__("math").log(_lag()["beta"]),
        number(rtol=1e-4, hint="n = log(1/2) / log(beta)."),
        data=_lag),
]
