"""Exercises of the chapter labelled ``capacity`` (from Jacobian to log-det capacity)."""
from __future__ import annotations

import math

import torch

from .. import theory as T
from ._core import Exercise, as_number, as_tensor, custom, number

CHAPTER = "capacity"

RTOL = 1e-6


def _eigen_gap():
    evals = lambda *v: T.capacity_from_eigenvalues(as_tensor(v))  # noqa: E731
    return float(evals(5.0, 5.0) - evals(10.0, 0.0))


def _lemma_data():
    return dict(A=as_tensor([[2.0, 0.5], [0.5, 1.0]]), w=0.8, u=as_tensor([1.0, -2.0]))


def _lemma_gain():
    d = _lemma_data()
    A1 = d["A"] + d["w"] * torch.outer(d["u"], d["u"])
    return float(torch.logdet(A1) - torch.logdet(d["A"]))


def _grade_lemma(answer, expected):
    a = as_number(answer)
    if math.isclose(a, expected, rel_tol=RTOL):
        return True, ""
    if math.isclose(a, math.expm1(expected), rel_tol=RTOL):
        return False, "That is w u^T A^-1 u; the log-det gain is log(1 + w u^T A^-1 u)."
    d = _lemma_data()
    if math.isclose(a, math.log1p(d["w"] * float(d["u"] @ d["A"] @ d["u"])), rel_tol=RTOL):
        return False, "Use the inverse: the lemma has u^T A^-1 u, not u^T A u."
    if math.isclose(a, expected / 2, rel_tol=RTOL):
        return False, "The question asks for the change of log det itself (no factor 1/2)."
    return False, "Matrix determinant lemma: det(A + w u u^T) = det(A) (1 + w u^T A^-1 u)."


def _noisy_capacity():
    return float(T.capacity_from_eigenvalues(as_tensor([5.0 / 4.0, 5.0 / 4.0])))


def _grade_noisy(answer, expected):
    a = as_number(answer)
    if math.isclose(a, expected, rel_tol=RTOL):
        return True, ""
    if math.isclose(a, float(T.capacity_from_eigenvalues(as_tensor([2.5, 2.5]))), rel_tol=RTOL):
        return False, "You divided by sigma = 2; the whitened eigenvalues are lambda / sigma^2 = lambda / 4."
    if math.isclose(a, 2 * expected, rel_tol=RTOL):
        return False, "Missing the factor 1/2 in front of log det."
    if math.isclose(a, float(T.capacity_from_eigenvalues(as_tensor([5.0, 5.0]))), rel_tol=RTOL):
        return False, "That is the sigma^2 = 1 capacity; divide the eigenvalues by sigma^2 = 4 first."
    return False, "Capacity = 1/2 sum log(1 + lambda_l / sigma^2) with lambda = (5, 5), sigma^2 = 4."


EXERCISES = [
    Exercise(
        "Capacity (1/2 sum log(1 + lambda)) of eigenvalues (5, 5) minus that of (10, 0), in nats.",
        _eigen_gap,
        number(slips={2.0: "Twice the answer: the capacity has a factor 1/2 in front of log det.",
                      -1.0: "Sign: (5, 5) has the LARGER capacity — subtract (10, 0) from it."})),
    Exercise(
        "For A, w, u = exercises.data('capacity.2'): log det(A + w u u^T) - log det(A).",
        _lemma_gain, custom(_grade_lemma, f"relative {RTOL:g}"), _lemma_data),
    Exercise(
        "Capacity of a channel with whitened-before-noise eigenvalues lambda = (5, 5) under isotropic "
        "noise Sigma = sigma^2 I with sigma = 2.",
        _noisy_capacity, custom(_grade_noisy, f"relative {RTOL:g}")),
]
