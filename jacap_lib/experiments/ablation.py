"""One-knob ablations of Jacap's default press, measured on the tune documents.

``jacap evaluate ablate``   the default press (``jacap_prompt``: the library's defaults) and every one-knob change of
                            it (:data:`jacap_lib.presses.jacap_ablation.ONE_KNOB`, label -> (registry spec,
                            description)) on *every* tune document (never a dev document) ->
                            ``data/results/eval/ablation.jsonl`` (the evaluation's row format, resumable) with
                            ``ablation.config.json``
``jacap evaluate ablate-summary``  ablation.jsonl -> ``ablation_summary.json``: per ablation and (prompt
                            length, c) cell, the paired comparison with its base (the default, or ONE_KNOB's
                            ``BASE_OF``) on the same documents
                            (:func:`~jacap_lib.experiments.protocol.compare_settings`): geometric-mean KL ratio
                            (ablation / base) with a BCa interval *simultaneous* over every (ablation, cell)
                            judged (Bonferroni: confidence 1 - alpha / m) and the unadjusted 95 % interval beside
                            it, wins/losses, Wilcoxon p, Holm p (over the ablation's cells, and over all m); plus
                            per ablation and layer the geometric-mean ratio of the attention-output relative error

The measurement is the evaluation's (:func:`~jacap_lib.experiments.protocol.measure_group`: one captured prefill
per (document, length), every (spec, c) replayed on it, a teacher-forced continuation). Every ablation changes one
knob of Algorithm 1 as tuned when the ablations ran (the preset ``algorithm1_as_ablated``, :data:`BASE_PRESET`: the
tempered centre, tau 3, beta 0.9, a 32-token window): the job writes each spec out in full on that preset
(:func:`knob_spec`), so the rows say what they measured whatever the class defaults are. A rerun skips the rows already there and refuses when a
spec now builds another press than the rows were made with (``check_settings_unchanged``).
"""
from __future__ import annotations

import argparse
import functools
import math
import os
from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.verdicts import rows as RS

__all__ = ["DEFAULT_SPEC", "BASE_PRESET", "knob_spec", "LENGTHS", "RATIOS", "GRID_CHOICE", "ALPHA", "FILE", "SUMMARY_FILE",
           "knob_table", "prepare", "execute", "summarize_ablation", "simultaneous_resamples",
           "ABLATE", "ABLATE_SUMMARY"]

#: the preset every one-knob ablation changes one option of (:data:`jacap_lib.presses.presets.PRESETS`)
BASE_PRESET = "algorithm1_as_ablated"


def knob_spec(spec: str) -> str:
    """``spec`` as the ablations measured it: the options of the preset :data:`BASE_PRESET` where neither the spec,
    nor its registry name (an alias such as ``jacap_obs`` sets the centre), nor its press class (a field default of
    its own: the multi-centre prior's flat statistics) sets them, every option then written out
    (:func:`~jacap_lib.presses.registry.written_out`)."""
    import dataclasses

    from jacap_lib.presses.jacap import JacapPromptPress
    from jacap_lib.presses.presets import PRESETS
    from jacap_lib.presses.registry import METHODS, parse_method, with_options, written_out

    name, opts = parse_method(spec)
    press = METHODS[name].press
    inherited = {f.name: f.default for f in dataclasses.fields(JacapPromptPress)}
    own = ({f.name for f in dataclasses.fields(press) if f.default != inherited.get(f.name, f.default)}
           if isinstance(press, type) else set())
    base = {k: v for k, v in PRESETS[BASE_PRESET].options.items()
            if k not in opts and k not in METHODS[name].options and k not in own}
    return written_out(with_options(spec, **base) if base else spec)


