r"""Exact small-scale mathematics of Jacap (reading note §4–§7, §19).

Everything here is differentiable torch code that works in float64 and batches over leading
dimensions where natural. Conventions (one head):

* ``K`` — keys, shape ``(..., n, d)`` (row i is :math:`k_i`);
* ``U`` — output directions, shape ``(..., d_out, n)`` (column i is :math:`u_i`, e.g. ``W_O v_i``);
* ``mu`` — centre query :math:`\mu_Q`, shape ``(..., d)``;
* ``lam`` — query covariance :math:`\Lambda_Q`: a ``(..., d)`` diagonal or a full ``(..., d, d)`` matrix;
* ``noise`` — channel noise :math:`\Sigma_{noise}`: a positive scalar :math:`\sigma^2` or an SPD ``(d_out, d_out)`` matrix.

Retained attention is :math:`f_C(q) = U_C\,\mathrm{softmax}(K_C q/\sqrt d)`; its Jacobian at
:math:`\mu` is :math:`J_C = U_C S_C K_C/\sqrt d` with :math:`S = \mathrm{Diag}(\alpha)-\alpha\alpha^\top`,
and the Jacobian capacity is :math:`\tfrac12\log\det(I + \Sigma^{-1} J \Lambda J^\top)`.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from . import _checks
from .config import DEFAULTS

__all__ = [
    "softmax_jacobian",
    "attention",
    "attention_jacobian",
    "jacobian_capacity",
    "linear_capacity",
    "whitened_eigenvalues",
    "capacity_from_eigenvalues",
    "algorithm1_scores",
    "removal_loss",
    "subset_capacity",
    "SelectionResult",
    "select_one_shot",
    "select_greedy",
    "select_exhaustive",
]


# ----------------------------------------------------------------------------- softmax and its Jacobian
def softmax_jacobian(alpha: torch.Tensor) -> torch.Tensor:
    r""":math:`S = \mathrm{Diag}(\alpha) - \alpha\alpha^\top` for probabilities ``alpha (..., n)``."""
    _checks.tensor("alpha", alpha, min_dim=1)
    _checks.finite("alpha", alpha)
    return torch.diag_embed(alpha) - alpha.unsqueeze(-1) * alpha.unsqueeze(-2)


def _alpha(K: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    d = K.shape[-1]
    return torch.softmax((K @ mu.unsqueeze(-1)).squeeze(-1) / math.sqrt(d), dim=-1)


def _check_KU(K, U, mu=None, mu_name: str = "mu"):
    _checks.tensor("K", K, min_dim=2)
    _checks.tensor("U", U, min_dim=2)
    if U.shape[-1] != K.shape[-2]:
        raise ValueError(f"`U` must be (..., d_out, n) with n = {K.shape[-2]} columns (one per key), got {tuple(U.shape)}")
    _checks.finite("K", K)
    _checks.finite("U", U)
    if mu is not None:
        _checks.tensor(mu_name, mu, min_dim=1)
        if mu.shape[-1] != K.shape[-1]:
            raise ValueError(f"`{mu_name}` must have last dim d = {K.shape[-1]}, got {tuple(mu.shape)}")
        _checks.finite(mu_name, mu)


def attention(K: torch.Tensor, U: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r"""Retained attention output :math:`f(q) = U\,\mathrm{softmax}(Kq/\sqrt d)`, shape ``(..., d_out)``."""
    _check_KU(K, U, q, "q")
    return (U @ _alpha(K, q).unsqueeze(-1)).squeeze(-1)


def attention_jacobian(K: torch.Tensor, U: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    r""":math:`J = U S K / \sqrt d` with S at :math:`\alpha = \mathrm{softmax}(K\mu/\sqrt d)`; shape ``(..., d_out, d)``."""
    _check_KU(K, U, mu)
    S = softmax_jacobian(_alpha(K, mu))
    return U @ S @ K / math.sqrt(K.shape[-1])


# ----------------------------------------------------------------------------- capacities
def _as_cov(lam: torch.Tensor, d: int) -> torch.Tensor:
    """A ``(..., d)`` diagonal or a full ``(..., d, d)`` covariance, returned as a matrix.

    A tensor whose last two dims are ``(d, d)`` is read as a full (symmetric) matrix."""
    _checks.tensor("lam", lam, min_dim=1)
    if lam.shape[-1] != d:
        raise ValueError(f"`lam` must be a (..., {d}) diagonal or a (..., {d}, {d}) matrix, got {tuple(lam.shape)}")
    _checks.finite("lam", lam)
    if lam.dim() >= 2 and lam.shape[-2] == d:
        if not torch.allclose(lam, lam.transpose(-1, -2)):
            raise ValueError("`lam` given as a full (d, d) covariance must be symmetric")
        evals = torch.linalg.eigvalsh(lam.detach())
        if bool((evals < -1e-10 * evals.abs().amax(-1, keepdim=True).clamp_min(1.0)).any()):
            raise ValueError(f"`lam` given as a full (d, d) covariance must be positive semi-definite; its smallest "
                             f"eigenvalue is {float(evals.min()):.3g}")
        return lam
    if bool((lam < 0).any()):
        raise ValueError("`lam` (a diagonal covariance) must be >= 0")
    return torch.diag_embed(lam)


def _logdet_spd(M: torch.Tensor) -> torch.Tensor:
    L = torch.linalg.cholesky(M)
    return 2.0 * torch.log(L.diagonal(dim1=-2, dim2=-1)).sum(-1)


def _check_noise(noise, m: int):
    """A positive scalar (number or one-element tensor) -> float; an SPD ``(m, m)`` tensor -> that tensor."""
    if isinstance(noise, torch.Tensor) and noise.dim() >= 2:
        if noise.shape[-2:] != (m, m):
            raise ValueError(f"`noise` must be a scalar or an ({m}, {m}) SPD matrix, got {tuple(noise.shape)}")
        _checks.tensor("noise", noise, min_dim=2)
        _checks.finite("noise", noise)
        if not torch.allclose(noise, noise.transpose(-1, -2)):
            raise ValueError("`noise` given as a matrix must be symmetric (a covariance)")
        _, info = torch.linalg.cholesky_ex(noise.detach().double())
        if bool((info != 0).any()):
            raise ValueError("`noise` given as a matrix must be positive definite (an SPD covariance)")
        return noise
    return _checks.positive("noise", noise)


def _noise_logdet_gain(G: torch.Tensor, noise) -> torch.Tensor:
    """½ logdet(I + Σ⁻¹ G) for a PSD ``G (..., m, m)`` and scalar or matrix noise Σ."""
    m = G.shape[-1]
    eye = torch.eye(m, dtype=G.dtype, device=G.device)
    noise = _check_noise(noise, m)
    if isinstance(noise, torch.Tensor):
        noise = noise.to(G.dtype)
        return 0.5 * (_logdet_spd(noise + G) - _logdet_spd(noise))
    return 0.5 * _logdet_spd(eye + G / noise)


def jacobian_capacity(K, U, mu, lam, noise=1.0) -> torch.Tensor:
    r""":math:`\tfrac12\log\det(I + \Sigma^{-1} J\Lambda J^\top)` with :math:`J` the attention Jacobian at ``mu``."""
    J = attention_jacobian(K, U, mu)
    G = J @ _as_cov(lam, K.shape[-1]).to(J.dtype) @ J.transpose(-1, -2)
    return _noise_logdet_gain(G, noise)


def linear_capacity(K, U, lam, noise=1.0) -> torch.Tensor:
    r"""CapKV's linear capacity :math:`\tfrac12\log\det(I + \Sigma^{-1} U K \Lambda K^\top U^\top)` (no softmax)."""
    _check_KU(K, U)
    M = U @ K
    G = M @ _as_cov(lam, K.shape[-1]).to(M.dtype) @ M.transpose(-1, -2)
    return _noise_logdet_gain(G, noise)


