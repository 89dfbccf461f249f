"""Exercises of the chapter labelled ``leverage`` (leverage in two dimensions)."""
from __future__ import annotations

import math

import torch

from .. import examples as EX
from ._core import Exercise, as_number, as_tensor, custom

CHAPTER = "leverage"

RTOL, ATOL = 1e-4, 1e-9

# a second example (not the chapter's, whose scores and best pair the page prints): four directions in 3-D
EX_U = ((1.0, 0.0, 0.0), (0.9, 0.3, 0.0), (0.0, 0.0, 1.0), (0.2, 1.0, 0.0))
EX_W = (1.0, 0.9, 0.4, 0.6)


def _data():
    return {"u": torch.tensor(EX_U, dtype=torch.float64), "w": torch.tensor(EX_W, dtype=torch.float64)}


def _close(a, b) -> bool:
    a, b = as_tensor(a), as_tensor(b)
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL))


def _scores():
    return EX.leverage_example(EX_U, EX_W).score


def _grade_scores(answer, expected):
    a = as_tensor(answer).flatten()
    if a.shape != expected.shape:
        return False, f"Give one score per direction: {expected.shape[0]} numbers."
    if _close(a, expected):
        return True, ""
    ex = EX.leverage_example(EX_U, EX_W)
    if _close(a, ex.leverage):
        return False, "Those are the leverages u_i^T A^-1 u_i; the score multiplies them by w_i."
    if _close(a, ex.weight):
        return False, "Those are the weights alone: the score is w_i u_i^T A^-1 u_i with A = I + sum_j w_j u_j u_j^T."
    u, w = as_tensor(EX_U), as_tensor(EX_W)
    if _close(a, w * (u * u).sum(-1)):
        return False, "You used A = I (no inverse of the full Gram matrix); include sum_j w_j u_j u_j^T in A."
    return False, "Build A = I + sum_j w_j u_j u_j^T (3 x 3), then r_i = w_i u_i^T A^-1 u_i."


def _best_pair():
    return sorted(i + 1 for i in EX.leverage_example(EX_U, EX_W).exhaustive)


def _grade_pair(answer, expected):
    try:
        a = sorted(int(i) for i in answer)
    except (TypeError, ValueError):
        raise ValueError("answer must be the 1-based indices of the kept directions, e.g. {1, 2}") from None
    if a == expected:
        return True, ""
    if a == [1, 2]:
        return False, "{1, 2} has the largest weights but u1 and u2 nearly coincide: compare the log-dets."
    if a == [e - 1 for e in expected]:
        return False, "Use 1-based indices (u1, ..., u4)."
    return False, "Compute 1/2 log det(I + sum_{i in C} w_i u_i u_i^T) for each of the 6 pairs."


def _crossing():
    """Smallest w3 with r_3 > r_2 (bisection on the score difference, which grows with w3)."""

    def gap(w3):
        s = EX.leverage_example(EX.NOTE_U, (1.0, 1.0, w3)).score
        return float(s[2] - s[1])

    lo, hi = 1e-6, 2.0
    if not gap(lo) < 0 < gap(hi):
        raise RuntimeError("exercise leverage.3: the score gap does not change sign on (0, 2]")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def _grade_crossing(answer, expected):
    a = as_number(answer)
    if math.isclose(a, expected, abs_tol=1e-3):
        return True, ""
    if a >= 1.0:
        return False, "Too large: u3 already wins at w3 = 0.7 < 1, because u2's leverage is diluted by u1."
    s = EX.leverage_example(EX.NOTE_U, (1.0, 1.0, a)).score
    side = "still below" if s[2] < s[1] else "already above"
    return False, f"At w3 = {a:.4g}, r_3 = {float(s[2]):.4f} is {side} r_2 = {float(s[1]):.4f}; bisect between 0 and 0.7."


EXERCISES = [
    Exercise(
        "The Jacap scores r_i = w_i u_i^T A^-1 u_i of the four directions u_i (rows of data()['u']) with weights "
        "data()['w'], A = I + sum_j w_j u_j u_j^T (four numbers).",
        _scores, custom(_grade_scores, f"elementwise |answer - expected| <= {ATOL:g} + {RTOL:g} |expected|"),
        data=_data),
    Exercise(
        "Same four directions, budget 2: which pair has the largest capacity 1/2 log det(I + sum_{i in C} w_i u_i "
        "u_i^T)? Answer with 1-based indices, e.g. {1, 2}.",
        _best_pair, custom(_grade_pair, "exact (the set of indices)"), data=_data),
    Exercise(
        "Keep u and w1 = w2 = 1. Find the weight w3 at which u3's score equals u2's score.",
        _crossing, custom(_grade_crossing, "absolute 1e-3")),
]
