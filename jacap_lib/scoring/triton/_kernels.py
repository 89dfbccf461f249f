"""The three Triton kernels of Algorithm 1 (undecorated; :mod:`jacap_lib.scoring.triton.launch` jits them).

They are kept as plain Python functions so that the host code can build a compiled version for CUDA
tensors and an interpreted version (``TRITON_INTERPRET``) for CPU tensors from the same source,
whatever the environment said when this module was imported.

Layout shared by all three: keys / values are addressed as ``(B, H, N, d)`` through four strides
(so transposed or sliced caches need no copy); one program handles one ``(b, h)`` pair (axis 0 of
the grid, ``g = b * H + h``) and one contiguous chunk of ``chunk`` tokens (axis 1), walking it in
tiles of ``BLOCK_N`` tokens.  Per-token outputs are float32 ``(G, N)`` buffers, ``G = B * H``.

* :func:`logits_kernel`   reads K once: logit ``z = k . mu / (tau sqrt d)``, ``kappa = sum lam k^2``
  and the chunk's online-softmax state (running max ``m`` and sum ``s = sum exp(z - m)``).
* :func:`gram_kernel`     combines the chunks' softmax states of its head into the global (max, sum)
  (on the device: no host round trip), reads V once: ``alpha, rho, weight`` and the chunk's share of
  the weighted Gram matrix ``sum w v v^T`` (fp32 ``tl.dot`` accumulator; the noise enters later).
* :func:`leverage_kernel` reads V again: ``leverage = |P v|^2`` with ``P = L^{-1} W`` (``A = L L^T``
  factorised once per head by batched torch calls) and ``score = (w / noise) * leverage`` with the
  head's noise read from a device buffer (a fixed number or the noise rule's solution alike).
"""
from __future__ import annotations

import triton.language as tl


