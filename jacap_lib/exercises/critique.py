"""Exercises of the chapter labelled ``critique`` (window, noise rule, statistics, the target)."""
from __future__ import annotations

import torch

from ..config import DEFAULTS
from ._core import Exercise, integer, number

CHAPTER = "critique"


def _spectrum():
    return {"eigenvalues": torch.tensor([2.0e-3, 5.0e-4, 1.0e-4, 2.0e-5, 1.0e-6], dtype=torch.float64), "target": 2.0}


def _sigma2():
    from ..scoring import deff_noise

    d = _spectrum()
    return float(deff_noise(d["eigenvalues"], d["target"]))


def _scored_slots():
    from kvpress.utils import compute_n_kept

    from ..presses.jacap import JacapPress

    p = JacapPress(0.9)
    return compute_n_kept(512, 0.9) - p.n_sink - p.window


EXERCISES = [
    Exercise(
        "A head's weighted Gram has the eigenvalues in exercises.data('critique.1')['eigenvalues']. Find the noise "
        "sigma^2 at which the effective dimension sum_k lambda_k / (lambda_k + sigma^2) equals the target 2 "
        "(bisection on log sigma^2 is enough).",
        _sigma2,
        number(rtol=1e-3, hint="d_eff falls monotonically in sigma^2: bisect between 1e-12 and sum(lambda) / 2."),
        data=_spectrum),
    Exercise(
        f"A 512-token prompt at c = 0.9 with JacapPress's defaults (n_sink = {DEFAULTS.n_sink}, window = "
        f"{DEFAULTS.window}): how many of the kept "
        "slots are left for Algorithm 1's scores?",
        _scored_slots,
        integer(slips=[(lambda e: e + 1, "kvpress keeps floor(N (1 - c)) tokens, rounding down.")],
                hint="kept = floor(512 x 0.1); subtract the sinks and the window."),
    ),
]
