r"""Algorithm 1 of Jacap on batched tensors.

For a cache of N tokens with keys :math:`k_i` and values :math:`v_i` (one head), a mean future
query :math:`\mu` and a diagonal query covariance :math:`\Lambda = \mathrm{diag}(\lambda)`:

.. math::

    \bar\alpha &= \mathrm{softmax}\big(K\mu / (\tau\sqrt d)\big), \qquad
    \rho_i = \bar\alpha_i(1-\bar\alpha_i), \qquad
    \kappa_i = \textstyle\sum_j \lambda_j k_{ij}^2, \\
    w_i &= \rho_i^2\,\kappa_i / d, \qquad
    A = I + \textstyle\sum_j (w_j/\sigma^2)\, u_j u_j^\top, \\
    \ell_i &= u_i^\top A^{-1} u_i, \qquad r_i = (w_i/\sigma^2)\, \ell_i ,

with :math:`u_i = v_i` or :math:`u_i = W_O v_i`. ``A`` is factorised once per (batch, head) by
Cholesky and the leverages come from one triangular solve; no inverse is formed.

The torch implementation here is the reference; :mod:`jacap_lib.kernels` holds fused Triton
kernels for CUDA tensors (``backend="triton"``).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, fields

import torch

from . import _checks

__all__ = ["JacapScores", "CholeskyFailure", "jacap_scores", "jacap_weight", "cholesky_with_jitter", "leverage"]

# relative jitters tried, in order, when A's Cholesky factorisation fails
_JITTERS = (0.0, 1e-6, 1e-4, 1e-2)


class CholeskyFailure(RuntimeError):
    """A = I + sum w u u^T could not be factorised even with jitter (non-finite or wildly scaled inputs)."""


@dataclass
class JacapScores:
    """Per-token quantities of Algorithm 1, each a float32 tensor of shape ``(..., N)``."""

    alpha: torch.Tensor
    rho: torch.Tensor
    kappa: torch.Tensor
    weight: torch.Tensor
    leverage: torch.Tensor
    score: torch.Tensor

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def map(self, fn) -> "JacapScores":
        """Apply ``fn`` to every field (e.g. ``lambda t: t[0, 1]`` or ``torch.Tensor.cpu``)."""
        return JacapScores(**{k: fn(v) for k, v in self.to_dict().items()})


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _validate(keys, values, mu, lam, tau, noise, out_proj):
    _checks.tensor("keys", keys, min_dim=2)
    _checks.tensor("values", values, min_dim=2)
    _checks.tensor("mu", mu, min_dim=1)
    _checks.tensor("lam", lam, min_dim=1)
    if keys.shape[:-1] != values.shape[:-1]:
        raise ValueError(
            f"`values` must have the same leading dims and N as `keys`: keys {tuple(keys.shape)} vs values "
            f"{tuple(values.shape)} (expected (..., N, d) for both)"
        )
    if keys.dtype != values.dtype:
        raise ValueError(f"`values` dtype {values.dtype} differs from `keys` dtype {keys.dtype}; cast one of them")
    if mu.dtype != lam.dtype:
        raise ValueError(f"`lam` dtype {lam.dtype} differs from `mu` dtype {mu.dtype}; cast one of them")
    if mu.dtype not in (keys.dtype, torch.float32, torch.float64):
        raise ValueError(
            f"`mu`/`lam` dtype {mu.dtype} must equal the keys' dtype {keys.dtype} or be float32/float64 "
            "(higher-precision statistics are allowed)"
        )
    devices = {t.device for t in (keys, values, mu, lam)}
    if len(devices) > 1:
        raise ValueError(f"`keys`, `values`, `mu`, `lam` must be on one device, got {sorted(map(str, devices))}")
    n, d = keys.shape[-2], keys.shape[-1]
    if n == 0:
        raise ValueError("`keys` has N = 0 tokens: there is nothing to score")
    if d == 0:
        raise ValueError("`keys` has head dimension d = 0")
    for name, stat in (("mu", mu), ("lam", lam)):
        if stat.shape[-1] != d:
            raise ValueError(f"`{name}` must have last dim d = {d} (the keys' head dim), got shape {tuple(stat.shape)}")
        try:
            torch.broadcast_shapes(stat.shape[:-1], keys.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"`{name}` shape {tuple(stat.shape)} does not broadcast against the keys' leading dims "
                f"{tuple(keys.shape[:-2])}; give it shape (..., d) matching keys (..., N, d)"
            ) from None
    tau = _checks.positive("tau", tau)
    noise = _checks.positive("noise", noise)
    # mu and lam are small: check them now. keys/values/out_proj are checked only when a result
    # comes out non-finite (see _diagnose_nonfinite): a full pass over the cache costs as much as scoring.
    for name, t in (("mu", mu), ("lam", lam)):
        _checks.finite(name, t)
    if bool((lam < 0).any()):
        raise ValueError("`lam` (the diagonal of the query covariance) must be >= 0; floor it, e.g. lam.clamp_min(1e-6)")
    if out_proj is not None:
        _checks.tensor("out_proj", out_proj, min_dim=2)
        if out_proj.shape[-1] != values.shape[-1]:
            raise ValueError(
                f"`out_proj` must have shape (..., d_out, d_v) with d_v = {values.shape[-1]}, got {tuple(out_proj.shape)}"
            )
        if out_proj.device != keys.device:
            raise ValueError(f"`out_proj` is on {out_proj.device} but `keys` on {keys.device}")
    return tau, noise


def _diagnose_nonfinite(**tensors) -> None:
    """Name the input that made a result non-finite (called only on the failure path)."""
    for name, t in tensors.items():
        if t is not None:
            _checks.finite(name, t)


def jacap_weight(keys: torch.Tensor, mu: torch.Tensor, lam: torch.Tensor, tau: float):
    """The token-wise part of Algorithm 1: ``(alpha, rho, kappa, weight)`` in the compute dtype.

    Inputs are assumed validated and already in a float32/float64 compute dtype.
    """
    d = keys.shape[-1]
    logits = (keys @ mu.unsqueeze(-1)).squeeze(-1) / (tau * math.sqrt(d))
    alpha = torch.softmax(logits, dim=-1)
    rho = alpha * (1.0 - alpha)
    kappa = (keys * keys) @ lam.unsqueeze(-1)
    kappa = kappa.squeeze(-1)
    weight = rho.square() * kappa / d
    return alpha, rho, kappa, weight


def cholesky_with_jitter(A: torch.Tensor) -> torch.Tensor:
    """Lower Cholesky factor of a batch of SPD matrices, retrying with growing diagonal jitter.

    Raises :class:`CholeskyFailure` when even the largest jitter (1e-2 of the mean diagonal) fails.
    """
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    scale = A.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True).unsqueeze(-1).clamp_min(1.0)
    for jitter in _JITTERS:
        L, info = torch.linalg.cholesky_ex(A + jitter * scale * eye if jitter else A)
        if not bool((info != 0).any()) and bool(torch.isfinite(L).all()):
            if jitter:
                warnings.warn(f"Cholesky of A needed a relative jitter of {jitter:g}", RuntimeWarning, stacklevel=3)
            return L
    raise CholeskyFailure(
        "Cholesky factorisation of A = I + sum_j (w_j/noise) u_j u_j^T failed even with a relative jitter of "
        f"{_JITTERS[-1]:g}; the keys/values are probably wildly scaled — check for overflow, or raise `noise`"
    )


def leverage(u: torch.Tensor, weight: torch.Tensor, noise: float = 1.0) -> torch.Tensor:
    """Leverage ``u_i^T A^{-1} u_i`` with ``A = I + sum_j (w_j/noise) u_j u_j^T`` for ``u (..., N, m)``."""
    m = u.shape[-1]
    gram = (u * (weight / noise).unsqueeze(-1)).transpose(-1, -2) @ u
    A = gram + torch.eye(m, dtype=u.dtype, device=u.device)
    L = cholesky_with_jitter(A)
    x = torch.linalg.solve_triangular(L, u.transpose(-1, -2), upper=False)  # L x = u  ->  |x|^2 = u^T A^-1 u
    return x.square().sum(-2)


def jacap_scores(
    keys: torch.Tensor,
    values: torch.Tensor,
    mu: torch.Tensor,
    lam: torch.Tensor,
    *,
    tau: float = 10.0,
    noise: float = 1.0,
    out_proj: torch.Tensor | None = None,
    backend: str = "auto",
) -> JacapScores:
    r"""Score every cached token with Jacap's Algorithm 1.

    Parameters
    ----------
    keys, values : (..., N, d) tensors (one row per cached token; any leading batch/head dims).
    mu : (..., d) mean future query :math:`\mu_Q` (broadcast over the keys' leading dims).
    lam : (..., d) diagonal of the query covariance :math:`\Lambda_Q` (must be >= 0).
    tau : temperature of the centre softmax, default 10 (the paper's best value).
    noise : isotropic channel noise :math:`\sigma^2`; weights enter A and the score as ``w / noise``.
    out_proj : optional (d_out, d) or (..., d_out, d) matrix; ``u = out_proj @ v`` (e.g. the head's
        slice of :math:`W_O`). Default ``u = v``.
    backend : ``"auto"`` (Triton for CUDA tensors when Triton is importable, torch otherwise),
        ``"torch"`` or ``"triton"``.

    Returns
    -------
    JacapScores with float32 ``(..., N)`` fields ``alpha, rho, kappa, weight, leverage, score``.
    fp16/bf16 inputs are accumulated in float32.
    """
    tau, noise = _validate(keys, values, mu, lam, tau, noise, out_proj)
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"`backend` must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "auto":
        # the Triton kernels take fp32/fp16/bf16; float64 stays on the torch path
        backend = "triton" if keys.is_cuda and keys.dtype != torch.float64 and _triton_available() else "torch"
    if backend == "triton":
        from .kernels import triton_jacap_scores

        return triton_jacap_scores(keys, values, mu, lam, tau=tau, noise=noise, out_proj=out_proj)
    return _torch_jacap_scores(keys, values, mu, lam, tau=tau, noise=noise, out_proj=out_proj)


def _torch_jacap_scores(keys, values, mu, lam, *, tau, noise, out_proj):
    cdt = _compute_dtype(keys.dtype)
    k = keys.to(cdt)
    alpha, rho, kappa, weight = jacap_weight(k, mu.to(cdt), lam.to(cdt), tau)
    if not bool(torch.isfinite(weight).all()):
        _diagnose_nonfinite(keys=keys)
    u = values.to(cdt)
    if out_proj is not None:
        u = u @ out_proj.to(cdt).transpose(-1, -2)
    if not bool(torch.isfinite(u.sum(-2)).all()):
        _diagnose_nonfinite(values=values, out_proj=out_proj)
    lev = leverage(u, weight, noise)
    score = (weight / noise) * lev
    if not bool(torch.isfinite(score).all()):
        raise CholeskyFailure("Algorithm 1 produced non-finite scores from finite inputs: the keys/values overflow "
                              "float32 products; rescale them or raise `noise`")
    out = JacapScores(alpha=alpha, rho=rho, kappa=kappa, weight=weight, leverage=lev, score=score)
    return out.map(lambda t: t.to(torch.float32))


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        warnings.warn("CUDA tensors but Triton is not installed: using the torch reference", RuntimeWarning, stacklevel=3)
        return False
    return True
