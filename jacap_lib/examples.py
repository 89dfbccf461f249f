"""The worked examples of the theory chapters as plain functions of numbers: two-token sensitivity,
capacity against query sharpness, and the reading note's weighted-direction (leverage) example with
its one-shot, greedy and exhaustive selections."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from . import theory as T
from .scoring import leverage

__all__ = ["two_token_sensitivity", "capacity_vs_sharpness", "weighted_capacity", "LeverageExample",
           "leverage_example", "NOTE_U", "NOTE_W", "rotated_example"]


# ----------------------------------------------------------------------------- chapter 01
def two_token_sensitivity(gap: float, tau: float = 1.0) -> dict:
    r"""Two tokens with logit gap ``gap`` at temperature ``tau``: :math:`\alpha_1`, :math:`\rho_1=\alpha_1(1-\alpha_1)`, S."""
    tau = float(tau)
    if not tau > 0:
        raise ValueError(f"`tau` must be > 0, got {tau!r}")
    alpha = torch.softmax(torch.tensor([gap / tau, 0.0], dtype=torch.float64), dim=0)
    S = T.softmax_jacobian(alpha)
    return dict(alpha=alpha, rho=float(alpha[0] * (1 - alpha[0])), S=S)


# ----------------------------------------------------------------------------- chapter 02
def capacity_vs_sharpness(K, U, mu, lam, scales, noise: float = 1.0) -> dict:
    """Jacobian and linear (CapKV) capacity of one cache as the centre query is scaled by ``scales``."""
    jac = [float(T.jacobian_capacity(K, U, s * mu, lam, noise)) for s in scales]
    lin = float(T.linear_capacity(K, U, lam, noise))
    return dict(scales=list(map(float, scales)), jacobian=jac, linear=[lin] * len(jac))


# ----------------------------------------------------------------------------- chapter 03
def weighted_capacity(u: torch.Tensor, w: torch.Tensor, subset, noise: float = 1.0) -> float:
    r""":math:`\tfrac12\log\det(I + \sum_{i\in C} (w_i/\sigma^2) u_i u_i^\top)` for rows ``u (n, m)``."""
    idx = torch.as_tensor(list(subset), dtype=torch.long)
    m = u.shape[-1]
    A = torch.eye(m, dtype=u.dtype) + (u[idx].T * (w[idx] / noise)) @ u[idx]
    return 0.5 * float(torch.logdet(A))


@dataclass
class LeverageExample:
    """Scores and the three selections of the weighted-direction example (indices 0-based)."""

    weight: torch.Tensor
    leverage: torch.Tensor
    score: torch.Tensor
    one_shot: tuple
    greedy: tuple
    exhaustive: tuple
    capacity: dict


def leverage_example(u, w, budget: int = 2, noise: float = 1.0) -> LeverageExample:
    r"""The reading note's 2-D example, generalised: rows ``u (n, m)``, weights ``w (n,)``.

    score :math:`r_i = (w_i/\sigma^2)\,u_i^\top A^{-1} u_i` with :math:`A` over *all* tokens;
    one-shot keeps the top-``budget`` scores; greedy adds the token with the largest
    :math:`\log(1 + (w_i/\sigma^2) u_i^\top A_C^{-1} u_i)` for the current set :math:`C`;
    exhaustive tries every subset of size ``budget`` for :func:`weighted_capacity`.
    """
    u = torch.as_tensor(u, dtype=torch.float64)
    w = torch.as_tensor(w, dtype=torch.float64)
    if u.dim() != 2 or w.shape != (u.shape[0],):
        raise ValueError(f"`u` must be (n, m) and `w` (n,), got {tuple(u.shape)} and {tuple(w.shape)}")
    if bool((w < 0).any()):
        raise ValueError("`w` must be >= 0 (weights are squared sensitivities times variances)")
    n = u.shape[0]
    if not 1 <= budget <= n:
        raise ValueError(f"`budget` must be between 1 and n = {n}, got {budget}")
    lev = leverage(u, w, noise)
    score = w / noise * lev
    one_shot = tuple(sorted(score.topk(budget).indices.tolist()))
    chosen: list[int] = []
    while len(chosen) < budget:
        rest = [i for i in range(n) if i not in chosen]
        chosen.append(max(rest, key=lambda i: weighted_capacity(u, w, chosen + [i], noise)))
    greedy = tuple(sorted(chosen))
    exhaustive = max(itertools.combinations(range(n), budget), key=lambda c: weighted_capacity(u, w, c, noise))
    capacity = {name: weighted_capacity(u, w, sel, noise)
                for name, sel in (("one-shot", one_shot), ("greedy", greedy), ("exhaustive", exhaustive))}
    return LeverageExample(w, lev, score, one_shot, greedy, tuple(exhaustive), capacity)


NOTE_U = ((1.0, 0.0), (0.95, 0.05), (0.0, 1.0))
NOTE_W = (1.0, 1.0, 0.7)


def rotated_example(angle_deg: float, w3: float = 0.7) -> LeverageExample:
    """The note's example with u2 at ``angle_deg`` degrees from u1 (|u2| kept) and weight ``w3`` on u3."""
    r = math.hypot(*NOTE_U[1])
    a = math.radians(angle_deg)
    u = (NOTE_U[0], (r * math.cos(a), r * math.sin(a)), NOTE_U[2])
    return leverage_example(u, (NOTE_W[0], NOTE_W[1], w3))
