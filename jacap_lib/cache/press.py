"""``RaggedPress(press)``: run any kvpress press, then free what it dropped.

A press whose choice varies across heads leaves it as kvpress's ``masked_key_indices`` on the attention modules,
the dense cache untouched. At the end of ``with RaggedPress(press)(model):`` (after the inner press's own exit,
where KVzip, KVgrad and ``JacapPress`` choose) every cache the model filled inside the block is turned ragged in
place (:func:`jacap_lib.cache.convert.to_ragged`): it holds only the kept entries, and the model's attention reads
it. A press that prunes for real (a plain ``ScorerPress``: one budget per head) leaves no masks, and its cache is
left as it is.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from kvpress import BasePress

from ..hf import attention_modules
from .convert import keep_from_masks, to_ragged

__all__ = ["RaggedPress", "freeing_memory", "free_dropped"]


def free_dropped(cache, model) -> bool:
    """Turn ``cache`` ragged (in place) if a press left per-head masks on ``model``; whether it did."""
    keep = keep_from_masks(model, cache)
    if keep is None:
        return False
    to_ragged(cache, model, keep=keep)
    return True


@contextmanager
def freeing_memory(model, inner):
    """Enter the context manager ``inner`` (a press applied to ``model``); after it exits, free the entries it
    masked in every cache ``model`` filled inside (:func:`free_dropped`). On an exception nothing is converted."""
    modules = attention_modules(model)
    caches = {}

    def grab(module, args, kwargs):
        cache = kwargs.get("past_key_values")
        if cache is not None:
            caches.setdefault(id(cache), cache)

    handle = modules[0].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with inner:
            yield
    finally:
        handle.remove()
    for cache in caches.values():
        free_dropped(cache, model)


@dataclass
class RaggedPress(BasePress):
    """Wrap ``press`` so that its cache holds only the entries it keeps.

    Parameters
    ----------
    press : BasePress
        Any kvpress press: KVzipPress, KVgradPress, ``AdaKVPress(...)``, CriticalAdaKVPress, ``JacapPress``, or a
        plain ScorerPress (which prunes already: the wrapper changes nothing there).

    The logits equal those of the masked cache ``press`` alone leaves (``tests/test_ragged_model.py``); the bytes
    held are the kept entries plus an index of 4 bytes per entry (:func:`jacap_lib.cache.cache_bytes`).
    """

    press: BasePress

    def __post_init__(self):
        if not isinstance(self.press, BasePress):
            raise ValueError(f"RaggedPress wraps a kvpress press (BasePress); got {type(self.press).__name__}")

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    @property
    def compression_ratio(self):
        return self.press.compression_ratio

    @compression_ratio.setter
    def compression_ratio(self, value):
        self.press.compression_ratio = value

    def __call__(self, model):
        return freeing_memory(model, self.press(model))
