"""Model plumbing, written once: decoder layers, attention modules, the model's own RoPE, the averaged
future RoPE, ``W_O`` factors, and capture hooks (per-head queries/keys/values, attention outputs).

Everything above the scoring core that touches a transformers model's internals goes through here, so a
new architecture (e.g. a multimodal wrapper with ``model.model.language_model``) is handled in one place.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from . import _checks

__all__ = ["decoder_layers_of", "attention_modules", "rope_function", "apply_rope", "averaged_rope",
           "num_kv_groups", "out_proj_factors", "reduce_out_proj", "HeadCapture", "capture_heads",
           "head_tensors", "capture_attn_outputs", "clear_masks"]


def decoder_layers_of(model) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM (also through a multimodal ``language_model``)."""
    inner = getattr(model, "model", None)
    if inner is None or not (hasattr(inner, "layers") or hasattr(inner, "language_model")):
        raise ValueError(f"`model` ({type(model).__name__}) has no decoder layers at model.model.layers; "
                         "pass a transformers causal LM (Llama, Qwen2/3, Mistral, ...)")
    inner = inner.language_model if hasattr(inner, "language_model") else inner
    return inner.layers


def attention_modules(model) -> list:
    """Every layer's ``self_attn`` module, in layer order."""
    return [layer.self_attn for layer in decoder_layers_of(model)]


def rope_function(module: nn.Module):
    """The ``apply_rotary_pos_emb`` of the module's own modeling file (``ValueError`` for non-RoPE models)."""
    apply = getattr(sys.modules[type(module).__module__], "apply_rotary_pos_emb", None)
    if apply is None:
        raise ValueError(f"{type(module).__name__} has no apply_rotary_pos_emb: only RoPE models are supported")
    return apply


