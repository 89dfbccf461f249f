"""Tensor plumbing shared by the Jacap presses (kvpress layout: presses stay short, plumbing lives here).

* :func:`future_query_states` - the prompt's pre-RoPE queries rotated by kvpress's averaged
  future-RoPE matrix, so that they live in the same (rotated) space as the cached keys;
* :func:`observed_attention` - the attention rows those queries actually computed (own RoPE positions,
  causal), averaged with the same weights: the observed centre of :class:`~jacap_lib.presses.jacap.JacapPromptPress`;
* :func:`group_query_heads` - GQA: the G query heads that share one KV head, pooled along time;
* :func:`out_proj_factors` - a ``(d, d)`` stand-in for a head's slice of ``W_O`` that gives exactly
  the same leverages as ``u = W_O v`` (see the function);
* :func:`real_tokens` - which slots hold real tokens when the attention module is handed a padding mask;
* :func:`protection` - the one protection rule of every Jacap press and instrument: the sink and recent-window
  slots (real tokens only) that fit the budget; the presses give them the largest finite score so kvpress's top-k
  always keeps them (:meth:`JacapPromptPress.protect <jacap_lib.presses.jacap.JacapPromptPress.protect>`).
"""
from __future__ import annotations

import math

import torch
from kvpress.utils import get_prerope_query_states
from torch import nn
from transformers.models.llama.modeling_llama import repeat_kv

from ..hf import apply_rope, averaged_rope, num_kv_groups, out_proj_factors
from .. import _checks
from ..selection import budget_split, n_kept, protect_within, protected_mask
from ..stats import ema_weights

__all__ = ["hook_positions", "future_query_states", "observed_attention", "protected_slots", "protection", "real_tokens",
           "real_rows",
           "averaged_rope", "group_query_heads", "out_proj_factors", "num_kv_groups"]


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
    which :meth:`JacapPromptPress.compress <jacap_lib.presses.jacap.JacapPromptPress.compress>` keeps), and
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


def real_tokens(kwargs: dict | None, n: int, device=None) -> torch.Tensor | None:
    """Boolean ``(B, n)``: which of the ``n`` scored slots hold real tokens, read from the attention module's
    ``attention_mask`` (padding); ``None`` when there is no mask or it masks no slot (every slot real).

    A 2-D mask ``(B, K)`` (flash attention's padding mask) is read directly; a 4-D mask ``(B, 1, Q, K)`` (bool:
    True attends; float: 0 attends) marks slot ``j`` real when a query row attends it, among the rows that respect
    causality (a row that attends a later key, e.g. a fully masked padding row that the SDPA path un-masked, says
    nothing about padding). The slots are the mask's last ``n`` columns; a mask narrower than ``n`` is ignored."""
    mask = (kwargs or {}).get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 4) or mask.shape[-1] < n:
        return None
    if mask.dim() == 2:
        real = mask[:, -n:].bool()
    else:
        att = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] > torch.finfo(mask.dtype).min / 2
        q, k = att.shape[-2:]
        future = torch.ones(q, k, dtype=torch.bool, device=att.device).triu(k - q + 1)  # keys after each row
        causal = ~(att & future).any(-1, keepdim=True)  # (B, Q, 1)
        real = (att & causal).any(-2)[:, -n:]
    if bool(real.all()):
        return None
    return real.to(device) if device is not None else real


def real_rows(hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict | None) -> torch.Tensor | None:
    """Boolean ``(B, T)``: which of the hook's ``T`` hidden-state rows are real tokens under padding
    (:func:`real_tokens` of the cache slots the rows are: the slots themselves in a prefill or a chunk, else the last
    ``T`` slots); ``None`` without padding or when the rows are not slots of the scored cache."""
    n, t = keys.shape[-2], hidden_states.shape[1]
    real = real_tokens(kwargs, n, keys.device)
    if real is None or t > n:
        return None
    _, key_pos, _ = hook_positions(hidden_states, keys, kwargs or {})
    return real[:, n - t:] if key_pos is None else real


def protected_slots(n: int, n_sink: int = 0, window: int = 0, *, key_positions: torch.Tensor | None = None,
                    next_position: int | None = None, real: torch.Tensor | None = None, device=None) -> torch.Tensor:
    """Boolean ``(n,)`` mask of the sink and recent-window tokens among ``n`` scored slots (``(B, n)`` with ``real``).

    Without ``key_positions``: the first ``n_sink`` and last ``window`` slots (a cache in position
    order). With the slots' true positions ``key_positions (n,)``: the slots at positions ``< n_sink``
    and ``>= next_position - window`` (a chunk in the middle of the prompt protects neither).
    ``real (B, n)`` (:func:`real_tokens`, padding): per batch row, the first ``n_sink`` and the last ``window``
    *real* slots in position order (pad slots are never protected).
    """
    if real is not None:
        real = real.to(device)
        order = torch.arange(n, device=device) if key_positions is None else key_positions.to(device).argsort()
        rank = torch.empty_like(real, dtype=torch.long)
        rank[:, order] = real[:, order].long().cumsum(-1) - 1  # 0 for the earliest real slot
        count = real.sum(-1, keepdim=True)
        return real & ((rank < n_sink) | (rank >= count - window))
    if key_positions is None:
        return protected_mask(n, n_sink=n_sink, window=window, device=device)
    if key_positions.numel() != n:
        raise ValueError(f"key_positions has {key_positions.numel()} entries for {n} scored tokens")
    kp = key_positions.to(device)
    end = int(kp.max()) + 1 if next_position is None else int(next_position)
    return (kp < n_sink) | (kp >= end - window) if window else kp < n_sink


