"""Tensor plumbing shared by the Jacap presses (kvpress layout: presses stay short, plumbing lives here).

* :func:`future_query_states` - the prompt's pre-RoPE queries rotated by kvpress's averaged
  future-RoPE matrix, so that they live in the same (rotated) space as the cached keys;
* :func:`group_query_heads` - GQA: the G query heads that share one KV head, pooled along time;
* :func:`out_proj_factors` - a ``(d, d)`` stand-in for a head's slice of ``W_O`` that gives exactly
  the same leverages as ``u = W_O v`` (see the function);
* :func:`protect` - sink and recent-window positions get the largest finite score so kvpress's
  top-k always keeps them.
"""
from __future__ import annotations

import torch
from kvpress import ExpectedAttentionPress
from kvpress.utils import get_prerope_query_states
from torch import nn

from ..select import protected_mask

__all__ = ["future_query_states", "averaged_rope", "group_query_heads", "out_proj_factors", "protect", "num_kv_groups"]


def num_kv_groups(module: nn.Module) -> int:
    """G = query heads per KV head."""
    cfg = module.config
    return cfg.num_attention_heads // cfg.num_key_value_heads


def future_query_states(
    module: nn.Module,
    hidden_states: torch.Tensor,
    *,
    n_queries: int | None = None,
    skip: int = 0,
    n_future_positions: int = 512,
) -> torch.Tensor:
    """Queries of the prompt, seen from the future: ``(B, H_q, T', d)``.

    Queries are taken before RoPE (``kvpress.utils.get_prerope_query_states``) for the last
    ``n_queries`` prompt positions (all when ``None``; the first ``skip`` positions - attention
    sinks with outlier queries - are always left out), then multiplied by the RoPE rotation averaged
    over the next ``n_future_positions`` positions (``ExpectedAttentionPress.apply_avg_rope``).
    The keys in the cache already carry their own rotation, so ``k_i . q`` is then the expected
    logit of a future query at an unknown position.
    """
    q_len = hidden_states.shape[1]
    start = skip if n_queries is None else max(skip, q_len - n_queries)
    if start >= q_len:
        raise ValueError(
            f"no prompt query left for the statistics: prompt length {q_len}, skip (n_sink) = {skip}, "
            f"n_queries = {n_queries}; use a longer prompt or a smaller n_sink"
        )
    q = get_prerope_query_states(module, hidden_states[:, start:])
    return q @ averaged_rope(module, q_len, n_future_positions, q.dtype).T


_ROPE_CACHE: dict = {}


def averaged_rope(module: nn.Module, q_len: int, n_future_positions: int = 512, dtype=torch.float32) -> torch.Tensor:
    """kvpress's averaged future-RoPE matrix ``R`` (``(d, d)``, queries map as ``q @ R.T``).

    Computed by ``ExpectedAttentionPress.apply_avg_rope`` applied to the identity, and memoised per
    (rotary embedding, prompt length): all layers of a model share it.
    """
    rotary = module.rotary_emb
    key = (id(rotary), q_len, n_future_positions, str(dtype), str(module.o_proj.weight.device))
    if key not in _ROPE_CACHE:
        if len(_ROPE_CACHE) > 64:
            _ROPE_CACHE.clear()
        eye = torch.eye(module.head_dim, dtype=dtype, device=module.o_proj.weight.device)
        rope = ExpectedAttentionPress(n_future_positions=n_future_positions)
        r_t, _ = rope.apply_avg_rope(module, eye, None, q_len)  # eye @ R.T
        _ROPE_CACHE[key] = (rotary, r_t.T.contiguous())  # keep `rotary` alive so its id stays unique
    return _ROPE_CACHE[key][1]


def group_query_heads(q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """``(B, H_q, T, d) -> (B, H_kv, G*T, d)``: the queries every KV head serves, pooled.

    Query head ``h`` reads KV head ``h // G`` (transformers' ``repeat_kv`` layout).
    """
    b, h, t, d = q.shape
    if h % n_kv_heads:
        raise ValueError(f"{h} query heads do not split into {n_kv_heads} KV groups")
    return q.reshape(b, n_kv_heads, (h // n_kv_heads) * t, d)


def out_proj_factors(module: nn.Module, *, pooled: bool) -> torch.Tensor:
    r"""``(H, d, d)`` matrices ``F_h`` with ``F_h^T F_h = W_h^T W_h`` for the output projection.

    Leverage depends on the output map ``W`` (``u = W v``) only through the Gram matrix
    ``W^T W``: by the push-through identity
    :math:`W^\top(I + W V W^\top)^{-1} W = (I + W^\top W V)^{-1} W^\top W` with
    :math:`V = \sum_j w_j v_j v_j^\top`. So ``u = F v`` with a ``(d, d)`` factor of ``W^T W``
    gives the same leverages (and scores) as the ``(hidden, d)`` slice of ``W_O`` while ``A``
    stays ``d x d``.

    ``pooled=False``: one factor per query head, ``W_h = o_proj.weight[:, h*d:(h+1)*d]``.
    ``pooled=True``: one factor per KV head for the G query heads that read it, their slices stacked
    (``W_g^T W_g = sum_h W_h^T W_h``): each query head's output is a separate channel.
    """
    d = module.head_dim
    w = module.o_proj.weight.detach().float()  # (hidden, H_q * d)
    blocks = w.reshape(w.shape[0], -1, d).permute(1, 0, 2)  # (H_q, hidden, d)
    gram = blocks.transpose(-1, -2) @ blocks  # (H_q, d, d)
    if pooled:
        n_kv = module.config.num_key_value_heads
        gram = gram.reshape(n_kv, -1, d, d).sum(1)
    evals, evecs = torch.linalg.eigh(gram.double())
    factor = evals.clamp_min(0).sqrt().unsqueeze(-1) * evecs.transpose(-1, -2)  # diag(sqrt e) Q^T
    return factor.float()


def protect(scores: torch.Tensor, n_sink: int = 0, window: int = 0) -> torch.Tensor:
    """Give the first ``n_sink`` and last ``window`` positions the largest finite score (kept by top-k)."""
    mask = protected_mask(scores.shape[-1], sink=n_sink, window=window, device=scores.device)
    return scores.masked_fill(mask, torch.finfo(scores.dtype).max)
