"""The evaluation jobs: every method tuned the same way on the tune documents, judged on the test ones.

``jacap evaluate tune``  every setting of :data:`~jacap_lib.results.protocol.SEARCH_SPACE` on the *tune*
                         documents -> ``data/results/eval/tune.jsonl``; when complete, each method's choice
                         and the best baseline per cell by the protocol's one rule -> ``choices.json``
``jacap evaluate test``  each method's chosen setting on the *test* documents -> ``test.jsonl``; refuses to
                         run without ``choices.json`` or with one made under a different configuration
``jacap evaluate summary`` test.jsonl + choices.json (same fingerprint) -> ``summary.json``: per cell, each
                         Jacap setting against the best baseline picked on tune (primary) and on test
                         (stricter, secondary): ratio intervals, wins/losses, Wilcoxon and Holm p, verdict
``jacap evaluate time``  wall and CPU time of one prefill and one replay per setting on one document, and
                         the extrapolated time of the whole tune + test grid -> ``timing.json``

The measurement (:mod:`jacap_lib.measure.quality`): per (document, prompt length) ONE uncompressed
prefill is captured (what every attention layer's kvpress hook sees) with its full-cache reference on the
continuation; every (setting, ratio) then replays the press's own hook on the captured prefill and runs
only the continuation, teacher-forced at its true positions. Per row: next-token KL(full || compressed)
averaged over the continuation (primary), top-1 agreement and the attention-output relative error
(secondary). ``tests/test_evaluation.py`` checks the replay against kvpress's own path for every method.

Rows are appended as each prefill's replays finish, keyed by (model, document + sha256, length,
continuation, ratio, method spec); a rerun skips the keys already there (resumable). ``--workers N``
runs N processes (one torch thread each), one prefill at a time each. The sidecar ``<file>.config.json``
records every invocation's full configuration (provenance, model file sha256, lengths, ratios,
continuation, documents, every setting's press options, seeds, package versions).
``--quick`` is the smoke run: 2 tune + 2 test documents, prompt 512, c 0.75/0.9, a 32-token continuation,
three methods with at most two settings each (:func:`~jacap_lib.results.protocol.quick_space`).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import files
from . import job as J
from . import protocol as P

__all__ = ["DEFAULT_LENGTHS", "DEFAULT_RATIOS", "DEFAULT_CONTINUATION", "QUICK", "Plan", "row_key", "load_docs",
           "tune_groups", "test_groups", "run_groups", "measure_group", "write_choices", "read_choices",
           "best_baselines", "jacap_settings", "complete_cells", "test_specs", "cell_statistics", "compare_settings", "check_settings_unchanged", "summarize", "summary_table",
           "TARGET", "target_status", "identical_documents", "check_ratios", "check_processes", "check_model_option",
           "eval_dir", "map_in_workers", "time_methods", "estimate", "add_arguments", "prepare", "execute", "report", "TUNE", "TEST",
           "TIME", "SUMMARY"]

DEFAULT_LENGTHS = (512, 1024, 2048)
DEFAULT_RATIOS = (0.5, 0.75, 0.9, 0.95)
DEFAULT_CONTINUATION = 128
TUNE_DOCS_PER_KIND = 3  # tune documents used per kind (round robin over source works): 4 kinds -> 12, as 3 hours allow
QUICK = {"lengths": (512,), "ratios": (0.75, 0.9), "continuation": 32, "docs_per_split": 2}
TEST_LABEL = "picked on test (stricter secondary line: favours the baselines, as it peeks at the test documents)"


def row_key(row: dict) -> tuple:
    return (row["model"], row["doc"], row["sha256"], int(row["length"]), int(row["continuation"]),
            float(row["ratio"]), row["method"])


# --------------------------------------------------------------------------------------------- documents
def load_docs(manifest=None, *, quick: bool = False, tune_per_kind: int = 0) -> list[dict]:
    """The documents of the evaluation corpus (``manifest``: another manifest of that shape, or of the older
    ``segments`` shape) with their text, sha256-checked, each with ``split`` "tune" or "test" (``quick``:
    the first two of each split; ``tune_per_kind`` > 0: only that many tune documents of each kind, taken
    round robin over its source works (``group``; the first excerpt of every work, then the second, ...,
    manifest order within a round) — the other tune documents take part in neither job)."""
    from .texts import load_corpus, load_segments

    if manifest is not None and "documents" not in files.read_json(manifest):
        docs = load_segments(None, manifest)
    else:
        docs = load_corpus(manifest=manifest)
    bad = sorted({str(d.get("split")) for d in docs} - {"tune", "test"})
    if bad:
        raise ValueError(f"every document of the manifest needs split 'tune' or 'test'; found {bad}")
    if tune_per_kind > 0:  # round robin over the source works (groups) of each kind, manifest order within
        rank, seen = {}, {}
        for i, d in enumerate(d for d in docs if d["split"] == "tune"):
            g = (d.get("kind"), d.get("group", d["id"]))
            seen[g] = seen.get(g, 0) + 1
            rank[d["id"]] = (seen[g], i)
        keep = set()
        for kind in dict.fromkeys(d.get("kind") for d in docs if d["split"] == "tune"):
            ids = sorted((rank[d["id"]], d["id"]) for d in docs if d["split"] == "tune" and d.get("kind") == kind)
            keep |= {x for _, x in ids[:tune_per_kind]}
        docs = [d for d in docs if d["split"] == "test" or d["id"] in keep]
    if quick:
        n = QUICK["docs_per_split"]
        docs = [d for d in docs if d["split"] == "tune"][:n] + [d for d in docs if d["split"] == "test"][:n]
    for split in ("tune", "test"):
        if not any(d["split"] == split for d in docs):
            raise ValueError(f"the manifest has no {split} documents; the protocol needs both splits")
    return docs


def check_lengths(tokenizer, docs, lengths, continuation) -> dict:
    """``{doc id: token count}``; ``ValueError`` naming every document too short for the longest prompt."""
    counts = {d["id"]: int(tokenizer(d["text"], return_tensors="pt", add_special_tokens=False).input_ids.shape[1])
              for d in docs}
    need = max(lengths) + continuation
    short = {k: v for k, v in counts.items() if v < need}
    if short:
        raise ValueError(f"{len(short)} document(s) have fewer than {need} tokens (longest prompt {max(lengths)} + "
                         f"continuation {continuation}): {dict(list(short.items())[:5])}; use shorter --lengths or "
                         "longer documents")
    return counts


# --------------------------------------------------------------------------------------------- option checks
# shared by the evaluation's jobs (this module and :mod:`.needle`): each raises ``ValueError`` naming the option
def check_ratios(ratios) -> None:
    """``--ratios``: every compression ratio in (0, 1)."""
    for c in ratios:
        if not 0 < c < 1:
            raise ValueError(f"--ratios: every compression ratio must lie in (0, 1), got {c}")


def check_processes(args, *, quick: bool) -> None:
    """``--workers`` (unset: 1 with ``--quick``, else 2; set on ``args``) and ``--threads``, each >= 1."""
    if getattr(args, "workers", 1) is None:
        args.workers = 1 if quick else 2
    for name in ("threads", "workers"):
        if getattr(args, name, 1) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")


def check_model_option(name) -> None:
    """``--model``: a valid model name (:func:`jacap_lib.models.check_model_name`); loads nothing."""
    from ..models import check_model_name

    try:
        check_model_name(name)
    except ValueError as e:
        raise ValueError(f"--model: {e}") from None


def eval_dir(given, *, quick: bool) -> Path:
    """``--dir``: the folder given, else ``data/results/eval`` (``.../eval/quick`` with ``--quick``); not a file."""
    from .paths import data_path

    out_dir = Path(given or data_path("results", "eval", *(("quick",) if quick else ()), must_exist=False))
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--dir {out_dir} is a file; give a folder")
    return out_dir


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


def test_groups(docs, chosen: dict, lengths, ratios, continuation, model_name, done=frozenset()) -> list[Group]:
    """Each method's chosen setting (and the paper preset, :func:`test_specs`) on every test document, minus
    the keys in ``done``."""
    specs = test_specs(chosen)
    return _groups([d for d in docs if d["split"] == "test"], lengths, ratios, lambda d: specs, continuation,
                   model_name, done)


def measure_group(model, tokenizer, group: Group, continuation: int, model_name: str, on_row=None,
                  build=None) -> list[dict]:
    """One prefill captured (with its full-cache reference), every (spec, ratio) of ``group`` replayed on
    it (:func:`jacap_lib.measure.quality.next_token_kl` with ``capture``); one row each, in job order.
    ``build(spec, ratio)``: the press of a spec (default :func:`~jacap_lib.results.protocol.protocol_press`,
    the protocol's pinned settings; the ablation job passes the registry's own ``press_from_spec``)."""
    from ..measure.quality import capture_prefill, full_reference, next_token_kl, prompt_and_continuation

    d = group.doc
    prompt, cont = prompt_and_continuation(tokenizer, d["text"], group.length, continuation, name=f"document {d['id']}")
    w0, c0 = time.perf_counter(), time.process_time()
    cap = capture_prefill(model, prompt)
    ref = full_reference(model, None, prompt, cont, capture=cap)
    prefill = {"prefill_seconds": round(time.perf_counter() - w0, 3),
               "prefill_cpu_seconds": round(time.process_time() - c0, 3)}
    rows = []
    for spec, c in group.jobs:
        w0, c0 = time.perf_counter(), time.process_time()
        press = (build or P.protocol_press)(spec, c)
        res = next_token_kl(model, None, prompt, cont, press, reference=ref, capture=cap)
        row = {"model": model_name, "doc": d["id"], "kind": d.get("kind"), "split": d["split"], "sha256": d["sha256"],
               "length": group.length, "continuation": int(continuation), "ratio": c, "method": spec,
               "family": P.method_of(spec), "kl": res.kl, "kl_max": float(res.kl_per_token.max()),
               "top1_agreement": res.top1_agreement, "attn_rel_error": res.attn_rel_error,
               "attn_rel_error_per_layer": [float(f"{x:.4g}") for x in res.attn_rel_error_per_layer.tolist()],
               "kept_tokens": res.kept_tokens, "seconds": round(time.perf_counter() - w0, 3),
               "cpu_seconds": round(time.process_time() - c0, 3), **prefill}
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


_WORKER: dict = {}


def _init_worker(model_name, threads, seed):
    import torch

    from ..models import load_model

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


# --------------------------------------------------------------------------------------------- choices
def write_choices(path: Path, tune_rows: list[dict], config: dict, space: dict, *, provenance: dict | None = None) -> dict:
    """Apply the rule to the tune rows and write ``choices.json``: each method's setting, the best
    baseline per (length, ratio) cell (picked on tune), the configuration and its fingerprint."""
    rows = [r for r in tune_rows if r.get("split") == "tune"]
    choices = P.choose_settings(rows, space, split="tune")
    chosen = {m: v["chosen"] for m, v in choices.items()}
    data = {"config": config, "fingerprint": P.fingerprint(config), "rule": P.RULE, "chosen": chosen,
            "choices": choices}
    if any(m in _baselines() for m in chosen):
        data["best_baseline"] = {"picked_on": "tune", "cells": P.best_baseline_per_cell(rows, chosen, split="tune")}
    if provenance is not None:
        data["provenance"] = provenance
    files.write_json(path, data)
    return data


def _baselines():
    from ..presses.registry import BASELINES

    return BASELINES


def read_choices(path: Path, config: dict) -> dict:
    """``choices.json`` if it exists and was made under ``config`` (same fingerprint); else ``ValueError``
    saying what to run."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist: the test job needs the tune choices; run `jacap evaluate tune` "
                         "(same options) first")
    data = files.read_json(path, require=("config", "fingerprint", "chosen"))
    if data["fingerprint"] != P.fingerprint(config):
        diff = P.compare_configs(data["config"], config)
        raise ValueError(f"{path} was made with a different configuration (differs in: {', '.join(diff) or 'fingerprint'}); "
                         "rerun `jacap evaluate tune` with this run's options, or run the test job with the tune's options")
    missing = sorted(set(config["search_space"]) - set(data["chosen"]))
    if missing:
        raise ValueError(f"{path} has no choice for {missing}; rerun `jacap evaluate tune`")
    return data