def logits_kernel(
    K, sk_b, sk_h, sk_n, sk_d,
    MU, LAM,                      # (G, d) float32, contiguous
    Z, KAPPA,                     # (G, N) float32 out
    PART_M, PART_S,               # (G, n_split) float32 out
    H, N, D, chunk, scale,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    g = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    b = g // H
    h = g % H
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    mu = tl.load(MU + g * D + offs_d, mask=dmask, other=0.0)
    lam = tl.load(LAM + g * D + offs_d, mask=dmask, other=0.0)
    k_base = K + b.to(tl.int64) * sk_b + h.to(tl.int64) * sk_h
    start = split * chunk
    m_run = tl.full([], float("-inf"), tl.float32)
    s_run = tl.full([], 0.0, tl.float32)
    for i in range(0, chunk, BLOCK_N):
        offs_n = start + i + tl.arange(0, BLOCK_N)
        nmask = offs_n < N
        k = tl.load(
            k_base + offs_n[:, None].to(tl.int64) * sk_n + offs_d[None, :] * sk_d,
            mask=nmask[:, None] & dmask[None, :], other=0.0,
        ).to(tl.float32)
        z = tl.sum(k * mu[None, :], axis=1) * scale
        kappa = tl.sum(k * k * lam[None, :], axis=1)
        tl.store(Z + g.to(tl.int64) * N + offs_n, z, mask=nmask)
        tl.store(KAPPA + g.to(tl.int64) * N + offs_n, kappa, mask=nmask)
        z = tl.where(nmask, z, float("-inf"))
        m_new = tl.maximum(m_run, tl.max(z, axis=0))
        # the first tile of every chunk holds a valid token (host guarantees start < N), so m_new is finite
        s_run = s_run * tl.exp(m_run - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m_run = m_new
    tl.store(PART_M + g * n_splits + split, m_run)
    tl.store(PART_S + g * n_splits + split, s_run)


def gram_kernel(
    V, sv_b, sv_h, sv_n, sv_d,
    Z, KAPPA, PART_M, PART_S,     # (G, N), (G, N), (G, n_split), (G, n_split) float32
    ALPHA, RHO, WEIGHT,           # (G, N) float32 out
    GRAM,                         # (G, n_split, D, D) float32 out: this chunk's sum w v v^T
    H, N, D, chunk, inv_d,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    g = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    b = g // H
    h = g % H
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    # the head's global softmax state from the chunks' (max, sum): every program of the head does it
    offs_s = tl.arange(0, BLOCK_S)
    smask = offs_s < n_splits
    part_m = tl.load(PART_M + g * n_splits + offs_s, mask=smask, other=float("-inf"))
    part_s = tl.load(PART_S + g * n_splits + offs_s, mask=smask, other=0.0)
    z_max = tl.max(part_m, axis=0)
    inv_sum = 1.0 / tl.sum(part_s * tl.exp(part_m - z_max), axis=0)
    v_base = V + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h
    row = g.to(tl.int64) * N
    start = split * chunk
    acc = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    for i in range(0, chunk, BLOCK_N):
        offs_n = start + i + tl.arange(0, BLOCK_N)
        nmask = offs_n < N
        z = tl.load(Z + row + offs_n, mask=nmask, other=float("-inf"))
        kappa = tl.load(KAPPA + row + offs_n, mask=nmask, other=0.0)
        alpha = tl.exp(z - z_max) * inv_sum
        rho = alpha * (1.0 - alpha)
        weight = rho * rho * kappa * inv_d
        tl.store(ALPHA + row + offs_n, alpha, mask=nmask)
        tl.store(RHO + row + offs_n, rho, mask=nmask)
        tl.store(WEIGHT + row + offs_n, weight, mask=nmask)
        v = tl.load(
            v_base + offs_n[:, None].to(tl.int64) * sv_n + offs_d[None, :] * sv_d,
            mask=nmask[:, None] & dmask[None, :], other=0.0,
        ).to(tl.float32)
        vw = v * weight[:, None]
        acc = tl.dot(tl.trans(vw), v, acc, input_precision=DOT_PRECISION)
    out = GRAM + (g * n_splits + split).to(tl.int64) * D * D + offs_d[:, None] * D + offs_d[None, :]
    tl.store(out, acc, mask=dmask[:, None] & dmask[None, :])


def leverage_kernel(
    V, sv_b, sv_h, sv_n, sv_d,
    P,                            # (G, M, D) float32 contiguous: P = L^{-1} W  (W = I when u = v)
    WEIGHT,                       # (G, N) float32
    INV_NOISE,                    # (G,) float32: 1 / sigma^2 per head
    LEVERAGE, SCORE,              # (G, N) float32 out
    H, N, D, M, chunk,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    g = tl.program_id(0)
    split = tl.program_id(1)
    inv_noise = tl.load(INV_NOISE + g)
    b = g // H
    h = g % H
    offs_d = tl.arange(0, BLOCK_D)   # index over the value dim d (rows of P^T)
    offs_m = tl.arange(0, BLOCK_D)   # index over the output dim m <= d (columns of P^T)
    dmask = offs_d < D
    # P^T tile (BLOCK_D x BLOCK_D): pt[j, i] = P[i, j]; rows i >= M are zero, so they add nothing to |P v|^2
    pt = tl.load(
        P + g.to(tl.int64) * M * D + offs_m[None, :] * D + offs_d[:, None],
        mask=dmask[:, None] & (offs_m[None, :] < M), other=0.0,
    )
    v_base = V + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h
    row = g.to(tl.int64) * N
    start = split * chunk
    for i in range(0, chunk, BLOCK_N):
        offs_n = start + i + tl.arange(0, BLOCK_N)
        nmask = offs_n < N
        v = tl.load(
            v_base + offs_n[:, None].to(tl.int64) * sv_n + offs_d[None, :] * sv_d,
            mask=nmask[:, None] & dmask[None, :], other=0.0,
        ).to(tl.float32)
        y = tl.dot(v, pt, input_precision=DOT_PRECISION)   # row n: (L^{-1} W v_n)^T
        lev = tl.sum(y * y, axis=1)
        weight = tl.load(WEIGHT + row + offs_n, mask=nmask, other=0.0)
        tl.store(LEVERAGE + row + offs_n, lev, mask=nmask)
        tl.store(SCORE + row + offs_n, weight * inv_noise * lev, mask=nmask)
