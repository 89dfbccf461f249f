r"""Host side of the Triton scoring core: shapes, launches, and the small d x d linear algebra.

Algorithm 1 for ``(..., N, d)`` keys and values in three passes over the cache:

1. :func:`~jacap_lib.scoring.triton._kernels.logits_kernel` reads K: logits, :math:`\kappa`, online softmax
   state per chunk.
2. :func:`~jacap_lib.scoring.triton._kernels.gram_kernel` combines the chunks' softmax states of its head,
   reads V: :math:`\bar\alpha, \rho, w` and the chunk's share of :math:`\sum_j w_j v_j v_j^\top`.
3. torch, batched over all heads at once, ``O(d^3)``: the chunks' Grams summed, :math:`M = W G W^\top`,
   the noise (a number, or the noise rule solved on the device: :func:`~jacap_lib.scoring.factor.deff_noise_ondevice`),
   :math:`A = I + M/\sigma^2 = LL^\top` with every jitter tried in one batched ``cholesky_ex`` and chosen
   per head on the device (:func:`~jacap_lib.scoring.factor.cholesky_jitter_ondevice`), and
   :math:`P = L^{-1} W` by one triangular solve (``W = I`` when ``u = v``).
4. :func:`~jacap_lib.scoring.triton._kernels.leverage_kernel` reads V again:
   :math:`\ell_i = \lVert P v_i \rVert^2 = u_i^\top A^{-1} u_i` and :math:`r_i = (w_i/\sigma^2)\,\ell_i`.

Traffic: K once, V twice, plus ``6 N`` float32 outputs and ``2 N`` float32 scratch per head.

No step waits for the GPU: nothing is copied to the host and no decision is taken on the host, so a
call only enqueues work (``check=False`` is fully asynchronous; with the default ``check=True`` the
call reads one small status tensor at its very end, after everything is enqueued, to raise the
contract's errors and the jitter warning).

With an output projection ``W`` of shape ``(d_out, d)``, ``d_out > d``, the problem is reduced to
``d x d`` exactly: with the thin QR factorisation ``W = Q R``, every ``u = W v`` lies in the column
space of ``Q``, where ``A`` acts as ``I + R G R^T``; so ``u^T A^{-1} u = (R v)^T (I + R G R^T)^{-1} (R v)``.
"""
from __future__ import annotations

import math

import torch

import warnings

from ..contract import _JITTERS, CholeskyFailure, JacapScores, check_statistics, diagnose_nonfinite, validate_inputs
from ...config import DEFAULTS, check as check_option
from ..factor import cholesky_jitter_ondevice, deff_noise_ondevice, leverage_map, project_gram
from ..noise import check_deff_target

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
    # shapes, dtypes and numbers only: the values of mu / lam / out_proj / a deff_target tensor are checked
    # on the device and reported at the end of the call (no synchronisation here)
    validate_inputs(keys, values, mu, lam, out_proj, values_now=False)
    check_deff_target(noise, deff_target, values_now=False)
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
    check: bool = True,
):
    r"""Algorithm 1 with the fused Triton kernels; same contract as :func:`jacap_lib.jacap_scores`.

    Parameters
    ----------
    keys, values : (..., N, d) float32/float16/bfloat16 tensors on a CUDA device (or on the CPU,
        where the kernels run in the Triton interpreter: correct but slow, for tests).
        Any strides are accepted for up to four dims.
    mu, lam : (..., d) query mean and diagonal query covariance, broadcast over the leading dims.
    tau, noise : temperature of the centre softmax, channel noise (weights enter as ``w / noise``).
    deff_target : with ``noise="deff"`` (the effective-dimension rule): each head's :math:`\sigma^2` is
        solved on the device from the ``d x d`` Gram (:func:`jacap_lib.scoring.factor.deff_noise_ondevice`,
        a batched float64 search with a fixed number of rounds; no eigenvalues, no host round trip).
    out_proj : optional (d_out, d) or (..., d_out, d); ``u = out_proj @ v``.
    dot_precision : ``tl.dot`` input precision on the GPU: ``"tf32"`` (default, tensor cores, about
        1e-3 relative error in the Gram and the leverages), ``"tf32x3"`` or ``"ieee"`` (fp32 exact, slower).
        Accumulation is always float32; the interpreter ignores it.
    num_splits : chunks of N per head (default: about four programs per SM on CUDA, 1 on the CPU).
    check : True (default): after all the work is enqueued, read one small status tensor (the call's
        only synchronisation) and raise what the torch path raises — ValueError naming a non-finite or
        negative input, :class:`~jacap_lib.scoring.CholeskyFailure`, the jitter RuntimeWarning. False:
        never synchronise (for CUDA graphs and pipelined layers); bad inputs then show as NaN scores.

    Returns
    -------
    :class:`jacap_lib.scoring.JacapScores` with float32 ``(..., N)`` fields.
    """
    return validated_triton_scores(keys, values, mu, lam, tau=check_option("tau", tau),
                                   noise=check_option("noise", noise), deff_target=deff_target, out_proj=out_proj, dot_precision=dot_precision,
                                   num_splits=num_splits, check=check)