def best_baselines(choices: dict, test_rows: list[dict]) -> dict:
    """The two best-baseline lines per (length, ratio) cell: ``"tune"`` (the protocol's, from
    ``choices.json``) and ``"test"`` (the same rule applied to the test rows; labelled :data:`TEST_LABEL`)."""
    return {"tune": {"label": "picked on tune (the protocol)", "cells": choices["best_baseline"]["cells"]},
            "test": {"label": TEST_LABEL,
                     "cells": P.best_baseline_per_cell(test_rows, choices["chosen"], split="test")}}


# --------------------------------------------------------------------------------------------- summary
TUNE_LABEL = "picked on tune (the protocol)"
TEST_SHORT_LABEL = "picked on test (stricter)"


def jacap_settings(choices: dict, test_rows: list[dict]) -> list[dict]:
    """The Jacap settings the summary judges: the protocol's default Jacap setting (the tune choice of
    ``jacap``) first, then the paper's exact settings preset when the search space has one
    (``protocol.PAPER_PRESET``, a method spec) and the test rows hold it, else every other Jacap setting
    (``jacap*`` method) the test rows hold. ``[{"spec", "role"}]``."""
    have = list(dict.fromkeys(r["method"] for r in test_rows if P.method_of(r["method"]).startswith("jacap")))
    default = choices["chosen"].get("jacap") or (have[0] if have else None)
    if default is None or default not in have:
        raise ValueError(f"test.jsonl has no rows of the chosen Jacap setting {default!r}; run `jacap evaluate test`")
    out = [{"spec": default, "role": "default"}]
    paper = getattr(P, "PAPER_PRESET", None)
    if paper is not None and paper in have and not P.same_setting(paper, default):
        out.append({"spec": paper, "role": "paper preset"})
    elif paper is None or paper not in have:
        out += [{"spec": s, "role": "tuned " + P.method_of(s)} for s in have if s != default]
    return out


