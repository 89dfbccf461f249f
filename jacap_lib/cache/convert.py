"""A press's choice into a ragged cache: kvpress's ``masked_key_indices`` (or a keep mask) to kept entries only.

:func:`to_ragged` replaces a cache's dense layers by :class:`~jacap_lib.cache.ragged.RaggedLayer` s in place and
switches the model to the ragged attention (:mod:`jacap_lib.cache.attention`).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from ..hf import attention_modules, clear_masks
from .attention import use_ragged_attention
from .ragged import RaggedLayer

__all__ = ["to_ragged", "keep_from_masks", "kept_mask"]


def keep_from_masks(model, cache) -> list | None:
    """Per layer, the ``(B, H, N)`` keep mask of kvpress's ``masked_key_indices`` on ``model``'s attention modules
    (``None`` for a layer without masks); ``None`` when no module holds masks."""
    masks, any_mask = [], False
    for module in attention_modules(model):
        idx = getattr(module, "masked_key_indices", None)
        layer = cache.layers[int(module.layer_idx)] if int(module.layer_idx) < len(cache.layers) else None
        if idx is None or layer is None or isinstance(layer, RaggedLayer):
            masks.append(None)
            continue
        b, h, n = layer.keys.shape[:3]
        keep = torch.ones(b, h, n, dtype=torch.bool, device=layer.keys.device)
        batch, head, seq = (t.to(keep.device) for t in idx)
        keep[batch, head, seq] = False
        masks.append(keep)
        any_mask = True
    return masks if any_mask else None


def kept_mask(layer: RaggedLayer) -> torch.Tensor:
    """``(B, H, n_prompt)`` bool: the prompt positions each head of a ragged layer holds."""
    k = layer.keys
    keep = torch.zeros(k.batch * k.heads, k.n_prompt, dtype=torch.bool, device=k.positions.device)
    segment = torch.repeat_interleave(torch.arange(k.batch * k.heads, device=k.offsets.device),
                                      k.offsets[1:] - k.offsets[:-1]).to(keep.device)
    keep[segment, k.positions.long()] = True
    return keep.view(k.batch, k.heads, k.n_prompt)


def to_ragged(cache: Cache, model=None, keep=None) -> Cache:
    """Turn ``cache``'s dense layers into :class:`RaggedLayer` s holding only the kept entries, in place (the same
    object, so a caller holding it, e.g. kvpress's pipeline, answers from the freed cache); returns it.

    ``keep``: a bool ``(L, B, H, N)`` tensor or a per-layer list of ``(B, H, N)`` masks (``None`` entries: keep
    the whole layer); without it, the choice kvpress left on ``model``'s attention modules (``masked_key_indices``),
    which are then cleared. ``model`` (required without ``keep``) is switched to the ragged attention
    (:func:`jacap_lib.cache.attention.use_ragged_attention`), which reads the ragged layers and runs the model's
    own sdpa/eager attention on every dense one. Layers that are ragged already are left as they are.
    """
    if not isinstance(cache, Cache):
        raise ValueError(f"`cache` must be a transformers Cache (e.g. the DynamicCache a prefill filled); got "
                         f"{type(cache).__name__}")
    if keep is None:
        if model is None:
            raise ValueError("to_ragged needs `model` (whose attention modules hold kvpress's masked_key_indices) "
                             "or an explicit `keep` mask")
        keep = keep_from_masks(model, cache)
        keep = [None] * len(cache.layers) if keep is None else keep
    if len(keep) != len(cache.layers):
        raise ValueError(f"`keep` must have one entry per cache layer ({len(cache.layers)}); got {len(keep)}")
    for i, mask in enumerate(keep):
        layer = cache.layers[i]
        if isinstance(layer, RaggedLayer):  # its own kept set again is a no-op; another one is refused
            if mask is not None and not torch.equal(mask.bool().cpu(), kept_mask(layer).cpu()):
                raise ValueError(f"layer {i} is ragged already and holds another kept set; a keep mask cannot be "
                                 f"applied to it again: build the cache anew")
            continue
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            raise ValueError(f"cache layer {i} is empty: prefill the cache before turning it ragged")
        if mask is None:
            mask = torch.ones(layer.keys.shape[:3], dtype=torch.bool, device=layer.keys.device)
        cache.layers[i] = RaggedLayer.from_dense(layer.keys, layer.values, mask)
    if model is not None:
        clear_masks(model)
        use_ragged_attention(model)
    return cache