def protection(hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict | None, *, n_sink: int, window: int,
               compression_ratio: float) -> tuple[torch.Tensor, str | None]:
    """The one protection rule of the Jacap presses: ``(mask, note)``, ``mask`` boolean ``(N,)`` (``(B, 1, N)``
    when the attention mask pads some batch row) of the sink and window slots kept whatever their score.

    The slots are located by their true positions when the hook tells them (a chunk), else by slot (a cache in
    position order), and among real tokens only under padding (:func:`protected_slots`, :func:`real_tokens`). The
    budget ``n_kept(N, compression_ratio)`` decides what fits (:func:`jacap_lib.selection.protect_within`): the
    sinks (if even they do not fit, the earliest ``n_kept`` of them), then the window, shrunk to the budget left
    after the sinks (most recent tokens first). ``note`` says what was cut (``None`` when everything fit). At
    ``compression_ratio = 1`` (kvpress's "drop the layer", budget 0) the sinks and window are returned unfitted.
    """
    _, key_pos, next_pos = hook_positions(hidden_states, keys, kwargs or {})
    n = keys.shape[-2]
    where = dict(key_positions=key_pos, next_position=next_pos, real=real_tokens(kwargs, n, keys.device),
                 device=keys.device)
    sink = protected_slots(n, n_sink, 0, **where)
    recent = protected_slots(n, 0, window, **where)
    budget = n_kept(n, compression_ratio)
    if budget == 0:
        mask = sink | recent
        return (mask.unsqueeze(1) if mask.dim() == 2 else mask), None
    if sink.dim() == 1:
        mask, fit = protect_within(sink, recent, budget, positions=key_pos)
        return mask, fit.note
    rows = [protect_within(s, r, budget, positions=key_pos) for s, r in zip(sink, recent)]
    note = next((fit.note for _, fit in rows if fit.note is not None), None)
    return torch.stack([m for m, _ in rows]).unsqueeze(1), note


def _row_weights(eligible: torch.Tensor, n_queries: int | None, beta: float | None, device):
    """``(rows, weights)`` of the observed centre from the eligible hook rows ``(T,)`` bool: the last ``n_queries``
    of them, weighted as :math:`\\mu_Q` weights them (EMA with ``beta``, flat for ``None``); EMA rows whose weight is
    below 1e-9 of the newest row's are dropped."""
    rows = torch.nonzero(eligible).flatten()
    if n_queries is not None:
        rows = rows[-n_queries:]
    weights = (torch.full((rows.numel(),), 1.0 / rows.numel(), device=device) if beta is None
               else ema_weights(rows.numel(), beta, device=device))
    if beta is not None:  # rows the EMA has forgotten (weight < 1e-9 of the newest; < 2e-9 in all) are skipped
        keep = weights >= 1e-9 * weights.max()
        rows, weights = rows[keep.to(rows.device)], weights[keep]
    return rows, weights


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

    Under padding (the hook's ``attention_mask``, :func:`real_tokens`) the pad slots get no attention and only the
    real query rows of each batch row are averaged (the last ``n_queries`` real rows at positions ``>= skip``).
    """
    query_pos, key_pos, next_pos = hook_positions(hidden_states, keys, kwargs)
    t_all = hidden_states.shape[1]
    b, h_kv, n, d = keys.shape
    real, rows_real = real_tokens(kwargs, n, keys.device), real_rows(hidden_states, keys, kwargs)
    if rows_real is None:
        eligible = query_pos >= skip
        if not bool(eligible.any()):
            eligible = torch.ones_like(eligible)
        rows, weights = _row_weights(eligible, n_queries, beta, keys.device)
    else:  # per batch row: its own real rows; weights (B, R) over the union of the rows any batch row uses
        per = []
        for r in rows_real:
            eligible = (query_pos.to(r.device) >= skip) & r
            per.append(_row_weights(eligible if bool(eligible.any()) else r, n_queries, beta, keys.device))
        rows = torch.unique(torch.cat([p[0] for p in per]))
        weights = torch.zeros(b, rows.numel(), device=keys.device)
        for i, (r, w) in enumerate(per):
            weights[i, torch.searchsorted(rows, r)] = w
    n_rows = rows.numel()
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
        if rows_real is None:
            attn = torch.softmax(logits, dim=-1)
            out += torch.einsum("bhrn,r->bhn", attn, weights[s: s + block])
        else:  # pad keys get no attention; rows a batch row does not use have weight 0 there
            attn = torch.softmax(logits.masked_fill(~real[:, None, None, :], float("-inf")), dim=-1)
            out += torch.einsum("bhrn,br->bhn", attn.nan_to_num(0.0), weights[:, s: s + block])
    if pooled:
        out = out.view(b, h_kv, g, n).mean(2)
    return out


class BudgetSplit:
    """The one ``budget_split`` of every press that protects sinks and a recent window (a mixin: the press has
    ``compression_ratio``, ``n_sink`` and ``window``)."""

    def budget_split(self, n_tokens: int) -> dict:
        """How the kept entries of a prompt of ``n_tokens`` tokens are filled, per KV head on average:
        ``{"kept", "sinks", "window", "scored"}`` (``kept = sinks + window + scored``, by
        :func:`jacap_lib.selection.budget_split`, the rule the press's protection follows); ``scored`` is how many
        kept tokens the score chose. The window is the one actually protected (shrunk when the budget cannot hold
        ``n_sink + window``); where ``scored == 0`` the protection fills the budget and the score chooses nothing
        (:func:`jacap_lib.experiments.protection.protection_fills_budget`)."""
        _checks.int_at_least("n_tokens", n_tokens, 1)
        return budget_split(n_tokens, self.compression_ratio, self.n_sink, self.window)