def summarize(test_rows: list[dict], choices: dict, *, confidence: float | None = None,
              n_resamples: int | None = None, seed: int | None = None, alpha: float = 0.05) -> dict:
    """The comparisons of the summary (pure): for each Jacap setting of :func:`jacap_settings` and each
    best-baseline line of :func:`best_baselines` (picked on tune: the protocol; picked on test: stricter),
    one comparison family over the (length, ratio) cells, each cell a row of
    :func:`jacap_lib.results.verdicts.compare_cells` (paired per-document KLs: geometric-mean and mean-KL
    ratio intervals, wins/losses, Wilcoxon p, Holm-adjusted p over the family's cells, verdict) plus the
    cell's length, ratio and baseline. ``{"families": [{"setting", "role", "picked_on", "label", "rows"}]}``."""
    from . import verdicts as V

    cfg = choices["config"]
    model = cfg.get("model", {}).get("name")
    rows = [r for r in test_rows if r.get("split", "test") == "test"
            and (model is None or r.get("model") == model) and int(r["continuation"]) == int(cfg["continuation"])]
    kl = {(r["method"], int(r["length"]), float(r["ratio"]), r["doc"]): float(r["kl"]) for r in rows}
    docs = [d for d, _ in cfg["test_docs"]]
    complete, missing = complete_cells(rows, choices)
    if not complete:
        raise ValueError("test.jsonl has no complete (length, ratio) cell (every chosen setting on every test "
                         "document); run or finish `jacap evaluate test`")
    rows = [r for r in rows if (int(r["length"]), float(r["ratio"])) in complete]
    lines = best_baselines(choices, rows)
    opts = {k: v for k, v in (("confidence", confidence), ("n_resamples", n_resamples), ("seed", seed))
            if v is not None}
    families = []
    for js in jacap_settings(choices, rows):
        for picked_on, line in lines.items():
            cells, meta = {}, {}
            for L in cfg["lengths"]:
                for c in cfg["ratios"]:
                    if (int(L), float(c)) not in complete:
                        continue
                    name = f"{int(L)}/{float(c)}"
                    base = line["cells"].get(name)
                    if base is None:
                        raise ValueError(f"choices.json / test.jsonl: no best baseline {picked_on} for cell {name}")
                    need = [(s, d) for s in (js["spec"], base["spec"]) for d in docs
                            if (s, int(L), float(c), d) not in kl]
                    if need:
                        raise ValueError(f"test.jsonl lacks cell {name} rows of {need[:3]}; finish `jacap evaluate test`")
                    cells[name] = ([kl[(js["spec"], int(L), float(c), d)] for d in docs],
                                   [kl[(base["spec"], int(L), float(c), d)] for d in docs])
                    meta[name] = {"length": int(L), "ratio": float(c), "baseline": base["method"],
                                  "baseline_spec": base["spec"]}
            out = []
            for row in V.compare_cells(cells, alpha=alpha, **opts):
                out.append({**meta[row["cell"]], **row, "losses": row["n"] - row["wins"] - row["ties"]})
            families.append({"setting": js["spec"], "role": js["role"], "picked_on": picked_on,
                             "label": TUNE_LABEL if picked_on == "tune" else TEST_SHORT_LABEL, "rows": out})
    return {"families": families, "cells_measured": [f"{L}/{c}" for L, c in complete],
            "cells_missing": [f"{L}/{c}" for L, c in missing]}


