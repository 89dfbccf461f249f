"""Exercises of the chapter labelled ``softmax-jacobian``."""
from __future__ import annotations

import math

import torch

from .. import theory as T
from ._core import Exercise, as_number, as_tensor, custom

CHAPTER = "softmax-jacobian"

RTOL, ATOL = 1e-6, 1e-9
_TOL = f"elementwise |answer - expected| <= {ATOL:g} + {RTOL:g} |expected| (torch.allclose), shape must match"
_ALPHA = (0.7, 0.2, 0.1)


def _close(a, b, rtol=RTOL, atol=ATOL) -> bool:
    a, b = as_tensor(a), as_tensor(b)
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=rtol, atol=atol))


def _grade_softmax_jacobian(answer, expected):
    a = as_tensor(answer)
    if a.shape != expected.shape:
        return False, f"S is n x n = {tuple(expected.shape)} for n = 3 probabilities; got shape {tuple(a.shape)}."
    if _close(a, expected):
        return True, ""
    alpha = as_tensor(_ALPHA)
    if _close(a, torch.diag(alpha)):
        return False, "That is Diag(alpha) alone: subtract the outer product alpha alpha^T (competition)."
    if _close(a, torch.diag(alpha) + torch.outer(alpha, alpha)):
        return False, "Sign slip: S = Diag(alpha) - alpha alpha^T (the off-diagonal entries are negative)."
    if not _close(a.sum(-1), torch.zeros(3), atol=1e-6):
        return False, "Each row of S must sum to 0 (S·1 = 0: adding a constant to every logit changes nothing)."
    return False, "Diagonal entries are alpha_i (1 - alpha_i); off-diagonal ones are -alpha_i alpha_j."


def _grade_peak(answer, expected):
    try:
        a_star, r_max = (as_number(v) for v in answer)
    except TypeError:
        raise ValueError("answer must be a pair (alpha_star, rho_max)") from None
    ok_a, ok_r = math.isclose(a_star, expected[0], abs_tol=1e-6), math.isclose(r_max, expected[1], abs_tol=1e-6)
    if ok_a and ok_r:
        return True, ""
    if ok_a:
        return False, "Right alpha; now evaluate alpha (1 - alpha) there."
    return False, "Set the derivative of alpha (1 - alpha) to zero: 1 - 2 alpha = 0."


def _jacobian_data():
    g = torch.Generator().manual_seed(13)
    return dict(K=torch.randn(4, 3, generator=g, dtype=torch.float64),
                U=torch.randn(2, 4, generator=g, dtype=torch.float64),
                mu=torch.randn(3, generator=g, dtype=torch.float64))


def _jacobian():
    d = _jacobian_data()
    return T.attention_jacobian(d["K"], d["U"], d["mu"])


def _grade_jacobian(answer, expected):
    a = as_tensor(answer)
    if a.shape == expected.shape[::-1] and _close(a.T, expected):
        return False, "Transposed: J maps a query perturbation (d,) to an output change (d_out,), so J is (d_out, d)."
    if a.shape != expected.shape:
        return False, f"J must have shape (d_out, d) = {tuple(expected.shape)}; got {tuple(a.shape)}."
    if _close(a, expected):
        return True, ""
    d = _jacobian_data()
    if _close(a, expected * math.sqrt(d["K"].shape[-1])):
        return False, "Off by sqrt(d): the logits are K q / sqrt(d), so dz/dq = K / sqrt(d)."
    alpha = torch.softmax(d["K"] @ d["mu"] / math.sqrt(3), 0)
    if _close(a, d["U"] @ torch.diag(alpha) @ d["K"] / math.sqrt(3)):
        return False, "You used Diag(alpha) for dalpha/dz; the softmax Jacobian also has -alpha alpha^T."
    return False, "Chain rule: J = U S K / sqrt(d) with S at alpha = softmax(K mu / sqrt(d)). Check with torch.autograd."


EXERCISES = [
    Exercise(
        "The softmax Jacobian S = dalpha/dz at alpha = (0.7, 0.2, 0.1), as a 3 x 3 matrix.",
        lambda: T.softmax_jacobian(as_tensor(_ALPHA)), custom(_grade_softmax_jacobian, _TOL)),
    Exercise(
        "The probability alpha* where the sensitivity rho = alpha (1 - alpha) is largest, and that largest "
        "value: a pair (alpha_star, rho_max).",
        lambda: (0.5, float(T.softmax_jacobian(as_tensor([0.5, 0.5]))[0, 0])),
        custom(_grade_peak, "absolute 1e-6 on each of the two numbers")),
    Exercise(
        "For K, U, mu = exercises.data('softmax-jacobian.3') (K (4, 3), U (2, 4), mu (3,)), the Jacobian of "
        "f(q) = U softmax(K q / sqrt(d)) at q = mu (shape (2, 3)).",
        _jacobian, custom(_grade_jacobian, _TOL), _jacobian_data),
]
