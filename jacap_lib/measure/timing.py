"""Speed measurements (the compute of ``jacap time``; the jobs that write ``data/bench`` are in
:mod:`jacap_lib.experiments.timing`, and ``benchmarks/*.py`` are thin entry points to them).

Timers: on CUDA, ``torch.cuda.Event`` pairs around each call (after a synchronize); on the CPU,
``time.perf_counter``. Peak extra memory: on CUDA ``torch.cuda.max_memory_allocated`` above what
was allocated before the call; on the CPU the resident-set high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) above the resident set before the call, with glibc's mmap threshold pinned
at 64 KiB so that freed temporaries go back to the OS and cannot hide later allocations.

**Scoring cost** on identical tensors (:func:`time_scoring`): Jacap (torch / Triton) vs kvpress CapPress,
Expected Attention, KNorm, and the memory floor (one read of K and V). What is timed, per (N, d), on
one (B=1, H=8, N, d) cache with query statistics already computed:

* ``floor``: ``keys.sum() + values.sum()`` — one read of K and V, the least any scorer must do.
* ``floor_gemm``: ``G = V^T V`` and ``V G`` (into a preallocated buffer) — the weighted Gram and the
  leverage step of Algorithm 1 as two plain ``N d^2`` GEMMs on the same tensors: its compute floor.
* ``jacap_torch``: ``jacap_lib.jacap_scores(keys, values, mu, lam, backend="torch")``.
* ``jacap_triton``: ``jacap_lib.scoring.triton.triton_jacap_scores`` (CUDA only; tf32 dots);
  ``jacap_triton_async``: the same with ``check=False`` (no host synchronisation at all).
* ``capkv``: ``kvpress.CapPress.score(...)`` itself, with its query anchor (normally q_proj of the
  hidden states, averaged RoPE, mean) replaced by the given ``mu`` — everything after the anchor
  (normalisation, weights, Gram, ``linalg.solve``, leverage, sink padding) is kvpress's own code.
  ``num_attention_heads = H`` so ``repeat_kv`` is the identity (the same 8 heads Jacap scores).
* ``expected_attention``: ``kvpress.ExpectedAttentionPress.score(...)`` with its query statistics
  replaced by ``(mu, diag(lam))`` (use_covariance and use_vnorm on, the defaults).
* ``knorm``: ``kvpress.KnormPress.score(...)`` unchanged.

Each method is called once to warm up, then ``repeats`` times round-robin; medians are reported with
their ratio to the floor measured in the same run, the fastest repeat with its ratios to both floors
(``min_over_kv_floor``, ``min_over_gemm_floor``), plus peak extra memory of one call.
:func:`fixed_and_per_token` splits each method's cost into a fixed per-call part and a per-token part
(a line through the fastest times against N). On the CPU with one thread the timer is the thread's CPU
time (:func:`cpu_clock`): on a shared machine it leaves out the time other jobs held the core.

**End-to-end cost** (:func:`run_one`), like the paper's runtime study: prefill (with the press scoring
and compressing every layer) + greedy tokens, mirroring kvpress's pipeline:
``with press(model): model.model(prompt[:-1], past_key_values=cache)`` (the press scores and prunes
each layer's cache in its forward hook), then ``new_tokens`` greedy steps from the last prompt token
with explicit position ids (the pruned cache is shorter than the true position). ``scoring_s`` is the
time spent inside the press's ``score()`` (wrapped with a timer; on CUDA after a synchronize), a part
of ``prefill_s``. :func:`random_init_model` builds the same architecture with random weights (timing
does not depend on the weights' values) for machines without the bundled model.
"""
from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import os
import re
import statistics
import time
import types
from pathlib import Path

import torch

from ..config import DEFAULTS

__all__ = ["pin_malloc", "peak_extra_bytes", "time_round_robin", "DEFAULT_N", "DEFAULT_D", "HEADS", "TAU", "NOISE",
           "WHAT", "make_inputs", "kvpress_scorers", "methods", "repeats_for", "median_row", "time_scoring", "summarise",
           "fixed_and_per_token", "cpu_clock",
           "DEFAULT_LENGTHS", "DEFAULT_RATIOS", "METHODS", "INIT_SEED", "ORIGIN_FILE", "random_init_model",
           "token_prompt", "run_one"]


