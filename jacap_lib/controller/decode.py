r"""Algorithm 2 of the reading note (§11): Jacap eviction *during* ``model.generate``.

:class:`JacapDecodeController` attaches three kinds of forward hooks to a transformers causal LM
and leaves ``generate`` itself untouched (no LogitsProcessor, no custom loop):

* a **pre-hook on every attention module** recomputes the step's queries, rotates them with the
  step's own RoPE ``(cos, sin)`` and folds them into per-layer, per-request EMA statistics
  (:class:`jacap_lib.stats.EMAQueryStats`, one object per layer *and batch row*, so requests never
  mix);
* a **pre-hook on the model** keeps the bookkeeping honest after an eviction: the 2-D padding mask
  handed to the model is rebuilt for the *compacted* cache slots, while ``cache_position`` and
  ``position_ids`` keep counting the true sequence (they are filled in when the caller gives none);
* a **post-hook on the model** checks the watermark every ``interval`` steps and, when needed,
  evicts every layer of the :class:`~transformers.DynamicCache` down to ``budget`` slots, scoring
  with :func:`jacap_lib.jacap_scores` and choosing with :func:`jacap_lib.select_keep`.

This is the mechanism kvpress's ``DecodingPress`` uses (hooks + replacing ``layer.keys`` /
``layer.values`` of the cache), lifted from per-layer to per-step so that an eviction is atomic:
all layers are scored first and committed together, so an exception leaves the cache untouched.

Design choices (the note leaves them open; they are the things to report when reproducing):

* **Post-RoPE query statistics.** The cache holds keys already rotated to their own positions, so
  :math:`q_t^\top k_i` between *rotated* vectors is the real logit. The EMA therefore runs on rotated
  queries. Low-frequency RoPE pairs barely turn between steps and keep a sharp mean; high-frequency
  pairs spin, their EMA mean shrinks and their spread moves into :math:`\Lambda_Q` -- which is what a
  Gaussian model of "the next few queries" should say. Cached keys are never re-rotated.
* **GQA.** One KV head serves ``G`` query heads. Its :math:`\mu_Q` is the mean of the group's EMA
  means and its :math:`\Lambda_Q` the variance of the equal mixture of the group's Gaussians
  (mean of second moments minus squared mean), floored at ``eps``.
* **Watermark and interval.** The controller only looks every ``interval`` steps (prefill = step 0).
  At a look it evicts when the cache would otherwise pass ``high`` before the next look
  (``length + interval > high``), down to ``budget``; hence ``budget + interval <= high`` is required
  and the cache never holds more than ``high`` slots once the prompt has been absorbed.
* **Protected tokens.** The first ``max(n_sink, prefix)`` real tokens of each request (attention sinks
  and the system prefix both sit at the start) and the last ``window`` tokens are always kept.
* **Fallback.** If Cholesky fails (:class:`jacap_lib.scoring.CholeskyFailure`) or the eviction runs
  past ``deadline_s``, the affected layers keep the protected prefix plus the most recent tokens
  (a sliding window). This is warned about and recorded in :attr:`EvictionEvent.fallback_reason`.
* **Padding.** Left padding (what batched ``generate`` uses) is supported: pad slots are dropped
  first and scoring only sees a row's real tokens. Right padding is refused.
* **Decoding modes.** Greedy decoding and sampling. Beam search reorders batch rows inside the
  cache and is refused (the per-request statistics would no longer match their rows).
"""
from __future__ import annotations

import math
import time
import warnings

import torch

from .. import _checks, config
from .. import scoring as _scoring
from .. import selection as _select
from ..config import DEFAULTS
from ..hf import apply_rope, attention_modules
from ..stats import EMAQueryStats, moment_stats
from .events import EvictionEvent

__all__ = ["JacapDecodeController"]


