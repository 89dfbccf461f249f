"""Autograded exercises of chapter 5 (same conventions as :mod:`jacap_lib.exercises.theory`).

    from jacap_lib.exercises import algorithm as kx
    kx.check("05.1", answer)     # None shows the question; a wrong answer gets a hint
    kx.data("05.3")              # the inputs an exercise talks about

Expected answers are computed from :mod:`jacap_lib.scoring.costs` and torch, never typed in.
In the book build a wrong (non-None) answer raises ``AssertionError``, so solutions stay right.
"""
from __future__ import annotations

import math

import torch

from ..scoring.costs import step_costs

__all__ = ["check", "data", "QUESTIONS", "Verdict"]

QUESTIONS = {
    "05.1": "For d = 128, at which N does the Gram step (2 N d^2 FLOPs) cost as much as the Cholesky "
            "factorisation (d^3 / 3)? Give N as a real number.",
    "05.2": "The Triton path reads K once and V twice. At N = 65536, d = 128, bf16, how many times the "
            "floor (one read of K and V) is that, counting only cache reads?",
    "05.3": "With data('05.3') = (A, U), compute every leverage u_i^T A^{-1} u_i in float64 with a Cholesky "
            "factor and one triangular solve (no inverse). Return a tensor of shape (N,).",
}


def data(exercise_id: str):
    if exercise_id != "05.3":
        raise ValueError(f"exercise {exercise_id!r} has no data; only '05.3' does")
    g = torch.Generator().manual_seed(53)
    U = torch.randn(40, 8, generator=g, dtype=torch.float64)
    w = torch.rand(40, generator=g, dtype=torch.float64)
    A = torch.eye(8, dtype=torch.float64) + (U * w[:, None]).T @ U
    return A, U


def _expected(exercise_id: str):
    if exercise_id == "05.1":
        d = 128
        gram = next(c for c in step_costs(1, d) if c["step"].startswith("Gram"))
        chol = next(c for c in step_costs(1, d) if c["step"].startswith("Cholesky"))
        # Gram flops are 2 N d^2 + N d: solve (2 d^2 + d) N = d^3 / 3
        return chol["flops"] / (gram["flops"])  # gram flops at N = 1
    if exercise_id == "05.2":
        costs = step_costs(65536, 128, bytes_per_scalar=2)
        return sum(c["bytes"] for c in costs) / (2 * 65536 * 128 * 2)
    if exercise_id == "05.3":
        A, U = data("05.3")
        return torch.linalg.solve(A, U.T).T.mul(U).sum(-1)
    raise ValueError(f"exercise_id {exercise_id!r} is unknown; choose one of {sorted(QUESTIONS)}")


def _in_book_build() -> bool:
    from jacap_lib._env import in_book_build

    return in_book_build()


class Verdict:
    """What :func:`check` returns: truthy when correct; shows its message in a notebook."""

    def __init__(self, correct: bool, message: str):
        self.correct, self.message = correct, message

    def __bool__(self):
        return self.correct

    def __repr__(self):
        return self.message


def check(exercise_id: str, answer) -> Verdict:
    """The verdict (with a hint when wrong); ``None`` returns the question."""
    expected = _expected(exercise_id)
    if answer is None:
        return Verdict(False, f"Exercise {exercise_id}: {QUESTIONS[exercise_id]}")
    hint = ""
    if exercise_id in ("05.1", "05.2"):
        try:
            value = float(answer)
        except (TypeError, ValueError):
            raise ValueError(f"exercise {exercise_id} expects a number, got {answer!r}") from None
        ok = math.isclose(value, expected, rel_tol=2e-2)
        if not ok and exercise_id == "05.1" and math.isclose(value, 128 / 6, rel_tol=2e-2):
            ok = True  # dropping the lower-order N d term of the Gram is fine
        if not ok and exercise_id == "05.1" and math.isclose(value, 128 / 3, rel_tol=2e-2):
            hint = " (a multiply-add is 2 FLOPs: the Gram costs 2 N d^2, not N d^2)"
        if not ok and exercise_id == "05.2" and math.isclose(value, 2.0, rel_tol=1e-2):
            hint = " (the floor already contains one read of V)"
    else:
        got = torch.as_tensor(answer, dtype=torch.float64)
        ok = got.shape == expected.shape and bool(torch.allclose(got, expected, rtol=1e-9, atol=1e-12))
        if not ok and got.shape == expected.shape and bool(torch.allclose(got.sqrt(), expected, rtol=1e-6)):
            hint = " (leverage is |L^{-1} u|^2: square the solve's column norms)"
    msg = f"Exercise {exercise_id}: " + ("correct." if ok else f"not yet{hint}.")
    if not ok and _in_book_build():
        raise AssertionError(msg)
    return Verdict(ok, msg)
