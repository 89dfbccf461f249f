"""Tensor plumbing shared by the Jacap presses (kvpress layout: presses stay short, plumbing lives here).

* :func:`future_query_states` - the prompt's pre-RoPE queries rotated by kvpress's averaged
  future-RoPE matrix, so that they live in the same (rotated) space as the cached keys;
* :func:`observed_attention` - the attention rows those queries actually computed (own RoPE positions,
  causal), averaged with the same weights: the observed centre of :class:`~jacap_lib.presses.jacap.JacapPress`;
* :func:`group_query_heads` - GQA: the G query heads that share one KV head, pooled along time;
* :func:`out_proj_factors` - a ``(d, d)`` stand-in for a head's slice of ``W_O`` that gives exactly
  the same leverages as ``u = W_O v`` (see the function);
* :func:`protect` - sink and recent-window positions get the largest finite score so kvpress's
  top-k always keeps them.
"""
from __future__ import annotations

import math

import torch
from kvpress.utils import get_prerope_query_states
from torch import nn
from transformers.models.llama.modeling_llama import repeat_kv

from ..hf import apply_rope, averaged_rope, num_kv_groups, out_proj_factors
from ..selection import protected_mask
from ..stats import ema_weights

__all__ = ["hook_positions", "future_query_states", "observed_attention", "protected_slots", "averaged_rope",
           "group_query_heads", "out_proj_factors", "protect", "num_kv_groups"]


