r"""Host side of the Triton scoring core: shapes, launches, and the small d x d linear algebra.

Algorithm 1 for ``(..., N, d)`` keys and values in three passes over the cache:

1. :func:`~jacap_lib.scoring.triton._kernels.logits_kernel` reads K: logits, :math:`\kappa`, online softmax
   state per chunk (combined on the host into one max and one sum per head: ``O(G * n_split)``).
2. :func:`~jacap_lib.scoring.triton._kernels.gram_kernel` reads V: :math:`\bar\alpha, \rho, w` and the
   weighted Gram :math:`\sum_j (w_j/\sigma^2) v_j v_j^\top` (chunks summed on the host).
3. torch, per head, ``O(d^3)``: :math:`A = I + W G W^\top`, its Cholesky factor :math:`L`, and
   :math:`P = L^{-1} W` by one triangular solve (``W = I`` when ``u = v``).
4. :func:`~jacap_lib.scoring.triton._kernels.leverage_kernel` reads V again:
   :math:`\ell_i = \lVert P v_i \rVert^2 = u_i^\top A^{-1} u_i` and :math:`r_i = (w_i/\sigma^2)\,\ell_i`.

Traffic: K once, V twice, plus ``6 N`` float32 outputs and ``2 N`` float32 scratch per head.

With an output projection ``W`` of shape ``(d_out, d)``, ``d_out > d``, the problem is reduced to
``d x d`` exactly: with the thin QR factorisation ``W = Q R``, every ``u = W v`` lies in the column
space of ``Q``, where ``A`` acts as ``I + R G R^T``; so ``u^T A^{-1} u = (R v)^T (I + R G R^T)^{-1} (R v)``.
"""
from __future__ import annotations

import math

import torch

from ..contract import CholeskyFailure, JacapScores, cholesky_with_jitter, diagnose_nonfinite, validate_inputs
from ...config import DEFAULTS, check
from ..noise import check_deff_target, deff_noise

__all__ = ["triton_jacap_scores", "plan_launch"]

_KERNELS: tuple | None = None


