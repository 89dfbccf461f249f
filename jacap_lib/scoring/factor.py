r"""The pieces of Algorithm 1 shared by the torch path (:mod:`.core`) and the Triton host code
(:mod:`.triton.launch`): the blocked passes over the cache and the small ``d x d`` algebra.

Both paths compute the leverage the same way. The weighted Gram of the *values*,
:math:`G_v = \sum_j w_j v_j v_j^\top` (``d x d``), is reduced to the matrix the output directions see,
:math:`A = I + W G_v W^\top/\sigma^2` (``W = I`` when ``u = v``; with ``d_out > d`` the thin QR
factorisation ``W = Q R`` gives the same leverages in ``d`` dimensions, see :func:`project_gram`),
factorised once, :math:`A = L L^\top`, and turned into one ``m x d`` matrix :math:`P = L^{-1} W`;
then :math:`\ell_i = u_i^\top A^{-1} u_i = \lVert P v_i\rVert^2` for every token is one GEMM.

On the CPU the passes over the cache walk it in blocks of rows small enough to stay in cache
(:func:`block_rows`), so the only full-size reads are of K once and V twice, no ``(N, d)``
temporary is ever allocated, and fp16/bf16 caches are converted block by block.

The sync-free variants (:func:`cholesky_jitter_ondevice`, :func:`deff_noise_ondevice`) decide on
the device what the torch path decides on the host (which jitter a head needs, the bisection of the
noise rule), so a CUDA scoring call never waits for the GPU.

The three passes over the cache write into preallocated buffers (``out=``), which autograd refuses; they
run under ``torch.no_grad()`` themselves, so every caller (Algorithm 1, :func:`~jacap_lib.scoring.leverage`,
the rank-one variant, the diagnostics) can hand them tensors that require grad (a model run outside
``torch.no_grad()``): the cache is read, not differentiated, and their results carry no gradient.
"""
from __future__ import annotations

import math

import torch

from .contract import _JITTERS

__all__ = ["block_rows", "token_pass", "gram_pass", "leverage_pass", "project_gram", "leverage_map",
           "cholesky_jitter_ondevice", "deff_noise_ondevice"]

# bytes of one block of rows across all heads: on the CPU well inside an L2 cache; on a GPU large
# enough that a call is a handful of launches (the blocks only bound the temporaries there)
_BLOCK_BYTES = 1 << 19
_BLOCK_BYTES_GPU = 1 << 28