DEFAULT_SPEC = "jacap_prompt"  # the ablations' base, on BASE_PRESET (knob_spec): every ablation changes one knob of it
FILE = "ablation.jsonl"
SUMMARY_FILE = "ablation_summary.json"
ALPHA = 0.05  # family-wise error level of the simultaneous intervals and of Holm
#: The screening grid (the default of --lengths / --ratios, measured in the order of LENGTHS) and why it is this one.
LENGTHS = (2048, 512, 1024)
RATIOS = (0.5, 0.9)
GRID_CHOICE = ("c 0.5 (where the default loses to the best baseline) and c 0.9 (where it wins) at prompt lengths 2048, "
               "512, 1024, measured in that order (2048 first: where the default loses, so an interrupted run still "
               "has it). c 0.75 was dropped because the estimate said it would not fit: 16 settings (default + 15 "
               "one-knob ablations) x 18 tune documents cost ~3.5 CPU-s per (setting, document, ratio) over the "
               "three lengths (replays 0.8-1.0 CPU-s at 512, 1.1-1.8 at 2048, the observed-attention centre ~10 at "
               "2048; prefills 1.8 CPU-s at 512, 8.1 at 2048), ~3400 CPU-s with c 0.5/0.75/0.9, while the first runs' "
               "workers (nice 5, load average 13-15 on 2 shared cores) got ~0.1 of a core each. c 0.5 was measured "
               "first at every length (a run with --ratios 0.5); c 0.9 was added by the next run when the load fell")


def knob_table() -> tuple[dict, str]:
    """``({label: (spec, description, base spec)}, source)``: :data:`jacap_lib.presses.jacap_ablation.ONE_KNOB`
    with each ablation's base (``BASE_OF``; :data:`DEFAULT_SPEC` for the others), both as measured
    (:func:`knob_spec`: written out in full); ``source`` names that table
    (recorded in the run's configuration)."""
    from jacap_lib.presses import jacap_ablation as JA

    return ({k: (knob_spec(s), d, knob_spec(JA.BASE_OF.get(k, DEFAULT_SPEC))) for k, (s, d) in JA.ONE_KNOB.items()},
            "jacap_lib.presses.jacap_ablation.ONE_KNOB")


def _build(spec: str, compression_ratio: float):
    """The press of a (written-out) spec (module level: workers pickle it)."""
    from jacap_lib.presses.registry import press_from_spec

    return press_from_spec(spec, compression_ratio)


# --------------------------------------------------------------------------------------------- the job
def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from jacap_lib.experiments import protocol as E

    J.shared_options(parser, seed=True)
    J.grid_options(parser, lengths=LENGTHS, ratios=RATIOS, continuation=E.DEFAULT_CONTINUATION)
    parser.add_argument("--ablations", nargs="+", default=None,
                        help="labels of the one-knob table to run (default: every one); the default press always runs")
    parser.add_argument("--manifest", type=Path, default=None,
                        help="document manifest (default: the evaluation corpus); only its tune documents are used")
    E.folder_options(parser, quick=f"smoke run: {E.QUICK['docs_per_split']} tune documents, prompt 512, c 0.75/0.9, "
                                   "32-token continuation, the first two ablations")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes, one prefill at a time each (default 2; 1 with --quick)")


def prepare(args, *, tokenizer=None):
    """Check every option (``ValueError`` naming it) and return the evaluation's ``Plan`` of this run (``space``:
    ``{label: (spec,)}``, the default first); loads no model, writes nothing."""
    from jacap_lib.models import load_tokenizer
    from jacap_lib.presses.registry import method_options
    from jacap_lib.experiments import protocol as E
    from jacap_lib.results.provenance import model_record

    quick = bool(args.quick)
    lengths, ratios, continuation = E.grid_from_args(args, lengths=LENGTHS, ratios=RATIOS, min_length=16)
    E.check_processes(args, quick=quick)
    table, source = knob_table()
    if args.ablations:
        unknown = [a for a in args.ablations if a not in table]
        if unknown:
            raise ValueError(f"--ablations: {unknown} not in the one-knob table; choose among {list(table)}")
        table = {k: table[k] for k in args.ablations}
    elif quick:
        table = dict(list(table.items())[:2])
    default = knob_spec(DEFAULT_SPEC)
    specs = [default] + [v[0] for v in table.values()]
    bases = [b for _, _, b in table.values() if b not in specs]  # a base that is no ablation of the table runs too
    specs += list(dict.fromkeys(bases))
    dup = sorted({s for s in specs if specs.count(s) > 1})
    if dup:
        raise ValueError(f"--ablations: {dup} appear twice (an ablation must differ from the default and the others)")
    options = {}
    for s in specs:
        try:
            options[s] = method_options(_build(s, ratios[0]))
        except ValueError as e:
            raise ValueError(f"--ablations: spec {s!r} does not build: {e}") from None
    J.check_model(args.model)  # before the tokenizer loads: an unusable model is named as --model
    try:
        docs = [d for d in E.load_docs(args.manifest, quick=quick) if d["split"] == "tune"]
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"--manifest: {e}") from None
    out_dir = E.eval_dir(args.dir, quick=quick)
    tok = tokenizer if tokenizer is not None else load_tokenizer(args.model)
    E.check_lengths(tok, docs, lengths, continuation)
    E.check_settings_unchanged(out_dir / FILE, None, specs, ratios, build=_build)
    record = model_record(args.model)
    space = {"default": (default,), **{k: (s,) for k, (s, _, _) in table.items()},
             **{f"base {b}": (b,) for b in dict.fromkeys(bases)}}
    given = args.lengths is not None or args.ratios is not None
    config = {"job": "ablate", "model": record, "lengths": list(lengths), "ratios": list(ratios),
              "continuation": int(continuation),
              "grid_choice": "given by --lengths / --ratios" if given else ("--quick" if quick else GRID_CHOICE),
              "default": default, "knob_table": source,
              "ablations": {k: {"spec": s, "description": desc, "base": b, "options": options[s]}
                            for k, (s, desc, b) in table.items()},
              "settings": options,
              "documents": [{k: d.get(k) for k in ("id", "kind", "split", "sha256", "source", "license")} for d in docs]}
    plan = E.Plan(job="ablate", out_dir=Path(out_dir), model_name=args.model, model_label=record["name"],
                  lengths=lengths, ratios=ratios, continuation=int(continuation), space=space, docs=docs,
                  config=config, record=record, threads=args.threads, workers=args.workers, seed=args.seed,
                  progress=not args.no_progress, extra={"command": getattr(args, "command", None)})
    return plan


