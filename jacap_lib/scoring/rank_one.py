"""Algorithm 1 with the exact rank-one softmax Jacobian (the ``jacap_rank1`` press and the decomposition
chapter's "diagonal S" ablation)."""
from __future__ import annotations

import torch

from .. import _checks
from ..config import DEFAULTS, check
from .contract import JacapScores, diagnose_nonfinite, validate_inputs
from .core import leverage, tempered_centre

__all__ = ["rank_one_corrected_scores"]


@torch.no_grad()  # scores decide a selection: inputs that require grad are read, not differentiated
def rank_one_corrected_scores(keys, values, mu, lam, *, tau: float = DEFAULTS.tau, noise: float = DEFAULTS.noise,
                              out_proj=None) -> JacapScores:
    r"""Algorithm 1 with the exact softmax Jacobian :math:`S=\mathrm{Diag}(\bar\alpha)-\bar\alpha\bar\alpha^\top`.

    Keeping :math:`K\Lambda K^\top\approx\mathrm{Diag}(\kappa)` but not diagonalising S,

    .. math::  \tfrac1d\,U S\,\mathrm{Diag}(\kappa)\,S U^\top
               = \sum_i \underbrace{\tfrac{\bar\alpha_i^2\kappa_i}{d}}_{w_i'}(u_i-\bar u)(u_i-\bar u)^\top,
               \qquad \bar u = \textstyle\sum_j\bar\alpha_j u_j ,

    because column i of :math:`US` is :math:`\bar\alpha_i(u_i-\bar u)`. So the rank-one term only
    re-centres the output directions on the attention-weighted mean and replaces
    :math:`\rho_i^2=\bar\alpha_i^2(1-\bar\alpha_i)^2` by :math:`\bar\alpha_i^2` — an O(N d d_out)
    computation, never an N×N matrix. Returned :class:`JacapScores` fields: ``alpha``, ``rho``
    (:math:`\bar\alpha(1-\bar\alpha)`, for reference), ``kappa``, ``weight`` (:math:`w_i'`),
    ``leverage`` (:math:`(u_i-\bar u)^\top A^{-1}(u_i-\bar u)` with
    :math:`A=I+\sum_j (w_j'/\sigma^2)(u_j-\bar u)(u_j-\bar u)^\top`) and ``score`` (:math:`w_i'/\sigma^2\cdot`leverage).
    Shapes as in :func:`jacap_lib.jacap_scores`: keys/values ``(..., N, d)``, mu/lam ``(..., d)``; the same
    argument checks (a ValueError naming a non-finite input), and likewise no gradient: inputs that
    require grad (a model run outside ``torch.no_grad()``) are read, not differentiated.
    """
    validate_inputs(keys, values, mu, lam, out_proj)
    tau = check("tau", tau)
    noise = _checks.positive("noise", noise)  # a number here: the "deff" rule is not implemented for this variant
    dt = torch.float64 if keys.dtype == torch.float64 else torch.float32
    k, v = keys.to(dt), values.to(dt)
    mu_, lam_ = mu.to(dt), lam.to(dt)
    d = k.shape[-1]
    alpha = tempered_centre(k, mu_, tau)
    kappa = (k.square() * lam_.unsqueeze(-2)).sum(-1)
    weight = alpha.square() * kappa / d
    if not bool(torch.isfinite(weight).all()):  # as jacap_scores: name the input before the solve fails on it
        diagnose_nonfinite(keys=keys)
    u = v if out_proj is None else v @ out_proj.to(dt).transpose(-1, -2)
    ubar = (alpha.unsqueeze(-1) * u).sum(-2, keepdim=True)
    uc = u - ubar
    if not bool(torch.isfinite(uc).all()):
        diagnose_nonfinite(values=values)
    lev = leverage(uc, weight, noise)
    out = JacapScores(alpha=alpha, rho=alpha * (1 - alpha), kappa=kappa, weight=weight, leverage=lev,
                      score=weight / noise * lev)
    return out if dt == torch.float64 else out.map(lambda t: t.float())
