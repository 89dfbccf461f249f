"""The worked examples of the theory chapters as plain functions of numbers: two-token sensitivity,
capacity against query sharpness, and the reading note's weighted-direction (leverage) example with
its one-shot, greedy and exhaustive selections."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from . import theory as T
from .config import DEFAULTS
from .scoring import leverage

__all__ = ["two_token_sensitivity", "deletion_damage", "deletion_damage_curve", "capacity_vs_sharpness",
           "weighted_capacity", "LeverageExample", "leverage_example", "NOTE_U", "NOTE_W", "rotated_example",
           "random_cache", "selection_by_budget", "monotonicity_counterexample", "submodularity_counterexample"]


# ----------------------------------------------------------------------------- chapter 01
def two_token_sensitivity(gap: float, tau: float = 1.0) -> dict:
    r"""Two tokens with logit gap ``gap`` at temperature ``tau``: :math:`\alpha_1`, :math:`\rho_1=\alpha_1(1-\alpha_1)`, S."""
    tau = float(tau)
    if not tau > 0:
        raise ValueError(f"`tau` must be > 0, got {tau!r}")
    alpha = torch.softmax(torch.tensor([gap / tau, 0.0], dtype=torch.float64), dim=0)
    S = T.softmax_jacobian(alpha)
    return dict(alpha=alpha, rho=float(alpha[0] * (1 - alpha[0])), S=S)


def deletion_damage(K, U, q, i: int) -> dict:
    r"""What deleting token ``i`` does to the retained attention :math:`f_C(q) = U\,\mathrm{softmax}(Kq/\sqrt d)`.

    ``change`` is :math:`f_C(q) - f_{C\setminus i}(q)`, computed by re-running attention without the
    token; ``closed_form`` is :math:`\alpha_i\,(u_i - f_{C\setminus i}(q))`; ``bound`` is
    :math:`\alpha_i \max_{j\ne i}\lVert u_i - u_j\rVert` and ``spread`` the largest distance between
    two value directions, :math:`\max_{j,k}\lVert u_j-u_k\rVert`, which bounds the damage for any ``q``.
    """
    n = K.shape[-2]
    if not 0 <= int(i) < n or n < 2:
        raise ValueError(f"`i` must index one of the n = {n} tokens (and n >= 2), got {i!r}")
    i = int(i)
    keep = [j for j in range(n) if j != i]
    alpha = torch.softmax(K @ q / math.sqrt(K.shape[-1]), dim=-1)
    rest = T.attention(K[keep], U[:, keep], q)
    change = T.attention(K, U, q) - rest
    dist = torch.cdist(U.T.unsqueeze(0), U.T.unsqueeze(0))[0]
    return dict(alpha=float(alpha[i]), change=change, damage=float(change.norm()),
                closed_form=alpha[i] * (U[:, i] - rest), bound=float(alpha[i] * dist[i, keep].max()),
                spread=float(dist.max()))


def deletion_damage_curve(K, U, mu, i: int, shifts) -> dict:
    r"""Move token ``i``'s logit by each of ``shifts`` (its key is shifted along :math:`\mu`) and record its
    weight :math:`\alpha_i`, its local sensitivity :math:`\rho_i=\alpha_i(1-\alpha_i)`, the Frobenius norm
    of the Jacobian :math:`J_C`, the deletion damage and the values' spread that bounds it."""
    d = K.shape[-1]
    out = dict(shift=[], alpha=[], rho=[], jacobian_norm=[], damage=[], spread=None)
    for s in shifts:
        Ks = K.clone()
        Ks[i] = K[i] + float(s) * math.sqrt(d) * mu / mu.dot(mu)   # logit of token i moves by exactly s
        dmg = deletion_damage(Ks, U, mu, i)
        out["shift"].append(float(s))
        out["alpha"].append(dmg["alpha"])
        out["rho"].append(dmg["alpha"] * (1 - dmg["alpha"]))
        out["jacobian_norm"].append(float(T.attention_jacobian(Ks, U, mu).norm()))
        out["damage"].append(dmg["damage"])
        out["spread"] = dmg["spread"]
    return out


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