def execute(plan, *, model=None, tokenizer=None) -> dict:
    """Run a :func:`prepare`\\ d ablation: the rows not yet in ``ablation.jsonl``, appended as each prefill's replays
    finish; this invocation's configuration appended to ``ablation.config.json``. ``{"rows_written", "file"}``."""
    from jacap_lib.experiments import protocol as E
    from jacap_lib.results.provenance import provenance

    out = plan.out_dir / FILE
    done = {E.row_key(r) for r in files.read_jsonl(out)}
    groups = E.tune_groups(plan.docs, plan.space, plan.lengths, plan.ratios, plan.continuation, plan.model_label, done)
    groups.sort(key=lambda g: plan.lengths.index(g.length))  # in the order --lengths gives (stable: documents' order)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    run = {**plan.config, **provenance(model, model_name=plan.model_name, command=plan.extra.get("command")),
           "threads": plan.threads, "workers": plan.workers, "seed": plan.seed,
           "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
           "measured": "the evaluation's replay (one captured prefill per document and length, each press's own "
                       "kvpress hook, the continuation teacher-forced): KL(full || compressed) of next-token "
                       "distributions; every spec built by the registry with today's library defaults"}
    files.append_run(out, run)
    measure = functools.partial(E.measure_group, continuation=plan.continuation, model_name=plan.model_label,
                                build=_build)
    n = E.run_groups(groups, out, measure=measure, model=model, tokenizer=tokenizer, model_name=plan.model_name,
                     workers=plan.workers, threads=plan.threads, seed=plan.seed, progress=plan.progress)
    return {"rows_written": n, "file": str(out)}


def _ablate_run(args):
    res = execute(J.prepared(prepare, args))
    print(f"wrote {res['rows_written']} new rows to {res['file']}")
    return res


# --------------------------------------------------------------------------------------------- summary
def simultaneous_resamples(m: int, alpha: float = ALPHA, *, per_tail: int = 25) -> int:
    """Bootstrap resamples for a two-sided interval at confidence ``1 - alpha / m``: enough that each tail
    holds about ``per_tail`` resamples (at least ``verdicts.N_RESAMPLES``)."""
    from jacap_lib.verdicts import intervals as V

    return max(V.N_RESAMPLES, int(math.ceil(per_tail * 2 * m / alpha)))


