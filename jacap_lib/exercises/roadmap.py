"""Exercises of the chapter labelled ``roadmap`` (the derivation roadmap): the exact eviction loss and
the full-pool softmax that Algorithm 1 uses instead of the kept set's."""
from __future__ import annotations

import math

import torch

from .. import examples as EX
from .. import theory as T
from ._core import Exercise, as_number, as_tensor, custom, number

CHAPTER = "roadmap"

RTOL, ATOL = 1e-6, 1e-9


def _loss_data():
    c = EX.random_cache(n=6, seed=11)
    s = T.algorithm1_scores(c["K"], c["U"], c["mu"], c["lam"], tau=1.0)
    return dict(U=c["U"], weight=s["weight"], score=s["score"])


def _loss():
    d = _loss_data()
    return T.removal_loss(d["U"], d["weight"])


def _grade_loss(answer, expected):
    a = as_tensor(answer).flatten()
    if a.shape != expected.shape:
        return False, f"Give one loss per token: {expected.shape[0]} numbers."
    if torch.allclose(a, expected, rtol=RTOL, atol=ATOL):
        return True, ""
    r = _loss_data()["score"]
    if torch.allclose(a, torch.log1p(r), rtol=RTOL, atol=ATOL):
        return False, ("That is log(1 + r_i), the gain of a second copy of a token A already contains; "
                       "evicting it removes w_i u_i u_i^T from A: the loss is -log(1 - r_i).")
    if torch.allclose(a, r, rtol=RTOL, atol=ATOL):
        return False, "Those are the scores r_i themselves (the first-order approximation); give the exact loss."
    if torch.allclose(a, -a.new_tensor(1.0) * expected, rtol=RTOL, atol=ATOL):
        return False, "Sign: evicting a token lowers log det A, and the loss is the (positive) drop."
    return False, "Use the determinant lemma on A - w_i u_i u_i^T: the drop of log det A is -log(1 - r_i)."


def _single_token():
    w, s = 3.0, 2.0
    return w * s / (1.0 + w * s)


def _grade_single(answer, expected):
    a = as_number(answer)
    if math.isclose(a, expected, rel_tol=RTOL):
        return True, ""
    if math.isclose(a, 6.0, rel_tol=RTOL):
        return False, "You used A = I; A = I + w u u^T already contains the token, so u^T A^-1 u = |u|^2 / (1 + w |u|^2)."
    if a >= 1.0:
        return False, "Every score is below 1: 1 - r = det(A - w u u^T) / det A = 1 / (1 + w |u|^2) > 0."
    return False, "Sherman-Morrison: u^T (I + w u u^T)^-1 u = |u|^2 / (1 + w |u|^2); multiply by w."


def _softmax_data():
    g = torch.Generator().manual_seed(21)
    return dict(z=2.0 * torch.randn(20, generator=g, dtype=torch.float64), kept=[1, 4, 7, 12, 18])


def _growth():
    d = _softmax_data()
    return float(1.0 / torch.softmax(d["z"], 0)[d["kept"]].sum())


def _grade_growth(answer, expected):
    a = as_number(answer)
    if math.isclose(a, expected, rel_tol=RTOL):
        return True, ""
    if math.isclose(a, 1.0 / expected, rel_tol=RTOL):
        return False, "That is the kept tokens' share of the full-pool softmax; the weights grow by its inverse."
    return False, "Re-normalising over C divides every kept weight by sum_{j in C} alpha_j (full-pool softmax)."


EXERCISES = [
    Exercise(
        "For U, weight, score = exercises.data('roadmap.1') (U (3, 6) with the directions as columns, "
        "Algorithm 1's weights w and scores r), the exact log-det of A = I + sum_j w_j u_j u_j^T lost by "
        "evicting each token (one number per token).",
        _loss, custom(_grade_loss, f"elementwise, torch.allclose with rtol {RTOL:g}, atol {ATOL:g}"), _loss_data),
    Exercise(
        "A cache with a single token: weight w = 3 and |u|^2 = 2, A = I + w u u^T. Its Algorithm 1 score "
        "r = w u^T A^-1 u.",
        _single_token, custom(_grade_single, f"relative {RTOL:g}")),
    Exercise(
        "For z, kept = exercises.data('roadmap.3') (20 logits and the 5 kept positions, 0-based), the factor "
        "by which each kept token's softmax weight grows when the 15 others are evicted (softmax at tau = 1).",
        _growth, custom(_grade_growth, f"relative {RTOL:g}"), _softmax_data),
]
