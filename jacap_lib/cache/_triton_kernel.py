"""The ragged-decode kernel, undecorated (:mod:`jacap_lib.cache.triton` jits it, compiled or interpreted)."""
from __future__ import annotations

import triton.language as tl


def ragged_decode_kernel(Q, K, V, OFF, O, LSE, scale, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid = tl.program_id(0)
    g = pid // G
    start = tl.load(OFF + g)
    end = tl.load(OFF + g + 1)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + pid * D + d, mask=d < D, other=0.0).to(tl.float32)
    m = tl.zeros([], dtype=tl.float32) - float("inf")
    ell = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        valid = n < end
        k = tl.load(K + n[:, None] * D + d[None, :], mask=valid[:, None] & (d[None, :] < D), other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        ell = ell * alpha + tl.sum(p, axis=0)
        v = tl.load(V + n[:, None] * DV + dv[None, :], mask=valid[:, None] & (dv[None, :] < DV), other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m = m_new
    has = ell > 0
    out = acc / tl.where(has, ell, 1.0)
    tl.store(O + pid * DV + dv, out, mask=dv < DV)
    tl.store(LSE + pid, tl.where(has, m + tl.log(tl.where(has, ell, 1.0)), float("-inf")))