def complete_cells(test_rows: list[dict], choices: dict) -> tuple[list, list]:
    """The (length, ratio) cells of the protocol in which every setting the test job runs (each method's
    choice, and the paper preset when it differs from them) has a row on every test document, and the cells
    that lack some: ``(complete, missing)``, each a list of ``(length, ratio)`` in the configuration's order.

    The jobs measure the shortest prompts first, so an unfinished (resumable) run leaves whole lengths
    complete; the summary judges those cells and names the others (the Holm family is then the cells judged)."""
    cfg = choices["config"]
    have = {(r["method"], int(r["length"]), float(r["ratio"]), r["doc"]) for r in test_rows}
    specs = test_specs(choices["chosen"])
    docs = [d for d, _ in cfg["test_docs"]]
    complete, missing = [], []
    for L in cfg["lengths"]:
        for c in cfg["ratios"]:
            ok = all((s, int(L), float(c), d) in have for s in specs for d in docs)
            (complete if ok else missing).append((int(L), float(c)))
    return complete, missing


def test_specs(chosen: dict) -> list[str]:
    """The settings the test job runs: each method's tune choice, then the paper preset
    (:data:`~jacap_lib.results.protocol.PAPER_PRESET`) when Jacap is among the methods and its choice
    resolves to other options (so the default and the paper's settings are in every table)."""
    specs = list(dict.fromkeys(chosen.values()))
    if "jacap" in chosen and not P.same_setting(chosen["jacap"], P.PAPER_PRESET):
        specs.append(P.PAPER_PRESET)
    return specs


def cell_statistics(rows: list[dict], specs=None, *, seed: int | None = None) -> list[dict]:
    """Per (setting, length, ratio): the geometric-mean KL over the documents with its 95 % bootstrap interval
    (:func:`jacap_lib.results.verdicts.geometric_mean`), the mean top-1 agreement and attention-output error.
    ``rows``: evaluation rows of one split; ``specs``: the settings, in order (default: every one in ``rows``).
    Only cells holding the same documents for every setting are reported."""
    from . import verdicts as V

    specs = list(specs) if specs is not None else list(dict.fromkeys(r["method"] for r in rows))
    by: dict = {}
    for r in rows:
        if r["method"] in specs:
            by.setdefault((int(r["length"]), float(r["ratio"])), {}).setdefault(r["method"], {})[r["doc"]] = r
    out = []
    for (L, c), per in sorted(by.items()):
        docs = set(per.get(specs[0], {}))
        if not docs or any(set(per.get(s, {})) != docs for s in specs):
            continue
        for s in specs:
            rs = [per[s][d] for d in sorted(docs)]
            gm = V.geometric_mean([r["kl"] for r in rs], **({} if seed is None else {"seed": seed}))
            out.append({"method": s, "length": L, "ratio": c, "n_docs": len(rs), "kl_geomean": gm.estimate,
                        "kl_low": gm.low, "kl_high": gm.high,
                        "top1_agreement": sum(r["top1_agreement"] for r in rs) / len(rs),
                        "attn_rel_error": sum(r["attn_rel_error"] for r in rs) / len(rs)})
    return out


def compare_settings(rows: list[dict], setting: str, reference: str, *, seed: int | None = None,
                     confidence: float | None = None, n_resamples: int | None = None) -> list[dict]:
    """``setting`` against ``reference`` in every (length, ratio) cell where both have rows on the same
    documents: :func:`jacap_lib.results.verdicts.compare_cells` rows (ratio intervals, wins, Wilcoxon p,
    Holm over these cells, verdict) with ``length`` and ``ratio``. For comparisons outside the protocol's
    primary one (e.g. Jacap against CapKV, the paper's headline). ``confidence`` / ``n_resamples``: the
    intervals' level and bootstrap size (default ``verdicts.CONFIDENCE`` / ``N_RESAMPLES``; a simultaneous
    interval over m comparisons is ``confidence = 1 - 0.05 / m``)."""
    from . import verdicts as V

    by: dict = {}
    for r in rows:
        if r["method"] in (setting, reference):
            by.setdefault((int(r["length"]), float(r["ratio"])), {}).setdefault(r["method"], {})[r["doc"]] = r["kl"]
    cells, meta = {}, {}
    for (L, c), per in sorted(by.items()):
        a, b = per.get(setting, {}), per.get(reference, {})
        if a and set(a) == set(b):
            docs = sorted(a)
            cells[f"{L}/{c}"] = ([a[d] for d in docs], [b[d] for d in docs])
            meta[f"{L}/{c}"] = {"length": L, "ratio": c}
    if not cells:
        raise ValueError(f"no cell holds rows of both {setting!r} and {reference!r} on the same documents")
    return [{**meta[r["cell"]], **r, "losses": r["n"] - r["wins"] - r["ties"]}
            for r in V.compare_cells(cells, **{k: v for k, v in (("seed", seed), ("confidence", confidence),
                                                                 ("n_resamples", n_resamples)) if v is not None})]


#: The evaluation's target for the default Jacap setting against the best baseline picked on tune: per
#: compression ratio, what the verdict of every prompt length must be ("better": the whole 95 % interval of
#: the geometric-mean KL ratio below 1; "not worse": its lower end at most 1).
TARGET = {0.9: "better", 0.95: "better", 0.75: "not worse"}