def apply_rope(module: nn.Module, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply the model's own RoPE to ``q (b, H, T, d)``."""
    q_rot, _ = rope_function(module)(q, q, cos, sin)
    return q_rot


def clear_masks(model) -> None:
    """Drop kvpress's per-head key masks (``masked_key_indices``) left on the attention modules."""
    for attn in attention_modules(model):
        attn.masked_key_indices = None


def num_kv_groups(module: nn.Module) -> int:
    """G = query heads per KV head."""
    cfg = module.config
    return cfg.num_attention_heads // cfg.num_key_value_heads


_ROPE_CACHE: dict = {}


def averaged_rope(module: nn.Module, q_len: int, n_future_positions: int = 512, dtype=torch.float32) -> torch.Tensor:
    """kvpress's averaged future-RoPE matrix ``R`` (``(d, d)``, queries map as ``q @ R.T``).

    Computed by ``ExpectedAttentionPress.apply_avg_rope`` applied to the identity, and memoised per
    (rotary embedding, prompt length): all layers of a model share it.
    """
    from kvpress import ExpectedAttentionPress

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


@contextmanager
def capture_attn_outputs(model, store: list):
    """Record every layer's attention-block output (output[0] of ``self_attn``) during a forward."""
    attns = attention_modules(model)
    store.clear()
    store.extend([None] * len(attns))
    hooks = []

    def make(i):
        def hook(module, args, kwargs, output):
            store[i] = output[0].detach()[0].float()

        return hook

    try:
        for i, attn in enumerate(attns):
            hooks.append(attn.register_forward_hook(make(i), with_kwargs=True))
        yield store
    finally:
        for h in hooks:
            h.remove()


@dataclass
class HeadCapture:
    """Per-layer attention inputs of one forward pass (batch element 0).

    Shapes: ``queries``/``queries_prerope`` ``(H, T, d)``; ``keys``/``keys_prerope``/``values``
    ``(H_kv, T, d)``; ``out_proj`` ``(H, d_model, d)`` — query head h's slice of :math:`W_O`.
    Queries and keys are post-RoPE unless ``_prerope``.
    """

    layer: int
    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    queries_prerope: torch.Tensor
    keys_prerope: torch.Tensor
    out_proj: torch.Tensor

    @property
    def n_heads(self) -> int:
        return self.queries.shape[0]

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.queries.shape[0] // self.keys.shape[0]


@torch.no_grad()
def capture_heads(model, input_ids: torch.Tensor, layers=None) -> dict[int, HeadCapture]:
    """Run one forward pass and capture every selected layer's queries, keys and values.

    Uses a forward pre-hook on each ``self_attn`` module and recomputes its own ``q_proj``,
    ``k_proj``, ``v_proj`` and the model's ``apply_rotary_pos_emb`` on the hidden states it
    receives — the exact tensors the model's attention uses. ``input_ids`` is ``(1, T)`` or ``(T,)``.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long:
        raise ValueError("`input_ids` must be a LongTensor of token ids, shape (1, T) or (T,)")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"`input_ids` must hold one sequence, shape (1, T); got {tuple(input_ids.shape)}")
    decoder_layers = decoder_layers_of(model)
    n_layers = len(decoder_layers)
    layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
    for l in layers:
        if not 0 <= l < n_layers:
            raise ValueError(f"`layers` must be indices in [0, {n_layers}); got {l}")
    out: dict[int, HeadCapture] = {}
    handles = []

    def make_hook(layer_idx):
        def hook(module, args, kwargs):
            hs = kwargs.get("hidden_states", args[0] if args else None)
            cos, sin = kwargs["position_embeddings"]
            rope = rope_function(module)
            shape = (*hs.shape[:-1], -1, module.head_dim)
            q = module.q_proj(hs).view(shape).transpose(1, 2)
            k = module.k_proj(hs).view(shape).transpose(1, 2)
            v = module.v_proj(hs).view(shape).transpose(1, 2)
            qr, kr = rope(q, k, cos, sin)
            W = module.o_proj.weight  # (d_model, H*d)
            H, d = q.shape[1], module.head_dim
            out[layer_idx] = HeadCapture(
                layer=layer_idx,
                queries=qr[0].float().cpu(),
                keys=kr[0].float().cpu(),
                values=v[0].float().cpu(),
                queries_prerope=q[0].float().cpu(),
                keys_prerope=k[0].float().cpu(),
                out_proj=W.float().cpu().view(W.shape[0], H, d).permute(1, 0, 2).contiguous(),
            )

        return hook

    try:
        for l in layers:
            handles.append(decoder_layers[l].self_attn.register_forward_pre_hook(make_hook(l), with_kwargs=True))
        model(input_ids.to(model.device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return out


def reduce_out_proj(out_proj: torch.Tensor) -> torch.Tensor:
    r"""A ``(d, d)`` matrix R with :math:`W^\top W = R^\top R` for ``out_proj`` W ``(d_model, d)``.

    Capacities, leverages and norms only see :math:`u_i^\top u_j = v_i^\top W^\top W v_j`, so
    ``u = R v`` (d entries) gives exactly the same numbers as ``u = W v`` (d_model entries),
    at a fraction of the cost (W = QR with orthonormal Q)."""
    _checks.tensor("out_proj", out_proj, min_dim=2)
    return torch.linalg.qr(out_proj.double(), mode="reduced").R


def head_tensors(cap: HeadCapture, head: int, *, prefix: int, reduce: bool = True, dtype=torch.float64) -> dict:
    """One query head's view of a capture: the cache = the first ``prefix`` tokens, the later
    queries = the rest.

    Returns ``K (prefix, d)``, ``V (prefix, d)``, ``U (d_u, prefix)`` (``u = W_O^h v``, reduced to
    d rows by :func:`reduce_out_proj` when ``reduce``), ``Q_future (T - prefix, d)``,
    ``Q_past (prefix, d)``, and ``W`` (the head's W_O slice or its reduction).
    """
    if not 0 <= head < cap.n_heads:
        raise ValueError(f"`head` must be in [0, {cap.n_heads}); got {head}")
    Tlen = cap.queries.shape[1]
    if not 2 <= prefix < Tlen:
        raise ValueError(f"`prefix` must be in [2, T={Tlen}) so that later queries exist; got {prefix}")
    kv = head // cap.group
    K = cap.keys[kv, :prefix].to(dtype)
    V = cap.values[kv, :prefix].to(dtype)
    W = reduce_out_proj(cap.out_proj[head]) if reduce else cap.out_proj[head].to(dtype)
    W = W.to(dtype)
    return dict(K=K, V=V, U=W @ V.T, W=W, Q_future=cap.queries[head, prefix:].to(dtype),
                Q_past=cap.queries[head, :prefix].to(dtype), kv_head=kv)