def summarize_ablation(rows: list[dict], runs: list[dict], *, alpha: float = ALPHA, seed: int | None = None,
                       n_resamples: int | None = None) -> dict:
    """The ablation summary (pure): ``rows`` of ``ablation.jsonl``, ``runs`` its recorded configurations.

    Judged: every ablation spec any run recorded (under its latest label), in every (length, c) cell where the
    default, the ablation and its base (``base``, default: the default) have rows on every tune document of the
    latest run (same model, continuation). With m such (ablation, cell) pairs each comparison
    (:func:`~jacap_lib.experiments.protocol.compare_settings`, ablation / base) has its
    geometric-mean ratio with a BCa interval at confidence ``1 - alpha / m`` (simultaneous over all m:
    Bonferroni; ``gm_low``/``gm_high``, ``verdict``) and at 95 % (``gm_low_95``/``gm_high_95``, ``verdict_95``),
    wins/losses, Wilcoxon p, Holm p over the ablation's cells (``p_holm``) and over all m (``p_holm_all``)."""
    from jacap_lib.experiments import protocol as E
    from jacap_lib.verdicts import intervals as V

    if not runs:
        raise ValueError("ablation.jsonl has no recorded configuration; run `jacap evaluate ablate`")
    last = runs[-1]
    default = last["default"]
    if any(r.get("default") != default for r in runs):
        raise ValueError("ablation.jsonl's runs name different default specs; summarize one at a time (--dir)")
    model, cont = last["model"]["name"], int(last["continuation"])
    docs = [d["id"] for d in last["documents"] if d["split"] == "tune"]
    by_spec: dict = {}
    for run in runs:  # every ablation spec any run measured, first appearance first (a later label wins)
        for label, a in run["ablations"].items():
            by_spec[a["spec"]] = (label, a)
    table = {label: a for label, a in by_spec.values()}
    lengths = sorted({int(L) for run in runs for L in run["lengths"]})
    ratios = sorted({float(c) for run in runs for c in run["ratios"]})
    rows = [r for r in rows if r["model"] == model and int(r["continuation"]) == cont and r["doc"] in docs]
    have = {(r["method"], int(r["length"]), float(r["ratio"]), r["doc"]) for r in rows}

    def complete(spec, L, c):
        return all((spec, L, c, d) in have for d in docs)

    cells = [(L, c) for L in lengths for c in ratios if complete(default, L, c)]
    judged = {label: [(L, c) for L, c in cells if complete(a["spec"], L, c) and complete(a.get("base", default), L, c)]
              for label, a in table.items()}
    m = sum(len(v) for v in judged.values())
    if m == 0:
        raise ValueError("ablation.jsonl has no (length, c) cell where the default and an ablation both have rows on "
                         "every tune document; run or finish `jacap evaluate ablate` (it resumes)")
    level = V.simultaneous_confidence(1 - alpha, m)
    nres = n_resamples or simultaneous_resamples(m, alpha)
    out = []
    for label, a in table.items():
        spec, base = a["spec"], a.get("base", default)
        head = {"label": label, "spec": spec, "base": base, "description": a.get("description")}
        if not judged[label]:
            out.append({**head, "rows": [], "layers": {}})
            continue
        keep = set(judged[label])
        sub = [r for r in rows if r["method"] in (spec, base) and (int(r["length"]), float(r["ratio"])) in keep]
        # both levels from the same resamples (same seed and count), so the simultaneous interval holds the 95 % one
        adj = E.compare_settings(sub, spec, base, seed=seed, confidence=level, n_resamples=nres)
        unadj = {(r["length"], r["ratio"]): r for r in E.compare_settings(sub, spec, base, seed=seed,
                                                                          confidence=1 - alpha, n_resamples=nres)}
        same = E.identical_documents(sub, spec, base)
        res = []
        for r in adj:
            u = unadj[(r["length"], r["ratio"])]
            res.append({"length": r["length"], "ratio": r["ratio"], "n": r["n"], "wins": r["wins"],
                        "losses": r["losses"], "ties": r["ties"], "gm_ratio": r["gm_ratio"], "gm_low": r["gm_low"],
                        "gm_high": r["gm_high"], "verdict": V.verdict((r["gm_low"], r["gm_high"])),
                        "gm_low_95": u["gm_low"], "gm_high_95": u["gm_high"],
                        "verdict_95": V.verdict((u["gm_low"], u["gm_high"])), "mean_ratio": r["mean_ratio"],
                        "mean_low": r["mean_low"], "mean_high": r["mean_high"], "p_wilcoxon": r["p_wilcoxon"],
                        "p_holm": r["p_holm"], "identical_docs": same[(r["length"], r["ratio"])][0]})
        out.append({**head, "rows": res, "layers": RS.layer_error_geomeans(rows, spec, base, docs, judged[label])})
    flat = [r for a in out for r in a["rows"]]
    for r, p in zip(flat, V.holm([r["p_wilcoxon"] for r in flat])):
        r["p_holm_all"] = float(p)
    stats = E.cell_statistics([r for r in rows if r["method"] == default and (int(r["length"]), float(r["ratio"]))
                               in set(cells)], [default], **({} if seed is None else {"seed": seed}))
    return {"default": default, "m": m, "confidence": level, "n_resamples_adjusted": nres,
            "cells_measured": [f"{L}/{c}" for L, c in cells],
            "cells_missing": [f"{L}/{c}" for L in lengths for c in ratios if (L, c) not in cells],
            "default_cells": stats, "ablations": out}


