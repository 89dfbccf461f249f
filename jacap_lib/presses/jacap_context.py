r"""JacapPress, the library's default: Jacap's capacity score with the context itself as the query prior (kvpress
KVzip's machinery).

``JacapPress()``'s defaults are the row ``jacap_default`` of the preset table
(:data:`jacap_lib.presses.presets.PRESETS`), which says where they came from. The press reads the context twice
(the prompt, then the reconstruction pass below), so its prefill costs several uncompressed prefills; the book
measures how many. The one-prefill press is :class:`~jacap_lib.presses.jacap.JacapPromptPress` (Algorithm 1 on the
prompt's own recent queries), which also works inside kvpress's wrappers; this press masks keys across heads and
layers after the prefill, so it is used on its own (``with press(model): model(...)``, or kvpress's pipeline).

kvpress's :class:`~kvpress.KVzipPress` prefills the prompt, then feeds "Repeat the previous context exactly." and
the context again (the *reconstruction pass*) under hooks, and scores every cached KV pair by the largest attention
a reconstruction query pays it; the lowest scores are masked (kvpress's ``masked_key_indices``) across layers and
heads. This press keeps that pass and changes, one knob each, what the prompt press
(:class:`~jacap_lib.presses.jacap.JacapPromptPress`) and KVzip differ in:

* ``summary``: how the reconstruction queries are summarised. ``"max"``: KVzip's own score (the max attention).
  ``"jacap"``: per KV head, the mean :math:`\mu_Q` and diagonal covariance :math:`\Lambda_Q` of the post-RoPE queries
  of the reconstruction tokens, pooled over the group's query heads (sums accumulated over the chunks), then
  Algorithm 1's :math:`r_i = (w_i/\sigma^2)\, u_i^\top A^{-1} u_i` of every context key
  (:func:`jacap_lib.scoring.core.validated_scores`), linearised at the centre ``centre``.
* ``budget``: ``"global"`` (KVzip: the lowest scores across all layers and heads), ``"layer"`` (KVzip's
  ``layerwise=True``: the same count per layer) or ``"head"`` (every KV head masks ``int(N * compression_ratio)``
  of its lowest scores, Jacap's uniform budget; protected slots never).
* ``window``: the last ``window`` prompt tokens protected by Jacap's rule (:func:`jacap_lib.presses.utils.protection`);
  0 is KVzip's protection (its ``n_sink`` sinks only).

Jacap's scores are marginal capacity gains: the objective is a sum over heads (and layers) of each head's log-det
capacity, and :math:`r_i` is what keeping token ``i`` adds to its head's term, so a global or per-layer budget
compares the scores of different heads and layers directly, as KVzip's global budget compares attentions.

The scoring (the reconstruction pass) does not depend on ``compression_ratio``, ``budget`` nor ``window``: those are
read by :meth:`compress_post` only, so one scoring serves them all (:func:`jacap_lib.measure.quality.scores_once`,
:func:`~jacap_lib.measure.quality.post_fields`).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from kvpress import KVzipPress
from kvpress.utils import get_prerope_query_states

from .. import _checks, config
from ..cache.press import freeing_memory
from ..config import DEFAULTS
from ..hf import apply_rope
from ..scoring.core import validated_scores
from ..selection import budget_split
from . import utils
from .jacap import CENTRES

__all__ = ["JacapPress", "SUMMARIES", "BUDGETS"]

#: how the reconstruction queries are summarised: Jacap's statistics and Algorithm 1, or KVzip's max attention
SUMMARIES = ("jacap", "max")
#: how the masked count is split: across layers and heads (KVzip), per layer (KVzip layerwise), per KV head (Jacap)
BUDGETS = ("global", "layer", "head")


@dataclass
class JacapPress(utils.BudgetSplit, KVzipPress):
    r"""Jacap KV-cache eviction (Yang et al., arXiv 2609.08131) with KVzip's reconstruction pass as the query prior;
    the library's default (see the module: the reconstruction pass, the knobs it adds to KVzip, the one-prefill
    press).

    Parameters
    ----------
    compression_ratio : float, default=0.0
        Fraction of the cached KV pairs masked (kvpress convention).
    summary : {"jacap", "max"}, default="jacap"
        ``"jacap"``: Algorithm 1's score with :math:`(\mu_Q, \Lambda_Q)` of the reconstruction queries (post-RoPE,
        each at its own position, pooled over the KV head's query heads, flat weights). ``"max"``: KVzip's score.
    budget : {"global", "layer", "head"}, default="global"
        ``"global"``: KVzip's (lowest scores masked across all layers and heads); ``"layer"``: KVzip's
        ``layerwise=True``; ``"head"``: every (layer, KV head) masks ``int(N * compression_ratio)`` of its lowest
        scores (fewer when protected slots would be among them). Jacap's scores are marginal capacity gains and the
        capacity adds over heads and layers, so the global and per-layer budgets compare them directly.
    centre : {"observed", "tempered", "ea"}, default="observed"
        With ``summary="jacap"``, where the attention is linearised. ``"observed"``: the attention the
        reconstruction queries actually paid each key (KVzip's cross-attention of the pass), averaged with
        :math:`\mu_Q`'s flat weights over those queries and the KV head's query heads, as JacapPromptPress's default
        centre averages the recent prompt queries' rows. ``"tempered"``: Algorithm 1's
        :math:`\mathrm{softmax}(K\mu_Q/(\tau\sqrt d))`; ``"ea"``: Expected Attention's
        (:func:`jacap_lib.scoring.core.centre_attention`).
    tau : float, default=3.0
        Temperature of the tempered centre (unused by the others); JacapPromptPress's default.
    noise : float, default=1.0
        Channel noise :math:`\sigma^2` (> 0); JacapPromptPress's default. The effective-dimension rule (``"deff"``) needs a
        per-head budget and is refused.
    eps : float, default=1e-6
        Floor of :math:`\mathrm{diag}(\Lambda_Q)`.
    window : int, default=64
        Last prompt tokens never masked, by Jacap's protection rule; 0: KVzip's protection (the sinks only).
    n_sink, chunk_size, kvzip_plus_normalization
        kvpress KVzip's (``kvzip_plus_normalization`` changes the ``"max"`` summary only). ``layerwise`` must stay
        False: set ``budget="layer"``.
    free_memory : bool, default=True
        After choosing, turn the cache ragged (:func:`jacap_lib.cache.press.freeing_memory`): it holds only the kept
        entries of each head, about ``1 - compression_ratio`` of the bytes. False leaves kvpress's masked cache
        (every byte kept, the dropped keys masked), the path the measurements ran (the registry builds it). The
        kept set and the logits (to float rounding) are the same either way; it is not part of a press's record.
    """

    summary: str = "jacap"
    budget: str = "global"
    centre: str = "observed"
    tau: float = DEFAULTS.tau
    noise: float = DEFAULTS.noise
    eps: float = DEFAULTS.eps
    window: int = 64
    #: how the choice is applied, not what is chosen: kept out of every record (registry.method_options)
    free_memory: bool = field(default=True, compare=False, metadata={"runtime": True})
    #: the scores the last compression ranked, ``(L, B, H_kv, N)`` float32, protection not applied (for inspection)
    last_scores: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    #: the centres this press can linearise at (as the prompt press's; the live widget offers them)
    centres: ClassVar[tuple] = CENTRES
    #: the fields only :meth:`compress_post` reads (one scoring serves every value; quality.post_fields)
    post_only: ClassVar[tuple] = ("compression_ratio", "budget", "window", "layerwise")

    def __post_init__(self):
        _checks.compression_ratio(self.compression_ratio)
        _checks.choice("summary", self.summary, SUMMARIES)
        _checks.choice("budget", self.budget, BUDGETS)
        _checks.choice("centre", self.centre, self.centres)
        config.check("tau", self.tau)
        if isinstance(self.noise, str):
            raise ValueError(f"noise must be a number > 0 (the effective-dimension rule 'deff' needs a per-head budget, "
                             f"which a global budget has not); got {self.noise!r}")
        config.check("noise", self.noise)
        config.check("eps", self.eps)
        _checks.nonneg_int("window", self.window)
        _checks.nonneg_int("n_sink", self.n_sink)
        _checks.int_at_least("chunk_size", self.chunk_size, 1)
        _checks.boolean("kvzip_plus_normalization", self.kvzip_plus_normalization)
        _checks.boolean("layerwise", self.layerwise)
        _checks.boolean("free_memory", self.free_memory)
        if self.layerwise:
            raise ValueError("layerwise=True is KVzip's per-layer budget: set budget='layer' instead (layerwise must "
                             "stay False)")
        kvzip_log = logging.getLogger(KVzipPress.__module__)  # kvpress's fixed "2-3 times the prefilling cost" note
        cost_note = lambda record: "prefilling cost" not in record.getMessage()  # noqa: E731 (measured: the module)
        kvzip_log.addFilter(cost_note)
        try:
            super().__post_init__()
        finally:
            kvzip_log.removeFilter(cost_note)

    def __call__(self, model):
        """KVzip's context manager (prefill, then the reconstruction pass and the choice at its exit); with
        ``free_memory`` the cache is then turned ragged, holding only the kept entries."""
        inner = _tokenizer_found(model, super().__call__(model))
        return freeing_memory(model, inner) if self.free_memory else inner

    # ---- state of one scoring -------------------------------------------------------------------------------
    def _reset_internal_parameters(self):
        super()._reset_internal_parameters()
        self._q_sum = self._q_square = self._q_count = None
        self._attn_sum = self._attn_count = None
        self._cross_attention = None

    def _perform_kvzip_compression(self, model, tokenizer):
        """KVzip's scoring and masking; if it fails, the cache is cut back to the prefill's context and no mask is
        left, so a failing press leaves the cache as the prefill wrote it."""
        batch, n = self._context_ids.shape[:2]
        if batch != 1:
            raise ValueError(f"JacapPress compresses one prompt at a time (its second reading repeats one context); "
                             f"got a batch of {batch} prompts: run them one by one")
        if n <= self.n_sink or budget_split(n, self.compression_ratio, self.n_sink, 0)["scored"] <= 0:
            return  # too short to compress: every token is a sink or the budget keeps them all, so the prompt is kept whole
        try:
            super()._perform_kvzip_compression(model, tokenizer)
        except BaseException:
            n = self.context_length
            for layer in getattr(self._cache, "layers", []):
                if getattr(layer, "keys", None) is not None and layer.keys.shape[-2] > n:
                    layer.keys, layer.values = layer.keys[:, :, :n].contiguous(), layer.values[:, :, :n].contiguous()
            for layer in model.model.layers:
                layer.self_attn.masked_key_indices = None
            raise

    def prepare(self, model, tokenizer, prev_postfix_size=8):
        """KVzip's chunks and score buffer; with ``summary="jacap"`` also the query sums and observed-attention
        sums, and a float32 score buffer (Algorithm 1's scores span many decades)."""
        pairs = super().prepare(model, tokenizer, prev_postfix_size)
        self.last_scores = None
        if self.summary == "jacap":
            n_layer, b, h, n = self.score_val.shape
            d = model.config.head_dim if getattr(model.config, "head_dim", None) else (
                model.config.hidden_size // model.config.num_attention_heads)
            dev = self.score_val.device
            self.score_val = self.score_val.float()
            self._q_sum = torch.zeros(n_layer, b, h, d, dtype=torch.float64, device=dev)
            self._q_square = torch.zeros_like(self._q_sum)
            self._q_count = torch.zeros(n_layer, dtype=torch.float64, device=dev)
            self._attn_sum = torch.zeros(n_layer, b, h, n, dtype=torch.float64, device=dev)
            self._attn_count = torch.zeros(n_layer, 1, 1, n, dtype=torch.float64, device=dev)
        return pairs

    def _compute_cross_attention(self, module, hidden_states, keys, kwargs):
        """KVzip's cross-attention of the reconstruction queries, kept for the observed centre."""
        attn = super()._compute_cross_attention(module, hidden_states, keys, kwargs)
        self._cross_attention = attn
        return attn

    # ---- the scoring ------------------------------------------------------------------------------------------
    def score_kvzip(self, module, hidden_states, keys, values, attentions, kwargs):
        """KVzip's scoring of one chunk (its max attention into ``score_val``, the cache cut back to the context);
        with ``summary="jacap"`` also the sums of the reconstruction queries' moments and attention, and, after the
        last chunk, Algorithm 1's scores of the layer's context keys in place of the max attention."""
        sink, start, end = min(self.n_sink, self.start_idx), self.start_idx, self.end_idx
        keys, values = super().score_kvzip(module, hidden_states, keys, values, attentions, kwargs)
        if self.summary != "jacap":
            return keys, values
        layer = int(module.layer_idx)
        b, t, _ = hidden_states.shape
        h_kv = keys.shape[1]
        cos, sin = kwargs["position_embeddings"]
        q = apply_rope(module, get_prerope_query_states(module, hidden_states), cos, sin).double()  # (B, H_q, T, d)
        q = utils.group_query_heads(q, h_kv)  # (B, H_kv, G*T, d)
        self._q_sum[layer] += q.sum(-2)
        self._q_square[layer] += q.square().sum(-2)
        self._q_count[layer] += q.shape[-2]
        attn = self._cross_attention  # (B, H_kv, G, T, sink + chunk + T)
        g = attn.shape[2]
        self._attn_sum[layer][..., :sink] += attn[..., :sink].double().sum((2, 3))
        self._attn_sum[layer][..., start:end] += attn[..., sink: sink + end - start].double().sum((2, 3))
        self._attn_count[layer][..., :sink] += g * t
        self._attn_count[layer][..., start:end] += g * t
        self._cross_attention = None
        if end >= self.context_length:  # the last chunk: this layer's statistics are complete
            self.score_val[layer] = self.jacap_scores(layer, keys, values).to(self.score_val.dtype)
        return keys, values

    def query_statistics(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu, lam)`` of layer ``layer``'s reconstruction queries so far, ``(B, H_kv, d)`` float32 each:
        the pooled mean and the diagonal variance floored at ``eps``."""
        n = self._q_count[layer]
        mu = self._q_sum[layer] / n
        lam = (self._q_square[layer] / n - mu.square()).clamp_min(self.eps)
        return mu.float(), lam.float()

    def centre_of(self, layer: int) -> torch.Tensor | None:
        """The observed centre ``(B, H_kv, N)`` (0 where no reconstruction query looked), else ``None``."""
        if self.centre != "observed":
            return None
        count = self._attn_count[layer]
        return torch.where(count > 0, self._attn_sum[layer] / count.clamp_min(1), 0.0).float()

    def jacap_scores(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Algorithm 1's score ``(B, H_kv, N)`` of the context keys of ``layer`` with the reconstruction queries'
        statistics (:func:`jacap_lib.scoring.core.validated_scores`, ``u = v``)."""
        mu, lam = self.query_statistics(layer)
        alpha = self.centre_of(layer)
        centre = "tempered" if alpha is not None else self.centre
        parts = validated_scores(keys, values, mu.to(keys.device), lam.to(keys.device), tau=float(self.tau),
                                 noise=float(self.noise), backend="torch", alpha=alpha, centre=centre)
        return parts.score

    # ---- the masks --------------------------------------------------------------------------------------------

    def protected(self, n: int, device=None) -> torch.Tensor:
        """Boolean ``(N,)``: KVzip's ``n_sink`` sinks and the last ``window`` prompt tokens. With ``budget="head"``
        by Jacap's rule (:func:`jacap_lib.presses.utils.protection`: fitted to the head's budget
        ``n_kept(N, ratio)``, the window shrunk first); with a global or per-layer budget, which no single head's
        budget bounds, whole, as KVzip protects its sinks."""
        dummy_states, dummy_keys = torch.empty(1, n, 0, device=device), torch.empty(1, 1, n, 1, device=device)
        sinks = torch.zeros(n, dtype=torch.bool, device=device)
        sinks[: self.n_sink] = True
        if not self.window:
            return sinks
        if self.budget != "head":
            return sinks | utils.protected_slots(n, 0, self.window, device=device)
        mask, _ = utils.protection(dummy_states, dummy_keys, {}, n_sink=self.n_sink, window=self.window,
                                   compression_ratio=self.compression_ratio)
        return sinks | mask.to(device)

    def compress_post(self, model):
        """The masks from ``score_val``: KVzip's (``budget="global"``/``"layer"``, the protected window raised to
        KVzip's sink score first) or ``int(N * ratio)`` per KV head (``budget="head"``)."""
        if self.compression_ratio <= 0:
            return
        self.last_scores = self.score_val.float().clone()
        n_layer, bsz, heads, n = self.score_val.shape
        protected = self.protected(n, self.score_val.device)
        if self.budget != "head":
            if self.window:
                self.score_val[..., protected] = self.score_val.amax() + 1.0
            self.layerwise = self.budget == "layer"
            try:
                return super().compress_post(model)
            finally:
                self.layerwise = False
        n_mask = min(int(n * self.compression_ratio), n - int(protected.sum()))
        scores = self.score_val.float().masked_fill(protected, float("inf"))
        for layer in model.model.layers:
            module = layer.self_attn
            idx = torch.topk(-scores[int(module.layer_idx)], n_mask, dim=-1).indices  # (B, H, n_mask)
            batch = torch.arange(bsz).repeat_interleave(heads * n_mask)
            head = torch.arange(heads).repeat_interleave(n_mask).repeat(bsz)
            module.masked_key_indices = (batch, head, idx.flatten().cpu())


@contextlib.contextmanager
def _tokenizer_found(model, inner):
    """KVzip's context manager ``inner``, with kvpress's ``OSError`` for a tokenizer it cannot load by the model's
    name (``model.config.name_or_path``) turned into a ``ValueError`` that says how to give one."""
    try:
        inner.__enter__()
    except OSError as err:
        name = getattr(model.config, "name_or_path", None)
        raise ValueError(f"JacapPress reads the context a second time, so it needs the model's tokenizer; kvpress loads "
                         f"it by the model's name, model.config.name_or_path = {name!r}, and could not find it. Save "
                         f"the tokenizer next to the model (tokenizer.save_pretrained(folder)) and set "
                         f"model.config.name_or_path = folder (or a Hugging Face id that has it)") from err
    try:
        yield
    except BaseException as err:
        if not inner.__exit__(type(err), err, err.__traceback__):
            raise
    else:
        inner.__exit__(None, None, None)