def interpreter_active() -> bool:
    """True when Triton was imported with ``TRITON_INTERPRET=1`` (its library functions are interpreted)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.standard.sum, InterpretedFunction)


def _kernels(device_type: str):
    """The (logits, gram, leverage) kernels, jitted (or interpreted under ``TRITON_INTERPRET=1``)."""
    global _KERNELS
    if device_type == "cpu" and not interpreter_active():
        raise ValueError(
            "the Triton kernels got CPU tensors, which only the Triton interpreter can run, and Triton was "
            "imported without it: set the environment variable TRITON_INTERPRET=1 before anything imports "
            "triton (kvpress does), or move the tensors to a CUDA device, or use backend='torch'"
        )
    if _KERNELS is None:
        import triton

        from . import _kernels as src

        _KERNELS = tuple(triton.jit(f) for f in (src.logits_kernel, src.gram_kernel, src.leverage_kernel))
    return _KERNELS


def plan_launch(G: int, N: int, d_k: int, d_v: int, device: torch.device, num_splits: int | None = None) -> dict:
    """Block sizes and the split of N into chunks (one program per (head, chunk)).

    On CUDA the number of chunks is chosen so that ``G * n_split`` is about four programs per SM;
    on the CPU (interpreter) one chunk per head keeps the Python overhead low.
    """
    block_dk = max(16, 1 << (d_k - 1).bit_length())
    block_dv = max(16, 1 << (d_v - 1).bit_length())
    block_n = 64 if block_dv <= 128 else 32
    if device.type == "cpu":
        block_n = 512
    n_tiles = -(-N // block_n)
    if num_splits is None:
        if device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            num_splits = max(1, -(-4 * sms // G))
        else:
            num_splits = 1
    num_splits = max(1, min(int(num_splits), n_tiles))
    chunk = -(-n_tiles // num_splits) * block_n
    num_splits = -(-N // chunk)  # every chunk starts at a valid token
    num_warps = 8 if block_dv >= 128 else 4  # the Gram kernel holds a BLOCK_DV^2 fp32 accumulator
    return {"BLOCK_N": block_n, "BLOCK_DK": block_dk, "BLOCK_DV": block_dv, "chunk": chunk, "n_split": num_splits,
            "num_warps": num_warps}


def _as_bhnd(x: torch.Tensor) -> torch.Tensor:
    """View ``(..., N, d)`` as ``(B, H, N, d)`` without copying when the leading dims allow it."""
    if x.dim() == 2:
        return x[None, None]
    if x.dim() == 3:
        return x[None]
    if x.dim() == 4:
        return x
    return x.reshape(-1, x.shape[-3], x.shape[-2], x.shape[-1])


def _check(keys, values, mu, lam, out_proj, dot_precision, deff_target, noise):
    """The contract of :func:`jacap_lib.jacap_scores` (shared tensor checks), plus what the kernels need."""
    validate_inputs(keys, values, mu, lam, out_proj)
    check_deff_target(noise, deff_target)
    if keys.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"`keys`/`values` dtype must be float32/float16/bfloat16 for the Triton kernels, got "
                         f"{keys.dtype}; use backend='torch' for float64")
    if keys.device.type not in ("cuda", "cpu"):
        raise ValueError(f"`keys` must be on a CUDA device (or the CPU, interpreted), got {keys.device}")
    if dot_precision not in ("tf32", "tf32x3", "ieee"):
        raise ValueError(f"`dot_precision` must be 'tf32', 'tf32x3' or 'ieee', got {dot_precision!r}")


@torch.no_grad()
def triton_jacap_scores(
    keys: torch.Tensor,
    values: torch.Tensor,
    mu: torch.Tensor,
    lam: torch.Tensor,
    *,
    tau: float = DEFAULTS.tau,
    noise: float | str = DEFAULTS.noise,
    deff_target: float | torch.Tensor | None = None,
    out_proj: torch.Tensor | None = None,
    dot_precision: str = "tf32",
    num_splits: int | None = None,
):
    r"""Algorithm 1 with the fused Triton kernels; same contract as :func:`jacap_lib.jacap_scores`.

    Parameters
    ----------
    keys, values : (..., N, d) float32/float16/bfloat16 tensors on a CUDA device (or on the CPU,
        where the kernels run in the Triton interpreter: correct but slow, for tests).
        Any strides are accepted for up to four dims.
    mu, lam : (..., d) query mean and diagonal query covariance, broadcast over the leading dims.
    tau, noise : temperature of the centre softmax, channel noise (weights enter as ``w / noise``).
    deff_target : with ``noise="deff"`` (the effective-dimension rule): the kernels build the Gram with
        :math:`\sigma^2 = 1`, the host solves for each head's :math:`\sigma^2` on the ``d x d`` Gram's
        eigenvalues (:func:`jacap_lib.scoring.noise.deff_noise`), forms ``A = I + G / sigma^2``, and divides
        the leverage pass's ``w * leverage`` by :math:`\sigma^2`.
    out_proj : optional (d_out, d) or (..., d_out, d); ``u = out_proj @ v``.
    dot_precision : ``tl.dot`` input precision on the GPU: ``"tf32"`` (default, tensor cores, about
        1e-3 relative error in the Gram and the leverages), ``"tf32x3"`` or ``"ieee"`` (fp32 exact, slower).
        Accumulation is always float32; the interpreter ignores it.
    num_splits : chunks of N per head (default: about four programs per SM on CUDA, 1 on the CPU).

    Returns
    -------
    :class:`jacap_lib.scoring.JacapScores` with float32 ``(..., N)`` fields.
    """
    return validated_triton_scores(keys, values, mu, lam, tau=check("tau", tau), noise=check("noise", noise),
                                   deff_target=deff_target, out_proj=out_proj, dot_precision=dot_precision,
                                   num_splits=num_splits)


@torch.no_grad()
def validated_triton_scores(keys, values, mu, lam, *, tau, noise, deff_target=None, out_proj=None,
                            dot_precision="tf32", num_splits=None):
    """:func:`triton_jacap_scores` for ``tau`` and ``noise`` already validated where they entered."""
    _check(keys, values, mu, lam, out_proj, dot_precision, deff_target, noise)
    rule = isinstance(noise, str)  # "deff": sigma^2 per head, solved on the host
    device = keys.device
    lead = tuple(keys.shape[:-2])
    N, d, dv = keys.shape[-2], keys.shape[-1], values.shape[-1]
    k4, v4 = _as_bhnd(keys), _as_bhnd(values)
    B, H = k4.shape[0], k4.shape[1]
    G = B * H
    mu_g = torch.broadcast_to(mu, lead + (d,)).reshape(G, d).to(torch.float32).contiguous()
    lam_g = torch.broadcast_to(lam, lead + (d,)).reshape(G, d).to(torch.float32).contiguous()
    plan = plan_launch(G, N, d, dv, device, num_splits)
    BN, chunk, S = plan["BLOCK_N"], plan["chunk"], plan["n_split"]
    logits_k, gram_k, leverage_k = _kernels(device.type)
    f32 = dict(dtype=torch.float32, device=device)
    z, kappa = torch.empty(G, N, **f32), torch.empty(G, N, **f32)
    part_m, part_s = torch.empty(G, S, **f32), torch.empty(G, S, **f32)
    alpha, rho, weight = (torch.empty(G, N, **f32) for _ in range(3))
    lev, score = torch.empty(G, N, **f32), torch.empty(G, N, **f32)
    gram_parts = torch.empty(G, S, dv, dv, **f32)
    scale = 1.0 / (float(tau) * math.sqrt(d))
    inv_noise = 1.0 if rule else 1.0 / float(noise)
    grid = (G, S)
    # pass 1: K -> logits, kappa, per-chunk (max, sum)
    logits_k[grid](k4, *k4.stride(), mu_g, lam_g, z, kappa, part_m, part_s,
                   H, N, d, chunk, scale, BLOCK_N=BN, BLOCK_D=plan["BLOCK_DK"])
    z_max = part_m.amax(dim=1)
    z_sum = (part_s * torch.exp(part_m - z_max[:, None])).sum(dim=1)
    # pass 2: V -> alpha, rho, weight, chunk Grams
    gram_k[grid](v4, *v4.stride(), z, kappa, z_max, z_sum, alpha, rho, weight, gram_parts,
                 H, N, dv, chunk, 1.0 / d, inv_noise,
                 BLOCK_N=BN, BLOCK_D=plan["BLOCK_DV"], DOT_PRECISION=dot_precision, num_warps=plan["num_warps"])
    gram = gram_parts.sum(dim=1)  # (G, d_v, d_v) = sum_j (w_j/noise) v_j v_j^T
    if not (bool(torch.isfinite(weight).all()) and bool(torch.isfinite(gram).all())):
        diagnose_nonfinite(keys=keys, values=values, out_proj=out_proj)  # names the bad input (ValueError)
    # d x d algebra per head: A = I + W G W^T = L L^T, P = L^{-1} W (W = I for u = v)
    if out_proj is None:
        proj = None
        A = gram
    else:
        d_out = out_proj.shape[-2]
        proj = torch.broadcast_to(out_proj, lead + (d_out, dv)).reshape(G, d_out, dv).to(torch.float32)
        if d_out > dv:  # same leverages in d_v dims: u = Q (R v), A = I + R G R^T on range(Q)
            proj = torch.linalg.qr(proj, mode="r").R
        A = proj @ gram @ proj.transpose(-1, -2)
    A = 0.5 * (A + A.transpose(-1, -2))
    m = A.shape[-1]
    if rule:  # A's Gram has the same non-zero eigenvalues as sum_j w_j u_j u_j^T
        target = deff_target
        if isinstance(target, torch.Tensor):
            target = torch.broadcast_to(target.to(device), lead).reshape(G)
        sigma2 = deff_noise(torch.linalg.eigvalsh(A.double()), target).to(torch.float32)  # (G,)
        A = A / sigma2[:, None, None]
    A = A + torch.eye(m, **f32)
    L = cholesky_with_jitter(A)
    rhs = torch.eye(m, **f32).expand(G, m, m) if proj is None else proj
    P = torch.linalg.solve_triangular(L, rhs, upper=False).contiguous()  # (G, m, d_v)
    # pass 3: V -> leverage = |P v|^2 and score
    leverage_k[grid](v4, *v4.stride(), P, weight, lev, score,
                     H, N, dv, m, chunk, inv_noise,
                     BLOCK_N=BN, BLOCK_D=plan["BLOCK_DV"], DOT_PRECISION=dot_precision, num_warps=plan["num_warps"])
    if rule:
        score = score / sigma2[:, None]
    if not bool(torch.isfinite(score).all()):
        diagnose_nonfinite(keys=keys, values=values, out_proj=out_proj)
        raise CholeskyFailure("the Triton path produced non-finite scores from finite inputs")
    shape = lead + (N,)
    return JacapScores(alpha=alpha.view(shape), rho=rho.view(shape), kappa=kappa.view(shape),
                       weight=weight.view(shape), leverage=lev.view(shape), score=score.view(shape))
