"""The tune and dev runs: their options and checks (:func:`prepare` -> :class:`Plan`, nothing loaded or
written), the grid of prefills (:class:`Group`), one prefill's replays (:func:`measure_group`), the spawned
worker pool (:func:`map_in_workers`, also used by :mod:`..needle` and :mod:`..decoding_comparison`), the rows
appended as they finish (:func:`run_groups`, resumable by :func:`row_key`), and the refusal to resume a file
whose settings now build other presses (:func:`check_settings_unchanged`). :func:`execute` hands the time job
to :mod:`.timing`."""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.experiments.protocol import rules as P
from jacap_lib.experiments.protocol import timing as T
from jacap_lib.experiments.protocol.choices import read_choices, dev_specs, write_choices
from jacap_lib.experiments.protocol.documents import (DEFAULT_CONTINUATION, DEFAULT_LENGTHS, DEFAULT_RATIOS, QUICK, TUNE_DOCS_PER_KIND, check_lengths,
                     load_docs)

__all__ = ["row_key", "grid_from_args", "check_ratios", "check_processes", "eval_dir", "Group", "tune_groups",
           "dev_groups", "measure_group", "map_in_workers", "run_groups", "add_arguments", "Plan", "prepare",
           "execute", "check_settings_unchanged"]


def row_key(row: dict) -> tuple:
    return (row["model"], row["doc"], row["sha256"], int(row["length"]), int(row["continuation"]),
            float(row["ratio"]), row["method"])


# --------------------------------------------------------------------------------------------- option checks
# shared by the evaluation's jobs (these modules and :mod:`..needle`): each raises ``ValueError`` naming the option
def check_ratios(ratios) -> None:
    """``--ratios``: every compression ratio in (0, 1) (:func:`jacap_lib._checks.compression_ratio`; the grid measures
    the uncompressed answer apart)."""
    from jacap_lib._checks import compression_ratio

    for c in ratios:
        compression_ratio(c, "--ratios", allow_zero=False)


def grid_from_args(args, *, lengths, ratios, min_length: int = 16, why: str = "") -> tuple:
    """``(lengths, ratios, continuation)`` of a grid job's ``--lengths`` / ``--ratios`` / ``--continuation`` (unset:
    ``lengths`` / ``ratios`` / the evaluation's continuation; with ``--quick`` the smoke run's), each checked:
    every length >= ``min_length`` (``why``: the reason, said in the error), each value listed once, ratios in (0, 1),
    a continuation >= 1; ``ValueError`` naming the option otherwise."""
    quick = bool(getattr(args, "quick", False))
    lengths = tuple(args.lengths or (QUICK["lengths"] if quick else lengths))
    ratios = tuple(float(c) for c in (args.ratios or (QUICK["ratios"] if quick else ratios)))
    continuation = args.continuation if args.continuation is not None else (
        QUICK["continuation"] if quick else DEFAULT_CONTINUATION)
    for L in lengths:
        if isinstance(L, bool) or L < min_length:
            raise ValueError(f"--lengths: every prompt length must be >= {min_length} tokens{why}, got {L}")
    if len(set(lengths)) != len(lengths) or len(set(ratios)) != len(ratios):
        raise ValueError("--lengths / --ratios: list each value once")
    check_ratios(ratios)
    if continuation < 1:
        raise ValueError(f"--continuation must be >= 1, got {continuation}")
    return lengths, ratios, continuation


def check_processes(args, *, quick: bool) -> None:
    """``--workers`` (unset: 1 with ``--quick``, else 2; set on ``args``) and ``--threads``, each >= 1."""
    if getattr(args, "workers", 1) is None:
        args.workers = 1 if quick else 2
    for name in ("threads", "workers"):
        if getattr(args, name, 1) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")


def eval_dir(given, *, quick: bool, space: str = "first") -> Path:
    """``--dir``: the folder given, else ``data/results/eval`` (``.../eval/quick`` with ``--quick``,
    ``.../eval/<space>`` for ``--space peers`` or ``context``); not a file."""
    from jacap_lib.results.paths import data_path

    sub = ("quick",) if quick else () if space == "first" else (space,)
    out_dir = Path(given or data_path("results", "eval", *sub, must_exist=False))
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--dir {out_dir} is a file; give a folder")
    return out_dir


