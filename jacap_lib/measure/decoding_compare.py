r"""Compression *during* decoding, measured: Algorithm 2 against kvpress's ``DecodingPress``.

Every method sees the same tokens (teacher forcing): a continuation is generated once without any
compression, then replayed one token per forward through

* ``alg2``: :class:`jacap_lib.controller.JacapDecodeController` (EMA statistics of post-RoPE queries,
  every layer evicted together, keeps ``budget`` slots, never more than ``budget + interval``);
* ``DecodingPress(<scorer>)``: kvpress's decoding wrapper (``compression_interval = interval``,
  ``target_size = budget``) around a scorer (Jacap, TOVA, KNorm, Expected Attention, StreamingLLM).

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

__all__ = ["AGE_EDGES", "decoding_methods", "teacher_forced", "compare_decoding"]

# age bins (tokens): recent ... old; the last edge is open-ended
AGE_EDGES = [0, 16, 32, 64, 128, 256, 512, 1024, 1 << 30]


def decoding_methods(names=("alg2", "jacap", "tova", "knorm", "expected_attention", "streaming_llm")) -> list[str]:
    """Method names :func:`compare_decoding` understands: ``"alg2"`` and registry scorer names (in DecodingPress)."""
    from ..presses.registry import list_methods

    valid = {"alg2"} | set(list_methods())
    bad = [n for n in names if n not in valid]
    if bad:
        raise ValueError(f"unknown decoding method(s) {bad}; valid: 'alg2' and the registry names {sorted(valid - {'alg2'})}")
    return list(names)


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


def teacher_forced(model, seq: torch.Tensor, n_prompt: int, method: str | None, *, budget: int, interval: int,
                   window: int = DEFAULTS.window, n_sink: int = DEFAULTS.n_sink, beta: float = DEFAULTS.decode_beta,
                   age_edges=AGE_EDGES) -> dict:
    """Replay ``seq (1, T)`` (prompt in one forward, then one token per forward) under ``method``
    (``None`` = no compression). Returns ``logits (T - n_prompt, vocab)`` predicting tokens
    ``n_prompt .. T-1``, the cache length after each step, ``positions`` (per layer, the original
    positions of the final cache's slots, ``(H_kv, L)``), the final ``cache``, times and the kept
    tokens' age histogram."""
    from transformers import DynamicCache

    from ..controller import JacapDecodeController

    _checks.nonneg_int("budget", budget)
    _checks.nonneg_int("interval", interval)
    T = seq.shape[1]
    if not 0 < n_prompt < T:
        raise ValueError(f"n_prompt must lie in [1, T-1 = {T - 1}], got {n_prompt}")
    timer, tracker, ctrl, ctx = _Timer(), None, None, nullcontext()
    if method == "alg2":
        ctrl = JacapDecodeController(model, high=budget + interval, budget=budget, interval=interval, beta=beta,
                                     n_sink=n_sink, window=window)
        ctrl._attn_pre = timer.wrap(ctrl._attn_pre)  # per-step EMA statistics (before attach: hooks bind these)
        ctrl._keep_layer = timer.wrap(ctrl._keep_layer)  # scoring + selection of one layer
        ctx = ctrl
    elif method is not None:
        import kvpress

        from ..presses.registry import build_press

        opts = {"n_sink": n_sink, "window": window} if method.startswith("jacap") else {}
        press = kvpress.DecodingPress(base_press=build_press(method, 0.0, **opts), compression_interval=interval,
                                      target_size=budget)
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
                     window: int = DEFAULTS.window, n_sink: int = DEFAULTS.n_sink, beta: float = DEFAULTS.decode_beta,
                     bins: int = 32, progress=None) -> dict:
    """Every method of ``methods`` on the tokens of ``seq``, judged against the uncompressed replay.

    Returns ``{"reference": {...}, "methods": {name: row}}``; a row has the per-step ``kl`` (nats),
    ``mean_kl``, ``mean_kl_compressed`` (steps after the cache first reached the budget), ``p90_kl``,
    ``top1_agree``, ``kl_binned`` (means over ``bins`` equal step ranges), ``peak_cache``,
    ``scoring_share`` (method work / run time), the age histogram and the timings.
    """
    from .quality import kl_from_logits

    methods = decoding_methods(methods)
    ref = teacher_forced(model, seq, n_prompt, None, budget=budget, interval=interval)
    n_steps = ref["logits"].shape[0]
    rows = {}
    for name in methods:
        if progress is not None:
            progress(name)
        run = teacher_forced(model, seq, n_prompt, name, budget=budget, interval=interval, window=window,
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
