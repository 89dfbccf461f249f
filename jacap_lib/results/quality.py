"""The quality grid jobs: they run :mod:`jacap_lib.measure` and write ``data/results``.

``run_kl``       next-token KL(full || compressed) of a continuation given a compressed prompt cache, and
                 the attention-output relative error, for every (segment, prompt length, method, ratio).
``run_passkey``  needle retrieval (context length x needle depth) with greedy decoding, uncompressed and
                 compressed.
``summarize``    mean and 95% interval (bootstrap over segments, :func:`scipy.stats.bootstrap`) per
                 method x ratio x length x kind, comparisons to the best baseline, the tune/test target.

Rows are appended to a JSONL file, each keyed by its configuration; a rerun skips the rows that are
already there, so an interrupted run resumes where it stopped. The sidecar ``<out>.config.json``
records every invocation's configuration (:mod:`jacap_lib.results.files`). Command line: ``jacap bench``.

Methods are registry names (:func:`jacap_lib.list_methods`), optionally with options in brackets:
``jacap[tau=1.0]``, ``jacap[noise=100]``, ``snapkv[window_size=32]``
(:func:`jacap_lib.presses.registry.parse_method`).
"""
from __future__ import annotations

import math
import random
from pathlib import Path

from . import files
from . import job as J
from ..presses.registry import method_options, parse_method, press_from_spec

__all__ = ["DEFAULT_RATIOS", "DEFAULT_LENGTHS", "PASSKEY_LENGTHS", "PASSKEY_DEPTHS", "row_key", "run_kl",
           "run_passkey", "bootstrap_ci", "paired", "summarize", "choose_target", "rank_on_tune", "COMPRESSED", "KL", "PASSKEY", "SUMMARY"]

DEFAULT_RATIOS = (0.5, 0.75, 0.9)
DEFAULT_LENGTHS = (512, 1024)
PASSKEY_LENGTHS = (128, 256, 384, 512, 768)
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
COMPRESSED = ("prompt KV only (kvpress prefill hook, every layer and KV head); continuation and decoding KV "
              "never evicted")


def row_key(row: dict) -> tuple:
    return (row["task"], row["model"], row["segment"], row["length"], row["continuation"], row["method"],
            row["ratio"])


def run_kl(model, tokenizer, *, segments: list[dict], methods: list[str], ratios, lengths, continuation: int,
           out: Path, model_name: str, progress: bool = True) -> int:
    """Append one row per (segment, length, method, ratio) not yet in ``out``; returns rows written."""
    from tqdm.auto import tqdm

    from ..measure.quality import kl_grid_cell, prompt_and_continuation

    out = Path(out)
    for spec in methods:  # fail fast on bad names/options before any model work
        press_from_spec(spec, 0.5)
    done = {row_key(r) for r in files.read_jsonl(out)}
    by_prompt: dict = {}
    for seg in segments:
        for L in lengths:
            for spec in methods:
                for c in ratios:
                    key = ("kl", model_name, seg["id"], int(L), int(continuation), spec, float(c))
                    if key not in done:
                        by_prompt.setdefault((seg["id"], int(L)), (seg, []))[1].append((spec, float(c)))
    n_jobs = sum(len(v[1]) for v in by_prompt.values())
    # every prompt is tokenised (and too-short segments refused) before anything is written
    pairs = {k: prompt_and_continuation(tokenizer, seg["text"], k[1], continuation, name=f"segment {k[0]}")
             for k, (seg, _) in by_prompt.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=n_jobs, desc="kl rows", disable=not progress)
    written = 0
    for (seg_id, L), (seg, jobs) in by_prompt.items():
        prompt, cont = pairs[(seg_id, L)]
        presses = {(spec, c): press_from_spec(spec, c) for spec, c in jobs}

        def write(label, res, seconds, prefill_seconds, seg=seg, L=L):
            nonlocal written
            spec, c = label
            files.append_jsonl(out, {
                "task": "kl", "model": model_name, "segment": seg["id"], "kind": seg["kind"],
                "split": seg.get("split"), "length": L, "continuation": int(continuation), "method": spec,
                "ratio": c, "kl": res.kl, "kl_per_token": [round(float(x), 7) for x in res.kl_per_token],
                "attn_rel_error": res.attn_rel_error,
                "attn_rel_error_per_layer": [round(float(x), 6) for x in res.attn_rel_error_per_layer],
                "top1_agreement": res.top1_agreement, "kept_tokens": res.kept_tokens,
                "press": method_options(presses[label]), "seconds": round(seconds, 3),
                "prefill_seconds": round(prefill_seconds, 3)})
            written += 1
            bar.update(1)

        kl_grid_cell(model, prompt, cont, presses.items(), on_result=write)
    bar.close()
    return written