def folder_options(parser, *, quick: str,
                   folder: str = "output folder (default data/results/eval; with --quick data/results/eval/quick)"):
    """Declare ``--dir`` (the folder :func:`eval_dir` resolves; ``folder``: its help) and ``--quick`` (``quick``:
    its help, what the smoke run is)."""
    parser.add_argument("--dir", type=Path, default=None, help=folder)
    parser.add_argument("--quick", action="store_true", help=quick)


def summary_options(parser, folder: str) -> None:
    """Declare a summary job's ``--dir`` (``folder``: its help, which files it reads and writes there),
    ``--quick`` (the smoke run's folder) and ``--seed`` (the bootstrap's; None: ``verdicts.SEED``)."""
    folder_options(parser, quick="summarize the --quick run's folder", folder=folder)
    parser.add_argument("--seed", type=int, default=None, help="bootstrap seed (default verdicts.SEED)")


# --------------------------------------------------------------------------------------------- the grid
@dataclass
class Group:
    """One prefill: a document at one prompt length, and the (spec, ratio) replays still to do on it."""

    doc: dict
    length: int
    jobs: list = field(default_factory=list)


def _groups(docs, lengths, ratios, specs_of, continuation, model_name, done) -> list[Group]:
    out = []
    for L in sorted(lengths):  # shortest first: an interrupted (resumable) run leaves the most complete cells
        for d in docs:
            jobs = [(s, float(c)) for s in specs_of(d) for c in ratios
                    if (model_name, d["id"], d["sha256"], int(L), int(continuation), float(c), s) not in done]
            if jobs:
                out.append(Group(d, int(L), jobs))
    return out


def tune_groups(docs, space, lengths, ratios, continuation, model_name, done=frozenset()) -> list[Group]:
    """Every setting of ``space`` on every tune document, minus the keys in ``done``."""
    specs = [s for v in space.values() for s in v]
    return _groups([d for d in docs if d["split"] == "tune"], lengths, ratios, lambda d: specs, continuation,
                   model_name, done)


def dev_groups(docs, chosen: dict, lengths, ratios, continuation, model_name, done=frozenset()) -> list[Group]:
    """Each method's chosen setting (and the paper preset, :func:`dev_specs`) on every dev document, minus
    the keys in ``done``."""
    specs = dev_specs(chosen)
    return _groups([d for d in docs if d["split"] == "dev"], lengths, ratios, lambda d: specs, continuation,
                   model_name, done)


