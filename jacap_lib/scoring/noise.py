r"""The noise scale :math:`\sigma^2` of Algorithm 1: a fixed number, or the effective-dimension rule.

With :math:`\lambda_k` the eigenvalues of the weighted Gram :math:`G = \sum_j w_j u_j u_j^\top`, the
scores of Algorithm 1 sum to the *effective dimension*

.. math::

    d_\mathrm{eff}(\sigma^2) = \sum_i r_i = \mathrm{tr}\big((\sigma^2 I + G)^{-1} G\big)
    = \sum_k \frac{\lambda_k}{\lambda_k + \sigma^2} ,

which falls from rank(G) to 0 as :math:`\sigma^2` grows. When it is far below 1, :math:`A = I + G/\sigma^2`
is close to :math:`I` and the leverage :math:`u_i^\top A^{-1}u_i` is just :math:`\lVert u_i\rVert^2`: the
capacity term does nothing. The rule ``noise="deff"`` picks, per head, the :math:`\sigma^2` at which
:math:`d_\mathrm{eff}` equals a target (ridge-leverage sampling does the same with its regulariser);
the scores then no longer depend on the overall scale of :math:`w`, which :math:`\tau` and the query
statistics change by orders of magnitude.
"""
from __future__ import annotations

import torch

from .. import _checks

__all__ = ["weighted_gram", "effective_dimension", "deff_noise", "check_deff_target", "per_head"]


def per_head(noise, like: torch.Tensor) -> torch.Tensor:
    """``noise`` (a number or a ``(...)`` tensor of per-head values) as a tensor broadcasting against ``(..., N)``."""
    if isinstance(noise, torch.Tensor):
        return noise.to(like.dtype).unsqueeze(-1)
    return torch.as_tensor(float(noise), dtype=like.dtype, device=like.device)



def weighted_gram(u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    r""":math:`G = \sum_j w_j u_j u_j^\top` for ``u (..., N, m)`` and ``weight (..., N)``: ``(..., m, m)``."""
    return (u * weight.unsqueeze(-1)).transpose(-1, -2) @ u


def effective_dimension(eigenvalues: torch.Tensor, noise) -> torch.Tensor:
    r""":math:`d_\mathrm{eff}(\sigma^2) = \sum_k \lambda_k / (\lambda_k + \sigma^2)` over the last axis.

    ``eigenvalues (..., m)`` are those of the weighted Gram :math:`G = \sum_j w_j u_j u_j^\top` (negative
    rounding noise is clamped to 0); ``noise`` is :math:`\sigma^2`, a number or a tensor broadcasting
    against ``(...)``. It equals :math:`\sum_i r_i`, the sum of Algorithm 1's scores, since
    :math:`\sum_i (w_i/\sigma^2)\, u_i^\top A^{-1} u_i = \mathrm{tr}\big((\sigma^2 I + G)^{-1} G\big)`.
    """
    lam = eigenvalues.clamp_min(0)
    noise = torch.as_tensor(noise, dtype=lam.dtype, device=lam.device)
    return (lam / (lam + noise.unsqueeze(-1))).sum(-1)


def deff_noise(eigenvalues: torch.Tensor, target, *, iters: int = 100) -> torch.Tensor:
    r"""Per-head :math:`\sigma^2` at which :math:`d_\mathrm{eff}(\sigma^2)` equals ``target``, by bisection.

    ``eigenvalues (..., m)`` of the weighted Gram, ``target`` a number or a tensor broadcasting against
    ``(...)``, > 0. :math:`d_\mathrm{eff}` falls strictly from the number ``p`` of positive eigenvalues
    (:math:`\sigma^2 \to 0`) to 0 (:math:`\sigma^2\to\infty`), so the root is unique. A target at or
    above ``p`` (a head with fewer directions than asked for) is lowered to ``0.999 p``; a head whose
    Gram is zero gets :math:`\sigma^2 = 1` (its scores are all zero anyway). The bisection runs on
    :math:`\log\sigma^2` between ``1e-30 * lambda_max`` and ``tr(G) / target`` (where
    :math:`d_\mathrm{eff} \le \mathrm{tr}(G)/\sigma^2 \le` target), ``iters`` halvings, in float64.
    Returns ``(...)`` float64.
    """
    _checks.tensor("eigenvalues", eigenvalues, min_dim=1)
    lam = eigenvalues.detach().to(torch.float64).clamp_min(0)
    top = lam.amax(-1)
    positive = lam > top.unsqueeze(-1) * 1e-12
    lam = torch.where(positive, lam, torch.zeros_like(lam))
    n_pos = positive.sum(-1).to(torch.float64)
    target = torch.as_tensor(target, dtype=torch.float64, device=lam.device)
    if not bool(torch.isfinite(target).all()) or bool((target <= 0).any()):
        raise ValueError(f"`deff_target` (the effective dimension to reach) must be finite and > 0, got {target}")
    target = torch.minimum(torch.broadcast_to(target, top.shape), (0.999 * n_pos).clamp_min(1e-12))
    hi = (lam.sum(-1).clamp_min(1e-300) / target).log()
    lo = (top * 1e-30).clamp_min(1e-300).log()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        too_small = effective_dimension(lam, mid.exp()) > target  # noise below the root
        lo = torch.where(too_small, mid, lo)
        hi = torch.where(too_small, hi, mid)
    out = (0.5 * (lo + hi)).exp()
    return torch.where(top > 0, out, torch.ones_like(out))


def check_deff_target(noise, deff_target, *, values_now: bool = True) -> None:
    """``deff_target`` (> 0) is given with ``noise="deff"`` and only then (``noise`` itself: :func:`jacap_lib.config.check`).

    With ``values_now=False`` a tensor ``deff_target``'s values are not read here (the Triton path checks
    them on the device and reports at the end of the call)."""
    if isinstance(noise, str):
        if deff_target is None:
            raise ValueError("`noise='deff'` needs `deff_target`, the effective dimension sum_i r_i to reach "
                             "(e.g. half the number of tokens kept, at most the head dim)")
        if isinstance(deff_target, torch.Tensor):
            if not values_now:
                return
            _checks.finite("deff_target", deff_target.float())
            if bool((deff_target <= 0).any()):
                raise ValueError(f"`deff_target` must be > 0, got {deff_target}")
        else:
            _checks.positive("deff_target", deff_target)
    elif deff_target is not None:
        raise ValueError("`deff_target` is used only with noise='deff'; drop it or set noise='deff'")