def block_rows(G: int, d: int, N: int, device: torch.device | str = "cpu") -> int:
    """Rows per block so that a ``(G, rows, d)`` float32 block is about 512 KiB on the CPU (256 MiB on a
    GPU); at least 128, at most N."""
    budget = _BLOCK_BYTES if torch.device(device).type == "cpu" else _BLOCK_BYTES_GPU
    rows = max(128, budget // (4 * max(1, G) * max(1, d)))
    return min(N, 1 << (rows.bit_length() - 1))


def _block(x3: torch.Tensor, s: int, e: int, cdt: torch.dtype, buf: torch.Tensor | None) -> torch.Tensor:
    """Rows ``s:e`` of ``x3 (G, N, d)`` in the compute dtype (a view when the dtype already matches)."""
    blk = x3[:, s:e]
    if blk.dtype == cdt:
        return blk
    return buf[:, : e - s].copy_(blk)


@torch.no_grad()  # out= buffers: see the module docstring
def token_pass(k3: torch.Tensor, mu3: torch.Tensor, lam3: torch.Tensor, cdt: torch.dtype, rows: int):
    """One read of K: ``logits = k . mu`` and ``kappa = sum lam k^2`` for ``k3 (G, N, d)``, ``mu3, lam3
    (G, d, 1)`` in ``cdt``. Returns two ``(G, N)`` tensors.

    Per block: the logits as a row-vector product ``mu^T K^T`` (BLAS reads the block once, and this
    orientation is several times faster than ``K mu`` on the CPU), then ``kappa = |k * sqrt(lam)|^2``
    from the same block while it is in cache (``lam >= 0`` is checked at entry)."""
    G, N, d = k3.shape
    logits = torch.empty(G, N, dtype=cdt, device=k3.device)
    kappa = torch.empty(G, N, dtype=cdt, device=k3.device)
    mu_row, lam_row = mu3.transpose(1, 2), lam3.transpose(1, 2).sqrt()  # (G, 1, d)
    conv = None if k3.dtype == cdt else torch.empty(G, rows, d, dtype=cdt, device=k3.device)
    scaled = torch.empty(G, min(rows, N), d, dtype=cdt, device=k3.device)
    row = torch.empty(G, 1, min(rows, N), dtype=cdt, device=k3.device)
    for s in range(0, N, rows):
        e = min(N, s + rows)
        n = e - s
        k = _block(k3, s, e, cdt, conv)
        torch.bmm(mu_row, k.transpose(1, 2), out=row[:, :, :n])
        logits[:, s:e] = row[:, 0, :n]
        x = torch.mul(k, lam_row, out=scaled[:, :n])
        torch.linalg.vector_norm(x, dim=-1, out=kappa[:, s:e])
    return logits, kappa.square_()


@torch.no_grad()  # out= buffers: see the module docstring
def gram_pass(v3: torch.Tensor, weight: torch.Tensor, cdt: torch.dtype, rows: int) -> torch.Tensor:
    r"""One read of V: :math:`\sum_j w_j v_j v_j^\top` for ``v3 (G, N, d)``, ``weight (G, N)``: ``(G, d, d)``,
    symmetrised."""
    G, N, d = v3.shape
    gram = torch.zeros(G, d, d, dtype=cdt, device=v3.device)
    conv = None if v3.dtype == cdt else torch.empty(G, rows, d, dtype=cdt, device=v3.device)
    scaled = torch.empty(G, min(rows, N), d, dtype=cdt, device=v3.device)
    for s in range(0, N, rows):
        e = min(N, s + rows)
        v = _block(v3, s, e, cdt, conv)
        x = torch.mul(v, weight[:, s:e, None], out=scaled[:, : e - s])
        gram.baddbmm_(x.transpose(1, 2), v)
    return 0.5 * (gram + gram.transpose(1, 2))


@torch.no_grad()  # out= buffers: see the module docstring
def leverage_pass(v3: torch.Tensor, Pt: torch.Tensor, cdt: torch.dtype, rows: int) -> torch.Tensor:
    r"""One more read of V: :math:`\ell_i = \lVert P v_i\rVert^2` for ``v3 (G, N, d)`` and ``Pt = P^T (G, d, m)``."""
    G, N, d = v3.shape
    m = Pt.shape[-1]
    lev = torch.empty(G, N, dtype=cdt, device=v3.device)
    conv = None if v3.dtype == cdt else torch.empty(G, rows, d, dtype=cdt, device=v3.device)
    y = torch.empty(G, min(rows, N), m, dtype=cdt, device=v3.device)
    for s in range(0, N, rows):
        e = min(N, s + rows)
        v = _block(v3, s, e, cdt, conv)
        yb = torch.bmm(v, Pt, out=y[:, : e - s])
        torch.linalg.vector_norm(yb, dim=-1, out=lev[:, s:e])  # one pass over the block, no write
    return lev.square_()


def project_gram(gram: torch.Tensor, out_proj: torch.Tensor | None, lead: tuple, dtype: torch.dtype):
    r"""``(M, proj)``: the Gram the output directions see, :math:`M = W G_v W^\top` (symmetrised), and the
    ``(G, m, d)`` map ``proj`` from values to those directions (``None`` for ``u = v``, where ``M = G_v``).

    With ``d_out > d`` every ``u = W v`` lies in the column space of ``Q`` (thin QR, ``W = Q R``), where
    :math:`A = I + W G_v W^\top` acts as :math:`I + R G_v R^\top`; so
    :math:`u^\top A^{-1} u = (R v)^\top (I + R G_v R^\top)^{-1} (R v)` and ``proj = R`` (``d x d``).
    ``M`` has the same non-zero eigenvalues as :math:`\sum_j w_j u_j u_j^\top` either way.
    """
    if out_proj is None:
        return gram, None
    G, dv = gram.shape[0], gram.shape[-1]
    d_out = out_proj.shape[-2]
    proj = torch.broadcast_to(out_proj, tuple(lead) + (d_out, dv)).reshape(G, d_out, dv).to(dtype)
    if d_out > dv:
        proj = torch.linalg.qr(proj, mode="r").R
    M = proj @ gram @ proj.transpose(-1, -2)
    return 0.5 * (M + M.transpose(-1, -2)), proj


def leverage_map(L: torch.Tensor, proj: torch.Tensor | None) -> torch.Tensor:
    """``P = L^{-1} W`` (``W = I`` when ``proj`` is None): ``(G, m, d)``, contiguous, so that
    ``||P v||^2 = u^T A^{-1} u``. One ``O(d^3)`` triangular solve per head."""
    m = L.shape[-1]
    rhs = proj if proj is not None else torch.eye(m, dtype=L.dtype, device=L.device).expand(L.shape)
    return torch.linalg.solve_triangular(L, rhs, upper=False).contiguous()


def cholesky_jitter_ondevice(A: torch.Tensor):
    """Lower Cholesky factors of a ``(G, m, m)`` batch of SPD matrices without a host synchronisation.

    Every jitter of :func:`jacap_lib.scoring.contract.cholesky_with_jitter` (0, 1e-6, 1e-4, 1e-2 of the
    mean diagonal) is tried at once (``torch.linalg.cholesky_ex``, one batched call, no error check) and
    each head takes the first factor that succeeded and is finite. Returns ``(L, level)``: ``level (G,)``
    int64 is the index of the jitter used, ``len(_JITTERS)`` where none worked (the caller reports it
    once it reads the result).
    """
    m = A.shape[-1]
    eye = torch.eye(m, dtype=A.dtype, device=A.device)
    scale = A.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1.0)  # (G,)
    step = scale[:, None, None] * eye  # (G, m, m); python-scalar jitters: no host-to-device copy
    tries = torch.stack([A + j * step if j else A for j in _JITTERS])  # (J, G, m, m)
    L, info = torch.linalg.cholesky_ex(tries)
    ok = (info == 0) & torch.isfinite(L).flatten(-2).all(-1)  # (J, G)
    J = len(_JITTERS)
    order = torch.arange(J, device=A.device)[:, None].expand_as(ok)
    level = torch.where(ok, order, torch.full_like(order, J)).amin(0)  # first jitter that worked, J if none
    pick = level.clamp_max(J - 1)
    L = torch.gather(L, 0, pick[None, :, None, None].expand(1, *L.shape[1:]))[0]
    return L, level