def measure_group(model, tokenizer, group: Group, continuation: int, model_name: str, on_row=None,
                  build=None, reuse_scores: bool = False, share_scoring: bool = False) -> list[dict]:
    """One prefill captured (with its full-cache reference), every (spec, ratio) of ``group`` replayed on
    it (:func:`jacap_lib.measure.quality.next_token_kl` with ``capture``; a press that cannot replay, KVzip or
    KVgrad, runs the real prefill); one row each, in job order.
    ``build(spec, ratio)``: the press of a spec (default the registry's ``press_from_spec``).
    ``reuse_scores``: a spec whose press scores the same at every ratio (:func:`~jacap_lib.measure.quality.scores_once`:
    KVzip, KVgrad) is scored once for all its ratios of the group (the same rows; each row's seconds are its share,
    ``scores_shared_by`` the number of ratios sharing them).
    ``share_scoring`` (with ``reuse_scores``): one scoring also serves the group's other specs with the same
    :func:`~jacap_lib.measure.quality.scoring_record` (they differ only in fields ``compress_post`` alone reads:
    ratio, budget, window; :func:`~jacap_lib.measure.quality.caches_by_setting`); ``scores_shared_by`` counts every
    (spec, ratio) sharing it."""
    from jacap_lib.measure.quality import (capture_prefill, full_reference, next_token_kl, next_token_kl_by_ratio,
                                    next_token_kl_by_setting, prompt_and_continuation, scores_once, scoring_record)
    from jacap_lib.presses.registry import press_from_spec

    d = group.doc
    prompt, cont = prompt_and_continuation(tokenizer, d["text"], group.length, continuation, name=f"document {d['id']}")
    w0, c0 = time.perf_counter(), time.process_time()
    cap = capture_prefill(model, prompt)
    ref = full_reference(model, None, prompt, cont, capture=cap)
    prefill = {"prefill_seconds": round(time.perf_counter() - w0, 3),
               "prefill_cpu_seconds": round(time.process_time() - c0, 3)}
    rows, shared = [], {}
    for spec, c in group.jobs:
        w0, c0 = time.perf_counter(), time.process_time()
        press = (build or press_from_spec)(spec, c)
        extra = {}
        if (spec, c) in shared:
            res, extra = shared.pop((spec, c))
        elif reuse_scores and share_scoring and scores_once(press):
            key = scoring_record(press)
            todo = [(s, r) for s, r in group.jobs if (s, r) not in shared and (s, r) != (spec, c)]
            batch = [(spec, c)] + [(s, r) for s, r in todo
                                   if scores_once(p := (build or press_from_spec)(s, r)) and scoring_record(p) == key]
            results = next_token_kl_by_setting(model, prompt, cont, [press] + [(build or press_from_spec)(s, r)
                                                                               for s, r in batch[1:]], reference=ref)
            extra = {"seconds": round((time.perf_counter() - w0) / len(batch), 3),
                     "cpu_seconds": round((time.process_time() - c0) / len(batch), 3), "scores_shared_by": len(batch)}
            shared.update({job: (x, extra) for job, x in zip(batch, results)})
            res = shared.pop((spec, c))[0]
        elif reuse_scores and scores_once(press):
            ratios = [r for s, r in group.jobs if s == spec]
            results = next_token_kl_by_ratio(model, prompt, cont, press, ratios, reference=ref)
            extra = {"seconds": round((time.perf_counter() - w0) / len(ratios), 3),
                     "cpu_seconds": round((time.process_time() - c0) / len(ratios), 3), "scores_shared_by": len(ratios)}
            shared.update({(spec, r): (x, extra) for r, x in zip(ratios, results)})
            res = shared.pop((spec, c))[0]
        else:
            res = next_token_kl(model, None, prompt, cont, press, reference=ref, capture=cap)
        row = {"model": model_name, "doc": d["id"], "kind": d.get("kind"), "split": d["split"], "sha256": d["sha256"],
               "length": group.length, "continuation": int(continuation), "ratio": c, "method": spec,
               "family": P.method_of(spec), "kl": res.kl, "kl_max": float(res.kl_per_token.max()),
               "top1_agreement": res.top1_agreement, "attn_rel_error": res.attn_rel_error,
               "attn_rel_error_per_layer": [float(f"{x:.4g}") for x in res.attn_rel_error_per_layer.tolist()],
               "kept_tokens": res.kept_tokens, "seconds": round(time.perf_counter() - w0, 3),
               "cpu_seconds": round(time.process_time() - c0, 3), **prefill, **extra}
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


_WORKER: dict = {}


def _init_worker(model_name, threads, seed):
    import torch

    from jacap_lib.models import load_model

    torch.set_num_threads(int(threads))
    torch.manual_seed(int(seed))
    _WORKER["model"], _WORKER["tok"] = load_model(model_name)


def _work(measure, task):
    return measure(_WORKER["model"], _WORKER["tok"], task)


