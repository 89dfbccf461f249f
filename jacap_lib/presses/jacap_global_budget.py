r"""One budget for the whole model: top-k of Jacap's marginal capacity across every layer and KV head.

Jacap's objective adds over the heads and layers of the model (one :math:`\tfrac12\log\det A` per head), so the
capacity a token's removal costs, :math:`-\tfrac12\log(1-r_i)`, is comparable across all of them
(:func:`~jacap_lib.presses.jacap_ablation.marginal_capacity`). kvpress ``AdaKVPress`` allocates one layer's budget
across its heads; this wrapper allocates the model's: it scores every layer during the prefill without evicting, and
once the last layer has been scored keeps the top ``L * H_kv * n_kept(N, c)`` slots over all of them, masking the
others (kvpress's per-head masks, ``module.masked_key_indices``, as AdaKV does; the cache tensors keep every slot).
A layer's prefill output does not depend on the compression of any layer (kvpress compresses after the layer's own
attention), so deciding after the last layer loses nothing. Sink and window slots (scored with the largest finite
value) stay in every head. The allocation needs one prefill of the whole prompt (no ``ChunkPress``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from transformers import Gemma3ForConditionalGeneration

from ..hf import decoder_layers_of
from ..selection import n_kept

__all__ = ["JacapGlobalBudgetPress"]


@dataclass
class JacapGlobalBudgetPress(BasePress):
    """Model-wide top-k of ``press``'s scores (a Jacap scorer scoring the marginal capacity, which makes scores
    of different layers comparable), applied as kvpress per-head masks.

    Parameters
    ----------
    press : ScorerPress
        The scorer; its ``compression_ratio`` sets the budget (the mean over layers and heads).
    """

    press: ScorerPress
    _scores: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _attn: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # layer_idx -> hooked module

    def __post_init__(self):
        if not isinstance(self.press, ScorerPress):
            raise ValueError(f"press must be a kvpress ScorerPress (e.g. JacapAblationPress), got {type(self.press)}")

    @property
    def compression_ratio(self):
        return self.press.compression_ratio

    @compression_ratio.setter
    def compression_ratio(self, value):
        self.press.compression_ratio = value

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)
        # the layers kvpress hooks (BasePress.__call__: all, but Gemma3's sliding-window layers)
        gemma3 = isinstance(model, Gemma3ForConditionalGeneration)
        self._attn = {layer.self_attn.layer_idx: layer.self_attn for layer in decoder_layers_of(model)
                      if not (gemma3 and layer.self_attn.is_sliding)}
        self._scores = {}

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.compression_ratio == 0:
            return keys, values
        if module.config._attn_implementation == "eager":
            raise ValueError("the model-wide budget masks keys through kvpress's attention patch, which eager "
                             "attention does not use: load the model with attn_implementation='sdpa'")
        if module.layer_idx in self._scores:
            self._scores = {}  # a new prefill (the last one was interrupted before its last layer)
        self._scores[module.layer_idx] = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        if len(self._scores) == len(self._attn):
            self._allocate()
        return keys, values

    def _allocate(self) -> None:
        """Mask the bottom slots over all layers and heads, per batch row."""
        layers = sorted(self._scores)
        scores = torch.stack([self._scores[i].float() for i in layers], dim=1)  # (B, L, H, N)
        self._scores = {}
        b, n_layers, h, n = scores.shape
        n_pruned = n_layers * h * (n - n_kept(n, self.compression_ratio))
        flat = scores.reshape(b, -1)
        idx = torch.topk(-flat, n_pruned, dim=1).indices  # (B, n_pruned)
        batch = torch.arange(b, device=idx.device).repeat_interleave(n_pruned)
        idx = idx.flatten()
        layer, rest = idx // (h * n), idx % (h * n)
        head, pos = rest // n, rest % n
        for j, li in enumerate(layers):
            sel = layer == j
            self._attn[li].masked_key_indices = (batch[sel], head[sel], pos[sel])

