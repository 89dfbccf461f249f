"""The scoring contract shared by the torch path (:mod:`.core`) and the Triton path (:mod:`.triton`):
the result type :class:`JacapScores`, the error :class:`CholeskyFailure`, the argument checks, the
attribution of non-finite results to an argument, and the jittered Cholesky factorisation of ``A``."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

import torch

from .. import _checks

__all__ = ["JacapScores", "CholeskyFailure", "validate_inputs", "diagnose_nonfinite", "compute_dtype",
           "cholesky_with_jitter"]

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


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def validate_inputs(keys, values, mu, lam, out_proj, *, values_now: bool = True):
    """The tensors' contract (shapes, dtypes, devices, finite statistics); ``tau``/``noise`` are checked where
    they enter (:func:`jacap_lib.config.check`). With ``values_now=False`` (the Triton path) the checks that
    read tensor *values* (NaN/Inf in ``mu``, ``lam``, ``out_proj``; ``lam < 0``) are left to the caller, which
    folds them into one status read at the end of the call instead of synchronising here."""
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
            lead = torch.broadcast_shapes(stat.shape[:-1], keys.shape[:-2])
        except RuntimeError:
            lead = None
        if lead != keys.shape[:-2]:  # also refuses extra leading dims, which would silently enlarge the result
            raise ValueError(
                f"`{name}` shape {tuple(stat.shape)} does not broadcast to the keys' leading dims "
                f"{tuple(keys.shape[:-2])}; give it shape (..., d) matching keys (..., N, d)"
            )
    # mu and lam are small: check them now. keys/values/out_proj are checked only when a result
    # comes out non-finite (see _diagnose_nonfinite): a full pass over the cache costs as much as scoring.
    if values_now:
        check_statistics(mu, lam)
    if out_proj is not None:
        _checks.tensor("out_proj", out_proj, min_dim=2)
        if out_proj.shape[-1] != values.shape[-1]:
            raise ValueError(
                f"`out_proj` must have shape (..., d_out, d_v) with d_v = {values.shape[-1]}, got {tuple(out_proj.shape)}"
            )
        if out_proj.device != keys.device:
            raise ValueError(f"`out_proj` is on {out_proj.device} but `keys` on {keys.device}")
        if values_now:
            _checks.finite("out_proj", out_proj)  # a (d_out, d) matrix per head: cheap to check up front


def check_statistics(mu, lam) -> None:
    """``mu`` and ``lam`` finite, ``lam >= 0`` (ValueError naming the argument)."""
    for name, t in (("mu", mu), ("lam", lam)):
        _checks.finite(name, t)
    if bool((lam < 0).any()):
        raise ValueError("`lam` (the diagonal of the query covariance) must be >= 0; floor it, e.g. lam.clamp_min(1e-6)")


def diagnose_nonfinite(**tensors) -> None:
    """Name the input that made a result non-finite (called only on the failure path)."""
    for name, t in tensors.items():
        if t is not None:
            _checks.finite(name, t)



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