@torch.no_grad()
def validated_triton_scores(keys, values, mu, lam, *, tau, noise, deff_target=None, out_proj=None,
                            dot_precision="tf32", num_splits=None, check=True):
    """:func:`triton_jacap_scores` for ``tau`` and ``noise`` already validated where they entered."""
    _check(keys, values, mu, lam, out_proj, dot_precision, deff_target, noise)
    rule = isinstance(noise, str)  # "deff": sigma^2 per head, solved on the device
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
    grid = (G, S)
    # pass 1: K -> logits, kappa, per-chunk (max, sum)
    logits_k[grid](k4, *k4.stride(), mu_g, lam_g, z, kappa, part_m, part_s,
                   H, N, d, chunk, scale, BLOCK_N=BN, BLOCK_D=plan["BLOCK_DK"])
    # pass 2: the head's softmax state from the chunks' states, then V -> alpha, rho, weight, chunk Grams
    gram_k[grid](v4, *v4.stride(), z, kappa, part_m, part_s, alpha, rho, weight, gram_parts,
                 H, N, dv, chunk, 1.0 / d,
                 BLOCK_N=BN, BLOCK_D=plan["BLOCK_DV"], BLOCK_S=max(16, 1 << (S - 1).bit_length()),
                 DOT_PRECISION=dot_precision, num_warps=plan["num_warps"])
    gram = gram_parts.sum(dim=1)  # (G, d_v, d_v) = sum_j w_j v_j v_j^T
    # d x d algebra for all heads at once, on the device: M = W G W^T, sigma^2, A = I + M / sigma^2 = L L^T
    M, proj = project_gram(0.5 * (gram + gram.transpose(-1, -2)), out_proj, lead, torch.float32)
    m = M.shape[-1]
    if rule:
        target = deff_target
        if isinstance(target, torch.Tensor):
            target = torch.broadcast_to(target.to(device=device, dtype=torch.float64), lead).reshape(G)
        else:
            target = torch.full((G,), float(target), dtype=torch.float64, device=device)
        sigma2 = deff_noise_ondevice(M, target).to(torch.float32)  # (G,)
    else:
        sigma2 = torch.full((G,), float(noise), **f32)
    A = M / sigma2[:, None, None] + torch.eye(m, **f32)
    L, level = cholesky_jitter_ondevice(A)
    P = leverage_map(L, proj)  # (G, m, d_v) = L^{-1} W
    # pass 3: V -> leverage = |P v|^2 and score = w / sigma^2 * leverage
    leverage_k[grid](v4, *v4.stride(), P, weight, 1.0 / sigma2, lev, score,
                     H, N, dv, m, chunk,
                     BLOCK_N=BN, BLOCK_D=plan["BLOCK_DV"], DOT_PRECISION=dot_precision, num_warps=plan["num_warps"])
    shape = lead + (N,)
    out = JacapScores(alpha=alpha.view(shape), rho=rho.view(shape), kappa=kappa.view(shape),
                      weight=weight.view(shape), leverage=lev.view(shape), score=score.view(shape))
    if check:
        _report(keys, values, mu, lam, out_proj, deff_target if rule else None, lam_g, level, score)
    return out


def _report(keys, values, mu, lam, out_proj, deff_target, lam_g, level, score):
    """The contract's errors and warning from one status read (the call's only synchronisation)."""
    flags = [(lam_g < 0).any(), ~torch.isfinite(score).all(), level.amax()]
    if isinstance(deff_target, torch.Tensor):
        flags.append(~(torch.isfinite(deff_target) & (deff_target > 0)).all())
    status = torch.stack([f.to(torch.int64) for f in flags]).tolist()
    negative_lam, nonfinite, jitter = status[:3]
    if len(status) > 3 and status[3]:
        raise ValueError(f"`deff_target` must be finite and > 0, got {deff_target}")
    if nonfinite or negative_lam:
        check_statistics(mu, lam)  # names mu / lam (NaN, Inf, lam < 0)
        diagnose_nonfinite(keys=keys, values=values, out_proj=out_proj)  # names the bad input (ValueError)
    if jitter >= len(_JITTERS):
        raise CholeskyFailure(
            "Cholesky factorisation of A = I + sum_j (w_j/noise) u_j u_j^T failed even with a relative jitter of "
            f"{_JITTERS[-1]:g}; the keys/values are probably wildly scaled — check for overflow, or raise `noise`")
    if nonfinite:
        raise CholeskyFailure("the Triton path produced non-finite scores from finite inputs")
    if jitter:
        warnings.warn(f"Cholesky of A needed a relative jitter of {_JITTERS[jitter]:g}", RuntimeWarning, stacklevel=3)