def _summary_add(parser):
    from jacap_lib.experiments import protocol as E

    E.summary_options(parser, "folder of ablation.jsonl, where ablation_summary.json is written (default "
                              "data/results/eval; with --quick data/results/eval/quick)")


def _summarize(args) -> tuple[Path, list[dict], dict]:
    """The ``--dir`` folder, ablation.jsonl's runs and their summary; ``ValueError`` when a file is missing."""
    from jacap_lib.experiments import protocol as E

    out_dir = E.eval_dir(args.dir, quick=args.quick)
    path = out_dir / FILE
    if not path.is_file() or not files.config_path(path).is_file():
        raise ValueError(f"--dir: {path} (or its configuration) does not exist; run `jacap evaluate ablate` first")
    runs = files.read_runs(path)
    return out_dir, runs, summarize_ablation(files.read_jsonl(path), runs, seed=args.seed)


def _summary_run(args):
    from jacap_lib.verdicts import intervals as V

    out_dir, runs, summary = J.prepared(_summarize, args)
    config = {"inputs": [FILE], "runs": [r.get("command") for r in runs], "command": getattr(args, "command", None),
              "model": runs[-1]["model"], "continuation": runs[-1]["continuation"],
              "documents": [d["id"] for d in runs[-1]["documents"]], "grid_choice": runs[-1].get("grid_choice"),
              "statistics": {"primary": "geometric-mean KL ratio (ablation / its base: the default unless "
                                        "the ablation names another) over the tune documents, paired",
                             "adjusted_confidence": summary["confidence"], "m": summary["m"],
                             "adjustment": f"Bonferroni: each interval at 1 - {ALPHA}/m, simultaneous over the m "
                                           "(ablation, cell) comparisons judged",
                             "n_resamples_adjusted": summary["n_resamples_adjusted"],
                             "unadjusted_confidence": 1 - ALPHA,
                             "resamples": "both levels from the same resamples (n_resamples_adjusted, one seed)",
                             "method": V.METHOD, "seed": V.SEED if args.seed is None else args.seed, "alpha": ALPHA,
                             "holm": "p_holm over one ablation's cells; p_holm_all over all m comparisons",
                             "layers": "per layer, geometric mean over documents (and cells) of the ratio of "
                                       "attention-output relative errors (ablation / base); no interval"}}
    out = out_dir / SUMMARY_FILE
    files.write_json(out, {"config": config, **files.round_floats(summary)})
    print(f"wrote {out}: {summary['m']} comparisons, intervals at {summary['confidence']:.5f}")
    for a in summary["ablations"]:
        for r in a["rows"]:
            print(f"  {a['label']} L={r['length']} c={r['ratio']}: {r['gm_ratio']:.3f} [{r['gm_low']:.3f}, "
                  f"{r['gm_high']:.3f}] {r['verdict']}")
    return out


ABLATE = J.Job("Algorithm 1's tuned Jacap press and each one-knob ablation of it on every tune document -> "
               "data/results/eval/ablation.jsonl (resumable)", _add_arguments, _ablate_run)
ABLATE_SUMMARY = J.Job("per ablation and cell, the paired geometric-mean KL ratio to the ablations' base setting with simultaneous "
                       "(Bonferroni) and unadjusted intervals, wins, Wilcoxon and Holm p, verdicts, and per-layer "
                       "attention-error ratios -> data/results/eval/ablation_summary.json", _summary_add, _summary_run)