def target_status(summary: dict, *, target: dict | None = None) -> list[dict]:
    """Each cell the target names, judged from ``summary`` (``summary.json``'s content): the default Jacap
    setting against the best baseline picked on tune. One row per (length, ratio) of the target's ratios:
    ``requirement``, ``met``, the interval, the verdict, and ``shortfall`` — how far the interval's end is from
    the requirement, as a fraction (``gm_high - 1`` for "better", ``gm_low - 1`` for "not worse"; 0 when met).
    Cells the summary has not measured are rows with ``met = None``."""
    target = TARGET if target is None else target
    fam = next((f for f in summary["families"] if f["role"] == "default" and f["picked_on"] == "tune"), None)
    if fam is None:
        raise ValueError("summary has no family of the default Jacap setting against the baseline picked on tune; "
                         "run `jacap evaluate summary`")
    by = {(int(r["length"]), float(r["ratio"])): r for r in fam["rows"]}
    lengths = sorted({L for L, _ in by} | {int(c.split("/")[0]) for c in summary.get("cells_missing", [])})
    out = []
    for c, need in target.items():
        if need not in ("better", "not worse"):
            raise ValueError(f"target: requirement {need!r} for c={c} must be 'better' or 'not worse'")
        for L in lengths:
            r = by.get((L, float(c)))
            if r is None:
                out.append({"length": L, "ratio": float(c), "requirement": need, "met": None, "baseline": None,
                            "gm_ratio": None, "gm_low": None, "gm_high": None, "verdict": "not measured",
                            "shortfall": None})
                continue
            met = r["gm_high"] < 1 if need == "better" else r["gm_low"] <= 1
            gap = (r["gm_high"] - 1 if need == "better" else r["gm_low"] - 1) if not met else 0.0
            out.append({"length": L, "ratio": float(c), "requirement": need, "met": bool(met),
                        "baseline": r["baseline_spec"], "gm_ratio": r["gm_ratio"], "gm_low": r["gm_low"],
                        "gm_high": r["gm_high"], "verdict": r["verdict"], "shortfall": max(gap, 0.0)})
    return out


def identical_documents(rows: list[dict], setting: str, other: str) -> dict:
    """Per (length, ratio) cell where both settings have rows on the same documents: how many documents give
    the two settings the same KL (to 1e-9 relative) and how many documents there are, ``{(L, c): (same, n)}``.
    Where every document is the same, the two settings kept the same tokens: nothing their scores differ in
    decided that cell (e.g. a budget the sinks and the recent window fill)."""
    by: dict = {}
    for r in rows:
        if r["method"] in (setting, other):
            by.setdefault((int(r["length"]), float(r["ratio"])), {}).setdefault(r["method"], {})[r["doc"]] = float(r["kl"])
    out = {}
    for cell, per in sorted(by.items()):
        a, b = per.get(setting, {}), per.get(other, {})
        if a and set(a) == set(b):
            same = sum(abs(a[d] - b[d]) <= 1e-9 * max(abs(a[d]), abs(b[d]), 1e-30) for d in a)
            out[cell] = (same, len(a))
    return out


def summary_table(summary: dict) -> list[dict]:
    """The summary as table rows (pure; ``summary``: what :func:`summarize` returns or ``summary.json``
    holds): one row per (Jacap setting, baseline line, cell), primary line (picked on tune) first."""
    def iv(est, lo, hi):
        return f"{est:.3f} [{lo:.3f}, {hi:.3f}]"

    fams = sorted(summary["families"], key=lambda f: f["picked_on"] != "tune")
    return [{"Jacap setting": f"{f['setting']} ({f['role']})", "best baseline": f["label"],
             "length": r["length"], "c": r["ratio"], "baseline": r["baseline_spec"],
             "geometric-mean ratio [95% CI]": iv(r["gm_ratio"], r["gm_low"], r["gm_high"]),
             "mean-KL ratio [95% CI]": iv(r["mean_ratio"], r["mean_low"], r["mean_high"]),
             "wins/losses": f"{r['wins']}/{r['losses']}", "Wilcoxon p": r["p_wilcoxon"], "Holm p": r["p_holm"],
             "verdict": r["verdict"]}
            for f in fams for r in f["rows"]]


def _summary_inputs(out_dir: Path) -> tuple[list[dict], dict, list[dict]]:
    """test rows, choices and the test runs' configurations of ``out_dir``; ``ValueError`` when a file is
    missing or test.jsonl was made under another configuration than choices.json."""
    test, ch = out_dir / "test.jsonl", out_dir / "choices.json"
    for path, job in ((ch, "tune"), (test, "test")):
        if not path.is_file():
            raise ValueError(f"--dir: {path} does not exist; run `jacap evaluate {job}` (same options) first")
    choices = files.read_json(ch, require=("config", "fingerprint", "chosen"))
    if "best_baseline" not in choices:
        raise ValueError(f"--dir: {ch} has no best baseline (no kvpress baseline was tuned); nothing to compare with")
    if P.fingerprint(choices["config"]) != choices["fingerprint"]:
        raise ValueError(f"--dir: {ch}'s fingerprint does not match its configuration; rerun `jacap evaluate tune`")
    if not files.config_path(test).is_file():
        raise ValueError(f"--dir: {files.config_path(test)} (test.jsonl's configuration) does not exist; rerun "
                         "`jacap evaluate test`")
    runs = files.read_runs(test)
    bad = [r.get("fingerprint") for r in runs if r.get("fingerprint") != choices["fingerprint"]]
    if not runs or bad:
        diff = sorted({k for r in runs if isinstance(r.get("protocol"), dict)
                       for k in P.compare_configs(r["protocol"], choices["config"])})
        raise ValueError(f"--dir: test.jsonl and choices.json were made with different configurations (differs in: "
                         f"{', '.join(diff) or 'fingerprint'}); rerun `jacap evaluate test` with the tune's options")
    return files.read_jsonl(test), choices, runs


def _summary_add(parser):
    parser.add_argument("--dir", type=Path, default=None,
                        help="folder of test.jsonl and choices.json, where summary.json is written (default "
                             "data/results/eval; with --quick data/results/eval/quick)")
    parser.add_argument("--quick", action="store_true", help="summarize the --quick run's folder")
    parser.add_argument("--seed", type=int, default=None, help="bootstrap seed (default verdicts.SEED)")


