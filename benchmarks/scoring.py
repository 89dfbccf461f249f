"""Scoring cost on identical tensors: Jacap (torch / Triton) vs kvpress CapPress, Expected Attention,
KNorm, and the memory floor (one read of K and V).

    python benchmarks/scoring.py                       # CPU here, CUDA (+ Triton) when a GPU is present
    python benchmarks/scoring.py --N 1024 4096 --d 64  # a subset
    python benchmarks/scoring.py --quick --out /tmp/x.json

What is timed, per (N, d), on one (B=1, H=8, N, d) cache with query statistics already computed:

* ``floor``: ``keys.sum() + values.sum()`` — one read of K and V, the least any scorer must do.
* ``jacap_torch``: ``jacap_lib.jacap_scores(keys, values, mu, lam, backend="torch")``.
* ``jacap_triton``: ``jacap_lib.scoring.triton.triton_jacap_scores`` (CUDA only; tf32 dots).
* ``capkv``: ``kvpress.CapPress.score(...)`` itself, with its query anchor (normally q_proj of the
  hidden states, averaged RoPE, mean) replaced by the given ``mu`` — everything after the anchor
  (normalisation, weights, Gram, ``linalg.solve``, leverage, sink padding) is kvpress's own code.
  ``num_attention_heads = H`` so ``repeat_kv`` is the identity (the same 8 heads Jacap scores).
* ``expected_attention``: ``kvpress.ExpectedAttentionPress.score(...)`` with its query statistics
  replaced by ``(mu, diag(lam))`` (use_covariance and use_vnorm on, the defaults).
* ``knorm``: ``kvpress.KnormPress.score(...)`` unchanged.

Each method is called once to warm up, then ``repeats`` times round-robin; medians are reported with
their ratio to the floor measured in the same run, plus peak extra memory of one call.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DEFAULT_N = (1024, 4096, 16384, 65536)
DEFAULT_D = (64, 128)
HEADS = 8
TAU, NOISE = 10.0, 1.0
WHAT = {
    "floor": "keys.sum() + values.sum(): one read of K and V",
    "jacap_torch": "jacap_lib.jacap_scores(keys, values, mu, lam, tau=10, backend='torch')",
    "jacap_triton": "jacap_lib.scoring.triton.triton_jacap_scores(..., dot_precision='tf32') (3 Triton passes + d x d torch)",
    "capkv": "kvpress CapPress.score() with _query_anchor replaced by the given mu (no q_proj / RoPE averaging)",
    "expected_attention": "kvpress ExpectedAttentionPress.score() with get_query_statistics replaced by (mu, diag(lam))",
    "knorm": "kvpress KnormPress.score() unchanged",
}


def make_inputs(N: int, d: int, device, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, HEADS, N, d, generator=g).to(device=device, dtype=dtype)
    values = torch.randn(1, HEADS, N, d, generator=g).to(device=device, dtype=dtype)
    mu = torch.randn(1, HEADS, d, generator=g).to(device=device, dtype=torch.float32)
    lam = (0.05 + torch.rand(1, HEADS, d, generator=g)).to(device=device, dtype=torch.float32)
    return keys, values, mu, lam


def kvpress_scorers(keys, values, mu, lam) -> dict:
    """The three kvpress ``score`` calls on these tensors, query statistics given (see module doc)."""
    from kvpress import CapPress, ExpectedAttentionPress, KnormPress

    H, d = keys.shape[1], keys.shape[-1]
    module = types.SimpleNamespace(config=types.SimpleNamespace(num_attention_heads=H), head_dim=d)
    hidden = torch.zeros(keys.shape[0], keys.shape[2], 1, device=keys.device, dtype=keys.dtype)  # unused
    cap = CapPress()
    cap._query_anchor = lambda module, hidden_states: mu.to(keys.dtype)
    ea = ExpectedAttentionPress()
    cov = torch.diag_embed(lam).to(keys.dtype)
    ea.get_query_statistics = lambda module, hidden_states: (mu.to(keys.dtype), cov)
    kn = KnormPress()
    return {
        "capkv": lambda: cap.score(module, hidden, keys, values, None, {}),
        "expected_attention": lambda: ea.score(module, hidden, keys, values, None, {}),
        "knorm": lambda: kn.score(module, hidden, keys, values, None, {}),
    }


def methods(keys, values, mu, lam, device) -> dict:
    from jacap_lib.scoring import jacap_scores

    fns = {
        "floor": lambda: keys.sum() + values.sum(),
        "jacap_torch": lambda: jacap_scores(keys, values, mu, lam, tau=TAU, noise=NOISE, backend="torch"),
    }
    if device.type == "cuda":
        from jacap_lib.scoring.triton import triton_jacap_scores

        fns["jacap_triton"] = lambda: triton_jacap_scores(keys, values, mu, lam, tau=TAU, noise=NOISE)
    fns.update(kvpress_scorers(keys, values, mu, lam))
    return fns


def repeats_for(N: int, device, quick: bool) -> int:
    if quick:
        return 1
    if device.type == "cuda":
        return 20
    return 2 if N >= 65536 else (3 if N >= 16384 else 5)


@torch.no_grad()
def run(Ns, ds, device, dtype, quick=False, progress=print, time_budget_s=None) -> dict:
    rows, skipped = [], []
    start = time.perf_counter()
    for d in ds:
        for N in Ns:
            if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
                skipped.append({"N": N, "d": d})
                continue
            keys, values, mu, lam = make_inputs(N, d, device, dtype)
            fns = methods(keys, values, mu, lam, device)
            reps = repeats_for(N, device, quick)
            timing = common.time_round_robin(fns, device, repeats=reps, warmup=1)
            floor = timing["floor"]["median_s"]
            for name, fn in fns.items():
                gc.collect()
                peak = common.peak_extra_bytes(fn, device)
                t = timing[name]
                rows.append({
                    "N": N, "d": d, "method": name, **t,
                    "ratio_to_floor": t["median_s"] / floor,
                    "peak_extra_bytes": peak,
                    "peak_extra_over_kv_bytes": None if peak is None else peak / (keys.nbytes + values.nbytes),
                    "load_average_1m_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                })
            cap = timing["capkv"]["median_s"]
            line = f"N={N:6d} d={d:3d} reps={reps}  floor {floor * 1e3:8.2f} ms"
            for name in fns:
                if name != "floor":
                    line += f" | {name} {timing[name]['median_s'] * 1e3:8.2f} ms ({timing[name]['median_s'] / floor:5.1f}x)"
            line += f" | jacap_torch/capkv {timing['jacap_torch']['median_s'] / cap:.2f}"
            progress(line)
            del keys, values, mu, lam, fns
            gc.collect()
    return {"rows": rows, "skipped_time_budget": skipped}


def summarise(rows) -> dict:
    by = {(r["N"], r["d"], r["method"]): r for r in rows}
    out = {}
    for (N, d, m), r in by.items():
        if m != "jacap_torch":
            continue
        key = f"N={N},d={d}"
        out[key] = {"jacap_torch_over_capkv": r["median_s"] / by[(N, d, "capkv")]["median_s"]}
        if (N, d, "jacap_triton") in by:
            t = by[(N, d, "jacap_triton")]
            out[key]["jacap_triton_over_floor"] = t["ratio_to_floor"]
            out[key]["jacap_triton_over_jacap_torch"] = t["median_s"] / r["median_s"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--N", type=int, nargs="+", default=list(DEFAULT_N))
    ap.add_argument("--d", type=int, nargs="+", default=list(DEFAULT_D))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    ap.add_argument("--quick", action="store_true", help="one repeat per method (smoke test)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's choice); on a shared machine 1 is far steadier")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="skip the remaining (N, d) once this much wall time is spent (recorded in the JSON)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default data/bench/scoring_<device>.json, e.g. scoring_h200.json)")
    args = ap.parse_args(argv)
    if any(n < 1 for n in args.N) or any(d < 1 for d in args.d):
        ap.error(f"--N and --d must be positive, got N={args.N}, d={args.d}")
    if args.time_budget_s is not None and args.time_budget_s <= 0:
        ap.error(f"--time-budget-s must be positive, got {args.time_budget_s}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    pinned = common.pin_malloc() if device.type == "cpu" else None
    env = common.environment(device)
    print(f"scoring benchmark on {env.get('gpu', env['cpu'])}, {dtype}, threads={env['torch_threads']}")
    res = run(args.N, args.d, device, dtype, quick=args.quick, time_budget_s=args.time_budget_s)
    out = {
        "benchmark": "scoring",
        "config": {
            "N": args.N, "d": args.d, "batch": 1, "kv_heads": HEADS, "dtype": str(dtype).replace("torch.", ""),
            "tau": TAU, "noise": NOISE, "seed": 0,
            "inputs": "keys, values ~ N(0,1); mu ~ N(0,1); lam ~ 0.05 + U(0,1); per (1, 8, N, d)",
            "repeats": {str(N): repeats_for(N, device, args.quick) for N in args.N},
            "repeats_note": "median of round-robin repeats after one warm-up call each; fewer repeats at large N on the CPU",
            "quick": args.quick, "time_budget_s": args.time_budget_s,
            "memory_probe": ("torch.cuda.max_memory_allocated above the live bytes" if device.type == "cuda" else
                             f"VmHWM - VmRSS around one call (glibc mmap threshold pinned: {pinned})"),
        },
        "what_was_timed": WHAT,
        "environment": env,
        "argv": sys.argv[1:] if argv is None else list(argv),
        **res,
        "summary": summarise(res["rows"]),
    }
    path = common.save_json(out, args.out or common.bench_path(f"scoring_{common.device_tag(env)}"))
    print(f"saved {path}")
    return out


if __name__ == "__main__":
    main()
