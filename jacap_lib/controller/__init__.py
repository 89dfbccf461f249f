"""Algorithm 2: Jacap eviction during ``model.generate`` (the cache layer).

* :mod:`.decode` -- :class:`JacapDecodeController`: the forward hooks (per-request EMA query statistics,
  padding and position bookkeeping), the watermark, the atomic eviction of every layer and its fallback;
* :mod:`.events` -- :class:`EvictionEvent`, the record of what one eviction did.

Teacher-forced replay and the KL between two runs are measurements (:mod:`jacap_lib.measure.replay`,
:func:`jacap_lib.measure.quality.kl_from_logits`); the beta analysis of an EMA stream is statistics
(:func:`jacap_lib.stats.ema_trace`, :func:`jacap_lib.stats.ema_tradeoff`).
"""
from __future__ import annotations

from .decode import JacapDecodeController
from .events import EvictionEvent

__all__ = ["JacapDecodeController", "EvictionEvent"]
