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
Cholesky, :math:`A = LL^\top`, and the leverages are :math:`\lVert L^{-1}u_i\rVert^2`: one GEMM with the
small triangular factor's inverse (formed by one ``d x d`` triangular solve); ``A^{-1}`` is never formed.
K is read once and V twice, in cache-sized blocks (:mod:`.factor`), as the Triton kernels do.

The noise scale :math:`\sigma^2` is either a number (the paper's setting is 1) or chosen per head by
the *effective-dimension rule* (``noise="deff"``): with :math:`\lambda_k` the eigenvalues of the
weighted Gram :math:`G = \sum_j w_j u_j u_j^\top`,

.. math::

    d_\mathrm{eff}(\sigma^2) = \sum_i r_i = \mathrm{tr}\big((\sigma^2 I + G)^{-1} G\big)
    = \sum_k \frac{\lambda_k}{\lambda_k + \sigma^2},

and :math:`\sigma^2` solves :math:`d_\mathrm{eff}(\sigma^2) = ` ``deff_target`` (bisection on
:math:`\log\sigma^2`; :func:`deff_noise`). This is the ridge-leverage construction: the target fixes
how many directions of :math:`G` count as "covered", so the leverage term discounts redundant
directions whatever the overall scale of :math:`w` (which :math:`\tau` and the statistics change by
orders of magnitude).

The torch implementation here is the reference; :mod:`jacap_lib.scoring.triton` holds fused Triton
kernels for CUDA tensors (``backend="triton"``).
"""
from __future__ import annotations

import math
import warnings

import torch

from ..config import DEFAULTS, check
from .factor import block_rows, gram_pass, leverage_map, leverage_pass, project_gram, token_pass
from .noise import check_deff_target, deff_noise, effective_dimension, per_head, weighted_gram
from .contract import (CholeskyFailure, JacapScores, cholesky_with_jitter, compute_dtype, diagnose_nonfinite,
                       validate_inputs)

__all__ = ["jacap_scores", "validated_scores", "jacap_weight", "centre_attention", "tempered_centre", "sensitivity_weight",
           "leverage", "weighted_gram", "effective_dimension", "deff_noise", "CENTRES", "SENSITIVITIES", "KAPPAS",
           "LEVERAGES"]

#: the centres computed from the keys and the query statistics (a given centre, e.g. the observed attention, is
#: passed as ``alpha``)
CENTRES = ("tempered", "ea")
#: the sensitivity factor s(alpha) of the weight w = s kappa / d: Algorithm 1's rho^2, or rho, or alpha itself
SENSITIVITIES = ("rho2", "rho", "alpha")
#: the response variance: kappa_i = k_i^T Lambda k_i ("on"), or the head's s-weighted mean of it ("mean")
KAPPAS = ("on", "mean")
#: the leverage: u_i^T A^{-1} u_i ("A"), or |u_i|^2 (A := I, "identity")
LEVERAGES = ("A", "identity")


def centre_attention(logits: torch.Tensor, d: int, *, centre: str = "tempered", tau: float = DEFAULTS.tau,
                     kappa: torch.Tensor | None = None) -> torch.Tensor:
    r"""The centre :math:`\bar\alpha` at which Algorithm 1 linearises the attention, from ``logits = K mu``
    ``(..., N)`` (head dimension ``d``).

    ``centre="tempered"``: Algorithm 1's :math:`\mathrm{softmax}(K\mu/(\tau\sqrt d))`. ``"ea"``: Expected
    Attention's log-normal expectation :math:`\mathrm{softmax}(K\mu/\sqrt d + \mathrm{diag}(K\Lambda K^\top)/(2d))`
    (no :math:`\tau`), with ``kappa`` :math:`= \mathrm{diag}(K\Lambda K^\top)` ``(..., N)``. The one home of both
    softmaxes (the torch path, the rank-one variant, the decomposition's capacities)."""
    if centre == "tempered":
        return torch.softmax(logits / (tau * math.sqrt(d)), dim=-1)
    if centre == "ea":
        if kappa is None:
            raise ValueError("centre='ea' needs `kappa` = diag(K Lambda K^T), the keys' response variance")
        return torch.softmax(logits / math.sqrt(d) + kappa / (2 * d), dim=-1)
    raise ValueError(f"`centre` must be one of {CENTRES} (a given centre is passed as `alpha`), got {centre!r}")


def tempered_centre(keys: torch.Tensor, mu: torch.Tensor, tau: float) -> torch.Tensor:
    r""":func:`centre_attention` ``"tempered"`` from ``keys (..., N, d)`` and ``mu (..., d)``:
    :math:`\mathrm{softmax}(K\mu/(\tau\sqrt d))`, ``(..., N)`` (``tau=1``: the model's own softmax)."""
    return centre_attention((keys @ mu.unsqueeze(-1)).squeeze(-1), keys.shape[-1], tau=tau)


def sensitivity_weight(alpha: torch.Tensor, kappa: torch.Tensor, d: int, *, sensitivity: str = "rho2",
                       kappa_mode: str = "on"):
    r"""``(rho, kappa, weight)``: :math:`\rho = \bar\alpha(1-\bar\alpha)` and Algorithm 1's weight
    :math:`w_i = s_i\kappa_i/d`, ``(..., N)``.

    ``sensitivity``: :math:`s = \rho^2` (``"rho2"``, Algorithm 1), :math:`\rho` or :math:`\bar\alpha`.
    ``kappa_mode="mean"``: every token gets the head's :math:`\bar\kappa = \sum_i s_i\kappa_i/\sum_i s_i` (the
    returned ``kappa``), so the total weight is unchanged and only the token-to-token variation of
    :math:`\kappa` goes (the plain mean where every :math:`s_i = 0`)."""
    rho = alpha * (1.0 - alpha)
    if sensitivity == "rho2" and kappa_mode == "on":
        return rho, kappa, rho.square() * kappa / d
    if sensitivity not in SENSITIVITIES:
        raise ValueError(f"`sensitivity` must be one of {SENSITIVITIES}, got {sensitivity!r}")
    if kappa_mode not in KAPPAS:
        raise ValueError(f"`kappa` must be one of {KAPPAS}, got {kappa_mode!r}")
    s = {"rho2": rho.square(), "rho": rho, "alpha": alpha}[sensitivity]
    if kappa_mode == "mean":
        total = s.sum(-1, keepdim=True)
        kbar = torch.where(total > 0, (s * kappa).sum(-1, keepdim=True) / total.clamp_min(torch.finfo(s.dtype).tiny),
                           kappa.mean(-1, keepdim=True))
        kappa = kbar.expand_as(kappa)
    return rho, kappa, s * kappa / d


def jacap_weight(keys: torch.Tensor, mu: torch.Tensor, lam: torch.Tensor, tau: float):
    """The token-wise part of Algorithm 1: ``(alpha, rho, kappa, weight)`` in the compute dtype.

    Inputs are assumed validated and already in a float32/float64 compute dtype.
    """
    d = keys.shape[-1]
    alpha = tempered_centre(keys, mu, tau)
    kappa = (keys * keys) @ lam.unsqueeze(-1)
    kappa = kappa.squeeze(-1)
    rho, kappa, weight = sensitivity_weight(alpha, kappa, d)
    return alpha, rho, kappa, weight


def leverage(u: torch.Tensor, weight: torch.Tensor, noise=1.0) -> torch.Tensor:
    """Leverage ``u_i^T A^{-1} u_i`` with ``A = I + sum_j (w_j/noise) u_j u_j^T`` for ``u (..., N, m)``.

    ``noise`` is a number or a tensor of per-head values broadcasting against ``u``'s leading dims.
    ``A = L L^T`` is factorised once per head and the leverages are ``|L^{-1} u_i|^2``, one GEMM with the
    ``m x m`` factor ``L^{-1}`` (:mod:`.factor`); ``A^{-1}`` itself is never formed. Inputs that require grad
    are read, not differentiated: the leverages carry no gradient.
    """
    lead, (N, m) = tuple(u.shape[:-2]), u.shape[-2:]
    cdt = compute_dtype(u.dtype)
    G = math.prod(lead)
    u3 = u.reshape(G, N, m)
    w3 = torch.broadcast_to(weight, lead + (N,)).reshape(G, N).to(cdt)
    if isinstance(noise, torch.Tensor):
        noise_g = torch.broadcast_to(noise.to(device=u.device, dtype=cdt), lead).reshape(G)
    else:
        noise_g = torch.full((G,), float(noise), dtype=cdt, device=u.device)
    rows = block_rows(G, m, N, u.device)
    A = gram_pass(u3, w3, cdt, rows) / noise_g[:, None, None] + torch.eye(m, dtype=cdt, device=u.device)
    L = cholesky_with_jitter(A)
    return leverage_pass(u3, leverage_map(L, None).transpose(1, 2), cdt, rows).reshape(lead + (N,))


def jacap_scores(
    keys: torch.Tensor,
    values: torch.Tensor,
    mu: torch.Tensor,
    lam: torch.Tensor,
    *,
    tau: float = DEFAULTS.tau,
    noise: float | str = DEFAULTS.noise,
    deff_target: float | torch.Tensor | None = None,
    out_proj: torch.Tensor | None = None,
    backend: str = DEFAULTS.backend,
) -> JacapScores:
    r"""Score every cached token with Jacap's Algorithm 1.

    Parameters
    ----------
    keys, values : (..., N, d) tensors (one row per cached token; any leading batch/head dims).
    mu : (..., d) mean future query :math:`\mu_Q` (broadcast over the keys' leading dims).
    lam : (..., d) diagonal of the query covariance :math:`\Lambda_Q` (must be >= 0).
    tau : temperature of the centre softmax, default ``config.DEFAULTS.tau`` (3, the evaluation's tune choice; the paper's is 10).
    noise : isotropic channel noise :math:`\sigma^2`; weights enter A and the score as ``w / noise``.
        ``"deff"``: per head, the :math:`\sigma^2` at which :math:`\sum_i r_i` equals ``deff_target``
        (the effective-dimension rule, :func:`deff_noise`).
    deff_target : with ``noise="deff"``, the effective dimension to reach: a number or a tensor
        broadcasting against the leading dims (per head), > 0; lowered to 0.999 x the Gram's rank where it
        exceeds it.
    out_proj : optional (d_out, d) or (..., d_out, d) matrix; ``u = out_proj @ v`` (e.g. the head's
        slice of :math:`W_O`). Default ``u = v``.
    backend : ``"auto"`` (Triton for CUDA tensors when Triton is importable, torch otherwise),
        ``"torch"`` or ``"triton"``.

    Returns
    -------
    JacapScores with float32 ``(..., N)`` fields ``alpha, rho, kappa, weight, leverage, score``.
    fp16/bf16 inputs are accumulated in float32. The scores decide a discrete selection and carry no
    gradient: inputs that require grad (a model run outside ``torch.no_grad()``) are read, not differentiated.
    """
    return validated_scores(keys, values, mu, lam, tau=check("tau", tau), noise=check("noise", noise),
                            deff_target=deff_target, out_proj=out_proj, backend=check("backend", backend))


def validated_scores(keys, values, mu, lam, *, tau, noise, deff_target=None, out_proj=None, backend="auto",
                     alpha=None, centre="tempered", sensitivity="rho2", kappa_rule="on", leverage_rule="A",
                     key_mask=None):
    """:func:`jacap_scores` for ``tau``, ``noise`` and ``backend`` already validated where they entered (the
    press, the decode-time controller, :func:`jacap_scores`; :mod:`jacap_lib.config`): checks the tensors only.

    ``alpha``: a given centre :math:`\\bar\\alpha` (``(..., N)``, e.g. the attention the recent queries observed,
    :func:`jacap_lib.presses.utils.observed_attention`) in place of the computed one (``centre`` and ``tau`` then
    unused). ``centre``: the computed centre, ``"tempered"`` (Algorithm 1) or ``"ea"`` (:func:`centre_attention`).
    ``sensitivity``, ``kappa_rule``: the weight's factors (:func:`sensitivity_weight`, Algorithm 1's ``"rho2"``,
    ``"on"`` by default); ``leverage_rule``: ``"A"`` :math:`u_i^\\top A^{-1}u_i` (Algorithm 1) or ``"identity"``
    :math:`\\lVert u_i\\rVert^2` (:math:`A := I`; with ``noise="deff"`` the rule still reads the Gram of the weights
    used). ``key_mask``: boolean, broadcasting against ``(..., N)``, the slots that hold real tokens (padding):
    the centre puts no mass on the others (their weight, hence their score, is 0). Anything but Algorithm 1's
    tempered centre and factors on every slot is scored on the torch path (``backend="auto"``; ``"triton"`` computes
    Algorithm 1 with the tempered centre in its kernels and refuses the rest)."""
    validate_inputs(keys, values, mu, lam, out_proj)
    check_deff_target(noise, deff_target)
    if centre not in CENTRES:
        raise ValueError(f"`centre` must be one of {CENTRES} (a given centre is passed as `alpha`), got {centre!r}")
    for name, value, valid in (("sensitivity", sensitivity, SENSITIVITIES), ("kappa_rule", kappa_rule, KAPPAS),
                               ("leverage_rule", leverage_rule, LEVERAGES)):
        if value not in valid:
            raise ValueError(f"`{name}` must be one of {valid}, got {value!r}")
    if alpha is not None and tuple(alpha.shape[-1:]) != tuple(keys.shape[-2:-1]):
        raise ValueError(f"alpha must have one entry per cached token, shape (..., {keys.shape[-2]}); got "
                         f"{tuple(alpha.shape)}")
    swapped = (centre, sensitivity, kappa_rule, leverage_rule) != ("tempered", "rho2", "on", "A")
    if alpha is not None or swapped or key_mask is not None:
        if backend == "triton":
            what = ("a given `alpha` (the observed centre)" if alpha is not None else "a swapped component"
                    if swapped else "a `key_mask` (padding)")
            raise ValueError(f"backend='triton' computes Algorithm 1 with the tempered centre inside its kernels and "
                             f"cannot take {what}; use backend='auto' or 'torch', or centre='tempered'")
        backend = "torch"
    if backend == "auto":
        # the Triton kernels take fp32/fp16/bf16; float64 stays on the torch path
        backend = "triton" if keys.is_cuda and keys.dtype != torch.float64 and _triton_available() else "torch"
    if backend == "triton":
        from .triton.launch import validated_triton_scores

        return validated_triton_scores(keys, values, mu, lam, tau=tau, noise=noise, deff_target=deff_target,
                                       out_proj=out_proj)
    with torch.no_grad():  # scores decide a selection: no autograd graph over the cache (the passes refuse one anyway)
        return _torch_jacap_scores(keys, values, mu, lam, tau=tau, noise=noise, deff_target=deff_target,
                                   out_proj=out_proj, alpha=alpha, centre=centre, sensitivity=sensitivity,
                                   kappa_rule=kappa_rule, leverage_rule=leverage_rule, key_mask=key_mask)


def _torch_jacap_scores(keys, values, mu, lam, *, tau, noise, deff_target=None, out_proj=None, alpha=None,
                        centre="tempered", sensitivity="rho2", kappa_rule="on", leverage_rule="A", key_mask=None):
    """The torch path: K read once, V twice, in cache-sized blocks of rows (:mod:`.factor`), float32
    accumulation (float64 for float64 inputs), no copy of the cache and no ``(N, d)`` temporary."""
    cdt = compute_dtype(keys.dtype)
    lead = tuple(keys.shape[:-2])
    N, d, dv = keys.shape[-2], keys.shape[-1], values.shape[-1]
    G = math.prod(lead)
    k3, v3 = keys.reshape(G, N, d), values.reshape(G, N, dv)  # views for any layout sliced along N
    mu3 = torch.broadcast_to(mu, lead + (d,)).reshape(G, d, 1).to(cdt)
    lam3 = torch.broadcast_to(lam, lead + (d,)).reshape(G, d, 1).to(cdt)
    logits, kappa = token_pass(k3, mu3, lam3, cdt, block_rows(G, d, N, keys.device))
    real = None if key_mask is None else torch.broadcast_to(key_mask.to(keys.device), lead + (N,)).reshape(G, N)
    if alpha is None:
        alpha = centre_attention(logits if real is None else logits.masked_fill(~real, float("-inf")), d,
                                 centre=centre, tau=tau, kappa=kappa)
    else:  # a given centre (the observed attention), broadcast over the leading dims like mu
        alpha = torch.broadcast_to(alpha.to(device=keys.device, dtype=cdt), lead + (N,)).reshape(G, N)
        alpha = alpha if real is None else alpha.masked_fill(~real, 0.0)
    rho, kappa, weight = sensitivity_weight(alpha, kappa, d, sensitivity=sensitivity, kappa_mode=kappa_rule)
    if not bool(torch.isfinite(weight).all()):
        diagnose_nonfinite(keys=keys)
    rows = block_rows(G, dv, N, keys.device)
    gram = gram_pass(v3, weight, cdt, rows)  # sum_j w_j v_j v_j^T; non-finite iff V (or w) is
    if not bool(torch.isfinite(gram).all()):
        diagnose_nonfinite(values=values, out_proj=out_proj)
    M, proj = project_gram(gram, out_proj, lead, cdt)
    if not bool(torch.isfinite(M).all()):
        diagnose_nonfinite(values=values, out_proj=out_proj)
    if isinstance(noise, str):  # the effective-dimension rule, on M's eigenvalues (those of sum w u u^T)
        sigma2 = deff_noise(torch.linalg.eigvalsh(M.to(torch.float64)), _target_per_head(deff_target, lead, M))
        sigma2 = sigma2.to(cdt)
    else:
        sigma2 = torch.full((G,), float(noise), dtype=cdt, device=keys.device)
    if leverage_rule == "A":
        A = M / sigma2[:, None, None] + torch.eye(M.shape[-1], dtype=cdt, device=keys.device)
        L = cholesky_with_jitter(A)
        lev = leverage_pass(v3, leverage_map(L, proj).transpose(1, 2), cdt, rows)
    else:  # A := I: |u_i|^2 = |proj v_i|^2 (proj = W, or R of its thin QR: the same norms)
        eye = torch.eye(dv, dtype=cdt, device=keys.device).expand(G, dv, dv)
        lev = leverage_pass(v3, (eye if proj is None else proj).transpose(1, 2), cdt, rows)
    score = (weight / sigma2[:, None]) * lev
    if not bool(torch.isfinite(score).all()):
        raise CholeskyFailure("Algorithm 1 produced non-finite scores from finite inputs: the keys/values overflow "
                              "float32 products; rescale them or raise `noise`")
    shape = lead + (N,)
    out = JacapScores(alpha=alpha, rho=rho, kappa=kappa, weight=weight, leverage=lev, score=score)
    return out.map(lambda t: t.reshape(shape).to(torch.float32))


def _target_per_head(target, lead, like):
    """``deff_target`` (a number or a tensor broadcasting against the leading dims) as ``(G,)``."""
    if isinstance(target, torch.Tensor):
        return torch.broadcast_to(target.to(like.device), lead).reshape(-1)
    return target


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        warnings.warn("CUDA tensors but Triton is not installed: using the torch reference", RuntimeWarning, stacklevel=3)
        return False
    return True
