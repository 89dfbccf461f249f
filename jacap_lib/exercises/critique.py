"""Exercises of the chapter labelled ``critique``: the noise rule, the slots left to the score, which kind of document
loses most, and where the protection fills the budget (from the committed rows)."""
from __future__ import annotations

import torch

from ..config import DEFAULTS
from ._core import Exercise, custom, integer, number

CHAPTER = "critique"


def _spectrum():
    return {"eigenvalues": torch.tensor([2.0e-3, 5.0e-4, 1.0e-4, 2.0e-5, 1.0e-6], dtype=torch.float64), "target": 2.0}


def _sigma2():
    from ..scoring import deff_noise

    d = _spectrum()
    return float(deff_noise(d["eigenvalues"], d["target"]))


def _scored_slots():
    from kvpress.utils import compute_n_kept

    from ..presses.jacap import JacapPromptPress

    p = JacapPromptPress(0.9)
    return compute_n_kept(512, 0.9) - p.n_sink - p.window


def _kind_cells():
    from jacap_lib.results.loaders import load_anatomy

    return {"cells": [{"cell": e["cell"], "kinds": [{"kind": k["kind"], "ratio": k["ratio"]} for k in e["kinds"]]}
                      for e in load_anatomy()["kinds"]]}


def _most_losing_kind():
    from jacap_lib.experiments.anatomy import kind_counts
    from jacap_lib.results.loaders import load_anatomy

    counts = kind_counts(load_anatomy())
    return max(counts, key=lambda k: counts[k]["largest"])


def _grade_kind(answer, expected):
    if not isinstance(answer, str):
        return False, "answer with the kind's name as a string, such as 'code'."
    if answer.strip().lower() == expected:
        return True, ""
    if answer.strip().lower() == "all":
        return False, "'all' pools every kind; compare the four kinds only."
    return False, "count, cell by cell, which kind has the largest ratio; one kind wins more cells than the others."


def _losses():
    from jacap_lib.experiments.anatomy import loss_rows
    from jacap_lib.results.loaders import load_eval_summary
    from jacap_lib.verdicts.rows import ALGORITHM1, family

    fam = family(load_eval_summary(), ALGORITHM1)
    return fam["setting"], [r for r in loss_rows(fam) if r["adjusted"] == "worse"]


def _loss_cells():
    from ..presses.registry import press_from_spec

    spec, rows = _losses()
    press = press_from_spec(spec, 0.5)
    return {"n_sink": int(press.n_sink), "window": int(press.window),
            "cells": [{"length": r["length"], "ratio": r["ratio"]} for r in rows]}


def _filled_losses():
    return sum(r["fills"] for r in _losses()[1])


EXERCISES = [
    Exercise(
        "A head's weighted Gram has the eigenvalues in exercises.data('critique.1')['eigenvalues']. Find the noise "
        "sigma^2 at which the effective dimension sum_k lambda_k / (lambda_k + sigma^2) equals the target 2 "
        "(bisection on log sigma^2 is enough).",
        _sigma2,
        number(rtol=1e-3, hint="d_eff falls monotonically in sigma^2: bisect between 1e-12 and sum(lambda) / 2."),
        data=_spectrum),
    Exercise(
        f"A 512-token prompt at c = 0.9 with JacapPromptPress's defaults (n_sink = {DEFAULTS.n_sink}, window = "
        f"{DEFAULTS.window}): how many of the kept "
        "slots are left for Algorithm 1's scores?",
        _scored_slots,
        integer(slips=[(lambda e: e + 1, "kvpress keeps floor(N (1 - c)) tokens, rounding down.")],
                hint="kept = floor(512 x 0.1); subtract the sinks and the window."),
    ),
    Exercise(
        "exercises.data('critique.3')['cells'] holds, per cell where Algorithm 1 tuned loses, the KL ratio per "
        "document kind (anatomy.json). Which kind has the largest ratio in the most cells?",
        _most_losing_kind,
        custom(_grade_kind, "exact kind name (case ignored)"),
        data=_kind_cells),
    Exercise(
        "exercises.data('critique.4') gives Algorithm 1 tuned's n_sink and window and its cells worse by the adjusted "
        "interval. In how many of them does the protection fill the budget (floor((1 - c) L) <= n_sink + window)?",
        _filled_losses,
        integer(slips=[(lambda e: len(_losses()[1]) - e, "that counts the cells where the score chooses part of the "
                                                         "cache; count those where it chooses none.")],
                hint="kept = floor((1 - c) L); the protection fills the budget where kept <= n_sink + window."),
        data=_loss_cells),
]