# ---------------------------------------------------------------------------------------------- timers
def pin_malloc() -> bool:
    """Fix glibc's mmap threshold (64 KiB) so large freed buffers leave the resident set at once."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, 65536)) and bool(libc.mallopt(-1, 65536))  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    except OSError:
        return False


def _status_bytes(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


def peak_extra_bytes(fn, device: torch.device) -> int | None:
    """Bytes allocated by one call of ``fn`` above what was live before it (None if not measurable)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    try:
        Path("/proc/self/clear_refs").write_text("5")
        base = _status_bytes("VmRSS")
        fn()
        return max(0, _status_bytes("VmHWM") - base)
    except OSError:
        return None


def cpu_clock() -> str:
    """The CPU timer: ``"thread_time"`` (CPU time of the calling thread) when torch runs one thread, else
    ``"perf_counter"`` (wall time). On a shared machine the thread's CPU time leaves out the time the
    scheduler gave to other jobs; with one thread and an idle machine the two agree."""
    return "thread_time" if torch.get_num_threads() == 1 else "perf_counter"


def time_round_robin(fns: dict, device: torch.device, repeats: int, warmup: int = 1) -> dict:
    """Median (and min, max) seconds per call for each function, calling them in turn (fair under a drifting
    load). CUDA: event pairs after a synchronize; CPU: :func:`cpu_clock`."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    clock = getattr(time, cpu_clock())
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize(device)
                samples[name].append(start.elapsed_time(end) / 1e3)
            else:
                t0 = clock()
                fn()
                samples[name].append(clock() - t0)
    return {
        name: {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s), "repeats": len(s)}
        for name, s in samples.items()
    }


# ---------------------------------------------------------------------------------------------- scoring cost
DEFAULT_N = (1024, 4096, 16384, 65536)

DEFAULT_D = (64, 128)

HEADS = 8

TAU, NOISE = DEFAULTS.tau, DEFAULTS.noise
WHAT = {
    "floor": "keys.sum() + values.sum(): one read of K and V",
    "floor_gemm": "G = values^T values, then values @ G into a preallocated buffer: the weighted Gram and the "
                  "leverage step as two plain N d^2 GEMMs on the same tensors (the compute floor of Algorithm 1)",
    "jacap_torch": f"jacap_lib.jacap_scores(keys, values, mu, lam, tau={TAU:g}, backend='torch')",
    "jacap_triton": "jacap_lib.scoring.triton.triton_jacap_scores(..., dot_precision='tf32') (3 Triton passes + d x d "
                    "torch on the device; check=True: one status read at the end of the call)",
    "jacap_triton_async": "the same with check=False: no host synchronisation inside the call",
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
    from ..scoring import jacap_scores

    product = torch.empty_like(values)

    def floor_gemm():
        gram = values.transpose(-1, -2) @ values
        torch.matmul(values, gram, out=product)

    fns = {
        "floor": lambda: keys.sum() + values.sum(),
        "floor_gemm": floor_gemm,
        "jacap_torch": lambda: jacap_scores(keys, values, mu, lam, tau=TAU, noise=NOISE, backend="torch"),
    }
    if device.type == "cuda":
        from ..scoring.triton import triton_jacap_scores

        fns["jacap_triton"] = lambda: triton_jacap_scores(keys, values, mu, lam, tau=TAU, noise=NOISE)
        fns["jacap_triton_async"] = lambda: triton_jacap_scores(keys, values, mu, lam, tau=TAU, noise=NOISE, check=False)
    fns.update(kvpress_scorers(keys, values, mu, lam))
    return fns



def repeats_for(N: int, device, quick: bool) -> int:
    if quick:
        return 1
    if device.type == "cuda":
        return 20 if N <= 65536 else 10
    return 3 if N >= 65536 else 5



@torch.no_grad()
def time_scoring(Ns, ds, device, dtype, quick=False, progress=print, time_budget_s=None) -> dict:
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
            timing = time_round_robin(fns, device, repeats=reps, warmup=1)
            floor = timing["floor"]["median_s"]
            floor_min, gemm_min = timing["floor"]["min_s"], timing["floor_gemm"]["min_s"]
            for name, fn in fns.items():
                gc.collect()
                peak = peak_extra_bytes(fn, device)
                t = timing[name]
                rows.append({
                    "N": N, "d": d, "method": name, **t,
                    "ratio_to_floor": t["median_s"] / floor,
                    "min_over_kv_floor": t["min_s"] / floor_min,
                    "min_over_gemm_floor": t["min_s"] / gemm_min,
                    "peak_extra_bytes": peak,
                    "peak_extra_over_kv_bytes": None if peak is None else peak / (keys.nbytes + values.nbytes),
                    "load_average_1m_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                })
            cap = timing["capkv"]["median_s"]
            line = f"N={N:6d} d={d:3d} reps={reps}  floor {floor_min * 1e3:8.2f} ms"
            for name in fns:
                if name != "floor":
                    t = timing[name]["min_s"]
                    line += f" | {name} {t * 1e3:8.2f} ms ({t / floor_min:5.1f}x kv, {t / gemm_min:4.2f}x gemm)"
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
        if "min_over_gemm_floor" in r:
            out[key]["jacap_torch_over_gemm_floor"] = r["min_over_gemm_floor"]
            out[key]["jacap_torch_over_kv_floor"] = r["min_over_kv_floor"]
        if (N, d, "jacap_triton") in by:
            t = by[(N, d, "jacap_triton")]
            out[key]["jacap_triton_over_floor"] = t["ratio_to_floor"]
            out[key]["jacap_triton_over_jacap_torch"] = t["median_s"] / r["median_s"]
    return out


def fixed_and_per_token(rows) -> list[dict]:
    """Per (d, method): the fastest time per call against N fitted by a line, ``t = fixed + per_token * N``
    (least squares in relative error, over the N's measured, with ``fixed >= 0``: where the free line would cross
    below zero, the best line through the origin), and the per-token cost as a multiple of the two floors'
    per-token costs. Needs at least two N's; ``fit_max_rel_residual`` says how well a line fits."""
    import numpy as np

    out = []
    for d in sorted({r["d"] for r in rows}):
        slopes = {}
        fits = []
        for m in dict.fromkeys(r["method"] for r in rows if r["d"] == d):
            pts = sorted((r["N"], r["min_s"]) for r in rows if r["d"] == d and r["method"] == m)
            if len(pts) < 2:
                continue
            N = np.array([p[0] for p in pts], dtype=float)
            t = np.array([p[1] for p in pts], dtype=float)
            per_token, fixed = np.polyfit(N, t, 1, w=1.0 / t)
            if fixed < 0:  # a call cannot cost less than nothing: the best line through the origin instead
                fixed, per_token = 0.0, float(np.sum(N / t) / np.sum((N / t) ** 2))
            resid = float(np.max(np.abs(fixed + per_token * N - t) / t))
            slopes[m] = per_token
            fits.append({"d": d, "method": m, "Ns": [int(x) for x in N], "fixed_s": float(fixed),
                         "per_token_s": float(per_token), "fit_max_rel_residual": resid})
        for f in fits:
            for floor, key in (("floor", "per_token_over_kv_floor"), ("floor_gemm", "per_token_over_gemm_floor")):
                f[key] = f["per_token_s"] / slopes[floor] if slopes.get(floor, 0) > 0 else None
        out += fits
    return out



