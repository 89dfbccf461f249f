r"""Attention over a ragged cache, registered in ``transformers``' ``AttentionInterface``.

Query head :math:`j` of KV head :math:`h` (GQA: :math:`G` query heads per KV head) attends to the kept prompt
entries of :math:`h` (its own number :math:`n_h`, packed) and to the tokens appended since (the tail, causal
among the new ones):

.. math:: o = \frac{\sum_{i \in C_h} e^{s_i} v_i + \sum_{t \le \text{now}} e^{s_t} v_t}
                   {\sum_{i \in C_h} e^{s_i} + \sum_{t \le \text{now}} e^{s_t}},\qquad s = q^\top k / \sqrt d .

Both sums are computed apart as (max, sum, weighted values) and merged, the online-softmax rule, so no key is
copied into a dense tensor. On the CPU the prompt part runs per (batch, KV head) in torch; on a CUDA tensor with
one query token it runs the Triton ragged-decode kernel (:mod:`jacap_lib.cache.triton`).

:func:`use_ragged_attention` switches a model to the registered name (``"jacap_ragged"``; ``"jacap_ragged_eager"``
beside an eager model), whose function hands every dense layer's call to the model's own sdpa or eager attention
with the same mask, so a model switched to it computes exactly what it did on a dense cache.
"""
from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .ragged import RaggedKV

__all__ = ["RAGGED_ATTENTION", "ragged_attention", "ragged_attention_eager", "use_ragged_attention",
           "ragged_attention_torch", "merge_partials", "segment_partials"]

#: the registered name per implementation the model ran before (the dense layers' fallback)
RAGGED_ATTENTION = {"sdpa": "jacap_ragged", "eager": "jacap_ragged_eager"}


def segment_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, allowed=None):
    """Softmax partials of queries ``q (M, d)`` over keys/values ``(n, d)``: ``(max (M,), sum (M,), unnormalised
    output (M, d))`` in ``q``'s dtype (float32 or wider); ``allowed (M, n)`` bool masks keys out. No key: max
    ``-inf``, sum and output 0."""
    k, v = k.to(q.dtype), v.to(q.dtype)
    if k.shape[0] == 0:
        return (q.new_full(q.shape[:1], float("-inf")), q.new_zeros(q.shape[:1]), q.new_zeros(q.shape[0], v.shape[-1]))
    s = (q @ k.T) * scale
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(-1)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)).unsqueeze(-1))
    return m, p.sum(-1), p @ v


def merge_partials(parts) -> torch.Tensor:
    """``sum_i e^{m_i - m} o_i / sum_i e^{m_i - m} l_i`` over partials ``(m, l, o)`` of the same queries (a query
    with no visible key at all gets 0)."""
    m = torch.stack([p[0] for p in parts]).amax(0)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    num = sum(torch.exp(p[0] - m).unsqueeze(-1) * p[2] for p in parts)
    den = sum(torch.exp(p[0] - m) * p[1] for p in parts)
    return num / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)


def _allowed(attention_mask, columns) -> torch.Tensor | None:
    """The ``(B, q, len(columns))`` bool visibility of ``columns`` in a transformers 4D mask (bool: True attends;
    float: 0 attends), or ``None`` without a mask."""
    if attention_mask is None:
        return None
    m = attention_mask[:, 0][..., columns] if attention_mask.ndim == 4 else attention_mask[..., columns]
    return m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2


