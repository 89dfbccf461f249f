r"""Jacap with its centre replaced by the attention the prompt's last queries actually paid: one knob of the
critique's anatomy (not a registry method).

:class:`JacapObservedPress` is :class:`~jacap_lib.presses.jacap.JacapPress` except for one quantity: the centre
:math:`\bar\alpha_i = \mathrm{softmax}_i(k_i^\top\mu_Q/(\tau\sqrt d))` becomes the attention of the last
``obs_window`` prompt queries to token ``i`` (kvpress's ``SnapKVPress.compute_window_attention``: true RoPE
positions, causal), averaged over those queries and over the query heads of the KV head. The sensitivity weight
:math:`w_i = [\bar\alpha_i(1-\bar\alpha_i)]^2 k_i^\top\Lambda_Q k_i / d`, the leverage and the protection are
Jacap's. kvpress's window attention leaves out the window's own keys: they get :math:`\bar\alpha = 0` (weight 0);
with ``window >= obs_window`` they are protected, so only their share of ``A`` changes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress import SnapKVPress

from .. import _checks
from ..scoring.core import leverage
from .jacap import TemperedCentrePress

__all__ = ["JacapObservedPress"]


@dataclass
class JacapObservedPress(TemperedCentrePress):
    """Jacap's score with :math:`\\bar\\alpha` = the observed attention of the last ``obs_window`` prompt queries
    (``gqa="pool"`` and a numeric ``noise`` only)."""

    obs_window: int = 32

    def __post_init__(self):
        super().__post_init__()
        _checks.int_at_least("obs_window", self.obs_window, 1)
        if self.gqa != "pool" or isinstance(self.noise, str) or self.use_out_proj:
            raise ValueError("JacapObservedPress supports gqa='pool', a numeric noise and use_out_proj=False only")

    def observed_alpha(self, module, hidden_states, keys, kwargs) -> torch.Tensor:
        """``(B, H_kv, N)``: the last ``obs_window`` queries' attention to each key, averaged over those queries and
        the KV head's query heads (0 for the window's own keys)."""
        w = min(self.obs_window, keys.shape[-2] - 1)
        attn = SnapKVPress.compute_window_attention(module, hidden_states, keys, w, kwargs["position_embeddings"])
        b, hq, _, n = attn.shape
        hkv = keys.shape[1]
        alpha = attn.float().mean(2).view(b, hkv, hq // hkv, n).mean(2)
        return torch.nn.functional.pad(alpha, (0, keys.shape[-2] - n))

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        _, lam = self.query_statistics(module, hidden_states, keys, kwargs)
        alpha = self.observed_alpha(module, hidden_states, keys, kwargs)
        k = keys.float()
        kappa = ((k * k) @ lam.unsqueeze(-1)).squeeze(-1)
        weight = (alpha * (1 - alpha)).square() * kappa / k.shape[-1]
        noise = float(self.noise)
        scores = weight / noise * leverage(values.float(), weight, noise)
        return self.protect(scores, hidden_states, keys, kwargs)
