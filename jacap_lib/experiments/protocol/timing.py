"""The time job: wall and CPU seconds of one prefill and one replay per setting on one document
(:func:`time_methods`), and the whole tune + dev grid extrapolated from them (:func:`estimate`)
-> ``timing.json``."""
from __future__ import annotations

import os
import time

from jacap_lib.results import files
from jacap_lib.experiments.protocol import rules as P

__all__ = ["time_methods", "estimate", "time_options", "execute_time"]


def time_methods(model, tokenizer, doc: dict, *, space: dict, lengths, ratio: float, continuation: int,
                 progress: bool = True) -> list[dict]:
    """Wall and CPU seconds, on one document, of one prefill capture (+ full reference) per length and one
    replay (press hook + continuation) per setting of ``space``."""
    from tqdm.auto import tqdm

    from jacap_lib.measure.quality import capture_prefill, full_reference, next_token_kl, prompt_and_continuation
    from jacap_lib.presses.registry import press_from_spec

    specs = [s for v in space.values() for s in v]
    rows = []
    bar = tqdm(total=len(lengths) * (len(specs) + 1), desc="timing", disable=not progress)
    for L in lengths:
        prompt, cont = prompt_and_continuation(tokenizer, doc["text"], L, continuation, name=f"document {doc['id']}")
        w, c = time.perf_counter(), time.process_time()
        cap = capture_prefill(model, prompt)
        ref = full_reference(model, None, prompt, cont, capture=cap)
        rows.append({"length": L, "what": "prefill", "seconds": time.perf_counter() - w, "cpu_seconds": time.process_time() - c})
        bar.update(1)
        for s in specs:
            press = press_from_spec(s, ratio)
            w, c = time.perf_counter(), time.process_time()
            next_token_kl(model, None, prompt, cont, press, reference=ref, capture=cap)
            rows.append({"length": L, "what": "replay", "method": s, "family": P.method_of(s),
                         "seconds": time.perf_counter() - w, "cpu_seconds": time.process_time() - c})
            bar.update(1)
    bar.close()
    return rows


def estimate(timing_rows: list[dict], *, space: dict, n_tune: int, n_dev: int, n_ratios: int,
             key: str = "cpu_seconds") -> dict:
    """Seconds of the full grid from :func:`time_methods` rows: the tune job runs every setting on every tune
    document, the dev job one setting per method (its settings' mean cost) on every dev document;
    one prefill per (document, length). ``{"tune", "dev", "total"}`` in seconds of ``key``."""
    by = {(r["length"], r.get("method", "prefill")): r[key] for r in timing_rows}
    lengths = sorted({r["length"] for r in timing_rows})
    tune = dev = 0.0
    for L in lengths:
        settings = [by[(L, s)] for v in space.values() for s in v]
        per_method = [sum(by[(L, s)] for s in v) / len(v) for v in space.values()]
        tune += n_tune * (by[(L, "prefill")] + n_ratios * sum(settings))
        dev += n_dev * (by[(L, "prefill")] + n_ratios * sum(per_method))
    return {"tune": tune, "dev": dev, "total": tune + dev}


def time_options(args, docs: list[dict], tok, lengths, continuation: int) -> dict:
    """The time job's own options, checked (``ValueError`` naming each): ``--ratio``, ``--doc`` (the first
    document long enough for the longest prompt when not given), ``--n-tune``/``--n-dev`` (default: the
    manifest's counts). ``{"doc", "ratio", "n_tune", "n_dev"}`` for the plan."""
    from jacap_lib._checks import compression_ratio

    compression_ratio(args.ratio, "--ratio", allow_zero=False)
    pick = [d for d in docs if d["id"] == args.doc] if args.doc else docs
    if args.doc and not pick:
        raise ValueError(f"--doc {args.doc!r} is not in the manifest; valid: {[d['id'] for d in docs][:8]}...")
    counts = {d["id"]: int(tok(d["text"], return_tensors="pt", add_special_tokens=False).input_ids.shape[1]) for d in pick}
    long_enough = [d for d in pick if counts[d["id"]] >= max(lengths) + continuation]
    if not long_enough:
        raise ValueError(f"--doc/--lengths: no document has {max(lengths) + continuation} tokens (longest: "
                         f"{max(counts.values())}); give shorter --lengths or --manifest with a longer document")
    return {"doc": long_enough[0], "ratio": float(args.ratio),
            "n_tune": args.n_tune or sum(d["split"] == "tune" for d in docs),
            "n_dev": args.n_dev or sum(d["split"] == "dev" for d in docs)}


def execute_time(plan, model, tokenizer) -> dict:
    """Run a prepared time job (:class:`~.runs.Plan` with ``job == "time"``): time every setting, write
    ``timing.json`` with the estimate; returns ``{"file", "estimate"}``."""
    import torch

    from jacap_lib.results.provenance import provenance

    if model is None:
        from jacap_lib.models import load_model

        torch.set_num_threads(plan.threads)
        model, tokenizer = load_model(plan.model_name)
    load_before = list(os.getloadavg())
    rows = time_methods(model, tokenizer, plan.extra["doc"], space=plan.space, lengths=plan.lengths,
                        ratio=plan.extra["ratio"], continuation=plan.continuation, progress=plan.progress)
    kw = dict(space=plan.space, n_tune=plan.extra["n_tune"], n_dev=plan.extra["n_dev"], n_ratios=len(plan.ratios))
    est = {"cpu_seconds": estimate(rows, **kw), "wall_seconds": estimate(rows, key="seconds", **kw)}
    est["hours_on_idle_cores"] = {f"workers={w}": est["cpu_seconds"]["total"] / 3600 / w for w in (1, 2)}
    config = {**provenance(model, model_name=plan.model_name, command=plan.extra.get("command")),
              "doc": plan.extra["doc"]["id"], "lengths": list(plan.lengths), "ratio": plan.extra["ratio"],
              "ratios_in_grid": list(plan.ratios), "continuation": plan.continuation, "threads": plan.threads,
              "n_tune": plan.extra["n_tune"], "n_dev": plan.extra["n_dev"], "search_space": plan.space,
              "load_average_before": load_before, "load_average_after": list(os.getloadavg()), "cpu_count": os.cpu_count()}
    path = plan.out_dir / "timing.json"
    files.write_results(path, config, [files.round_floats(r) for r in rows], estimate=files.round_floats(est))
    return {"file": str(path), "estimate": est}