def _current_positions(hidden_states: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """True sequence positions of the hook's own forward, ``(L,)``: ``position_ids`` (row 0), else ``cache_position``.

    ``position_ids`` first: it is what RoPE used, and it stays the true position when the cache has been
    compressed, while ``cache_position`` is then only the true position if the caller passed it
    (``generate`` and :func:`jacap_lib.measure.replay.replay` do; kvpress's pipeline passes ``position_ids``
    only, so the model derives ``cache_position`` from the compressed cache length). A direct call
    without either (``press.score(..., kwargs={})``) is taken as a prefill from position 0 of exactly
    ``hidden_states``.
    """
    pos = None
    if kwargs and kwargs.get("position_ids") is not None:
        pos = kwargs["position_ids"][0]
    elif kwargs and kwargs.get("cache_position") is not None:
        pos = kwargs["cache_position"]
    if pos is None:
        return torch.arange(hidden_states.shape[1], device=hidden_states.device)
    return pos.reshape(-1).to(torch.long)


def _row_offset(rows: torch.Tensor, full: torch.Tensor | None) -> int | None:
    """Offset of ``rows`` along the sequence if it is a slice ``full[:, i:i+T]`` (kvpress ChunkPress), else None."""
    if full is None or not isinstance(full, torch.Tensor) or full.dim() != 3 or rows.dim() != 3:
        return None
    if rows.untyped_storage().data_ptr() != full.untyped_storage().data_ptr() or rows.stride() != full.stride():
        return None
    delta = rows.storage_offset() - full.storage_offset()
    step = full.stride(1)
    if step <= 0 or delta % step or not 0 <= delta // step <= full.shape[1] - rows.shape[1]:
        return None
    return delta // step


def hook_positions(hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict):
    """Where the tensors a kvpress scorer receives sit in the sequence: ``(query_pos, key_pos, next_pos)``.

    kvpress wrappers do not always hand a scorer the prompt from position 0:

    * a plain prefill (``ScorerPress`` and the budget wrappers): ``hidden_states`` and ``keys`` are
      positions ``0 .. L-1`` (``position_ids`` / ``cache_position``);
    * ``ChunkPress``: a slice ``hidden_states[:, i:i+c]`` (and the matching keys) of the hook's
      states; the offset ``i`` is read from the slice itself (it is a view of ``kwargs["hidden_states"]``);
    * ``DecodingPress`` / ``CAMPress``: the buffered hidden states of the last ``T`` decoding steps,
      ending at the current position, while ``keys`` is the whole (already compressed) cache;
    * anything else shorter than the step (``BlockPress``'s regathered states): taken, like
      ``DecodingPress``, as the ``T`` positions ending at the current one.

    Returns ``query_pos (T,)``, ``key_pos (N,)`` or ``None`` when the cache slots' positions are not
    known from the hook (a cache compressed earlier: slot order is then assumed to be position order,
    which :meth:`JacapPress.compress <jacap_lib.presses.jacap.JacapPress.compress>` keeps), and
    ``next_pos`` = current position + 1, the first position a future query can have.
    """
    cur = _current_positions(hidden_states, kwargs)
    t = hidden_states.shape[1]
    nxt = int(cur[-1]) + 1 if cur.numel() else t
    offset = None
    if t == cur.numel():
        query_pos = cur.to(hidden_states.device)
        offset = 0
    else:
        offset = _row_offset(hidden_states, kwargs.get("hidden_states") if kwargs else None)
        if offset is not None and kwargs["hidden_states"].shape[1] == cur.numel():
            query_pos = cur[offset: offset + t].to(hidden_states.device)
        else:
            offset = None
            query_pos = torch.arange(nxt - t, nxt, device=hidden_states.device).clamp_min(0)
    key_pos = query_pos if (offset is not None and keys.shape[-2] == t) else None
    return query_pos, key_pos, nxt


def future_query_states(
    module: nn.Module,
    hidden_states: torch.Tensor,
    *,
    n_queries: int | None = None,
    skip: int = 0,
    n_future_positions: int = 512,
    positions: torch.Tensor | None = None,
    next_position: int | None = None,
) -> torch.Tensor:
    """Queries of the hook's hidden states, seen from the future: ``(B, H_q, T', d)``.

    ``positions (T,)`` are the true sequence positions of the rows of ``hidden_states`` (default
    ``0 .. T-1``, a prefill) and ``next_position`` the first future position (default ``positions[-1] + 1``).
    Rows at positions ``< skip`` (attention sinks, whose queries are outliers) are left out, then the
    last ``n_queries`` rows are kept (all when ``None``). If that leaves no row (a chunk or decoding
    buffer made of sinks only, a prompt no longer than ``skip``), the last ``n_queries`` rows are used
    regardless: the statistics fall back to the queries there are and never come out empty.

    Queries are taken before RoPE (``kvpress.utils.get_prerope_query_states``) and multiplied by the
    RoPE rotation averaged over the ``n_future_positions`` positions from ``next_position`` on
    (``ExpectedAttentionPress.apply_avg_rope``). The keys in the cache already carry their own
    rotation, so ``k_i . q`` is then the expected logit of a future query at an unknown position.
    """
    q_len = hidden_states.shape[1]
    if q_len == 0:
        raise ValueError("hidden_states holds no query (sequence length 0): nothing to estimate statistics from")
    if positions is None:
        positions = torch.arange(q_len, device=hidden_states.device)
    if positions.numel() != q_len:
        raise ValueError(f"positions has {positions.numel()} entries for {q_len} hidden-state rows")
    if next_position is None:
        next_position = int(positions[-1]) + 1
    rows = torch.nonzero(positions.to(hidden_states.device) >= skip).flatten()
    if rows.numel() == 0:
        rows = torch.arange(q_len, device=hidden_states.device)
    if n_queries is not None:
        rows = rows[-n_queries:]
    start, stop = int(rows[0]), int(rows[-1]) + 1
    states = hidden_states[:, start:stop] if stop - start == rows.numel() else hidden_states.index_select(1, rows)
    q = get_prerope_query_states(module, states)
    return q @ averaged_rope(module, next_position, n_future_positions, q.dtype).T


def group_query_heads(q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """``(B, H_q, T, d) -> (B, H_kv, G*T, d)``: the queries every KV head serves, pooled.

    Query head ``h`` reads KV head ``h // G`` (transformers' ``repeat_kv`` layout).
    """
    b, h, t, d = q.shape
    if h % n_kv_heads:
        raise ValueError(f"{h} query heads do not split into {n_kv_heads} KV groups")
    return q.reshape(b, n_kv_heads, (h // n_kv_heads) * t, d)


def protected_slots(n: int, n_sink: int = 0, window: int = 0, *, key_positions: torch.Tensor | None = None,
                    next_position: int | None = None, device=None) -> torch.Tensor:
    """Boolean ``(n,)`` mask of the sink and recent-window tokens among ``n`` scored slots.

    Without ``key_positions``: the first ``n_sink`` and last ``window`` slots (a cache in position
    order). With the slots' true positions ``key_positions (n,)``: the slots at positions ``< n_sink``
    and ``>= next_position - window`` (a chunk in the middle of the prompt protects neither).
    """
    if key_positions is None:
        return protected_mask(n, n_sink=n_sink, window=window, device=device)
    if key_positions.numel() != n:
        raise ValueError(f"key_positions has {key_positions.numel()} entries for {n} scored tokens")
    kp = key_positions.to(device)
    end = int(kp.max()) + 1 if next_position is None else int(next_position)
    return (kp < n_sink) | (kp >= end - window) if window else kp < n_sink


def protect(scores: torch.Tensor, n_sink: int = 0, window: int = 0, *, key_positions: torch.Tensor | None = None,
            next_position: int | None = None) -> torch.Tensor:
    """Give the sink and recent-window tokens (:func:`protected_slots`) the largest finite score (kept by top-k)."""
    mask = protected_slots(scores.shape[-1], n_sink, window, key_positions=key_positions,
                           next_position=next_position, device=scores.device)
    return scores.masked_fill(mask, torch.finfo(scores.dtype).max)


@torch.no_grad()
def observed_attention(module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict, *,
                       n_queries: int | None, skip: int, beta: float | None, pooled: bool,
                       block: int = 256) -> torch.Tensor:
    r"""The prompt's recent queries' actual attention rows, averaged: ``(B, H, N)`` float32, each row summing to 1.

    The rows are those :func:`~jacap_lib.presses.utils.future_query_states` uses for :math:`\mu_Q` (positions
    ``>= skip``, the last ``n_queries``), weighted as :math:`\mu_Q` weights them (EMA with ``beta``, flat for
    ``None``). Each query is rotated by RoPE at its *own* position (as the model attended, as kvpress SnapKV's
    ``compute_window_attention`` does), attends causally (a key at a later position is masked; a cache whose
    positions the hook does not tell is taken in position order, the rows' own keys last) with the model's
    scaling (``module.scaling``, else :math:`1/\sqrt d`). With an EMA, rows whose weight is below 1e-9 of the
    newest row's (at most 2e-9 of the total) are skipped: a long prompt costs about 200 rows at ``beta=0.9``.
    ``pooled``: the G query heads of a KV head averaged
    (``H = H_kv``), else per query head (``H = H_q``). Rows are processed ``block`` at a time.
    """
    query_pos, key_pos, next_pos = hook_positions(hidden_states, keys, kwargs)
    t_all = hidden_states.shape[1]
    rows = torch.nonzero(query_pos >= skip).flatten()
    if rows.numel() == 0:
        rows = torch.arange(t_all, device=hidden_states.device)
    if n_queries is not None:
        rows = rows[-n_queries:]
    weights = (torch.full((rows.numel(),), 1.0 / rows.numel(), device=keys.device) if beta is None
               else ema_weights(rows.numel(), beta, device=keys.device))
    if beta is not None:  # rows the EMA has forgotten (weight < 1e-9 of the newest; < 2e-9 in all) are skipped
        keep = weights >= 1e-9 * weights.max()
        rows, weights = rows[keep.to(rows.device)], weights[keep]
    n_rows = rows.numel()
    b, h_kv, n, d = keys.shape
    g = module.config.num_attention_heads // h_kv
    scale = float(getattr(module, "scaling", 1.0 / math.sqrt(d)))
    k = repeat_kv(keys, g).float()  # (B, H_q, N, d)
    if key_pos is None:  # slots in position order, the hook's rows are the last t_all slots
        slot_pos = torch.arange(n, device=keys.device) + (next_pos - n)
    else:
        slot_pos = key_pos.to(keys.device)
    out = torch.zeros(b, k.shape[1], n, dtype=torch.float32, device=keys.device)
    for s in range(0, n_rows, block):
        r = rows[s: s + block]
        pos = query_pos[r].to(keys.device)
        cos, sin = module.rotary_emb(hidden_states, pos[None])
        q = apply_rope(module, get_prerope_query_states(module, hidden_states[:, r]), cos, sin).float()
        logits = (q @ k.transpose(-1, -2)) * scale  # (B, H_q, R, N)
        logits = logits.masked_fill(slot_pos[None, :] > pos[:, None], float("-inf"))
        attn = torch.softmax(logits, dim=-1)
        out += torch.einsum("bhrn,r->bhn", attn, weights[s: s + block])
    if pooled:
        out = out.view(b, h_kv, g, n).mean(2)
    return out
