"""What one eviction of the decode-time controller did: :class:`EvictionEvent` (one per eviction)."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EvictionEvent"]


@dataclass
class EvictionEvent:
    """What one eviction did (one entry of :attr:`JacapDecodeController.events`).

    Counts are cache *slots* per layer and KV head (all layers and rows hold the same number).
    ``age_counts`` histograms the age (current position minus original position) of the real
    tokens kept, pooled over layers, KV heads and rows, with bin edges ``age_edges``.
    ``entropy_before/after`` is the attention entropy (nats) of the step's last query over the
    cache before and after, averaged over layers, query heads and rows.
    """

    step: int
    seq_len: int
    tokens_before: int
    tokens_after: int
    method: str
    seconds: float
    kv_bytes_before: int
    kv_bytes_after: int
    entropy_before: float
    entropy_after: float
    age_edges: list
    age_counts: list
    mean_age_kept: float
    fallback_reason: str | None = None
    fallback_layers: list = field(default_factory=list)
    kept_positions: list | None = None  # per layer LongTensor (b, H_kv, budget) when record_kept=True

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "kept_positions"}
        return d