def whitened_eigenvalues(K, U, mu, lam, noise=1.0) -> torch.Tensor:
    r"""Eigenvalues of :math:`G = \Sigma^{-1/2} J\Lambda J^\top \Sigma^{-1/2}` (ascending, ``(..., d_out)``)."""
    J = attention_jacobian(K, U, mu)
    G = J @ _as_cov(lam, K.shape[-1]).to(J.dtype) @ J.transpose(-1, -2)
    noise = _check_noise(noise, U.shape[-2])
    if isinstance(noise, torch.Tensor):
        evals, evecs = torch.linalg.eigh(noise.to(G.dtype))
        w = evecs @ torch.diag_embed(evals.rsqrt()) @ evecs.transpose(-1, -2)
        G = w @ G @ w
    else:
        G = G / noise
    return torch.linalg.eigvalsh(0.5 * (G + G.transpose(-1, -2)))


def capacity_from_eigenvalues(eigenvalues: torch.Tensor) -> torch.Tensor:
    r""":math:`\tfrac12\sum_\ell \log(1+\lambda_\ell)` — e.g. (10, 0) gives ½ log 11, (5, 5) gives ½ log 36."""
    _checks.tensor("eigenvalues", eigenvalues, min_dim=1)
    _checks.finite("eigenvalues", eigenvalues)
    if bool((eigenvalues <= -1).any()):
        raise ValueError(f"`eigenvalues` must be > -1 (they are eigenvalues of a PSD matrix, >= 0 up to rounding); "
                         f"got {float(eigenvalues.min()):.3g}")
    return 0.5 * torch.log1p(eigenvalues).sum(-1)


