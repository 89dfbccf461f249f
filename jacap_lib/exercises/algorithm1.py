"""Exercises of the chapter labelled ``algorithm1`` (Algorithm 1 and its GPU core).

Expected answers come from :mod:`jacap_lib.scoring.costs` and torch, never typed in."""
from __future__ import annotations

import torch

from ..scoring.costs import step_costs
from ._core import Exercise, number, tensor

CHAPTER = "algorithm1"


def _crossover():
    d = 128
    gram = next(c for c in step_costs(1, d) if c["step"].startswith("Gram"))
    chol = next(c for c in step_costs(1, d) if c["step"].startswith("Cholesky"))
    # Gram FLOPs are 2 N d^2 + N d, linear in N: solve (2 d^2 + d) N = d^3 / 3
    return chol["flops"] / gram["flops"]  # Gram FLOPs at N = 1


def _traffic():
    costs = step_costs(65536, 128, bytes_per_scalar=2)
    return sum(c["bytes"] for c in costs) / (2 * 65536 * 128 * 2)


def _leverage_data():
    g = torch.Generator().manual_seed(53)
    U = torch.randn(40, 8, generator=g, dtype=torch.float64)
    w = torch.rand(40, generator=g, dtype=torch.float64)
    A = torch.eye(8, dtype=torch.float64) + (U * w[:, None]).T @ U
    return dict(A=A, U=U)


def _leverages():
    d = _leverage_data()
    return torch.linalg.solve(d["A"], d["U"].T).T.mul(d["U"]).sum(-1)


EXERCISES = [
    Exercise(
        "For d = 128, at which N does the Gram step (2 N d^2 FLOPs) cost as much as the Cholesky "
        "factorisation (d^3 / 3)? Give N as a real number (dropping the Gram's lower-order N d term is fine).",
        _crossover,
        number(rtol=2e-2, slips={2.0: "Twice too large: a multiply-add is 2 FLOPs, so the Gram costs 2 N d^2, "
                                      "not N d^2."})),
    Exercise(
        "The Triton path reads K once and V twice. At N = 65536, d = 128, bf16, how many times the "
        "floor (one read of K and V) is that, counting only cache reads?",
        _traffic,
        number(rtol=2e-2, slips={4 / 3: "The floor already contains one read of V: divide 3 reads by 2, not 1.5 by 1."})),
    Exercise(
        "With A, U = exercises.data('algorithm1.3'), compute every leverage u_i^T A^{-1} u_i in float64 with a "
        "Cholesky factor and one triangular solve (no inverse). Return a tensor of shape (N,).",
        _leverages,
        tensor(rtol=1e-9, atol=1e-12,
               slips=[(lambda e: e.sqrt(), "Those are the norms |L^{-1} u_i|: the leverage is their square.")]),
        _leverage_data),
]