def _summary_run(args):
    from . import verdicts as V

    try:
        out_dir = eval_dir(args.dir, quick=args.quick)
        test_rows, choices, runs = _summary_inputs(out_dir)
        summary = summarize(test_rows, choices, seed=args.seed)
    except (ValueError, FileNotFoundError, files.ResultsFileError) as e:
        raise J.BadArgument(str(e)) from None
    seed = V.SEED if args.seed is None else args.seed
    config = {"protocol": choices["config"], "fingerprint": choices["fingerprint"], "chosen": choices["chosen"],
              "rule": choices.get("rule"), "inputs": ["test.jsonl", "choices.json"],
              "test_runs": [r.get("command") for r in runs], "command": getattr(args, "command", None),
              "statistics": {"confidence": V.CONFIDENCE, "n_resamples": V.N_RESAMPLES, "method": V.METHOD,
                             "seed": seed, "alpha": 0.05, "primary": "geometric-mean KL ratio (Jacap / baseline)",
                             "holm_family": "all (length, ratio) cells of one Jacap setting against one "
                                            "best-baseline line"}}
    path = out_dir / "summary.json"
    files.write_json(path, {"config": config, **files.round_floats(summary)})
    print(f"wrote {path}")
    if summary["cells_missing"]:
        print(f"  judged {len(summary['cells_measured'])} complete cells; not yet measured on every test document "
              f"(finish `jacap evaluate test`, it resumes): {', '.join(summary['cells_missing'])}")
    for r in summary_table(summary):
        print(f"  {r['Jacap setting']} vs {r['baseline']} ({r['best baseline']}), L={r['length']} c={r['c']}: "
              f"{r['verdict']}")
    return path


# --------------------------------------------------------------------------------------------- timing
def time_methods(model, tokenizer, doc: dict, *, space: dict, lengths, ratio: float, continuation: int,
                 progress: bool = True) -> list[dict]:
    """Wall and CPU seconds, on one document, of one prefill capture (+ full reference) per length and one
    replay (press hook + continuation) per setting of ``space``."""
    from tqdm.auto import tqdm

    from ..measure.quality import capture_prefill, full_reference, next_token_kl, prompt_and_continuation

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
            press = P.protocol_press(s, ratio)
            w, c = time.perf_counter(), time.process_time()
            next_token_kl(model, None, prompt, cont, press, reference=ref, capture=cap)
            rows.append({"length": L, "what": "replay", "method": s, "family": P.method_of(s),
                         "seconds": time.perf_counter() - w, "cpu_seconds": time.process_time() - c})
            bar.update(1)
    bar.close()
    return rows


def estimate(timing_rows: list[dict], *, space: dict, n_tune: int, n_test: int, n_ratios: int,
             key: str = "cpu_seconds") -> dict:
    """Seconds of the full grid from :func:`time_methods` rows: the tune job runs every setting on every tune
    document, the test job one setting per method (its settings' mean cost) on every test document;
    one prefill per (document, length). ``{"tune", "test", "total"}`` in seconds of ``key``."""
    by = {(r["length"], r.get("method", "prefill")): r[key] for r in timing_rows}
    lengths = sorted({r["length"] for r in timing_rows})
    tune = test = 0.0
    for L in lengths:
        settings = [by[(L, s)] for v in space.values() for s in v]
        per_method = [sum(by[(L, s)] for s in v) / len(v) for v in space.values()]
        tune += n_tune * (by[(L, "prefill")] + n_ratios * sum(settings))
        test += n_test * (by[(L, "prefill")] + n_ratios * sum(per_method))
    return {"tune": tune, "test": test, "total": tune + test}