# ---------------------------------------------------------------------------------------------- end to end
DEFAULT_LENGTHS = (2048, 4096, 8192)

DEFAULT_RATIOS = (0.6, 0.8)

METHODS = ("none", "jacap_prompt", "capkv")

INIT_SEED = 0

ORIGIN_FILE = "jacap_architecture.json"



def random_init_model(arch_dir: Path, device: torch.device, dtype: torch.dtype | None = None):
    """The architecture of ``arch_dir/config.json`` with randomly initialised weights (seed ``INIT_SEED``)
    and its tokenizer; float32 on the CPU, bfloat16 on a GPU (as ``load_model``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ..models import DEFAULT_ATTN

    config = AutoConfig.from_pretrained(arch_dir)
    dtype = dtype or (torch.float32 if device.type == "cpu" else torch.bfloat16)
    torch.manual_seed(INIT_SEED)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=DEFAULT_ATTN)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(arch_dir)
    origin_file = arch_dir / ORIGIN_FILE
    origin = json.loads(origin_file.read_text()) if origin_file.is_file() else {"model": str(arch_dir)}
    record = {
        "model": f"{origin['model']} architecture (random weights)",
        "architecture_of": origin,
        "revision": origin.get("revision"),
        "weights": f"random init (transformers' own initialisation, torch.manual_seed({INIT_SEED})), "
                   "same architecture as the named model; timing does not depend on the weights' values",
        "architecture_source": str(arch_dir / "config.json"),
        "architecture_config_sha256": hashlib.sha256((arch_dir / "config.json").read_bytes()).hexdigest(),
        "architecture": {k: getattr(config, k, None) for k in (
            "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "rope_parameters", "tie_word_embeddings")},
    }
    return model, tokenizer, record



def token_prompt(tokenizer, length: int, text: str) -> torch.Tensor:
    """``(1, length)`` token ids of ``text``, cycled when it is shorter, and how many times it was repeated."""
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    reps = -(-length // ids.numel())
    return ids.repeat(reps)[:length][None], reps


class _Timed:
    """Wraps ``press.score`` and accumulates the seconds spent in it."""

    def __init__(self, fn, device):
        self.fn, self.device, self.seconds, self.calls = fn, device, 0.0, 0

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, *args, **kwargs):
        self._sync()
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self._sync()
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out



def _now(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()



@torch.no_grad()
def run_one(model, ids, method: str, ratio: float, new_tokens: int) -> dict:
    from transformers import DynamicCache

    from ..presses.registry import build_press

    device = model.device
    ids = ids.to(device)
    press, timer = None, None
    if method != "none":
        press = build_press(method, ratio)
        timer = _Timed(press.score, device)
        press.score = timer
    cache = DynamicCache()
    context, last = ids[:, :-1], ids[:, -1:]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = _now(device)
    if press is None:
        model.model(input_ids=context, past_key_values=cache)
    else:
        with press(model):
            model.model(input_ids=context, past_key_values=cache)
    t1 = _now(device)
    kept = cache.get_seq_length()
    position = torch.tensor([[context.shape[1]]], device=device)
    token = last
    for step in range(new_tokens):
        logits = model(input_ids=token, past_key_values=cache, position_ids=position + step, logits_to_keep=1).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
    t2 = _now(device)
    prefill, decode = t1 - t0, t2 - t1
    row = {
        "method": method, "ratio": 0.0 if method == "none" else ratio, "prompt_tokens": ids.shape[1],
        "kept_tokens_per_head": int(kept), "new_tokens": new_tokens,
        "prefill_s": prefill, "decode_s": decode, "total_s": prefill + decode,
        "decode_ms_per_token": 1e3 * decode / new_tokens,
        "scoring_s": timer.seconds if timer else 0.0, "score_calls": timer.calls if timer else 0,
    }
    row["scoring_share_of_total"] = row["scoring_s"] / row["total_s"]
    row["load_average_1m_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if device.type == "cuda":
        row["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return row


TIMED_FIELDS = ("prefill_s", "decode_s", "total_s", "decode_ms_per_token", "scoring_s")


def median_row(runs: list[dict]) -> dict:
    """One row from repeated :func:`run_one` runs of the same configuration: the median of each timed
    field (``TIMED_FIELDS``), with the min and max of the decode time per token and the repeat count;
    the untimed fields (method, ratio, kept tokens, ...) must agree across the runs."""
    if not runs:
        raise ValueError("`runs` is empty: pass the rows of at least one run_one call")
    fixed = ("method", "ratio", "prompt_tokens", "kept_tokens_per_head", "new_tokens")
    for key in fixed:
        if len({r[key] for r in runs}) != 1:
            raise ValueError(f"`runs` mix configurations: {key} = {sorted({r[key] for r in runs})}")
    row = dict(runs[0])
    for key in TIMED_FIELDS:
        row[key] = statistics.median(r[key] for r in runs)
    row["scoring_share_of_total"] = row["scoring_s"] / row["total_s"]
    row["decode_ms_per_token_min"] = min(r["decode_ms_per_token"] for r in runs)
    row["decode_ms_per_token_max"] = max(r["decode_ms_per_token"] for r in runs)
    row["repeats"] = len(runs)
    if "peak_memory_bytes" in runs[0]:
        row["peak_memory_bytes"] = max(r["peak_memory_bytes"] for r in runs)
    return row