# ----------------------------------------------------------------------------- chapter 03: set selection
def random_cache(n: int = 8, d: int = 4, d_out: int = 3, *, seed: int = 3, key_scale: float = 1.5) -> dict:
    """A small float64 cache ``K (n, d)``, ``U (d_out, n)``, centre ``mu (d,)`` and ``lam = 1`` (seeded)."""
    g = torch.Generator().manual_seed(seed)
    K = key_scale * torch.randn(n, d, generator=g, dtype=torch.float64)
    U = torch.randn(d_out, n, generator=g, dtype=torch.float64)
    mu = torch.randn(d, generator=g, dtype=torch.float64)
    return dict(K=K, U=U, mu=mu, lam=torch.ones(d, dtype=torch.float64))


def selection_by_budget(K, U, mu, lam, budgets, *, tau: float = DEFAULTS.tau, noise: float = DEFAULTS.noise) -> list[dict]:
    """One row per budget: the kept sets (1-based) and kept-set capacities of one-shot (Algorithm 1 at
    ``tau``), greedy and exhaustive selection."""
    rows = []
    for b in budgets:
        row = {"budget": int(b)}
        for r in (T.select_one_shot(K, U, mu, lam, b, tau=tau, noise=noise), T.select_greedy(K, U, mu, lam, b, noise=noise),
                  T.select_exhaustive(K, U, mu, lam, b, noise=noise)):
            row[f"{r.method} set"] = "{" + ", ".join(str(int(i) + 1) for i in r.indices) + "}"
            row[f"{r.method} capacity"] = r.capacity
        rows.append(row)
    return rows


def _all_capacities(K, U, mu, lam, noise) -> dict:
    n = K.shape[0]
    caps = {(): 0.0}
    for size in range(1, n + 1):
        for c in itertools.combinations(range(n), size):
            caps[c] = float(T.subset_capacity(K, U, mu, lam, list(c), noise)) if size > 1 else 0.0
    return caps


def monotonicity_counterexample(K, U, mu, lam, *, noise: float = 1.0) -> dict:
    """The largest drop of the kept-set capacity when one token is *added* (brute force over all sets):
    ``subset`` and ``added`` (0-based), the capacities before and after, and how many of all
    (set, added token) pairs lower the capacity."""
    caps = _all_capacities(K, U, mu, lam, noise)
    n = K.shape[0]
    drops = [(caps[tuple(sorted(c + (j,)))] - v, c, j) for c, v in caps.items() for j in range(n) if j not in c]
    worst = min(drops)
    return dict(subset=worst[1], added=worst[2], before=caps[worst[1]], after=caps[worst[1]] + worst[0],
                n_decreasing=sum(d < 0 for d, _, _ in drops), n_pairs=len(drops))


def submodularity_counterexample(K, U, mu, lam, *, noise: float = 1.0) -> dict:
    """The largest violation of diminishing returns: sets ``small`` ⊂ ``large`` (one token apart) and a
    token ``added`` whose gain is larger for ``large`` than for ``small`` (0-based indices), plus how many
    such (small, large, added) triples exist out of all tried."""
    caps = _all_capacities(K, U, mu, lam, noise)
    n = K.shape[0]
    best, count, total = None, 0, 0
    for small, v in caps.items():
        for extra in range(n):
            if extra in small:
                continue
            large = tuple(sorted(small + (extra,)))
            for x in range(n):
                if x in large:
                    continue
                g_small = caps[tuple(sorted(small + (x,)))] - v
                g_large = caps[tuple(sorted(large + (x,)))] - caps[large]
                total += 1
                count += g_large > g_small
                if best is None or g_large - g_small > best["excess"]:
                    best = dict(small=small, large=large, added=x, gain_small=g_small, gain_large=g_large,
                                excess=g_large - g_small)
    return dict(best, n_violations=count, n_triples=total)