# --------------------------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser, job: str = "tune") -> None:
    """The options of ``jacap evaluate <job>`` (``job``: tune, test or time)."""
    J.shared_options(parser, seed=True)
    parser.add_argument("--lengths", nargs="+", type=int, default=None,
                        help=f"prompt tokens (default {' '.join(map(str, DEFAULT_LENGTHS))})")
    parser.add_argument("--ratios", nargs="+", type=float, default=None,
                        help=f"compression ratios (default {' '.join(map(str, DEFAULT_RATIOS))})")
    parser.add_argument("--continuation", type=int, default=None,
                        help=f"continuation tokens scored (default {DEFAULT_CONTINUATION})")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="registry names of the search space to run (default: every method of "
                             "protocol.SEARCH_SPACE)")
    parser.add_argument("--manifest", type=Path, default=None,
                        help="document manifest (default: the evaluation corpus, data/texts/corpus/manifest.json)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="output folder (default data/results/eval; with --quick data/results/eval/quick)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: {QUICK['docs_per_split']} tune + {QUICK['docs_per_split']} test documents, "
                             "prompt 512, c 0.75/0.9, 32-token continuation, knorm/snapkv/jacap with <= 2 settings")
    parser.add_argument("--tune-per-kind", type=int, default=TUNE_DOCS_PER_KIND,
                        help=f"tune documents used per kind, first in manifest order (default {TUNE_DOCS_PER_KIND}; "
                             "0: every tune document)")
    if job != "time":
        parser.add_argument("--workers", type=int, default=None,
                            help="processes, one prefill at a time each, --threads torch threads each (default 2, "
                                 "for a 2-core machine; 1 with --quick)")
    else:
        parser.add_argument("--doc", default=None, help="document id (default: the first long enough)")
        parser.add_argument("--ratio", type=float, default=0.9, help="the ratio the replays are timed at (default 0.9)")
        parser.add_argument("--n-tune", type=int, default=None, help="tune documents to extrapolate to (default: the manifest's)")
        parser.add_argument("--n-test", type=int, default=None, help="test documents to extrapolate to (default: the manifest's)")


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
    from ..models import load_tokenizer
    from .provenance import model_record

    quick = bool(args.quick)
    lengths = tuple(args.lengths or (QUICK["lengths"] if quick else DEFAULT_LENGTHS))
    ratios = tuple(args.ratios or (QUICK["ratios"] if quick else DEFAULT_RATIOS))
    continuation = args.continuation if args.continuation is not None else (QUICK["continuation"] if quick else DEFAULT_CONTINUATION)
    for L in lengths:
        if isinstance(L, bool) or L < 16:
            raise ValueError(f"--lengths: every prompt length must be >= 16 tokens, got {L}")
    if len(set(lengths)) != len(lengths) or len(set(ratios)) != len(ratios):
        raise ValueError("--lengths / --ratios: list each value once")
    check_ratios(ratios)
    if continuation < 1:
        raise ValueError(f"--continuation must be >= 1, got {continuation}")
    check_processes(args, quick=quick)
    space = P.quick_space() if quick else dict(P.SEARCH_SPACE)
    if args.methods:
        unknown = sorted(set(args.methods) - set(space))
        if unknown:
            raise ValueError(f"--methods: {unknown} not in the search space; choose among {list(space)}")
        space = {m: space[m] for m in args.methods}
    P.check_search_space(space, exact=not quick)
    check_model_option(args.model)
    try:
        if args.tune_per_kind < 0:
            raise ValueError(f"--tune-per-kind must be >= 0, got {args.tune_per_kind}")
        docs = load_docs(args.manifest, quick=quick, tune_per_kind=args.tune_per_kind)
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"--manifest: {e}") from None
    out_dir = eval_dir(args.dir, quick=quick)
    tok = tokenizer if tokenizer is not None else load_tokenizer(args.model)
    extra = {}
    if args.job == "time":
        if not 0 < args.ratio < 1:
            raise ValueError(f"--ratio must lie in (0, 1), got {args.ratio}")
        pick = [d for d in docs if d["id"] == args.doc] if args.doc else docs
        if args.doc and not pick:
            raise ValueError(f"--doc {args.doc!r} is not in the manifest; valid: {[d['id'] for d in docs][:8]}...")
        counts = {d["id"]: int(tok(d["text"], return_tensors="pt", add_special_tokens=False).input_ids.shape[1]) for d in pick}
        long_enough = [d for d in pick if counts[d["id"]] >= max(lengths) + continuation]
        if not long_enough:
            raise ValueError(f"--doc/--lengths: no document has {max(lengths) + continuation} tokens (longest: "
                             f"{max(counts.values())}); give shorter --lengths or --manifest with a longer document")
        extra = {"doc": long_enough[0], "ratio": float(args.ratio),
                 "n_tune": args.n_tune or sum(d["split"] == "tune" for d in docs),
                 "n_test": args.n_test or sum(d["split"] == "test" for d in docs)}
    else:
        check_lengths(tok, docs, lengths, continuation)
    record = model_record(args.model)
    config = P.protocol_config(model=record, lengths=lengths, ratios=ratios, continuation=continuation, space=space,
                               docs=docs)
    plan = Plan(job=args.job, out_dir=Path(out_dir), model_name=args.model, model_label=record["name"], lengths=lengths,
                ratios=ratios, continuation=int(continuation), space=space, docs=docs, config=config, record=record,
                threads=args.threads, workers=getattr(args, "workers", 1), seed=args.seed,
                progress=not args.no_progress, extra=extra)
    plan.extra["command"] = getattr(args, "command", None)
    if args.job == "test":
        plan.extra["choices"] = read_choices(plan.out_dir / "choices.json", config)
    return plan


def _run_config(plan: Plan, model=None) -> dict:
    from ..presses.registry import method_options
    from .provenance import provenance

    rec = provenance(model, model_name=plan.model_name, command=plan.extra.get("command"))
    specs = [s for v in plan.space.values() for s in v]
    return {**rec, "job": plan.job, "protocol": plan.config, "fingerprint": P.fingerprint(plan.config),
            "threads": plan.threads, "workers": plan.workers, "seed": plan.seed,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "measured": "prompt KV of every layer and KV head compressed by the press's own kvpress hook, replayed on "
                        "one captured prefill per (document, length); the continuation teacher-forced at its true "
                        "positions, never evicted; KL(full || compressed) of next-token distributions",
            "documents": [{k: d.get(k) for k in ("id", "kind", "split", "sha256", "source", "license")} for d in plan.docs],
            "settings": {s: method_options(P.protocol_press(s, plan.ratios[0])) for s in specs},
            "pins": {s: P.pinned(s) for s in specs if P.pinned(s) != s}}


def execute(plan: Plan, *, model=None, tokenizer=None) -> dict:
    """Run a :func:`prepare`d job (``model``/``tokenizer``: use these instead of loading ``plan.model_name``,
    in this process). Returns a summary dict (rows written, files)."""
    if plan.job == "time":
        return _execute_time(plan, model, tokenizer)
    name = "tune.jsonl" if plan.job == "tune" else "test.jsonl"
    out = plan.out_dir / name
    done = {row_key(r) for r in files.read_jsonl(out)}
    if plan.job == "tune":
        groups = tune_groups(plan.docs, plan.space, plan.lengths, plan.ratios, plan.continuation, plan.model_label, done)
    else:
        chosen = plan.extra["choices"]["chosen"]
        groups = test_groups(plan.docs, {m: chosen[m] for m in plan.space}, plan.lengths, plan.ratios,
                             plan.continuation, plan.model_label, done)
    check_settings_unchanged(out, plan.space if plan.job == "tune" else None,
                             test_specs(plan.extra["choices"]["chosen"]) if plan.job == "test" else None, plan.ratios)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    files.append_run(out, _run_config(plan, model))
    n = run_groups(groups, out, continuation=plan.continuation, model_label=plan.model_label, model=model,
                   tokenizer=tokenizer, model_name=plan.model_name, workers=plan.workers, threads=plan.threads,
                   seed=plan.seed, progress=plan.progress)
    res = {"rows_written": n, "file": str(out)}
    if plan.job == "tune":
        rows = [r for r in files.read_jsonl(out) if r["model"] == plan.model_label
                and r["continuation"] == plan.continuation]
        data = write_choices(plan.out_dir / "choices.json", rows, plan.config, plan.space,
                             provenance={"tune_file": name, "command": plan.extra.get("command")})
        res.update(choices=str(plan.out_dir / "choices.json"), chosen=data["chosen"])
    return res