def map_in_workers(measure, tasks, *, workers: int, model_name=None, threads: int = 1, seed: int = 0):
    """``measure(model, tokenizer, task)`` for every task in ``workers`` spawned processes, each loading
    ``model_name`` once (``torch`` with ``threads`` threads, seeded ``seed``); yields the results in the order
    they finish. ``measure``: a module-level function or a ``functools.partial`` of one (workers unpickle it)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                             initargs=(model_name, threads, seed)) as pool:
        futures = [pool.submit(_work, measure, t) for t in tasks]
        for f in as_completed(futures):
            yield f.result()


def run_groups(groups: list, out: Path, *, continuation: int | None = None, model_label: str | None = None,
               measure=None, model=None, tokenizer=None, model_name=None, workers: int = 1, threads: int = 1,
               seed: int = 0, progress: bool = True) -> int:
    """Measure every group and append its rows to ``out``; returns the rows written.

    ``measure(model, tokenizer, group, on_row=None) -> rows``: what one group (one prefill) is (default:
    :func:`measure_group` with ``continuation`` and ``model_label``); a module-level function or a
    ``functools.partial`` of one, so spawned workers can unpickle it; ``group.jobs``: its rows to come.
    ``workers == 1``: in this process with ``model``/``tokenizer`` (loaded from ``model_name`` when not
    given); ``workers > 1``: that many spawned processes, each loading ``model_name``, the rows written
    here as each prefill's replays finish."""
    import functools

    from tqdm.auto import tqdm

    if measure is None:
        measure = functools.partial(measure_group, continuation=continuation, model_name=model_label)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    total = sum(len(g.jobs) for g in groups)
    bar = tqdm(total=total, desc=f"{out.stem} rows", disable=not progress, smoothing=0.05)
    written = 0

    def put(row):
        nonlocal written
        files.append_jsonl(out, row)
        written += 1
        bar.update(1)

    try:
        if workers <= 1 or model is not None:
            if model is None:
                _init_worker(model_name, threads, seed)
                model, tokenizer = _WORKER["model"], _WORKER["tok"]
            for g in groups:
                measure(model, tokenizer, g, on_row=put)
        elif groups:
            for rows in map_in_workers(measure, groups, workers=workers, model_name=model_name, threads=threads,
                                       seed=seed):
                for row in rows:
                    put(row)
    finally:
        bar.close()
    return written


# --------------------------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser, job: str = "tune") -> None:
    """The options of ``jacap evaluate <job>`` (``job``: tune, dev or time)."""
    J.shared_options(parser, seed=True)
    J.grid_options(parser, lengths=DEFAULT_LENGTHS, ratios=DEFAULT_RATIOS, continuation=DEFAULT_CONTINUATION)
    parser.add_argument("--space", choices=sorted(P.SPACES), default="first",
                        help="the search space: 'first' (protocol.SEARCH_SPACE, the first rounds' methods; folder "
                             "data/results/eval), 'peers' (protocol.PEER_SPACE, kvpress's newer presses; folder "
                             "data/results/eval/peers) or 'context' (protocol.CONTEXT_SPACE, the capacity press with "
                             "the context as its query prior; folder data/results/eval/context)")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="registry names of the search space to run (default: every method of --space); the "
                             "tune job's choices.json still covers every method of --space whose rows are complete")
    parser.add_argument("--manifest", type=Path, default=None,
                        help="document manifest (default: the evaluation corpus, data/texts/corpus/manifest.json)")
    folder_options(parser, quick=f"smoke run: {QUICK['docs_per_split']} tune + {QUICK['docs_per_split']} dev "
                                 "documents, prompt 512, c 0.75/0.9, 32-token continuation, knorm/snapkv/jacap with "
                                 "<= 2 settings")
    parser.add_argument("--tune-per-kind", type=int, default=TUNE_DOCS_PER_KIND,
                        help=f"tune documents used per kind, first in manifest order (default {TUNE_DOCS_PER_KIND or 'all'}; "
                             "0: every tune document)")
    if job != "time":
        parser.add_argument("--workers", type=int, default=None,
                            help="processes, one prefill at a time each, --threads torch threads each (default 2, "
                                 "for a 2-core machine; 1 with --quick)")
    else:
        parser.add_argument("--doc", default=None, help="document id (default: the first long enough)")
        parser.add_argument("--ratio", type=float, default=0.9, help="the ratio the replays are timed at (default 0.9)")
        parser.add_argument("--n-tune", type=int, default=None, help="tune documents to extrapolate to (default: the manifest's)")
        parser.add_argument("--n-dev", type=int, default=None, help="dev documents to extrapolate to (default: the manifest's)")


@dataclass
class Plan:
    """A checked invocation: everything :func:`execute` needs, nothing written yet."""

    job: str
    out_dir: Path
    model_name: str | None
    model_label: str
    lengths: tuple
    ratios: tuple
    continuation: int
    space: dict
    docs: list
    config: dict
    record: dict
    threads: int = 1
    workers: int = 1
    seed: int = 0
    progress: bool = True
    extra: dict = field(default_factory=dict)