def deff_noise_ondevice(M: torch.Tensor, target: torch.Tensor, *, rounds: int = 7, grid: int = 16) -> torch.Tensor:
    r"""The noise rule's :math:`\sigma^2` per head, :math:`d_\mathrm{eff}(\sigma^2) = \mathrm{tr}((\sigma^2 I + M)^{-1} M)
    = ` ``target``, without eigenvalues and without a host synchronisation.

    ``M (G, m, m)`` is the (symmetric, PSD) weighted Gram, ``target (G,)`` > 0. The root is bracketed on
    :math:`\log\sigma^2` in :math:`[10^{-30}\,\mathrm{tr} M, \mathrm{tr} M/\text{target}]` (as
    :func:`jacap_lib.scoring.noise.deff_noise` does with :math:`\lambda_\max`) and narrowed by a
    ``grid``-ary search: each round evaluates :math:`d_\mathrm{eff} = m - \sigma^2\,\lVert L^{-1}\rVert_F^2`
    at ``grid`` points at once (one batched float64 Cholesky, :math:`\sigma^2 I + M = L L^\top`; a failed
    factorisation means :math:`\sigma^2` is below the rounding noise of ``M``, i.e. on the low side) and keeps
    the cell that holds the root, ``rounds`` rounds (``grid ** rounds`` cells, 2^28 by default: a
    relative precision of about 1e-7 in :math:`\sigma^2`). A target above the Gram's numerical rank
    ``p`` is lowered to ``0.999 p`` with ``p`` the rounded :math:`d_\mathrm{eff}(10^{-12}\,\mathrm{tr} M / m)`
    (the eigenvalue version counts the eigenvalues above :math:`10^{-12}\lambda_\max`); a zero Gram gets
    :math:`\sigma^2 = 1`. Returns ``(G,)`` in float64.
    """
    M = M.to(torch.float64)
    G, m = M.shape[0], M.shape[-1]
    eye = torch.eye(m, dtype=torch.float64, device=M.device)
    tr = M.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(0)  # (G,)
    target = target.to(torch.float64)

    def deff(sigma2):  # sigma2 (K, G) -> (K, G); +inf where the factorisation fails
        L, info = torch.linalg.cholesky_ex(M.unsqueeze(0) + sigma2[..., None, None] * eye)
        Linv = torch.linalg.solve_triangular(L, eye.expand(L.shape), upper=False)
        d = m - sigma2 * Linv.square().sum((-2, -1))
        return torch.where((info == 0) & torch.isfinite(d), d, torch.full_like(d, math.inf))

    # each eigenvalue far above (below) 1e-12 tr/m counts ~1 (~0) there: rounding gives the numerical rank
    rank = deff((tr.clamp_min(1e-300) * 1e-12 / m)[None])[0].clamp(0, m).round()
    rank = torch.where(torch.isfinite(rank), rank, torch.full_like(rank, float(m)))
    target = torch.minimum(target, (0.999 * rank).clamp_min(1e-12))
    hi = (tr.clamp_min(1e-300) / target).log()
    lo = (tr * 1e-30).clamp_min(1e-300).log()
    index = torch.arange(1, grid, device=M.device)[:, None]  # interior points 1 .. grid - 1
    steps = index.to(torch.float64) / grid
    for _ in range(rounds):
        x = lo[None] + steps * (hi - lo)[None]  # (grid - 1, G)
        above = deff(x.exp()) > target[None]  # noise below the root there
        # d_eff falls with sigma^2, so the root lies right of the last point above the target; counting
        # from the right ignores sigma^2 so small that M's rounding noise makes the factorisation garbage
        n_above = (above * index).amax(0)
        width = (hi - lo) / grid
        lo, hi = lo + n_above * width, lo + (n_above + 1) * width
    out = (0.5 * (lo + hi)).exp()
    return torch.where(tr > 0, out, torch.ones_like(out))