def check_settings_unchanged(out: Path, space: dict | None, specs=None, ratios=(0.5,), build=None) -> None:
    """Refuse to resume ``out`` when a setting now builds another press than the rows were made with.

    A method spec without options (``"jacap"``) means the library's defaults, which the protocol itself may
    change (``JacapPress``'s defaults are the tune choice). Every earlier run of ``out`` recorded each
    setting's resolved options; a spec whose options differ today (the compression ratio aside) would mix two
    presses under one name, so this raises ``ValueError`` naming it and the fix (a new ``--dir``)."""
    from ..presses.registry import effective_options, method_options

    if not Path(out).is_file():
        return
    specs = list(specs or []) + [s for v in (space or {}).values() for s in v]
    drop = {"compression_ratio"}
    for run in files.read_runs(out):
        for spec in specs:
            then = (run.get("settings") or {}).get(spec)
            if then is None:
                continue
            now = method_options((build or P.protocol_press)(spec, float(ratios[0])))
            a = effective_options({k: v for k, v in then.items() if k not in drop})
            b = effective_options(json.loads(json.dumps({k: v for k, v in now.items() if k not in drop})))
            if a != b:
                diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                raise ValueError(f"{out} holds rows of {spec!r} made with other options ({', '.join(diff)}: "
                                 f"{[a.get(k) for k in diff]} then, {[b.get(k) for k in diff]} now; the library "
                                 "defaults changed); resuming would mix two presses under one name. Give a new "
                                 "--dir to measure today's settings")


def _execute_time(plan: Plan, model, tokenizer) -> dict:
    import torch

    from .provenance import provenance

    if model is None:
        from ..models import load_model

        torch.set_num_threads(plan.threads)
        model, tokenizer = load_model(plan.model_name)
    load_before = list(os.getloadavg())
    rows = time_methods(model, tokenizer, plan.extra["doc"], space=plan.space, lengths=plan.lengths,
                        ratio=plan.extra["ratio"], continuation=plan.continuation, progress=plan.progress)
    kw = dict(space=plan.space, n_tune=plan.extra["n_tune"], n_test=plan.extra["n_test"], n_ratios=len(plan.ratios))
    est = {"cpu_seconds": estimate(rows, **kw), "wall_seconds": estimate(rows, key="seconds", **kw)}
    est["hours_on_idle_cores"] = {f"workers={w}": est["cpu_seconds"]["total"] / 3600 / w for w in (1, 2)}
    config = {**provenance(model, model_name=plan.model_name, command=plan.extra.get("command")),
              "doc": plan.extra["doc"]["id"], "lengths": list(plan.lengths), "ratio": plan.extra["ratio"],
              "ratios_in_grid": list(plan.ratios), "continuation": plan.continuation, "threads": plan.threads,
              "n_tune": plan.extra["n_tune"], "n_test": plan.extra["n_test"], "search_space": plan.space,
              "load_average_before": load_before, "load_average_after": list(os.getloadavg()), "cpu_count": os.cpu_count()}
    path = plan.out_dir / "timing.json"
    files.write_results(path, config, [files.round_floats(r) for r in rows], estimate=files.round_floats(est))
    return {"file": str(path), "estimate": est}


def report(res: dict) -> None:
    """Print what :func:`execute` wrote."""
    if "estimate" in res:
        e = res["estimate"]
        print(f"wrote {res['file']}; full grid: {e['cpu_seconds']['total'] / 3600:.2f} CPU-hours "
              f"(tune {e['cpu_seconds']['tune'] / 3600:.2f}, test {e['cpu_seconds']['test'] / 3600:.2f}); "
              f"{e['wall_seconds']['total'] / 3600:.2f} h at this run's load, one process")
    else:
        print(f"wrote {res['rows_written']} new rows to {res['file']}")
        if "choices" in res:
            print(f"wrote {res['choices']}: " + ", ".join(f"{m}: {s}" for m, s in res["chosen"].items()))


def _job(job: str):
    def add(parser):
        add_arguments(parser, job)

    def run(args):
        args.job = job
        try:
            plan = prepare(args)
        except J.BadArgument:
            raise
        except (ValueError, FileNotFoundError) as e:
            raise J.BadArgument(str(e)) from None
        res = execute(plan)
        report(res)
        return res

    return add, run


TUNE = J.Job("every setting of the search space on the tune documents -> data/results/eval/tune.jsonl, then "
             "each method's choice and the best baseline per cell -> choices.json", *_job("tune"))
TEST = J.Job("each method's tuned setting on the test documents -> data/results/eval/test.jsonl (needs the tune's "
             "choices.json, made with the same options)", *_job("test"))
TIME = J.Job("wall and CPU time of one prefill and one replay per setting on one document, and the extrapolated "
             "time of the tune + test grid -> data/results/eval/timing.json", *_job("time"))
SUMMARY = J.Job("per cell, the default Jacap setting (and the paper preset or the other Jacap settings) against the best "
                "baseline picked on tune and, stricter, on test: ratio intervals, wins, Wilcoxon and Holm p, verdicts "
                "-> data/results/eval/summary.json (needs test.jsonl and choices.json of one configuration)",
                _summary_add, _summary_run)
