"""Exercises of the chapter labelled ``serving`` (Algorithm 2 during decoding).

Exercise 1 is about the chapter's own live run, so ``check`` is given its controller; the others compute
their answers from the library (:func:`jacap_lib.stats.ema_weights`, :func:`jacap_lib.stats.ema_tradeoff`)."""
from __future__ import annotations

import torch

from ..stats import ema_tradeoff, ema_weights
from ._core import Exercise, integer, number

CHAPTER = "serving"

BETA_GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def _bytes_after(controller):
    if not getattr(controller, "events", None):
        raise ValueError("controller must be the chapter's JacapDecodeController after its run (it has no evictions)")
    return int(controller.events[0].kv_bytes_after)


def _one_percent_age(beta: float = 0.9) -> int:
    """Smallest age k (steps since a query arrived) at which its EMA weight is below 1% of a new query's."""
    w = ema_weights(2000, beta, dtype=torch.float64)
    newest = float(w[-1])
    ages = torch.nonzero(w.flip(0)[:-1] < 0.01 * newest).flatten()  # the oldest entry carries the prior's mass
    return int(ages[0])


def _best_beta(q, horizon):
    q = torch.as_tensor(q, dtype=torch.float32)
    q = q[:, None] if q.dim() == 1 else q
    errs = {b: ema_tradeoff(q, b, int(horizon))["lag_error"] for b in BETA_GRID}
    return min(errs, key=errs.get)


EXERCISES = [
    Exercise(
        "Recompute kv_bytes_after of the live run's first eviction from the model configuration with "
        "M_KV = 2 L b H_kv T d_h s (float32: s = 4 bytes). (controller = the chapter's controller)",
        _bytes_after,
        integer(slips=[(lambda e: e / 2, "Half the answer: keys AND values are cached (the factor 2)."),
                       (lambda e: 3 * e, "Three times too big: use the 3 KV heads, not the 9 query heads (GQA)."),
                       (lambda e: e / 2 / 2, "A quarter: float32 is 4 bytes per number, and keys AND values count.")],
                hint="T is the budget the eviction cuts down to; d_h = hidden_size / num_attention_heads."),
        given=("controller",)),
    Exercise(
        "With beta = 0.9, how many steps after a query arrives has its weight in the EMA mean fallen below "
        "1% of the weight of the newest query? (an integer number of steps)",
        _one_percent_age,
        integer(slips=[(lambda e: e - 1, "One step short: at that age the weight is still above 1%."),
                       (lambda e: 10, "1/(1 - beta) = 10 is the EMA's mean age, not where a weight drops below 1%.")],
                hint="A query k steps old has weight (1 - beta) beta^k; find the smallest k with beta^k < 0.01.")),
    Exercise(
        "On the recorded query coordinate, which beta in {0.5, 0.6, 0.7, 0.8, 0.9, 0.95} has the smallest "
        "error against the mean of the next `horizon` queries? (q, horizon = the run's query trace and horizon)",
        _best_beta,
        number(rtol=0.0, atol=1e-9, hint="Evaluate the lag error of every beta of the grid (WS.beta_view) and "
                                         "take the smallest."),
        given=("q", "horizon")),
]
