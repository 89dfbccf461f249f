"""The one-knob ladder from Jacap's prompt press (``JacapPromptPress()``) to kvpress KVzip, on the tune documents.

``jacap evaluate kvzip-ladder``  every step of :data:`STEPS` on every tune document (never a dev or confirmatory one) ->
                                 ``data/results/eval/peers/ladder.jsonl`` (the evaluation's rows, resumable) with
                                 ``ladder.config.json``; kvpress's own ``kvzip`` on the first document of each
                                 length (the check that step L3 is KVzip)
``jacap evaluate kvzip-ladder-summary``  ladder.jsonl -> ``ladder_summary.json``: per (length, c) cell, each step's
                                 geometric-mean KL ratio to the step before with a BCa interval simultaneous over
                                 every (step, cell) judged (Bonferroni), its verdict, and each step's share of the
                                 log gap prompt press -> KVzip (the step ratios multiply to the total ratio)

The steps change one thing each (:class:`~jacap_lib.presses.jacap_context.JacapPress`):

* L0 the default ``jacap_prompt`` written out in full;
* L1 (a) which queries: the reconstruction pass's queries instead of the prompt's recent ones (Jacap's statistics,
  weight and leverage, per-head budget, the default's window 16, centre, tau and noise);
* L1b the protection as KVzip's (window 0);
* L2 (b) how the queries are summarised: KVzip's max attention instead of Algorithm 1 (per-head budget);
* L3 (c) the budget: KVzip's global one (= kvpress KVzip);
* d   Jacap's weight and leverage on KVzip's queries and budget, against L3.

The measurement is the evaluation's (:func:`~jacap_lib.experiments.protocol.measure_group`: one captured prefill and
reference per (document, length); L0 replayed; the reconstruction presses on the real prefill, scored once for every
(step, ratio) with the same scoring: ``reuse_scores`` and ``share_scoring``).
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import time
from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments import job as J

__all__ = ["STEPS", "LADDER", "EXTRA", "LENGTHS", "RATIOS", "FILE", "SUMMARY_FILE", "COST_FILE", "step_specs",
           "prepare", "execute", "summarize_ladder", "LADDER_JOB", "LADDER_SUMMARY"]

#: label -> (spec before writing out, what the step changes); L0's options are the default's, and the context steps
#: take the default's window, centre, tau and noise where they keep Jacap's
STEPS = {
    "L0": ("jacap_prompt", "the default press (Algorithm 1, the prompt's recent queries, per-head budget)"),
    "L1": ("jacap[summary=jacap,budget=head,window=16,centre=observed,tau=3,noise=1]",
           "(a) which queries: the context-reconstruction queries' statistics"),
    "L1b": ("jacap[summary=jacap,budget=head,window=0,centre=observed,tau=3,noise=1]",
            "protection as KVzip's (no recent window)"),
    "L2": ("jacap[summary=max,budget=head,window=0]",
           "(b) how the queries are summarised: KVzip's max attention"),
    "L3": ("jacap[summary=max,budget=global,window=0]", "(c) the budget: KVzip's global one (= KVzip)"),
    "d": ("jacap[summary=jacap,budget=global,window=0,centre=observed,tau=3,noise=1]",
          "(d) Jacap's weight and leverage on KVzip's queries and budget"),
}
#: the ladder's comparisons (step, the step before); their ratios multiply to L3 / L0
LADDER = (("L1", "L0"), ("L1b", "L1"), ("L2", "L1b"), ("L3", "L2"))
#: the comparison beside the ladder
EXTRA = (("d", "L3"),)
CHECK = "kvzip"  # kvpress KVzip, on the first tune document of each length: L3's rows must equal its rows
LENGTHS = (512, 1024)
RATIOS = (0.5, 0.75, 0.9, 0.95)
GRID_CHOICE = ("prompt lengths 512 and 1024 only (2048 is left for a later run: the CPU is shared), c 0.5/0.75/0.9/"
               "0.95, a 128-token continuation, one worker")
FILE = "ladder.jsonl"
SUMMARY_FILE = "ladder_summary.json"
COST_FILE = "ladder_cost.jsonl"
ALPHA = 0.05
GAP = 1.25  # a total ratio within a factor GAP of 1 has no gap worth splitting into shares (they blow up near 0)


def step_specs() -> dict:
    """``{label: written-out spec}`` (:func:`~jacap_lib.presses.registry.written_out`)."""
    from jacap_lib.presses.registry import written_out

    return {k: written_out(s) for k, (s, _) in STEPS.items()}


def _build(spec: str, compression_ratio: float):
    from jacap_lib.presses.registry import press_from_spec

    return press_from_spec(spec, compression_ratio)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from jacap_lib.experiments import protocol as E

    J.shared_options(parser, seed=True)
    J.grid_options(parser, lengths=LENGTHS, ratios=RATIOS, continuation=E.DEFAULT_CONTINUATION)
    parser.add_argument("--manifest", type=Path, default=None,
                        help="document manifest (default: the evaluation corpus); only its tune documents are used")
    E.folder_options(parser, quick="smoke run: 2 tune documents, prompt 512, c 0.75/0.9, 32-token continuation",
                     folder="output folder (default data/results/eval/peers; with --quick data/results/eval/quick)")
    parser.add_argument("--no-cost", action="store_true",
                        help="skip the direct prefill timing on the first document of each length (ladder_cost.jsonl)")


def prepare(args, *, tokenizer=None):
    """Check every option (``ValueError`` naming it); the evaluation's ``Plan`` (``space``: ``{label: (spec,)}``)."""
    from jacap_lib.models import load_tokenizer
    from jacap_lib.presses.registry import method_options
    from jacap_lib.experiments import protocol as E
    from jacap_lib.results.provenance import model_record

    quick = bool(args.quick)
    lengths, ratios, continuation = E.grid_from_args(args, lengths=LENGTHS, ratios=RATIOS, min_length=64,
                                                     why=" (KVzip reconstructs what follows its chat-template prefix)")
    specs = step_specs()
    options = {s: method_options(_build(s, ratios[0])) for s in [*specs.values(), CHECK]}
    J.check_model(args.model)
    try:
        docs = [d for d in E.load_docs(args.manifest, quick=quick) if d["split"] == "tune"]
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"--manifest: {e}") from None
    if not docs:
        raise ValueError("--manifest: it has no tune document")
    out_dir = E.eval_dir(args.dir, quick=quick, space="peers")
    tok = tokenizer if tokenizer is not None else load_tokenizer(args.model)
    E.check_lengths(tok, docs, lengths, continuation)
    E.check_settings_unchanged(out_dir / FILE, None, [*specs.values(), CHECK], ratios, build=_build)
    record = model_record(args.model)
    given = args.lengths is not None or args.ratios is not None
    config = {"job": "kvzip-ladder", "model": record, "lengths": list(lengths), "ratios": list(ratios),
              "continuation": int(continuation),
              "grid_choice": ("given by --lengths / --ratios; " if given else "") + GRID_CHOICE,
              "steps": {k: {"spec": specs[k], "description": STEPS[k][1], "options": options[specs[k]]} for k in STEPS},
              "ladder": [list(p) for p in LADDER], "extra": [list(p) for p in EXTRA],
              "check": {"spec": CHECK, "documents": "the first tune document of each length",
                        "rule": "L3's rows equal kvpress kvzip's on the same document (KL to 1e-6)"},
              "score_reuse": "one reconstruction scoring per (document, length, scoring): the steps and ratios that "
                             "differ only in compress_post's fields (ratio, budget, window) share it "
                             "(quality.caches_by_setting); each row's seconds are its share (scores_shared_by)",
              "documents": [{k: d.get(k) for k in ("id", "kind", "split", "sha256", "source", "license")} for d in docs]}
    space = {k: (specs[k],) for k in STEPS}
    return E.Plan(job="kvzip-ladder", out_dir=Path(out_dir), model_name=args.model, model_label=record["name"],
                  lengths=lengths, ratios=ratios, continuation=int(continuation), space=space, docs=docs,
                  config=config, record=record, threads=args.threads, workers=1, seed=args.seed,
                  progress=not args.no_progress,
                  extra={"command": getattr(args, "command", None), "cost": not getattr(args, "no_cost", False)})