# ----------------------------------------------------------------------------- Algorithm 1 (small, float64, full Λ allowed)
def algorithm1_scores(K, U, mu, lam, *, tau: float = DEFAULTS.tau, noise=1.0) -> dict:
    r"""Algorithm 1 for one small cache in the theory conventions (``U`` is ``(d_out, n)``; full or diagonal Λ).

    Returns a dict of ``alpha, rho, kappa, weight, leverage, score`` (each ``(..., n)``), computed
    with an explicit solve — an independent cross-check of :func:`jacap_lib.jacap_scores`.

    ``noise`` is :math:`\sigma^2` or an SPD ``(d_out, d_out)`` matrix :math:`\Sigma`; a matrix whitens the
    output directions, :math:`\tilde u_i = L^{-1} u_i` with :math:`\Sigma = LL^\top`, and the scalar rule
    runs on them with :math:`\sigma^2 = 1` (then ``leverage`` is :math:`\tilde u_i^\top A^{-1}\tilde u_i`).
    """
    _check_KU(K, U, mu)
    tau = _checks.positive("tau", tau)
    noise = _check_noise(noise, U.shape[-2])
    if isinstance(noise, torch.Tensor):
        U = torch.linalg.solve_triangular(torch.linalg.cholesky(noise.to(U.dtype)), U, upper=False)
        noise = 1.0
    d = K.shape[-1]
    alpha = torch.softmax((K @ mu.unsqueeze(-1)).squeeze(-1) / (tau * math.sqrt(d)), dim=-1)
    rho = alpha * (1 - alpha)
    Lam = _as_cov(lam, d).to(K.dtype)
    kappa = torch.einsum("...id,...de,...ie->...i", K, Lam, K)
    weight = rho.square() * kappa / d
    A = torch.eye(U.shape[-2], dtype=U.dtype, device=U.device) + (U * (weight / noise).unsqueeze(-2)) @ U.transpose(-1, -2)
    X = torch.linalg.solve(A, U)
    lev = (U * X).sum(-2)
    return dict(alpha=alpha, rho=rho, kappa=kappa, weight=weight, leverage=lev, score=weight / noise * lev)


def removal_loss(U, weight, noise: float = 1.0) -> torch.Tensor:
    r"""Exact log-det lost by removing each token from :math:`A = I + \sum_j (w_j/\sigma^2) u_j u_j^\top`.

    ``U (d_out, n)`` holds the directions as columns, ``weight (n,)`` the :math:`w_j`. Returns
    :math:`\log\det A - \log\det(A - (w_i/\sigma^2) u_i u_i^\top)` for every ``i`` by two
    determinants per token (brute force; an independent check of the closed form
    :math:`-\log(1 - r_i)` with Algorithm 1's score :math:`r_i`).
    """
    _checks.tensor("U", U, min_dim=2)
    _checks.tensor("weight", weight, min_dim=1)
    if weight.shape[-1] != U.shape[-1]:
        raise ValueError(f"`weight` must have one entry per column of `U` ({U.shape[-1]}), got {tuple(weight.shape)}")
    if bool((weight < 0).any()):
        raise ValueError("`weight` must be >= 0 (squared sensitivities times variances)")
    noise = _checks.positive("noise", noise)
    eye = torch.eye(U.shape[-2], dtype=U.dtype, device=U.device)
    A = eye + (U * (weight / noise).unsqueeze(-2)) @ U.transpose(-1, -2)
    full = _logdet_spd(A)
    out = []
    for i in range(U.shape[-1]):
        u = U[..., :, i]
        out.append(full - _logdet_spd(A - (weight[..., i] / noise)[..., None, None] * (u.unsqueeze(-1) * u.unsqueeze(-2))))
    return torch.stack(out, dim=-1)