def prepare(args, *, tokenizer=None) -> Plan:
    """Check every option (``ValueError`` naming it) and build the :class:`Plan`; loads no model, writes nothing.

    ``tokenizer``: the one the documents' token counts are checked with (default: ``--model``'s)."""
    from jacap_lib.models import load_tokenizer
    from jacap_lib.results.provenance import model_record

    quick = bool(args.quick)
    lengths, ratios, continuation = grid_from_args(args, lengths=DEFAULT_LENGTHS, ratios=DEFAULT_RATIOS)
    check_processes(args, quick=quick)
    which = getattr(args, "space", "first") or "first"
    if which not in P.SPACES:
        raise ValueError(f"--space must be one of {sorted(P.SPACES)}, got {which!r}")
    table = P.quick_space() if quick else dict(P.SPACES[which])
    space = dict(table)
    if args.methods:
        unknown = sorted(set(args.methods) - set(space))
        if unknown:
            raise ValueError(f"--methods: {unknown} not in the search space; choose among {list(space)}")
        space = {m: space[m] for m in args.methods}
    P.check_search_space(space, exact=not quick)
    J.check_model(args.model)  # before the tokenizer loads: an unusable model is named as --model
    try:
        if args.tune_per_kind < 0:
            raise ValueError(f"--tune-per-kind must be >= 0, got {args.tune_per_kind}")
        docs = load_docs(args.manifest, quick=quick, tune_per_kind=args.tune_per_kind)
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"--manifest: {e}") from None
    out_dir = eval_dir(args.dir, quick=quick, space=which)
    tok = tokenizer if tokenizer is not None else load_tokenizer(args.model)
    extra = {}
    if args.job == "time":
        extra = T.time_options(args, docs, tok, lengths, continuation)
    else:
        check_lengths(tok, docs, lengths, continuation)
    record = model_record(args.model)
    # the configuration names the whole table of --space (a --methods run of tune or dev is one stage of it: same
    # fingerprint, so a dev stage reads the choices its tune stages wrote)
    config = P.protocol_config(model=record, lengths=lengths, ratios=ratios, continuation=continuation,
                               space=table if args.job in ("tune", "dev") else space, docs=docs)
    plan = Plan(job=args.job, out_dir=Path(out_dir), model_name=args.model, model_label=record["name"], lengths=lengths,
                ratios=ratios, continuation=int(continuation), space=space, docs=docs, config=config, record=record,
                threads=args.threads, workers=getattr(args, "workers", 1), seed=args.seed,
                progress=not args.no_progress, extra=extra)
    plan.extra["command"] = getattr(args, "command", None)
    if args.job == "dev":
        plan.extra["choices"] = read_choices(plan.out_dir / "choices.json", config, methods=space)
    return plan


def _run_config(plan: Plan, model=None) -> dict:
    from jacap_lib.results.provenance import provenance

    rec = provenance(model, model_name=plan.model_name, command=plan.extra.get("command"))
    specs = [s for v in plan.space.values() for s in v]
    return {**rec, "job": plan.job, "protocol": plan.config, "fingerprint": P.fingerprint(plan.config),
            "threads": plan.threads, "workers": plan.workers, "seed": plan.seed,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "measured": "prompt KV of every layer and KV head compressed by the press's own kvpress hook, replayed on "
                        "one captured prefill per (document, length); the continuation teacher-forced at its true "
                        "positions, never evicted; KL(full || compressed) of next-token distributions",
            "documents": [{k: d.get(k) for k in ("id", "kind", "split", "sha256", "source", "license")} for d in plan.docs],
            **P.settings_record(specs, plan.ratios[0])}


