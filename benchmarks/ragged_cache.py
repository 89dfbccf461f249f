"""What the ragged cache frees, and what it costs: bytes held after compression, peak memory of the press's prefill,
decode time per token (uncompressed vs kvpress's masked cache vs the ragged cache).

Per press (the default ``JacapPress``, kvpress ``KVzipPress``, kvpress ``AdaKVPress(SnapKVPress())``), prompt length
and compression ratio:

* ``bytes``: :func:`jacap_lib.cache.cache_bytes` of the cache after the press (tensor storage: kept keys and values
  plus the ragged index) over the uncompressed prefill's cache; the masked cache kvpress leaves holds 1.0. The kept
  count is deterministic, so one document per cell. The reconstruction presses (the default, KVzip) score once per
  prompt and mask every ratio from the same scores (:func:`jacap_lib.measure.quality.caches_by_ratio`, what a
  prefill per ratio leaves).
* ``peak``: the resident-set high-water mark of one prefill above what was live before it
  (:func:`jacap_lib.measure.timing.peak_extra_bytes`: ``/proc/self/status`` VmHWM after a clear_refs reset, glibc's
  mmap threshold pinned so freed buffers leave at once), for the uncompressed prefill and for the press's ragged
  prefill at c = 0.5 (scoring, masking and the conversion to the ragged cache included); not tracemalloc, which does
  not see torch's CPU allocations.
* ``decode``: median wall seconds per greedy token (single thread, ``--decode-tokens`` tokens after a one-token
  warm-up, the cache cut back after each run) on the uncompressed cache, on the default's masked cache and on its
  ragged cache, at the ``--decode-lengths`` and every ratio.

    python benchmarks/ragged_cache.py                                    # the committed grid (CPU)
    python benchmarks/ragged_cache.py --lengths 512 --ratios 0.5 --out /tmp/r.json   # a smoke run
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from common import bench_path, environment, peak_extra_bytes, pin_malloc

PRESSES = ("jacap_default", "kvzip", "adakv_snapkv")
DESCRIBE = {
    "jacap_default": "jacap_lib.JacapPress(compression_ratio=c) (free_memory=True: the cache turned ragged at the "
                     "press's exit); bytes of c = 0.75, 0.9 from the c = 0.5 scoring (JacapPress(free_memory=False) "
                     "masks, then jacap_lib.cache.to_ragged)",
    "kvzip": "jacap_lib.RaggedPress(kvpress.KVzipPress(compression_ratio=c)) (kvpress defaults otherwise); bytes of "
             "c = 0.75, 0.9 from the c = 0.5 scoring",
    "adakv_snapkv": "jacap_lib.RaggedPress(kvpress.AdaKVPress(kvpress.SnapKVPress(compression_ratio=c))) (kvpress "
                    "defaults: alpha_safeguard 0.2, window_size 64, kernel_size 5); one prefill per ratio",
}


def press_of(name: str, c: float, free_memory: bool = True):
    from kvpress import AdaKVPress, KVzipPress, SnapKVPress

    from jacap_lib import JacapPress, RaggedPress

    if name == "jacap_default":
        return JacapPress(compression_ratio=c, free_memory=free_memory)
    inner = KVzipPress(compression_ratio=c) if name == "kvzip" else AdaKVPress(SnapKVPress(compression_ratio=c))
    return RaggedPress(inner) if free_memory else inner


@torch.inference_mode()
def prefill(model, ids, press=None):
    from transformers import DynamicCache

    cache = DynamicCache()
    if press is None:
        model.model(input_ids=ids, past_key_values=cache)
    else:
        with press(model):
            model.model(input_ids=ids, past_key_values=cache)
    return cache


@torch.inference_mode()
def decode_seconds(model, cache, n_prompt: int, n_tokens: int) -> float:
    """Median seconds per token of ``n_tokens`` one-token forwards (after one warm-up), the cache cut back after."""
    length = cache.get_seq_length()
    token = torch.tensor([[198]])
    times = []
    for t in range(n_tokens + 1):
        pos = torch.tensor([[n_prompt + t]])
        start = time.perf_counter()
        out = model(input_ids=token, past_key_values=cache, position_ids=pos, use_cache=True)
        times.append(time.perf_counter() - start)
        token = out.logits[:, -1:].argmax(-1)
    cache.crop(length)
    return statistics.median(times[1:])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="benchmarks/ragged_cache.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75, 0.9])
    ap.add_argument("--presses", nargs="+", default=list(PRESSES), choices=PRESSES)
    ap.add_argument("--decode-lengths", type=int, nargs="*", default=[2048, 8192])
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--decode-press", default="jacap_default", choices=PRESSES,
                    help="whose masks the masked and ragged decode runs use (the decode cost depends on the kept count)")
    ap.add_argument("--peak-lengths", type=int, nargs="*", default=None, help="default: every length")
    ap.add_argument("--time-budget", type=float, default=3600.0, help="seconds; no new length starts after it")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from jacap_lib import load_model
    from jacap_lib.cache import cache_bytes, is_ragged, to_ragged
    from jacap_lib.measure.quality import caches_by_ratio
    from jacap_lib.results.provenance import provenance
    from jacap_lib.experiments.timing import prompt_ids

    torch.set_num_threads(1)
    pinned = pin_malloc()
    model, tok = load_model(device="cpu")
    device = torch.device("cpu")
    out_path = args.out or bench_path("ragged_cache_cpu")
    peak_lengths = args.lengths if args.peak_lengths is None else args.peak_lengths
    record = {
        "benchmark": "ragged_cache",
        "config": {
            "lengths": args.lengths, "ratios": args.ratios, "presses": {p: DESCRIBE[p] for p in args.presses},
            "decode_lengths": args.decode_lengths, "decode_tokens": args.decode_tokens, "peak_lengths": peak_lengths,
            "decode_press": args.decode_press, "threads": 1, "malloc_pinned": pinned,
            "bytes": "jacap_lib.cache.cache_bytes (tensor storage: keys, values; ragged: + offsets, int32 positions)"
                     " after compression / the uncompressed prefill's",
            "peak": "RSS high-water mark above the live set before one prefill (jacap_lib.measure.timing."
                    "peak_extra_bytes: /proc/self/status VmHWM after clear_refs), not tracemalloc",
            "decode": "median wall seconds of one-token forwards (model(...) with the lm head), after one warm-up",
            "gpu": "none in this session: the Triton kernel ran only in the interpreter (tests), no GPU timing",
            "time_budget_s": args.time_budget,
        },
        "provenance": provenance(model, command="python benchmarks/ragged_cache.py " + " ".join(argv or sys.argv[1:])),
        "environment": environment(device),
        "rows": [], "skipped_lengths": [],
    }

    def save():
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(record, indent=1) + "\n")

    started = time.perf_counter()
    for n in args.lengths:
        if time.perf_counter() - started > args.time_budget:
            record["skipped_lengths"].append(n)
            save()
            continue
        ids, _ = prompt_ids(tok, n)
        dense = prefill(model, ids)
        dense_bytes = cache_bytes(dense)
        row = {"length": n, "uncompressed_bytes": dense_bytes, "cells": []}
        if n in peak_lengths:
            del dense
            row["peak_uncompressed_bytes"] = peak_extra_bytes(lambda: prefill(model, ids), device)
            dense = prefill(model, ids)
        decode = n in args.decode_lengths
        if decode:
            row["decode_uncompressed_s"] = decode_seconds(model, dense, n, args.decode_tokens)
        del dense
        for name in args.presses:
            t0 = time.perf_counter()
            if name == "adakv_snapkv":
                caches = ((c, prefill(model, ids, press_of(name, c, free_memory=False))) for c in args.ratios)
            else:
                caches = caches_by_ratio(model, ids, press_of(name, args.ratios[0], free_memory=False), args.ratios)
            for c, cache in caches:  # the model's attention holds this ratio's masks
                cell = {"press": name, "compression_ratio": c, "masked_bytes": cache_bytes(cache)}
                if decode and name == args.decode_press:
                    cell["decode_masked_s"] = decode_seconds(model, cache, n, args.decode_tokens)
                to_ragged(cache, model)
                assert is_ragged(cache)
                cell["ragged_bytes"] = cache_bytes(cache)
                cell["ragged_over_uncompressed"] = cell["ragged_bytes"] / dense_bytes
                cell["target_1_minus_c_plus_2pct"] = 1 - c + 0.02
                if decode and name == args.decode_press:
                    cell["decode_ragged_s"] = decode_seconds(model, cache, n, args.decode_tokens)
                del cache
                row["cells"].append(cell)
            row.setdefault("scoring_s", {})[name] = time.perf_counter() - t0
            if n in peak_lengths:
                press = press_of(name, 0.5)
                row.setdefault("peak_ragged_prefill_bytes_c0.5", {})[name] = peak_extra_bytes(
                    lambda: prefill(model, ids, press), device)
            record["rows"] = [r for r in record["rows"] if r["length"] != n] + [row]
            save()
            print(f"{n} {name}: {time.perf_counter() - started:.0f}s", flush=True)
        record["rows"] = [r for r in record["rows"] if r["length"] != n] + [row]
        record["elapsed_s"] = time.perf_counter() - started
        save()
    record["elapsed_s"] = time.perf_counter() - started
    save()
    return record


if __name__ == "__main__":
    main()