def run_passkey(model, tokenizer, *, methods: list[str], ratios, lengths, depths, trials: int, seed: int,
                out: Path, model_name: str, progress: bool = True) -> int:
    """Append one row per (length, depth, trial, method, ratio); ``method='full'`` = uncompressed."""
    from tqdm.auto import tqdm

    from ..measure.passkey import passkey_answer, passkey_prompt
    from ..measure.quality import capture_prefill

    out = Path(out)
    specs = [("full", 0.0)] + [(m, float(c)) for m in methods for c in ratios]
    for m, c in specs[1:]:
        press_from_spec(m, c)
    done = {(r["model"], r["length"], r["depth"], r["trial"], r["method"], r["ratio"])
            for r in files.read_jsonl(out) if r.get("task") == "passkey"}
    rng = random.Random(seed)
    keys = [str(rng.randrange(10000, 100000)) for _ in range(trials)]
    todo = [(L, d, t, m, c) for L in lengths for d in depths for t in range(trials) for m, c in specs
            if (model_name, int(L), float(d), t, m, c) not in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(todo), desc="passkey rows", disable=not progress)
    written = 0
    groups: dict = {}
    for job in todo:
        groups.setdefault(job[:3], []).append(job)
    for (L, d, t), group in groups.items():
        ctx, question = passkey_prompt(tokenizer, int(L), float(d), keys[t])
        cap = capture_prefill(model, ctx)
        for _, _, _, m, c in group:
            text = passkey_answer(model, tokenizer, cap, None if m == "full" else press_from_spec(m, c), question)
            files.append_jsonl(out, {"task": "passkey", "model": model_name, "length": int(L), "depth": float(d),
                                  "trial": t, "key": keys[t], "method": m, "ratio": c, "answer": text,
                                  "correct": keys[t] in text})
            written += 1
            bar.update(1)
    bar.close()
    return written


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------
def bootstrap_ci(values, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: percentile bootstrap interval of the mean (:func:`scipy.stats.bootstrap`,
    resampling the values). One value, or all values equal: the interval is that value."""
    import numpy as np
    from scipy import stats

    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not np.isfinite(x).all():
        raise ValueError(f"`values` holds {int((~np.isfinite(x)).sum())} NaN/Inf value(s); drop or fix those rows first")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"`n_boot` (bootstrap resamples) must be an int >= 1, got {n_boot!r}")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"`level` (confidence level) must lie in (0, 1), got {level!r}")
    mean = float(x.mean())
    if x.size == 1 or np.all(x == x[0]):
        return mean, mean, mean
    res = stats.bootstrap((x,), np.mean, n_resamples=n_boot, confidence_level=level, method="percentile",
                          rng=np.random.default_rng(seed))
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)


def _geo_mean(xs) -> float:
    xs = [max(float(v), 1e-12) for v in xs]
    return math.exp(sum(math.log(v) for v in xs) / len(xs))


def paired(a: dict, b: dict) -> dict:
    """Per-segment comparison of two methods' KL (``{segment: kl}``, same segments).

    ``wins``/``losses``/``ties``: segments where ``a`` has the lower/higher/equal KL; ``mean_ratio`` =
    mean(a)/mean(b); ``geo_mean_ratio`` = geometric mean of the per-segment ratios a/b; ``wilcoxon_p``:
    two-sided ``scipy.stats.wilcoxon`` signed-rank test on the per-segment log ratios (None when every
    ratio is 1 or fewer than 2 segments).
    """
    from scipy import stats

    segs = sorted(a)
    if set(segs) != set(b):
        raise ValueError("paired(): the two methods must have rows on the same segments")
    logr = [math.log(max(a[s], 1e-12) / max(b[s], 1e-12)) for s in segs]
    p = None
    if len(segs) >= 2 and any(abs(x) > 0 for x in logr):
        p = float(stats.wilcoxon(logr).pvalue)
    mean_a, mean_b = sum(a.values()) / len(a), sum(b.values()) / len(b)
    return {"wins": sum(x < 0 for x in logr), "losses": sum(x > 0 for x in logr), "ties": sum(x == 0 for x in logr),
            "mean_ratio": mean_a / max(mean_b, 1e-12), "geo_mean_ratio": math.exp(sum(logr) / len(logr)),
            "wilcoxon_p": p}


def summarize(rows: list[dict], *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean KL / attention error with 95% bootstrap intervals per (method, ratio, length, kind).

    ``kind='all'`` pools every segment. Also, per (split, ratio, length): the best kvpress baseline by
    mean KL on that split, and for every Jacap method its paired per-segment comparison (:func:`paired`:
    wins/losses, mean-KL ratio, geometric mean of per-segment ratios, Wilcoxon p) to that baseline and
    to CapKV (the paper's own headline comparison). Only methods with rows on every segment of a cell
    enter a comparison.
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
    comparisons = []
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
                    c = {"split": split, "ratio": ratio, "length": length, "method": m, "n_segments": len(segs),
                         "best_baseline": best, "baseline_kl": base[best], "kl": sum(v.values()) / len(v),
                         **paired(v, full[best])}
                    if "capkv" in full:
                        c["vs_capkv"] = {"capkv_kl": base["capkv"], **paired(v, full["capkv"])}
                    comparisons.append(c)
    return {"table": table, "comparisons": comparisons, "target": choose_target(comparisons),
            "baselines": list(BASELINES), "n_boot": n_boot, "seed": seed,
            "bootstrap": "scipy.stats.bootstrap, percentile method, resampling segments",
            "paired_test": "scipy.stats.wilcoxon on per-segment log KL ratios, two-sided"}


def rank_on_tune(comparisons: list[dict], methods, ratios=(0.75, 0.9), lengths=(512, 1024)) -> list[dict]:
    """Rank candidate settings (e.g. windows 0/8/32/64) on the *tune* segments, best first.

    Score = sum over the (length, ratio) settings of ``log(mean_ratio) + log(geo_mean_ratio)`` to the best
    kvpress baseline: both halves of the target (mean KL and per-segment ratios), every setting weighted
    alike. Methods without tune comparisons at every setting are left out.
    """
    by = {(c["length"], c["ratio"], c["method"]): c for c in comparisons if c["split"] == "tune"}
    out = []
    for m in methods:
        cs = [by.get((L, r, m)) for L in lengths for r in ratios]
        if any(c is None for c in cs):
            continue
        score = sum(math.log(c["mean_ratio"]) + math.log(c["geo_mean_ratio"]) for c in cs)
        out.append({"method": m, "score": score, "worst_ratio": max(max(c["mean_ratio"], c["geo_mean_ratio"]) for c in cs),
                    **{f"{c['length']}/{c['ratio']}": [c["mean_ratio"], c["geo_mean_ratio"]] for c in cs}})
    return sorted(out, key=lambda x: x["score"])


def choose_target(comparisons: list[dict], ratios=(0.75, 0.9), lengths=None) -> dict:
    """Issue 10 item 6: choose a Jacap method on the *tune* segments, judge it on the *test* segments.

    The chosen method minimises, over every target (length, ratio) setting, the worst of (mean-KL ratio,
    geometric mean of per-segment KL ratios) to the best kvpress baseline on the tune split; only methods
    with tune and test comparisons at every setting compete. The target is reached when both ratios are
    <= 1 on the test split at every setting; ``test_worst_ratio`` says by how much it is missed (or met).
    """
    by = {(c["split"], c["length"], c["ratio"], c["method"]): c for c in comparisons}
    lengths = sorted(lengths or {c["length"] for c in comparisons if c["split"] == "tune"})
    settings = [(L, r) for L in lengths for r in ratios if any(k[:3] == ("tune", L, r) for k in by)]
    out = {"rule": "min over Jacap methods of max over (prompt length, c) in the settings of max(mean_ratio, "
                   "geo_mean_ratio) to the best kvpress baseline on the tune split; judged on the test split",
           "settings": [list(s) for s in settings]}
    methods = sorted({k[3] for k in by if k[0] == "tune"})
    ranked = []
    for m in methods:
        if not all(("tune", L, r, m) in by and ("test", L, r, m) in by for L, r in settings):
            continue
        worst = max(max(by[("tune", L, r, m)]["mean_ratio"], by[("tune", L, r, m)]["geo_mean_ratio"])
                    for L, r in settings)
        ranked.append((worst, m))
    if not ranked:
        out["chosen"] = None
        return out
    ranked.sort()
    worst, m = ranked[0]
    out.update(chosen=m, tune_worst_ratio=worst, runners_up=[{"method": x, "tune_worst_ratio": w} for w, x in ranked[1:4]])
    keys = ("best_baseline", "baseline_kl", "kl", "mean_ratio", "geo_mean_ratio", "wins", "losses", "wilcoxon_p",
            "n_segments")
    for split in ("tune", "test"):
        out[split] = {f"{L}/{r}": {k: by[(split, L, r, m)].get(k) for k in keys} for L, r in settings}
    out["test_worst_ratio"] = max(max(v["mean_ratio"], v["geo_mean_ratio"]) for v in out["test"].values())
    out["reached"] = out["test_worst_ratio"] <= 1
    out["reached_per_setting"] = {k: v["mean_ratio"] <= 1 and v["geo_mean_ratio"] <= 1 for k, v in out["test"].items()}
    return out


# --------------------------------------------------------------------------------------------- jobs: jacap bench
def _grid_arguments(task: str):
    def add_arguments(p) -> None:
        J.shared_options(p, seed=True, out="the JSONL grid file (rows appended; a rerun resumes)", out_required=True)
        p.add_argument("--methods", nargs="+", default=["all"],
                       help="registry names, optionally name[key=value,...]; 'all' = every registry method")
        p.add_argument("--ratios", nargs="+", type=float, default=list(DEFAULT_RATIOS))
        if task == "kl":
            p.add_argument("--lengths", nargs="+", type=int, default=list(DEFAULT_LENGTHS), help="prompt tokens")
            p.add_argument("--continuation", type=int, default=32, help="continuation tokens scored")
            p.add_argument("--segments", nargs="+", default=None, help="segment ids (default: all in the manifest)")
        else:
            p.add_argument("--lengths", nargs="+", type=int, default=list(PASSKEY_LENGTHS), help="context tokens")
            p.add_argument("--depths", nargs="+", type=float, default=list(PASSKEY_DEPTHS))
            p.add_argument("--trials", type=int, default=2)

    return add_arguments


def _check_grid(args, task: str):
    """Every argument of ``jacap bench kl|passkey``; returns (methods, config, segments)."""
    J.check_out_file(args.out, ".jsonl")
    J.check_ratios(args.ratios)
    J.check_positive(args.lengths, "--lengths")
    methods = J.check_methods(args.methods)
    config = {"command": args.command, "task": task, "ratios": args.ratios, "lengths": args.lengths,
              "seed": args.seed, "threads": args.threads, "compressed": COMPRESSED}
    segs = None
    if task == "kl":
        from .texts import load_segments

        J.check_positive(args.continuation, "--continuation")
        try:
            segs = load_segments(args.segments)
        except (ValueError, FileNotFoundError) as e:
            raise J.BadArgument(f"--segments: {e}") from None
        config.update(continuation=args.continuation, segments=[
            {k: s[k] for k in ("id", "kind", "split", "sha256", "source")} for s in segs])
    else:
        for d in args.depths:
            J.check(0 <= d <= 1, f"--depths: every depth must be in [0, 1], got {d}")
        J.check_positive(args.trials, "--trials")
        J.check(min(args.lengths) >= 32, f"--lengths: passkey contexts need >= 32 tokens, got {min(args.lengths)}")
        from ..measure.passkey import FILLER, QUESTION

        config.update(depths=args.depths, trials=args.trials, filler=FILLER, question=QUESTION)
    J.check_model(args.model)
    if task == "kl":  # every (segment, length) must hold length + continuation tokens: refuse now, not mid-run
        from ..measure.quality import prompt_and_continuation
        from ..models import load_tokenizer

        tok = load_tokenizer(args.model)
        for seg in segs:
            for L in args.lengths:
                try:
                    prompt_and_continuation(tok, seg["text"], L, args.continuation, name=f"segment {seg['id']}")
                except ValueError as e:
                    raise J.BadArgument(f"--lengths/--continuation: {e}") from None
    return methods, config, segs


def _run_grid(task: str):
    def run(args) -> int:
        import time

        from .provenance import model_record, provenance

        methods, config, segs = _check_grid(args, task)
        model, tok = J.load_model(args)
        mname = model_record(args.model)["name"]
        record = provenance(model, model_name=args.model)
        config.update(model=record["model"], versions=record["versions"], git=record["git"],
                      device=record["model"]["device"], started=time.strftime("%Y-%m-%dT%H:%M:%S"),
                      methods={m: method_options(press_from_spec(m, args.ratios[0])) for m in methods})
        files.append_run(args.out, config)
        if task == "kl":
            n = run_kl(model, tok, segments=segs, methods=methods, ratios=args.ratios, lengths=args.lengths,
                       continuation=args.continuation, out=args.out, model_name=mname, progress=not args.no_progress)
        else:
            n = run_passkey(model, tok, methods=methods, ratios=args.ratios, lengths=args.lengths, depths=args.depths,
                            trials=args.trials, seed=args.seed, out=args.out, model_name=mname,
                            progress=not args.no_progress)
        print(f"wrote {n} new rows to {args.out}")
        return n

    return run


def _summary_arguments(p) -> None:
    p.add_argument("--inp", type=Path, nargs="+", required=True, help="one or more JSONL grid files")
    J.shared_options(p, model=False, threads=False, progress=False, out="the summary JSON file", out_required=True)
    p.add_argument("--n-boot", type=int, default=2000)


def _run_summary(args) -> Path:
    rows = []
    for p in args.inp:
        J.check(p.is_file(), f"--inp {p} does not exist")
        try:
            rows += files.read_jsonl(p, missing_ok=False)
        except ValueError as e:
            raise J.BadArgument(f"--inp: {e}") from None
    J.check(any(r.get("task") == "kl" for r in rows), f"--inp {[str(p) for p in args.inp]} holds no KL rows")
    J.check_out_file(args.out, ".json")
    J.check_positive(args.n_boot, "--n-boot")
    res = summarize(rows, n_boot=args.n_boot)
    res["source"] = [str(p) for p in args.inp]
    path = files.write_json(args.out, res)
    print(f"wrote {len(res['table'])} cells and {len(res['comparisons'])} comparisons to {args.out}")
    return path


_GRID_NOTE = ". Rows are appended to --out (JSONL); a rerun resumes. The configuration goes to <out>.config.json."
_KL_HELP = "next-token KL and attention-output error per segment x length x method x ratio"
_PASSKEY_HELP = "needle retrieval over context length x needle depth"
KL = J.Job(_KL_HELP, _grid_arguments("kl"), _run_grid("kl"), description=_KL_HELP + _GRID_NOTE)
PASSKEY = J.Job(_PASSKEY_HELP, _grid_arguments("passkey"), _run_grid("passkey"), description=_PASSKEY_HELP + _GRID_NOTE)
SUMMARY = J.Job("mean and 95%% bootstrap interval per method x ratio x length x kind", _summary_arguments, _run_summary,
                description="mean and 95% bootstrap interval per method x ratio x length x kind")