def execute(plan: Plan, *, model=None, tokenizer=None) -> dict:
    """Run a :func:`prepare`d job (``model``/``tokenizer``: use these instead of loading ``plan.model_name``,
    in this process). Returns a summary dict (rows written, files)."""
    if plan.job == "time":
        return T.execute_time(plan, model, tokenizer)
    name = "tune.jsonl" if plan.job == "tune" else "dev.jsonl"
    out = plan.out_dir / name
    had = files.read_jsonl(out)
    done = {row_key(r) for r in had}
    if plan.job == "tune":
        groups = tune_groups(plan.docs, plan.space, plan.lengths, plan.ratios, plan.continuation, plan.model_label, done)
    else:
        chosen = plan.extra["choices"]["chosen"]
        groups = dev_groups(plan.docs, {m: chosen[m] for m in plan.space}, plan.lengths, plan.ratios,
                             plan.continuation, plan.model_label, done)
    check_settings_unchanged(out, plan.space if plan.job == "tune" else None,
                             dev_specs(plan.extra["choices"]["chosen"]) if plan.job == "dev" else None, plan.ratios)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    # rows_before: where this run's rows begin in the file (the dev record assigns rows to runs by it)
    files.append_run(out, {**_run_config(plan, model), "rows_before": len(had)})
    import functools

    # KVzip and KVgrad score the same at every ratio: one real prefill scores all of a group's ratios (same rows)
    # settings that differ only in what compress_post reads (budget, window: jacap's) share one scoring
    measure = functools.partial(measure_group, continuation=plan.continuation, model_name=plan.model_label,
                                reuse_scores=True, share_scoring=True)
    n = run_groups(groups, out, measure=measure, model=model, tokenizer=tokenizer, model_name=plan.model_name,
                   workers=plan.workers, threads=plan.threads, seed=plan.seed, progress=plan.progress)
    res = {"rows_written": n, "file": str(out)}
    if plan.job == "tune":
        rows = [r for r in files.read_jsonl(out) if r["model"] == plan.model_label
                and r["continuation"] == plan.continuation]
        table = plan.config["search_space"]  # the whole --space table: methods still unmeasured are left pending
        data = write_choices(plan.out_dir / "choices.json", rows, plan.config, table,
                             provenance={"tune_file": name, "command": plan.extra.get("command")}, partial=True)
        res.update(choices=str(plan.out_dir / "choices.json"), chosen=data["chosen"], pending=data.get("pending", []))
    return res


def _without(record: dict, keys: set) -> dict:
    """``record`` without ``keys``, in it and in every press record nested in it (a wrapper's scorer)."""
    return {k: _without(v, keys) if isinstance(v, dict) else v for k, v in record.items() if k not in keys}


def check_settings_unchanged(out: Path, space: dict | None, specs=None, ratios=(0.5,), build=None) -> None:
    """Refuse to resume ``out`` when a setting now builds another press than the rows were made with.

    The protocol writes its Jacap settings out in full, but a spec that names fewer options (``"jacap_prompt"``, a kvpress
    baseline) means today's defaults, which may move (``JacapPromptPress``'s defaults are a tune choice). Every earlier
    run of ``out`` recorded each
    setting's resolved options; a spec whose options differ today (the compression ratio aside) would mix two
    presses under one name, so this raises ``ValueError`` naming it and the fix (a new ``--dir``).

    The press classes' names are not compared: the spec's registry name fixes the method and its options fix the
    press, so a class renamed under the same registry name keeps its rows (``jacap_prompt``'s ``JacapPress``, which became
    ``JacapPromptPress`` when ``JacapPress`` became the default context press)."""
    from jacap_lib.presses.registry import effective_options, method_options, press_from_spec

    if not Path(out).is_file():
        return
    specs = list(specs or []) + [s for v in (space or {}).values() for s in v]
    drop = {"compression_ratio", "class"}
    for run in files.read_runs(out):
        for spec in specs:
            then = (run.get("settings") or {}).get(spec)
            if then is None:
                continue
            now = json.loads(json.dumps(method_options((build or press_from_spec)(spec, float(ratios[0])))))
            a, b = effective_options(_without(then, drop)), effective_options(_without(now, drop))
            if a != b:
                diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                raise ValueError(f"{out} holds rows of {spec!r} made with other options ({', '.join(diff)}: "
                                 f"{[a.get(k) for k in diff]} then, {[b.get(k) for k in diff]} now; the library "
                                 "defaults changed); resuming would mix two presses under one name. Give a new "
                                 "--dir to measure today's settings")