def ragged_attention_torch(query: torch.Tensor, key: RaggedKV, value: RaggedKV, scale: float, attention_mask=None,
                           decode_kernel=None) -> torch.Tensor:
    """Attention of ``query (B, H_q, q, d)`` over a ragged layer; ``(B, H_q, q, d_v)``.

    The tail (the ``q`` new tokens are its last ones) is causal: new token ``i`` sees tail entries ``<= t - q + i``.
    ``attention_mask`` (transformers' 4D mask sized ``n_prompt + t``, e.g. padding) also masks the packed entries
    at their original positions. ``decode_kernel(q (B H_q, d), packed_k, packed_v, offsets, scale) -> (out, lse)``
    replaces the per-head prompt part (the Triton kernel, for one query token and no mask). Computed in float32
    (float64 for a float64 query).
    """
    B, Hq, q_len, d = query.shape
    H, t = key.heads, int(key.tail.shape[2])
    if Hq % H:
        raise ValueError(f"query heads ({Hq}) must be a multiple of the cache's KV heads ({H})")
    G = Hq // H
    n_total = key.n_prompt + t
    if attention_mask is not None and attention_mask.shape[-1] != n_total:
        if B > 1:
            raise ValueError(f"the attention mask covers {attention_mask.shape[-1]} keys but the ragged layer holds "
                             f"{n_total} positions: a padded batch needs one length for every layer")
        attention_mask = None  # batch 1: the mask is only the causal rule, applied below
    acc = torch.promote_types(query.dtype, torch.float32)
    qf = query.to(acc).reshape(B, H, G * q_len, d)  # rows (g, i) of KV head h
    # tail: dense over heads, causal among the new tokens
    tail_k, tail_v = key.tail.to(acc), value.tail.to(acc)
    s_t = torch.einsum("bhmd,bhtd->bhmt", qf, tail_k) * scale
    causal = torch.arange(t, device=query.device)[None, :] <= (t - q_len + torch.arange(q_len, device=query.device))[:, None]
    allowed_t = causal.expand(B, q_len, t)
    mask_t = _allowed(attention_mask, slice(key.n_prompt, n_total))
    if mask_t is not None:
        allowed_t = allowed_t & mask_t
    allowed_t = allowed_t[:, None, None].expand(B, H, G, q_len, t).reshape(B, H, G * q_len, t)
    s_t = s_t.masked_fill(~allowed_t, float("-inf"))
    m_t = s_t.amax(-1)
    m_t_safe = torch.where(torch.isfinite(m_t), m_t, torch.zeros_like(m_t))
    p_t = torch.exp(s_t - m_t_safe.unsqueeze(-1))
    tail_part = (m_t, p_t.sum(-1), p_t @ tail_v)  # (B, H, Gq), (B, H, Gq), (B, H, Gq, d_v)
    # packed prompt entries, per (batch, KV head)
    if decode_kernel is not None and q_len == 1 and attention_mask is None:
        out, lse = decode_kernel(query.reshape(B * Hq, d), key.packed, value.packed, key.offsets, scale)
        out, lse = out.to(acc).view(B, H, G, -1), lse.to(acc).view(B, H, G)
        finite = torch.isfinite(lse)
        m_p = torch.where(finite, lse, torch.full_like(lse, float("-inf")))
        prompt_part = (m_p, finite.float(), out * finite.unsqueeze(-1))  # (max, sum, o) with the sum folded in lse
        prompt_part = tuple(x.reshape(B, H, G * q_len, *x.shape[3:]) for x in prompt_part)
    else:
        m_p = torch.empty(B, H, G * q_len, device=query.device, dtype=acc)
        l_p = torch.empty_like(m_p)
        o_p = torch.empty(B, H, G * q_len, value.tail.shape[-1], device=query.device, dtype=acc)
        for b in range(B):
            mask_b = None if attention_mask is None else attention_mask[b:b + 1]
            for h in range(H):
                allowed = None
                if mask_b is not None:
                    pos = key.head_positions(b, h).long()
                    allowed = _allowed(mask_b, pos)[0]  # (q, n_bh)
                    allowed = allowed[None].expand(G, q_len, -1).reshape(G * q_len, -1)
                m_p[b, h], l_p[b, h], o_p[b, h] = segment_partials(qf[b, h], key.head(b, h), value.head(b, h), scale,
                                                                   allowed)
        prompt_part = (m_p, l_p, o_p)
    out = merge_partials([prompt_part, tail_part])  # (B, H, G q, d_v)
    return out.view(B, H, G, q_len, -1).reshape(B, Hq, q_len, -1)


def _fallback(module, name: str):
    if name == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def _decode_kernel(query):
    if query.device.type != "cuda":
        return None
    try:
        from .triton import triton_ragged_decode
    except ImportError:  # no triton: the torch loop
        return None
    return triton_ragged_decode


def _ragged(module, query, key, value, attention_mask, dense: str, dropout=0.0, scaling=None, **kwargs):
    if not isinstance(key, RaggedKV):  # a dense layer (a fresh prefill, the masked path): the model's own attention
        return _fallback(module, dense)(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
    if dropout:
        raise ValueError("the ragged attention has no dropout: call the model in eval mode")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = ragged_attention_torch(query, key, value, scale, attention_mask, decode_kernel=_decode_kernel(query))
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def ragged_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """``jacap_ragged``: :func:`ragged_attention_torch` on a ragged layer, transformers' sdpa on a dense one.
    Returns ``(attn_output (B, q, H_q, d), None)`` as transformers' attention functions do."""
    return _ragged(module, query, key, value, attention_mask, "sdpa", dropout, scaling, **kwargs)


def ragged_attention_eager(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """``jacap_ragged_eager``: as :func:`ragged_attention`, with the model's eager attention on a dense layer."""
    return _ragged(module, query, key, value, attention_mask, "eager", dropout, scaling, **kwargs)


AttentionInterface.register(RAGGED_ATTENTION["sdpa"], ragged_attention)
AttentionInterface.register(RAGGED_ATTENTION["eager"], ragged_attention_eager)
# the masks the dense layers' own implementation expects
AttentionMaskInterface.register(RAGGED_ATTENTION["sdpa"], sdpa_mask)
AttentionMaskInterface.register(RAGGED_ATTENTION["eager"], eager_mask)
assert RAGGED_ATTENTION["sdpa"] in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping


def use_ragged_attention(model) -> str:
    """Switch ``model`` to the ragged attention (its dense layers keep running its own sdpa or eager attention);
    returns the name now in use. A model on another implementation (flash, flex) is refused."""
    current = model.config._attn_implementation
    if current in RAGGED_ATTENTION.values():
        return current
    if current not in RAGGED_ATTENTION:
        raise ValueError(f"the ragged cache's attention runs beside sdpa or eager attention; this model uses "
                         f"{current!r}: load it with attn_implementation='sdpa'")
    name = RAGGED_ATTENTION[current]
    model.set_attn_implementation(name)
    return name