def _measure(model, tokenizer, group, on_row=None, *, continuation, model_name, cost_file=None):
    """One group by the evaluation's :func:`measure_group` (reuse and sharing of the reconstruction scoring); with
    ``cost_file``, first the direct prefill timing of the default, kvpress KVzip and jacap (:func:`time_prefills`)."""
    from jacap_lib.experiments import protocol as E

    if cost_file is not None:
        files.append_jsonl(cost_file, time_prefills(model, tokenizer, group, model_name=model_name))
    return E.measure_group(model, tokenizer, group, continuation, model_name, on_row=on_row, build=_build,
                           reuse_scores=True, share_scoring=True)


def time_prefills(model, tokenizer, group, *, model_name) -> dict:
    """CPU and wall seconds of one real prefill (``with press(model): model(prompt)``) of the group's document at
    c 0.5: no press, the default (L0), kvpress KVzip, and jacap's L1 (the reconstruction scored by
    Algorithm 1), each once, in that order."""
    import torch
    from transformers import DynamicCache

    from jacap_lib.hf import clear_masks
    from jacap_lib.measure.quality import prompt_and_continuation

    d = group.doc
    prompt, _ = prompt_and_continuation(tokenizer, d["text"], group.length, 1, name=f"document {d['id']}")
    specs = step_specs()
    out = {"model": model_name, "doc": d["id"], "sha256": d["sha256"], "length": group.length, "ratio": 0.5,
           "threads": torch.get_num_threads(), "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    for label, spec in (("none", None), ("L0", specs["L0"]), ("kvzip", CHECK), ("L1", specs["L1"])):
        press = None if spec is None else _build(spec, 0.5)
        w0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            cache = DynamicCache()
            if press is None:
                model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
            else:
                with press(model):
                    model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        out[label] = {"spec": spec, "cpu_seconds": round(time.process_time() - c0, 3),
                      "seconds": round(time.perf_counter() - w0, 3)}
        clear_masks(model)
    return out


def execute(plan, *, model=None, tokenizer=None) -> dict:
    """Run a :func:`prepare`\\ d ladder: the rows not yet in ``ladder.jsonl`` (kvpress kvzip on the first document of
    each length too), appended as each prefill's replays finish. ``{"rows_written", "file"}``."""
    from jacap_lib.experiments import protocol as E
    from jacap_lib.results.provenance import provenance

    out = plan.out_dir / FILE
    done = {E.row_key(r) for r in files.read_jsonl(out)}
    groups = E.tune_groups(plan.docs, plan.space, plan.lengths, plan.ratios, plan.continuation, plan.model_label, done)
    first = plan.docs[0]
    for L in plan.lengths:  # the check: kvpress kvzip on the first document of each length
        jobs = [(CHECK, c) for c in plan.ratios if (plan.model_label, first["id"], first["sha256"], int(L),
                                                    int(plan.continuation), float(c), CHECK) not in done]
        if jobs:
            g = next((g for g in groups if g.doc["id"] == first["id"] and g.length == L), None)
            if g is None:
                groups.insert(0, E.Group(first, int(L), jobs))
            else:
                g.jobs += jobs
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    run = {**plan.config, **provenance(model, model_name=plan.model_name, command=plan.extra.get("command")),
           "threads": plan.threads, "workers": 1, "seed": plan.seed,
           "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    files.append_run(out, run)
    timed = {(r["doc"], int(r["length"])) for r in files.read_jsonl(plan.out_dir / COST_FILE)}
    n = 0
    for g in groups:
        cost = (plan.out_dir / COST_FILE if plan.extra.get("cost") and g.doc["id"] == first["id"]
                and (first["id"], g.length) not in timed else None)
        measure = functools.partial(_measure, continuation=plan.continuation, model_name=plan.model_label,
                                    cost_file=cost)
        n += E.run_groups([g], out, measure=measure, model=model, tokenizer=tokenizer, model_name=plan.model_name,
                          workers=1, threads=plan.threads, seed=plan.seed, progress=plan.progress)
        if model is None:  # the first group loaded it: keep it
            model, tokenizer = E._WORKER.get("model"), E._WORKER.get("tok")
    return {"rows_written": n, "file": str(out)}


def _ladder_run(args):
    res = execute(J.prepared(prepare, args))
    print(f"wrote {res['rows_written']} new rows to {res['file']}")
    return res


# --------------------------------------------------------------------------------------------- summary
def summarize_ladder(rows: list[dict], runs: list[dict], *, alpha: float = ALPHA, seed: int | None = None) -> dict:
    """The ladder summary (pure): ``rows`` of ``ladder.jsonl``, ``runs`` its recorded configurations.

    Judged: every (length, c) cell where every step has rows on every tune document of the latest run. Each step of
    :data:`LADDER` and :data:`EXTRA` against the step before, per cell: the geometric-mean KL ratio (paired per
    document, KLs floored at the protocol's ``KL_FLOOR``) with a BCa interval at ``1 - alpha / m`` (m = steps x
    cells: simultaneous, Bonferroni) and its verdict; the total L3 / L0; each ladder step's share of the log gap
    ``log(step ratio) / log(total)`` (the shares add to 1, the step ratios multiply to the total). The check: L3's
    KL equals kvpress kvzip's wherever both were measured."""
    import numpy as np

    from jacap_lib.verdicts import intervals as V
    from jacap_lib.experiments.ablation import simultaneous_resamples
    from jacap_lib.verdicts.rows import KL_FLOOR, paired_values

    if not runs:
        raise ValueError("ladder.jsonl has no recorded configuration; run `jacap evaluate kvzip-ladder`")
    last = runs[-1]
    specs = {k: v["spec"] for k, v in last["steps"].items()}
    docs = {d["id"] for d in last["documents"]}
    rows = [r for r in rows if r["doc"] in docs and int(r["continuation"]) == int(last["continuation"])]
    have: dict = {}
    for r in rows:
        have.setdefault((int(r["length"]), float(r["ratio"]), r["method"]), set()).add(r["doc"])
    cells = [(L, c) for L in sorted({int(r["length"]) for r in rows}) for c in sorted({float(r["ratio"]) for r in rows})
             if all(have.get((L, c, s), set()) >= docs for s in specs.values())]
    # the check: L3 = kvpress KVzip
    check = []
    for r in rows:
        if r["method"] != CHECK:
            continue
        twin = next((x for x in rows if x["method"] == specs["L3"] and x["doc"] == r["doc"]
                     and x["length"] == r["length"] and x["ratio"] == r["ratio"]), None)
        if twin is not None:
            check.append({"doc": r["doc"], "length": r["length"], "ratio": r["ratio"], "kl_kvzip": r["kl"],
                          "kl_L3": twin["kl"], "equal": abs(r["kl"] - twin["kl"]) <= 1e-6,
                          "kept_equal": r["kept_tokens"] == twin["kept_tokens"]})
    if any(not (c["equal"] and c["kept_equal"]) for c in check):
        raise ValueError(f"step L3 ({specs['L3']}) differs from kvpress kvzip: {[c for c in check if not c['equal']]}")
    pairs = LADDER + EXTRA
    m = max(1, len(cells) * len(pairs))
    conf = V.simultaneous_confidence(1 - alpha, m)
    n_res = simultaneous_resamples(m, alpha)
    opts = {"n_resamples": n_res, "seed": V.SEED if seed is None else seed}
    out_cells = []
    for L, c in cells:
        steps = []
        for a, b in pairs:
            _, x, y = paired_values(rows, specs[a], specs[b], L, c)
            x, y = np.maximum(x, KL_FLOOR), np.maximum(y, KL_FLOOR)
            iv = V.geometric_mean_ratio(x, y, confidence=conf, **opts)
            iv95 = V.geometric_mean_ratio(x, y, confidence=1 - alpha, **opts)
            steps.append({"step": a, "base": b, "gm_ratio": iv.estimate, "gm_low": iv.low, "gm_high": iv.high,
                          "verdict": V.verdict(iv), "gm_low_95": iv95.low, "gm_high_95": iv95.high,
                          "verdict_95": V.verdict(iv95), "wins": int(np.sum(x < y)), "n": iv.n})
        _, x, y = paired_values(rows, specs["L3"], specs["L0"], L, c)
        total = V.geometric_mean_ratio(np.maximum(x, KL_FLOOR), np.maximum(y, KL_FLOOR), confidence=conf, **opts)
        log_total = math.log(total.estimate)
        for s in steps:
            if (s["step"], s["base"]) in LADDER:
                s["share_of_log_gap"] = math.log(s["gm_ratio"]) / log_total if log_total else float("nan")
        out_cells.append({"length": L, "ratio": c, "total_L3_over_L0": total.estimate, "total_low": total.low,
                          "total_high": total.high, "total_verdict": V.verdict(total), "steps": steps})
    # per cell the step that carries the gap (the largest share), where there is a gap to split (|log total| at least
    # log GAP); pooled shares over the cells where KVzip is lower and, apart, where it is higher (opposite gaps cancel)
    for x in out_cells:
        big = abs(math.log(x["total_L3_over_L0"])) >= math.log(GAP)
        lad = [s for s in x["steps"] if "share_of_log_gap" in s]
        x["carrier"] = max(lad, key=lambda s: s["share_of_log_gap"])["step"] if big else None
    pooled = {}
    for side, keep in (("kvzip_lower", lambda t: t < 1 / GAP), ("kvzip_higher", lambda t: t > GAP)):
        sel = [x for x in out_cells if keep(x["total_L3_over_L0"])]
        if not sel:
            continue
        tot = sum(math.log(x["total_L3_over_L0"]) for x in sel)
        shares = {a: sum(math.log(next(s["gm_ratio"] for s in x["steps"] if s["step"] == a)) for x in sel) / tot
                  for a, _ in LADDER}
        carrier = max(shares, key=lambda k: shares[k])
        pooled[side] = {"cells": [f"{x['length']}/{x['ratio']}" for x in sel], "total_gm_ratio":
                        math.exp(tot / len(sel)), "shares": shares, "carrier": carrier}
    carrier = {k: v["carrier"] for k, v in pooled.items()}
    # cells not complete (an interrupted run): point estimates on the documents every step has, not judged
    partial = []
    for L in sorted({int(r["length"]) for r in rows}):
        for c in sorted({float(r["ratio"]) for r in rows}):
            if (L, c) in cells:
                continue
            common = set.intersection(*(have.get((L, c, s), set()) for s in specs.values()))
            if len(common) < 3:
                continue
            sub = [r for r in rows if r["doc"] in common]
            est = {}
            for a, b in pairs + (("L3", "L0"),):
                _, x, y = paired_values(sub, specs[a], specs[b], L, c)
                est[f"{a}/{b}"] = float(np.exp(np.mean(np.log(np.maximum(x, KL_FLOOR)) - np.log(np.maximum(y, KL_FLOOR)))))
            partial.append({"length": L, "ratio": c, "n_documents": len(common), "of": len(docs),
                            "gm_ratios": est, "judged": False})
    return {"m": m, "confidence": conf, "n_resamples_adjusted": n_res, "cells": out_cells, "partial_cells": partial,
            "cells_judged": [f"{L}/{c}" for L, c in cells], "pooled_share_of_log_gap": pooled, "carrier": carrier,
            "gap": GAP, "kvzip_check": check, "steps": {k: specs[k] for k in STEPS},
            "cost": cost_summary(rows, specs)}


def cost_summary(rows: list[dict], specs: dict) -> dict:
    """Per length, the mean row CPU seconds of each step (a reconstruction step's rows carry their share of the
    shared scoring) and the mean captured-prefill CPU seconds the replays of L0 build on."""
    import statistics

    out = {}
    for L in sorted({int(r["length"]) for r in rows}):
        per = {}
        for k, s in specs.items():
            xs = [r["cpu_seconds"] for r in rows if r["method"] == s and int(r["length"]) == L]
            if xs:
                per[k] = statistics.mean(xs)
        pre = [r["prefill_cpu_seconds"] for r in rows if r["method"] == specs["L0"] and int(r["length"]) == L]
        out[str(L)] = {"row_cpu_seconds": per, "capture_cpu_seconds": statistics.mean(pre) if pre else None}
    return out


def _summary_add(parser):
    from jacap_lib.experiments import protocol as E

    E.summary_options(parser, "folder of ladder.jsonl, where ladder_summary.json is written (default "
                              "data/results/eval/peers)")


def _summary_run(args):
    from jacap_lib.experiments import protocol as E
    from jacap_lib.verdicts import intervals as V

    def load(args):
        out_dir = E.eval_dir(args.dir, quick=args.quick, space="peers")
        path = out_dir / FILE
        if not path.is_file() or not files.config_path(path).is_file():
            raise ValueError(f"--dir: {path} (or its configuration) does not exist; run `jacap evaluate kvzip-ladder`")
        runs = files.read_runs(path)
        return out_dir, runs, summarize_ladder(files.read_jsonl(path), runs, seed=args.seed)

    out_dir, runs, summary = J.prepared(load, args)
    cost = files.read_jsonl(out_dir / COST_FILE)
    config = {"inputs": [FILE, COST_FILE], "runs": [r.get("command") for r in runs],
              "command": getattr(args, "command", None), "model": runs[-1]["model"],
              "continuation": runs[-1]["continuation"], "grid_choice": runs[-1].get("grid_choice"),
              "documents": [d["id"] for d in runs[-1]["documents"]],
              "statistics": {"primary": "geometric-mean KL ratio of each step to the step before, paired per tune "
                                        "document", "adjustment": f"Bonferroni: each interval at 1 - {ALPHA}/m over the "
                                                                  "m (step, cell) comparisons", "method": V.METHOD,
                             "seed": V.SEED if args.seed is None else args.seed}}
    out = out_dir / SUMMARY_FILE
    files.write_json(out, {"config": config, **files.round_floats(summary), "prefill_timing": cost})
    print(f"wrote {out}: {summary['m']} comparisons at {summary['confidence']:.5f}")
    for cell in summary["cells"]:
        print(f"L={cell['length']} c={cell['ratio']}: total {cell['total_L3_over_L0']:.3f} " + "; ".join(
            f"{s['step']}/{s['base']} {s['gm_ratio']:.3f} [{s['gm_low']:.3f}, {s['gm_high']:.3f}]"
            + (f" share {s['share_of_log_gap']:.2f}" if "share_of_log_gap" in s else "") for s in cell["steps"]))
    return out


LADDER_JOB = J.Job("the one-knob ladder from the prompt press JacapPromptPress() to kvpress KVzip (which queries, the protection, "
                   "how they are summarised, the budget; and Jacap's score on KVzip's queries and budget) on every tune "
                   "document -> data/results/eval/peers/ladder.jsonl (resumable)", _add_arguments, _ladder_run)
LADDER_SUMMARY = J.Job("per cell, each ladder step's geometric-mean KL ratio to the step before with simultaneous "
                       "(Bonferroni) intervals and verdicts, and each step's share of the log gap prompt press -> KVzip -> "
                       "data/results/eval/peers/ladder_summary.json", _summary_add, _summary_run)
