"""A cache that holds only what a press keeps, and the attention over it.

* :class:`~.ragged.RaggedCache` / :class:`~.ragged.RaggedLayer` — per layer, each KV head's kept prompt entries
  packed one after another (offsets and original positions beside them), then the tokens appended since;
  :func:`~.convert.to_ragged` turns a press's choice (kvpress's ``masked_key_indices`` or a keep mask) into it, in
  place, freeing the dropped entries; :func:`~.ragged.cache_bytes` counts what a cache holds;
* :mod:`.attention` — the attention over it (torch on the CPU, per KV head, GQA, causal among new tokens),
  registered in ``transformers``' ``AttentionInterface`` as ``"jacap_ragged"``;
* :mod:`.triton` — the Triton ragged-decode kernel (one query token against each head's packed keys and values);
* :class:`~.press.RaggedPress` — ``RaggedPress(press)``: any kvpress press, then its cache freed.

The masked cache kvpress leaves is the reference: the logits over a ragged cache equal its logits.
"""
from __future__ import annotations

from .._lazy import lazy_attributes

_EXPORTS = {
    "RaggedCache": "jacap_lib.cache.ragged",
    "RaggedLayer": "jacap_lib.cache.ragged",
    "RaggedKV": "jacap_lib.cache.ragged",
    "to_ragged": "jacap_lib.cache.convert",
    "keep_from_masks": "jacap_lib.cache.convert",
    "cache_bytes": "jacap_lib.cache.ragged",
    "kept_per_head": "jacap_lib.cache.ragged",
    "is_ragged": "jacap_lib.cache.ragged",
    "RaggedPress": "jacap_lib.cache.press",
    "freeing_memory": "jacap_lib.cache.press",
    "use_ragged_attention": "jacap_lib.cache.attention",
    "ragged_attention_torch": "jacap_lib.cache.attention",
    "triton_ragged_decode": "jacap_lib.cache.triton",
    "ragged_decode_torch": "jacap_lib.cache.triton",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, __all__)
