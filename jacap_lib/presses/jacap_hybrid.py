r"""Hybrid Jacap (note §14.3, "protect globally important saturated tokens").

A token whose centre probability saturates (:math:`\bar\alpha_i\to1`) has a vanishing Jacobian
weight, yet deleting it can change the output the most (note §13.3, §19.1). The hybrid mixes the
Jacap score with a global-importance score, each normalised to sum to one per head:

.. math::  s_i = \lambda\,\frac{r_i}{\sum_j r_j} + (1-\lambda)\,\frac{g_i}{\sum_j g_j}

with :math:`g` the attention the last prompt window paid to token i (kvpress SnapKV's score,
``global_score="snapkv"``) or the key norm (``"keynorm"``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress import SnapKVPress

from . import utils
from .jacap import TemperedCentrePress

__all__ = ["JacapHybridPress"]


@dataclass
class JacapHybridPress(TemperedCentrePress):
    """JacapPress mixed with a global-importance score.

    Parameters
    ----------
    lam_mix : float, default=0.5
        Weight of the (normalised) Jacap score; ``1 - lam_mix`` goes to the global score.
    global_score : {"snapkv", "keynorm"}, default="snapkv"
        ``"snapkv"``: observed attention of the last ``snap_window`` prompt queries (kvpress SnapKV,
        pooled over the query heads of each KV head); ``"keynorm"``: ``||k_i||``. With fewer than two
        queries available (a one-step ``DecodingPress`` buffer) ``"snapkv"`` falls back to ``"keynorm"``.
    snap_window : int, default=64
        Observation window of the SnapKV score (capped at half the prompt).
    (all other parameters: see :class:`~jacap_lib.presses.jacap.JacapPress`)
    """

    lam_mix: float = 0.5
    global_score: str = "snapkv"
    snap_window: int = 64

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.lam_mix, bool) or not (isinstance(self.lam_mix, (int, float)) and 0 <= self.lam_mix <= 1):
            raise ValueError(f"lam_mix must be in [0, 1], got {self.lam_mix!r}")
        if self.global_score not in ("snapkv", "keynorm"):
            raise ValueError(f"global_score must be 'snapkv' or 'keynorm', got {self.global_score!r}")
        if isinstance(self.snap_window, bool) or not (isinstance(self.snap_window, int) and self.snap_window > 0):
            raise ValueError(f"snap_window must be a positive int, got {self.snap_window!r}")

    def global_scores(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """Non-negative global importance ``(B, H_kv, N)``."""
        window = min(self.snap_window, hidden_states.shape[1] // 2, keys.shape[-2] - 1)
        if self.global_score == "keynorm" or window < 1:
            # fewer than two queries (e.g. DecodingPress with a one-step buffer): no observation window
            return keys.float().norm(dim=-1)
        # SnapKV rotates the window's queries with kwargs["position_embeddings"][:, -window:]: hand it
        # the rows' own positions (a chunk or a decoding buffer is not where the step's embeddings are)
        query_pos, _, _ = utils.hook_positions(hidden_states, keys, kwargs)
        cos, sin = module.rotary_emb(hidden_states, query_pos[None].to(hidden_states.device))
        snap = SnapKVPress(compression_ratio=0.0, window_size=window)  # the ratio is not used by score()
        snap_kwargs = {**kwargs, "position_embeddings": (cos, sin)}
        return snap.score(module, hidden_states, keys, values, attentions, snap_kwargs).float().clamp_min(0)

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        mu, lam = self.query_statistics(module, hidden_states, keys, kwargs)
        r = self.token_scores(keys, values, mu, lam, module).float()
        g = self.global_scores(module, hidden_states, keys, values, attentions, kwargs)
        tiny = torch.finfo(torch.float32).tiny
        mixed = self.lam_mix * r / r.sum(-1, keepdim=True).clamp_min(tiny) + (1 - self.lam_mix) * g / g.sum(
            -1, keepdim=True).clamp_min(tiny)
        return self.protect(mixed, hidden_states, keys, kwargs)
