r"""Compression *during* decoding, measured: Algorithm 2 against kvpress's ``DecodingPress``.

Every method sees the same tokens (teacher forcing): a continuation is generated once without any
compression, then replayed one token per forward through

* ``alg2``: :class:`jacap_lib.controller.JacapDecodeController` (EMA statistics of post-RoPE queries,
  every layer evicted together, keeps ``budget`` slots, never more than ``budget + interval``);
  ``alg2_flat`` = ``alg2[beta=none]``: the same controller with flat (cumulative) statistics, nothing else changed;
* ``DecodingPress(<scorer>)``: kvpress's decoding wrapper (``compression_interval = interval``,
  ``target_size = budget``) around a registry scorer spec (``jacap_prompt``, ``tova``, ``streaming_llm[n_sink=1]``, ...),
  as :func:`positional_decoding_press`: kept tokens written back in slot (= position) order, so that a scorer
  that reads positions off slot indices (StreamingLLM) keeps its sinks after the first compression.

Per method and step: the KL divergence of the next-token distribution from the uncompressed run's,
top-1 agreement, the cache length (its peak), the wall time of the step and of the method's own work
(scoring + selection; for Algorithm 2 also its per-step statistics hooks), and at the end the age
(current position minus original position) of every kept token, pooled over layers and KV heads.

The kept tokens' original positions under ``DecodingPress`` are not tracked by kvpress; they are
recovered after each compression by matching the kept key rows to the rows before it (an exact
gather, so each kept row equals exactly one earlier row), outside the timed region.
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import torch

from .. import _checks
from ..config import DEFAULTS

__all__ = ["AGE_EDGES", "ALG2_ALIASES", "parse_decoding_method", "decoding_methods", "positional_decoding_press",
           "build_alg2", "build_decoding_press", "teacher_forced", "compare_decoding"]

# age bins (tokens): recent ... old; the last edge is open-ended
AGE_EDGES = [0, 16, 32, 64, 128, 256, 512, 1024, 1 << 30]


ALG2_ALIASES = {"alg2": "alg2", "alg2_flat": "alg2[beta=none]"}


def parse_decoding_method(spec: str) -> tuple[str, dict]:
    """``(name, options)`` of a decoding method spec: ``"alg2"`` / ``"alg2[beta=none]"`` (Algorithm 2; its one
    option is ``beta``, ``None`` = flat statistics; ``"alg2_flat"`` is ``"alg2[beta=none]"``) or a registry
    spec such as ``"streaming_llm[n_sink=1]"`` (that scorer inside :class:`PositionalDecodingPress`)."""
    from ..presses.registry import list_methods, parse_method

    name, opts = parse_method(ALG2_ALIASES.get(spec, spec))
    if name == "alg2":
        bad = sorted(set(opts) - {"beta"})
        if bad:
            raise ValueError(f"decoding method {spec!r}: Algorithm 2 takes only the option 'beta', got {bad}")
        return name, opts
    if name not in list_methods():
        raise ValueError(f"unknown decoding method {spec!r}; valid: 'alg2', 'alg2_flat', 'alg2[beta=...]' and the "
                         f"registry names {sorted(list_methods())}")
    return name, opts


def decoding_methods(names=("alg2", "jacap_prompt", "tova", "knorm", "expected_attention", "streaming_llm")) -> list[str]:
    """Method specs :func:`compare_decoding` understands (see :func:`parse_decoding_method`), each checked
    (a registry spec by building its press once)."""
    from ..presses.registry import build_press

    for n in names:
        try:
            name, opts = parse_decoding_method(n)
        except ValueError as e:
            raise ValueError(f"{e} (decoding methods: 'alg2' and the registry names)") from None
        if name == "alg2":
            if opts.get("beta") is not None:
                from ..config import check

                check("decode_beta", opts["beta"], name="beta")
        else:
            build_press(name, 0.0, **opts)
    return list(names)


def positional_decoding_press(base_press, *, compression_interval: int, target_size: int, **kw):
    """kvpress ``DecodingPress`` whose compressions write the kept tokens back **in their slot order**.

    kvpress 0.5.5's ``ScorerPress.compress`` gathers the kept slots in ``topk`` (score) order, and
    ``DecodingPress`` writes them back so; after the first compression a slot's index is no longer its position,
    and a scorer that reads positions off slot indices (StreamingLLM: "the first ``n_sink`` slots") then
    protects whatever tokens landed first. Here the kept indices are sorted before the gather, so slot order
    stays position order for every scorer. Presses with their own ``compress`` (Jacap's, which already sorts)
    are called unchanged. Nothing else of ``DecodingPress`` changes (buffer, interval, target size)."""
    import kvpress
    from kvpress.presses.scorer_press import ScorerPress

    from ..selection import n_kept as kept_of  # the one budget rule: kvpress's compute_n_kept

    class _Positional(kvpress.DecodingPress):
        def compress(self, module, hidden_states, keys, values, attentions, kwargs):
            base = self.base_press
            if type(base).compress is not ScorerPress.compress:
                return super().compress(module, hidden_states, keys, values, attentions, kwargs)
            k_len = keys.shape[2]
            ratio = self._find_target_compression_ratio(k_len, self._resolve_target_size(kwargs))
            if ratio == 0:
                return keys, values
            original, base.compression_ratio = base.compression_ratio, ratio
            try:
                scores = base.score(module, hidden_states, keys, values, attentions, kwargs)
            finally:
                base.compression_ratio = original
            idx = scores.topk(kept_of(k_len, ratio), dim=-1).indices.sort(dim=-1).values
            idx = idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
            return keys.gather(2, idx).contiguous(), values.gather(2, idx).contiguous()

    _Positional.__name__ = _Positional.__qualname__ = "PositionalDecodingPress"
    return _Positional(base_press=base_press, compression_interval=compression_interval, target_size=target_size, **kw)


class _Timer:
    def __init__(self):
        self.seconds = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed


def _kept_index(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``(H, n)`` index of each row of ``after (1, H, n, d)`` in ``before (1, H, N, d)`` (exact copies)."""
    dist = torch.cdist(after[0].float(), before[0].float(), compute_mode="donot_use_mm_for_euclid_dist")
    return dist.argmin(-1)


class _PressTracker:
    """Time a DecodingPress's compressions and follow the original positions of the slots it keeps."""

    def __init__(self, press):
        self.press, self.timer, self.positions, self.book = press, _Timer(), {}, 0.0
        original = press.compress

        def compress(module, hidden_states, keys, values, attentions, kwargs):
            t0 = time.perf_counter()
            out_k, out_v = original(module, hidden_states, keys, values, attentions, kwargs)
            self.timer.seconds += time.perf_counter() - t0
            t1 = time.perf_counter()
            layer, cur = module.layer_idx, int(kwargs["position_ids"][0, -1])
            pos = self._current(layer, keys.shape[1], keys.shape[2], cur)
            if out_k.shape[2] < keys.shape[2]:
                pos = pos.gather(1, _kept_index(keys, out_k))
            self.positions[layer] = pos
            self.book += time.perf_counter() - t1
            return out_k, out_v

        press.compress = compress

    def _current(self, layer: int, n_heads: int, length: int, cur: int) -> torch.Tensor:
        """Positions of the ``length`` slots of ``layer`` when the newest is position ``cur``, ``(H, length)``."""
        old = self.positions.get(layer)
        if old is None:
            return torch.arange(cur - length + 1, cur + 1).expand(n_heads, -1).clone()
        new = torch.arange(cur - (length - old.shape[1]) + 1, cur + 1).expand(n_heads, -1)
        return torch.cat([old, new], 1)

    def final_positions(self, cache, cur: int) -> list:
        return [self._current(i, layer.keys.shape[1], layer.keys.shape[2], cur) for i, layer in enumerate(cache.layers)]


def build_alg2(model, spec: str = "alg2", *, budget: int, interval: int, n_sink: int = DEFAULTS.n_sink,
               window: int = DEFAULTS.window, beta: float | None = DEFAULTS.decode_beta):
    """Algorithm 2 for an ``alg2`` spec: ``JacapDecodeController(high = budget + interval, budget, interval,
    beta, n_sink, window)``, the spec's ``beta`` (``alg2_flat``: ``None``) replacing the run's."""
    from ..controller import JacapDecodeController

    name, opts = parse_decoding_method(spec)
    if name != "alg2":
        raise ValueError(f"`spec` {spec!r} is not an Algorithm 2 spec ('alg2', 'alg2_flat', 'alg2[beta=...]')")
    return JacapDecodeController(model, high=budget + interval, budget=budget, interval=interval,
                                 beta=opts.get("beta", beta), n_sink=n_sink, window=window)


def build_decoding_press(spec: str, *, budget: int, interval: int, n_sink: int = DEFAULTS.n_sink,
                         window: int = DEFAULTS.window):
    """The press of a registry decoding-method spec: its scorer (options of the spec; for ``jacap*`` the run's
    ``n_sink`` and ``window`` unless the spec sets them) inside :func:`positional_decoding_press`."""
    from ..presses.registry import build_press

    name, opts = parse_decoding_method(spec)
    if name == "alg2":
        raise ValueError("`spec` 'alg2' is Algorithm 2 (a controller), not a DecodingPress scorer")
    if name.startswith("jacap"):
        opts = {"n_sink": n_sink, "window": window, **opts}
    return positional_decoding_press(build_press(name, 0.0, **opts), compression_interval=interval,
                                     target_size=budget)


def teacher_forced(model, seq: torch.Tensor, n_prompt: int, method: str | None, *, budget: int, interval: int,
                   window: int = DEFAULTS.window, n_sink: int = DEFAULTS.n_sink, beta: float | None = DEFAULTS.decode_beta,
                   age_edges=AGE_EDGES) -> dict:
    """Replay ``seq (1, T)`` (prompt in one forward, then one token per forward) under ``method``
    (``None`` = no compression). Returns ``logits (T - n_prompt, vocab)`` predicting tokens
    ``n_prompt .. T-1``, the cache length after each step, ``positions`` (per layer, the original
    positions of the final cache's slots, ``(H_kv, L)``), the final ``cache``, times and the kept
    tokens' age histogram."""
    from transformers import DynamicCache

    _checks.nonneg_int("budget", budget)
    _checks.nonneg_int("interval", interval)
    T = seq.shape[1]
    if not 0 < n_prompt < T:
        raise ValueError(f"n_prompt must lie in [1, T-1 = {T - 1}], got {n_prompt}")
    timer, tracker, ctrl, ctx = _Timer(), None, None, nullcontext()
    name, opts = parse_decoding_method(method) if method is not None else (None, {})
    if name == "alg2":
        ctrl = build_alg2(model, method, budget=budget, interval=interval, n_sink=n_sink, window=window, beta=beta)
        ctrl._attn_pre = timer.wrap(ctrl._attn_pre)  # per-step statistics (before attach: hooks bind these)
        ctrl._keep_layer = timer.wrap(ctrl._keep_layer)  # scoring + selection of one layer
        ctx = ctrl
    elif name is not None:
        press = build_decoding_press(method, budget=budget, interval=interval, n_sink=n_sink, window=window)
        tracker = _PressTracker(press)
        ctx = press(model)
    cache = DynamicCache(config=model.config)
    logits, lengths, step_s = [], [], []
    t_run = time.perf_counter()
    with ctx, torch.no_grad():
        out = model(input_ids=seq[:, :n_prompt], past_key_values=cache).logits[:, -1]
        logits.append(out.float())
        for t in range(n_prompt, T - 1):
            pos = torch.tensor([t])
            t0 = time.perf_counter()
            out = model(input_ids=seq[:, t:t + 1], past_key_values=cache, cache_position=pos,
                        position_ids=pos[None]).logits[:, -1]
            step_s.append(time.perf_counter() - t0)
            logits.append(out.float())
            lengths.append(max(layer.keys.shape[2] for layer in cache.layers))
        cur = T - 2  # position of the last token fed
        if ctrl is not None:
            positions = [ctrl.positions(i)[0] for i in range(len(cache.layers))]
        elif tracker is not None:
            positions = tracker.final_positions(cache, cur)
        else:
            positions = [torch.arange(cur + 1).expand(layer.keys.shape[1], -1) for layer in cache.layers]
    total = time.perf_counter() - t_run - (tracker.book if tracker else 0.0)
    method_s = timer.seconds + (tracker.timer.seconds if tracker else 0.0)
    ages = torch.cat([(cur - p).flatten() for p in positions]).double()
    counts = torch.histogram(ages.clamp_max(age_edges[-1] - 1), bins=torch.tensor(age_edges, dtype=torch.double)).hist
    return {"logits": torch.cat(logits, 0), "lengths": lengths, "positions": positions, "cache": cache, "peak_cache": max(lengths),
            "final_cache": lengths[-1], "seconds": total, "method_seconds": method_s,
            "step_seconds": step_s, "age_edges": list(age_edges), "age_counts": [int(c) for c in counts.tolist()],
            "mean_age": float(ages.mean()), "evictions": len(ctrl.events) if ctrl is not None else None}


def compare_decoding(model, seq: torch.Tensor, n_prompt: int, methods, *, budget: int, interval: int,
                     window: int = DEFAULTS.window, n_sink: int = DEFAULTS.n_sink, beta: float | None = DEFAULTS.decode_beta,
                     bins: int = 32, progress=None) -> dict:
    """Every method of ``methods`` on the tokens of ``seq``, judged against the uncompressed replay.

    ``methods``: decoding-method specs (:func:`parse_decoding_method`), or ``{label: spec}`` (rows keyed by label).

    Returns ``{"reference": {...}, "methods": {name: row}}``; a row has the per-step ``kl`` (nats),
    ``mean_kl``, ``mean_kl_compressed`` (steps after the cache first reached the budget), ``p90_kl``,
    ``top1_agree``, ``kl_binned`` (means over ``bins`` equal step ranges), ``peak_cache``,
    ``scoring_share`` (method work / run time), the age histogram and the timings.
    """
    from .quality import kl_from_logits

    specs = dict(methods) if isinstance(methods, dict) else {m: m for m in methods}
    decoding_methods(list(specs.values()))
    ref = teacher_forced(model, seq, n_prompt, None, budget=budget, interval=interval)
    n_steps = ref["logits"].shape[0]
    rows = {}
    for name, spec in specs.items():
        if progress is not None:
            progress(name)
        run = teacher_forced(model, seq, n_prompt, spec, budget=budget, interval=interval, window=window,
                             n_sink=n_sink, beta=beta)
        kl = kl_from_logits(ref["logits"], run["logits"])
        agree = (run["logits"].argmax(-1) == ref["logits"].argmax(-1)).float()
        # first step (of the logits rows) at which the compressed cache is shorter than the full one
        full = [n_prompt + 1 + i for i in range(len(run["lengths"]))]
        diverged = next((i + 1 for i, (a, b) in enumerate(zip(run["lengths"], full)) if a < b), n_steps)
        edges = torch.linspace(0, n_steps, bins + 1).round().long().tolist()
        rows[name] = {
            "kl": kl.tolist(), "mean_kl": float(kl.mean()), "median_kl": float(kl.median()),
            "p90_kl": float(kl.quantile(0.9)), "max_kl": float(kl.max()),
            "mean_kl_compressed": float(kl[diverged:].mean()) if diverged < n_steps else 0.0,
            "first_compressed_step": diverged, "top1_agree": float(agree.mean()),
            "kl_binned": [float(kl[a:b].mean()) for a, b in zip(edges[:-1], edges[1:])], "bin_edges": edges,
            "peak_cache": run["peak_cache"], "final_cache": run["final_cache"],
            "mean_cache": sum(run["lengths"]) / len(run["lengths"]),
            "seconds": run["seconds"], "method_seconds": run["method_seconds"],
            "scoring_share": run["method_seconds"] / run["seconds"],
            "age_edges": run["age_edges"], "age_counts": run["age_counts"], "mean_age": run["mean_age"],
            "evictions": run["evictions"],
        }
    return {"reference": {"seconds": ref["seconds"], "peak_cache": ref["peak_cache"], "n_steps": n_steps,
                          "age_counts": ref["age_counts"]},
            "methods": rows}