class JacapDecodeController:
    r"""Jacap eviction during ``model.generate`` (Algorithm 2).

    Parameters
    ----------
    model : a transformers causal LM with RoPE attention (Llama, Qwen2/3, Mistral, ...).
    high : int
        High watermark: the cache never holds more than ``high`` slots after the prompt.
    budget : int
        Slots kept after an eviction (``budget + interval <= high``).
    interval : int, default 16
        The controller looks every ``interval`` steps (K in the note), not every token.
    beta : float or None, default 0.9
        EMA factor of the query statistics: large = stable but lagging, small = responsive but noisy.
        ``None``: flat (cumulative) statistics -- the mean and variance of every query seen so far, each
        weighing the same (the ablation of the EMA; everything else unchanged).
    eps : float, default 1e-6
        Floor of the diagonal query variance.
    n_sink : int, default 4
        Leading tokens always kept (attention sinks).
    prefix : int, default 0
        Length of a system prefix to protect; the protected head is ``max(n_sink, prefix)`` tokens.
    window : int, default 32
        Most recent tokens always kept.
    tau, noise : float
        Temperature and channel noise of :func:`jacap_lib.jacap_scores` (defaults: ``config.DEFAULTS``, tau 3 and 1).
        ``noise="deff"``: per layer and KV head, the :math:`\sigma^2` at which :math:`\sum_i r_i` equals
        ``deff_frac * min(budget, head_dim)`` (the effective-dimension rule, :func:`jacap_lib.scoring.deff_noise`).
    deff_frac : float, default 0.25
        Target effective dimension of the ``"deff"`` rule as a fraction of ``min(budget, head_dim)``.
    deadline_s : float or None
        Per-eviction time budget; layers not scored in time fall back to a sliding window.
    age_bins : int, default 16
        Number of bins of the token-age histogram of each event.
    record_kept : bool, default False
        Keep the original positions of the kept tokens of every layer in each event (for tests
        and figures; costs memory).
    record_layers : tuple of int
        Layers whose rotated queries are logged every step in :attr:`query_log` (for the β study).
    backend : str
        ``backend`` argument of :func:`jacap_lib.jacap_scores`.

    Use it as a context manager around ``generate`` (hooks are removed on exit)::

        ctrl = JacapDecodeController(model, high=256, budget=192, interval=16, beta=0.9)
        with ctrl:
            out = model.generate(**inputs, max_new_tokens=400, do_sample=False)
        ctrl.events, ctrl.trace
    """

    def __init__(self, model, *, high: int, budget: int, interval: int = 16, beta: float | None = DEFAULTS.decode_beta,
                 eps: float = DEFAULTS.eps, n_sink: int = DEFAULTS.n_sink, prefix: int = 0,
                 window: int = DEFAULTS.window, tau: float = DEFAULTS.tau, noise: float | str = DEFAULTS.noise,
                 deff_frac: float = DEFAULTS.deff_frac, deadline_s: float | None = None, age_bins: int = 16,
                 record_kept: bool = False, record_layers: tuple = (), backend: str = DEFAULTS.backend):
        self.high = _checks.nonneg_int("high", high)
        self.budget = _checks.nonneg_int("budget", budget)
        self.interval = _checks.nonneg_int("interval", interval)
        if self.interval < 1:
            raise ValueError("`interval` must be >= 1 (1 = look at every step)")
        if self.budget < 1:
            raise ValueError("`budget` must be >= 1")
        if self.budget + self.interval > self.high:
            raise ValueError(
                f"`budget` + `interval` = {self.budget + self.interval} exceeds `high` = {self.high}: between two looks "
                f"the cache grows by `interval`, so lower `budget` or `interval`, or raise `high`")
        # Jacap's shared parameters: one rule each (jacap_lib.config)
        self.beta = config.check("decode_beta", beta, name="beta")
        self.eps = config.check("eps", eps)
        self.n_sink = config.check("n_sink", n_sink)
        self.prefix = _checks.nonneg_int("prefix", prefix)
        self.window = config.check("window", window)
        self.head = max(self.n_sink, self.prefix)
        # the protection rule of the press and select_keep (sinks first, then the window shrunk to fit); the budget
        # is fixed here, so a protected set that does not fit is refused now rather than cut at every eviction
        fit = _select.fit_protection(self.budget, self.head, self.window)
        if fit.note is not None:
            raise ValueError(
                f"`budget` = {self.budget} is smaller than the protected tokens (max(n_sink, prefix) = {self.head} + "
                f"window = {self.window}); raise `budget` or shrink `n_sink`/`prefix`/`window`")
        self.tau = config.check("tau", tau)
        self.noise = config.check("noise", noise)
        self.deff_frac = config.check("deff_frac", deff_frac)
        self.deadline_s = None if deadline_s is None else _checks.positive("deadline_s", deadline_s, allow_zero=True)
        self.age_bins = _checks.nonneg_int("age_bins", age_bins)
        if self.age_bins < 1:
            raise ValueError("`age_bins` must be >= 1")
        self.record_kept = _checks.boolean("record_kept", record_kept)
        self.backend = config.check("backend", backend)

        self.model = model
        self.attn_modules = self._find_attention(model)
        n_layers = len(self.attn_modules)
        if isinstance(record_layers, (str, bytes)) or not hasattr(record_layers, "__iter__"):
            raise ValueError(f"`record_layers` must be a tuple of layer indices, got {record_layers!r}")
        layers = []
        for i in record_layers:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers:
                raise ValueError(f"`record_layers` must hold layer indices in [0, {n_layers}), got {record_layers!r}")
            layers.append(i)
        self.record_layers = tuple(layers)
        cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        self.n_q_heads = cfg.num_attention_heads
        self.n_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.group = self.n_q_heads // self.n_kv_heads
        self._handles = []
        self.reset()

    # ------------------------------------------------------------------ hooks
    @staticmethod
    def _find_attention(model) -> list:
        if not hasattr(model, "named_modules") or not hasattr(model, "config"):
            raise ValueError(f"`model` must be a transformers causal LM (Llama, Qwen2/3, Mistral, ...), got "
                             f"{type(model).__name__}")
        return attention_modules(model)

    def attach(self) -> "JacapDecodeController":
        if self._handles:
            raise ValueError("controller is already attached; call detach() first")
        self._handles.append(self.model.register_forward_pre_hook(self._model_pre, with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._model_post, with_kwargs=True))
        for m in self.attn_modules:
            self._handles.append(m.register_forward_pre_hook(self._attn_pre, with_kwargs=True))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self.attach()

    def __exit__(self, *exc):
        self.detach()
        return False

    def reset(self) -> None:
        """Forget the current request (statistics, positions, events, trace)."""
        self.events: list[EvictionEvent] = []
        self.trace: list[tuple[int, int, int]] = []  # (step, true sequence length, cache slots)
        self.query_log: dict[int, list] = {i: [] for i in self.record_layers}
        self._cache = None
        self._stats: dict[int, list[EMAQueryStats]] = {}
        self._last_q: dict[int, torch.Tensor] = {}
        self._slot_valid = None      # (b, L) bool: slot holds a real token (not padding)
        self._positions: dict[int, torch.Tensor] = {}  # layer -> (b, H_kv, L) original position ids
        self._seq_len = 0            # true sequence length seen (padding slots included)
        self._n_real = None          # (b,) real tokens seen per row
        self._step = -1
        self._step_ctx = None

    # ----------------------------------------------------------- public state
    @property
    def step(self) -> int:
        """Forward passes seen for the current request minus one (prefill = 0)."""
        return self._step

    def positions(self, layer: int) -> torch.Tensor:
        """Original position ids of the slots of ``layer``: ``(b, H_kv, L)`` (padding slots hold 0)."""
        if layer not in self._positions:
            raise ValueError(f"no positions for layer {layer!r}: layers are 0..{len(self.attn_modules) - 1} and are "
                             "filled by a forward pass with the controller attached")
        return self._positions[layer]

    def query_stats(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """EMA ``(mu, lam)`` per query head, ``(b, H_q, d)`` float32, for the current request."""
        if layer not in self._stats:
            raise ValueError(f"no statistics for layer {layer} yet: run a forward pass with the controller attached")
        mus = [s.mu for s in self._stats[layer]]
        lams = [s.lam for s in self._stats[layer]]
        return torch.stack(mus), torch.stack(lams)

    def kv_stats(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu, lam)`` per KV head ``(b, H_kv, d)``: the equal mixture of each GQA group's Gaussians."""
        mu_q, lam_q = self.query_stats(layer)
        return moment_stats(mu_q, lam_q + mu_q.square(), self.eps, group=self.group)

    # ------------------------------------------------------------ model hooks
    def _model_pre(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        ref = input_ids if input_ids is not None else embeds
        if ref is None:
            raise ValueError("the controller needs `input_ids` or `inputs_embeds`")
        b, q_len = ref.shape[0], ref.shape[1]
        device = ref.device
        if kwargs.get("use_cache") is False:
            raise ValueError("use_cache=False: there is no KV cache to manage; drop use_cache=False")
        cache = kwargs.get("past_key_values")
        if cache is None:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.model.config)
            kwargs["past_key_values"] = cache
        from transformers import DynamicCache

        if not isinstance(cache, DynamicCache):
            raise ValueError(f"`past_key_values` must be a transformers DynamicCache, got {type(cache).__name__}")
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            raise ValueError("sliding-window cache layers are not supported by the controller")

        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() != 2:
            raise ValueError("the controller needs a 2-D padding `attention_mask` (or none), not a 4-D mask")
        new_valid = (mask[:, -q_len:].bool() if mask is not None
                     else torch.ones(b, q_len, dtype=torch.bool, device=device))

        cached = cache.get_seq_length()
        if cached == 0:  # a new request
            self.reset()
            self._cache = cache
            self._slot_valid = torch.zeros(b, 0, dtype=torch.bool, device=device)
            self._n_real = torch.zeros(b, dtype=torch.long, device=device)
        elif cache is not self._cache:
            raise ValueError("this cache was filled without the controller: attach it before the prompt is processed")
        elif b != self._slot_valid.shape[0]:
            raise ValueError(f"batch size changed from {self._slot_valid.shape[0]} to {b} mid-request: beam search and "
                             "batch reordering are not supported (use greedy decoding or sampling)")
        if not bool(new_valid[:, -1].all()):
            raise ValueError("right padding is not supported: pad on the left (tokenizer.padding_side = 'left')")
        cache_position = kwargs.get("cache_position")
        if cache_position is None:
            cache_position = torch.arange(self._seq_len, self._seq_len + q_len, device=device)
            kwargs["cache_position"] = cache_position
        elif int(cache_position[0]) != self._seq_len:
            raise ValueError(f"`cache_position` starts at {int(cache_position[0])} but {self._seq_len} tokens were seen: "
                             "it must count the true sequence length, not the (shrunk) cache length")
        position_ids = kwargs.get("position_ids")
        if position_ids is None:
            position_ids = self._n_real[:, None] + new_valid.long().cumsum(-1) - 1
            position_ids = position_ids.masked_fill(~new_valid, 0)
            kwargs["position_ids"] = position_ids
        # the padding mask of the compacted cache slots + the new tokens
        kwargs["attention_mask"] = torch.cat([self._slot_valid, new_valid], dim=1).long()
        self._step_ctx = {"valid": new_valid, "position_ids": position_ids.expand(b, q_len), "q_len": q_len}
        return args, kwargs

    def _attn_pre(self, module, args, kwargs):
        if self._step_ctx is None:  # the attention is run outside a controlled model forward
            return None
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        cos, sin = kwargs["position_embeddings"]
        from kvpress.utils import get_prerope_query_states

        with torch.no_grad():
            q = apply_rope(module, get_prerope_query_states(module, hidden), cos, sin).float()  # (b, Hq, T, d)
        layer = module.layer_idx
        valid = self._step_ctx["valid"]
        if layer not in self._stats:
            self._stats[layer] = [EMAQueryStats(self.beta, self.eps) for _ in range(q.shape[0])]
        for r, stats in enumerate(self._stats[layer]):
            v = valid[r]
            if bool(v.all()):
                stats.update(q[r], chunk=True)
            elif bool(v.any()):
                stats.update(q[r][:, v], chunk=True)
        self._last_q[layer] = q[:, :, -1]
        if layer in self.query_log:
            self.query_log[layer].append(q.detach().cpu())
        return None

    def _model_post(self, module, args, kwargs, output):
        ctx, self._step_ctx = self._step_ctx, None
        if ctx is None:
            return output
        cache = self._cache
        q_len, valid = ctx["q_len"], ctx["valid"]
        pos = ctx["position_ids"]
        for layer in range(len(cache.layers)):
            new = pos[:, None, :].expand(-1, self.n_kv_heads, -1)
            old = self._positions.get(layer)
            self._positions[layer] = new.clone() if old is None else torch.cat([old, new], dim=-1)
        self._slot_valid = torch.cat([self._slot_valid, valid], dim=1)
        self._n_real = self._n_real + valid.sum(-1)
        self._seq_len += q_len
        self._step += 1
        length = cache.get_seq_length()
        if any(layer.get_seq_length() != length for layer in cache.layers):
            raise ValueError("cache layers hold different lengths: another press or hook is editing this cache")
        if self._step % self.interval == 0 and length + self.interval > self.high:
            self.evict()
        self.trace.append((self._step, self._seq_len, cache.get_seq_length()))
        return output

    # --------------------------------------------------------------- eviction
    def _window_keep(self, n_pad: int, length: int, b_heads: int, device) -> torch.Tensor:
        head = torch.arange(n_pad, n_pad + self.head, device=device)
        tail = torch.arange(length - (self.budget - self.head), length, device=device)
        return torch.cat([head, tail]).expand(b_heads, -1)

    def _keep_layer(self, layer: int, keys, values, pads: list, use_jacap: bool) -> torch.Tensor:
        """Kept slot indices ``(b, H_kv, budget)`` for one layer (raises CholeskyFailure from scoring)."""
        b, h, length, _ = keys.shape
        out = torch.empty(b, h, self.budget, dtype=torch.long, device=keys.device)
        mu, lam = self.kv_stats(layer) if use_jacap else (None, None)
        rows_full = [r for r in range(b) if length - pads[r] > self.budget]
        for r in range(b):
            if r not in rows_full:  # too few real tokens: keep the newest `budget` slots (pads first)
                out[r] = torch.arange(length - self.budget, length, device=keys.device).expand(h, -1)
            elif not use_jacap:
                out[r] = self._window_keep(pads[r], length, h, keys.device)
        if not use_jacap or not rows_full:
            return out
        if all(pads[r] == 0 for r in rows_full) and len(rows_full) == b:  # one batched call
            res = _scoring.validated_scores(keys, values, mu.to(keys.device), lam.to(keys.device), tau=self.tau,
                                   noise=self.noise, deff_target=self._deff_target(keys), backend=self.backend)
            return _select.select_keep(res.score, self.budget, n_sink=self.head, window=self.window)
        for r in rows_full:
            p = pads[r]
            res = _scoring.validated_scores(keys[r:r + 1, :, p:], values[r:r + 1, :, p:], mu[r:r + 1].to(keys.device),
                                   lam[r:r + 1].to(keys.device), tau=self.tau, noise=self.noise,
                                   deff_target=self._deff_target(keys), backend=self.backend)
            out[r] = _select.select_keep(res.score, self.budget, n_sink=self.head, window=self.window)[0] + p
        return out

    def _deff_target(self, keys: torch.Tensor) -> float | None:
        """``deff_frac * min(budget, head_dim)`` under ``noise="deff"``, else ``None``."""
        return self.deff_frac * min(self.budget, keys.shape[-1]) if self.noise == "deff" else None

    def _entropy(self, layer: int, keys: torch.Tensor, slot_valid: torch.Tensor) -> torch.Tensor:
        """Attention entropy (nats) of the last query per (row, query head): ``(b, H_q)``."""
        q = self._last_q[layer].to(keys.device)  # (b, Hq, d)
        k = keys.float().repeat_interleave(self.group, dim=1)  # (b, Hq, L, d)
        logits = torch.einsum("bhd,bhld->bhl", q, k) / math.sqrt(q.shape[-1])
        logits = logits.masked_fill(~slot_valid[:, None, :], float("-inf"))
        logp = torch.log_softmax(logits, dim=-1)
        return -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)

    def evict(self) -> EvictionEvent:
        """Evict every layer down to ``budget`` slots now (atomic: on error nothing changes)."""
        cache = self._cache
        if cache is None:
            raise ValueError("no request in progress: run a forward pass with the controller attached first")
        t0 = time.perf_counter()
        length = cache.get_seq_length()
        if length <= self.budget:
            raise ValueError(f"cache holds {length} <= budget = {self.budget} slots: nothing to evict")
        b = self._slot_valid.shape[0]
        pads = (length - self._slot_valid.sum(-1)).tolist()
        reason, fallback_layers, plans = None, [], []
        for layer_idx, layer in enumerate(cache.layers):
            use_jacap = True
            if self.deadline_s is not None and time.perf_counter() - t0 >= self.deadline_s:
                use_jacap = False
                reason = reason or f"deadline of {self.deadline_s:g} s exceeded before layer {layer_idx}"
            try:
                keep = self._keep_layer(layer_idx, layer.keys, layer.values, pads, use_jacap)
            except (_scoring.CholeskyFailure, torch.linalg.LinAlgError) as err:
                reason = reason or f"Cholesky failed at layer {layer_idx}: {err}"
                keep = self._keep_layer(layer_idx, layer.keys, layer.values, pads, False)
                use_jacap = False
            if not use_jacap:
                fallback_layers.append(layer_idx)
            plans.append(keep)

        # new slot validity: all rows share it (pads, if any remain, are the leading slots)
        n_pad_after = [max(self.budget - (length - p), 0) for p in pads]
        new_valid = torch.ones(b, self.budget, dtype=torch.bool, device=self._slot_valid.device)
        for r, p in enumerate(n_pad_after):
            new_valid[r, :p] = False

        # measurements (before committing; nothing here mutates state)
        cur = (self._n_real - 1).to(torch.long)  # position id of each row's newest token
        ages, ent_before, ent_after, new_kv, new_pos = [], [], [], [], []
        bytes_before = bytes_after = 0
        for layer_idx, (layer, keep) in enumerate(zip(cache.layers, plans)):
            idx = keep[..., None].expand(-1, -1, -1, layer.keys.shape[-1])
            k_new, v_new = layer.keys.gather(2, idx), layer.values.gather(2, idx)
            pos_new = self._positions[layer_idx].gather(2, keep)
            new_kv.append((k_new, v_new))
            new_pos.append(pos_new)
            bytes_before += layer.keys.numel() * layer.keys.element_size() * 2
            bytes_after += k_new.numel() * k_new.element_size() * 2
            age = (cur[:, None, None].to(pos_new.device) - pos_new)[new_valid[:, None, :].expand_as(pos_new)]
            ages.append(age.flatten().cpu())
            if layer_idx in self._last_q:
                ent_before.append(self._entropy(layer_idx, layer.keys, self._slot_valid).mean())
                ent_after.append(self._entropy(layer_idx, k_new, new_valid).mean())
        ages = torch.cat(ages).double()
        hi = max(float(cur.max()) + 1.0, 1.0)
        counts = torch.histc(ages, bins=self.age_bins, min=0.0, max=hi)
        edges = torch.linspace(0.0, hi, self.age_bins + 1)

        # commit (plain attribute swaps, no failure point left)
        for layer, (k_new, v_new) in zip(cache.layers, new_kv):
            layer.keys, layer.values = k_new, v_new
        for layer_idx, pos_new in enumerate(new_pos):
            self._positions[layer_idx] = pos_new
        self._slot_valid = new_valid

        method = "jacap" if not fallback_layers else ("window" if len(fallback_layers) == len(plans) else "mixed")
        if reason is not None:
            warnings.warn(f"Jacap eviction fell back to a sliding window on {len(fallback_layers)} layer(s): {reason}",
                          RuntimeWarning, stacklevel=2)
        event = EvictionEvent(
            step=self._step, seq_len=self._seq_len, tokens_before=length, tokens_after=self.budget, method=method,
            seconds=time.perf_counter() - t0, kv_bytes_before=bytes_before, kv_bytes_after=bytes_after,
            entropy_before=float(torch.stack(ent_before).mean()) if ent_before else float("nan"),
            entropy_after=float(torch.stack(ent_after).mean()) if ent_after else float("nan"),
            age_edges=edges.tolist(), age_counts=[int(c) for c in counts.tolist()],
            mean_age_kept=float(ages.mean()) if ages.numel() else float("nan"),
            fallback_reason=reason, fallback_layers=fallback_layers,
            kept_positions=[p.cpu() for p in new_pos] if self.record_kept else None,
        )
        self.events.append(event)
        return event