# ----------------------------------------------------------------------------- set selection on small caches
@dataclass
class SelectionResult:
    """Chosen token indices (ascending) and the Jacobian capacity of the chosen set."""

    indices: torch.Tensor
    capacity: float
    method: str


def subset_capacity(K, U, mu, lam, indices, noise=1.0) -> torch.Tensor:
    """Jacobian capacity of the subset ``indices`` with the softmax re-normalised over that subset."""
    _checks.tensor("K", K, min_dim=2)
    idx = torch.as_tensor(indices, device=K.device)
    if idx.dim() != 1 or (idx.numel() and (idx.is_floating_point() or idx.dtype == torch.bool)):
        raise ValueError(f"`indices` must be a 1-D sequence of token indices (ints), got {indices!r}")
    idx = idx.long()
    n = K.shape[-2]
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise ValueError(f"`indices` must lie in [0, n = {n}), got {idx.tolist()}")
    return jacobian_capacity(K[..., idx, :], U[..., :, idx], mu, lam, noise)


def _check_selection(K, U, mu, budget):
    if K.dim() != 2:
        raise ValueError(f"set selection works on one cache: `K` must be (n, d), got {tuple(K.shape)}")
    _check_KU(K, U, mu)
    budget = _checks.nonneg_int("budget", budget)
    n = K.shape[0]
    if not 1 <= budget <= n:
        raise ValueError(f"`budget` must be between 1 and n = {n}, got {budget}")
    return budget


def select_one_shot(K, U, mu, lam, budget: int, *, tau: float = DEFAULTS.tau, noise=1.0) -> SelectionResult:
    """Algorithm 1: keep the top-``budget`` tokens by the one-shot score (no protected regions)."""
    budget = _check_selection(K, U, mu, budget)
    s = algorithm1_scores(K, U, mu, lam, tau=tau, noise=noise)["score"]
    idx = s.topk(budget).indices.sort().values
    return SelectionResult(idx, float(subset_capacity(K, U, mu, lam, idx, noise)), "one-shot")


def select_greedy(K, U, mu, lam, budget: int, *, noise=1.0) -> SelectionResult:
    """Greedy capacity maximisation, re-normalising the softmax over the chosen set at each step.

    A single token has zero Jacobian (its softmax is constantly 1), so the first step ties for every
    token; the search therefore starts from the best *pair* and then adds one token at a time.
    """
    budget = _check_selection(K, U, mu, budget)
    n = K.shape[0]
    if budget == 1:
        return SelectionResult(torch.tensor([0], device=K.device), 0.0, "greedy")
    best = max(itertools.combinations(range(n), 2), key=lambda c: float(subset_capacity(K, U, mu, lam, list(c), noise)))
    chosen = list(best)
    while len(chosen) < budget:
        rest = [i for i in range(n) if i not in chosen]
        gains = [float(subset_capacity(K, U, mu, lam, chosen + [i], noise)) for i in rest]
        chosen.append(rest[max(range(len(rest)), key=gains.__getitem__)])
    idx = torch.tensor(sorted(chosen), device=K.device)
    return SelectionResult(idx, float(subset_capacity(K, U, mu, lam, idx, noise)), "greedy")


def select_exhaustive(K, U, mu, lam, budget: int, *, noise=1.0, max_subsets: int = 200_000, chunk: int = 4096) -> SelectionResult:
    """The best subset of size ``budget`` by brute force (refuses more than ``max_subsets`` subsets).

    Subsets are evaluated in batches of ``chunk`` (one batched Cholesky per batch)."""
    budget = _check_selection(K, U, mu, budget)
    max_subsets = _checks.int_at_least("max_subsets", max_subsets, 1)
    chunk = _checks.int_at_least("chunk", chunk, 1)
    n = K.shape[0]
    total = math.comb(n, budget)
    if total > max_subsets:
        raise ValueError(f"exhaustive search over C({n}, {budget}) = {total} subsets exceeds `max_subsets` = {max_subsets}")
    combos = itertools.combinations(range(n), budget)
    best_c, best_v = None, -math.inf
    while True:
        block = list(itertools.islice(combos, chunk))
        if not block:
            break
        idx = torch.tensor(block, device=K.device)  # (S, budget)
        caps = jacobian_capacity(K[idx], U[:, idx].permute(1, 0, 2), mu, lam, noise)
        j = int(caps.argmax())
        if float(caps[j]) > best_v:
            best_c, best_v = block[j], float(caps[j])
    return SelectionResult(torch.tensor(best_c, device=K.device), best_v, "exhaustive")
