"""Needle retrieval with the tuned methods: does a compressed cache still hold a number hidden in filler?

``jacap evaluate needle``          every setting of :func:`~jacap_lib.experiments.protocol.dev_specs` of the tune
                                   choices (each method's choice, the paper preset) at prompts of 512/1024/2048
                                   tokens, c 0.5/0.75/0.9, a 5-digit key hidden at depths 0.1/0.3/0.5/0.7/0.9
                                   x ``--trials`` keys per depth (default 4: 20 prompts per length, what the CPU budget of the whole evaluation allows), plus one
                                   uncompressed answer per prompt -> ``data/results/eval/needle.jsonl``
``jacap evaluate needle-summary``  needle.jsonl + choices.json -> ``needle_summary.json``: per (length, ratio)
                                   cell the uncompressed accuracy (the ceiling) and each setting's accuracy with
                                   a 95 % Wilson interval; Algorithm 1's tuned Jacap setting against the cell's best
                                   baseline by KL on tune and against the paper preset, paired per prompt
                                   (accuracy difference in points with a paired bootstrap interval, exact
                                   McNemar p, Holm over the cells of one comparison, wins/losses, and the
                                   verdict of the Holm-adjusted exact test).
                                   The needle job itself writes rows only; the summary is this separate leaf
                                   (it needs no model and can be rerun on a partial file).

This module is the two jobs (their options, settings, prompts and files); the statistics of the summary are
:mod:`jacap_lib.verdicts.rows`' (:func:`~jacap_lib.verdicts.rows.needle_summary`), its printed lines
:func:`jacap_lib.report.findings.needle_lines`.

The measurement (:func:`jacap_lib.measure.passkey.measure_needle`): the context (filler with the needle, exactly
``length`` tokens) is prefilled ONCE per (length, depth, trial) (:func:`jacap_lib.measure.quality.capture_prefill`);
every (setting, ratio) replays its press's own kvpress hook on that capture (a press that scores after the
prefill, such as KVzip, KVgrad or the context press, runs the real prefill instead) and greedily decodes 8 tokens
after the question (:func:`jacap_lib.measure.passkey.needle_trial`); a row is ``correct`` when the key is in
the answer. Keys: ``random.Random(seed)``, one per (depth, trial), shared by the lengths.

The settings are the tune's choices, so the job needs ``choices.json`` (``--choices``, default
``data/results/eval/choices.json``, also with ``--quick``) made under the evaluation's configuration: its
fingerprint matches its configuration, it was made with this ``--model`` (name and file sha256) on the
protocol's search space (:data:`~jacap_lib.experiments.protocol.rules.SEARCH_SPACE`), and it has a best baseline for
every (length, ratio) cell asked for; otherwise it refuses (exit 2) before loading a model or writing a file.

Rows are keyed by (model, length, depth, trial, key, setting, ratio); a rerun skips the keys already there
(resumable), and refuses when a setting now builds another press than its rows were made with. ``--workers N``
(default 2) runs N spawned processes, one prefill at a time each (:func:`~jacap_lib.experiments.protocol.run_groups`).
The sidecar ``needle.config.json`` records every invocation (command, provenance with the model's sha256, the
choices' fingerprint, lengths, ratios, depths, trials, seed, every setting's press options, workers, threads).
``--quick``: prompt 512, c 0.75/0.9, depth 0.5 x 2 keys, three settings (Algorithm 1's tuned Jacap setting, the paper preset,
the quick cells' best baseline), written under ``data/results/eval/quick/``.

``--mode after|inside`` (:data:`~jacap_lib.measure.passkey.MODES`, default ``after``, the measurement above):
``inside`` puts the question at the end of the compressed prompt (query-aware compression) and runs only its
last token on the compressed cache. The mode is in every row, in the row key and in the run's configuration
(rows without one were made ``after``), so a resume never mixes the two, and the summaries judge one mode at
a time. Every row also records the needle's DIGIT SURVIVAL (:func:`~jacap_lib.measure.passkey.digit_survival`:
per layer and KV head the fraction of the key's digit tokens kept, at their true positions, and of the needle's
other tokens; overall fractions; whether every key digit survived everywhere).

``--space peers|context`` (default ``first``): the tune choices of that search space (``--methods``: some of them),
from its own ``choices.json``, every row in its folder (``data/results/eval/<space>/needle.jsonl``), the same prompts
and keys; the presses that score after the prefill (KVzip, ``jacap``) run the real prefill on each prompt,
scored once for every ratio. ``--quick`` and ``--probe`` are the first space's only.

``--probe``: the digit-survival probe, written to ``needle_probe.jsonl`` (never ``needle.jsonl``): prompt
1024, c 0.5/0.75, the default depths x keys, the :data:`PROBE_METHODS`' tuned settings and the paper preset;
run it once per ``--mode``. ``jacap evaluate needle-summary --probe`` -> ``needle_probe_summary.json``
(:func:`jacap_lib.verdicts.rows.needle_probe_summary`).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from jacap_lib.measure import passkey as PK
from jacap_lib.measure.passkey import MODES, N_NEW, NeedleGroup
from jacap_lib.experiments import protocol as E
from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.experiments.protocol import rules as P
from jacap_lib.verdicts import rows as RS
from jacap_lib.verdicts.rows import DEFAULT_MODE, FULL

__all__ = ["DEFAULT_LENGTHS", "DEFAULT_RATIOS", "DEFAULT_DEPTHS", "DEFAULT_TRIALS", "QUICK", "PROBE", "PROBE_METHODS",
           "PROBE_FILE", "probe_specs", "row_key", "needle_keys", "needle_specs", "read_choices", "needle_groups",
           "row_measure", "prompts_of", "add_arguments", "prepare", "execute", "NEEDLE", "NEEDLE_SUMMARY"]

DEFAULT_LENGTHS = (512, 1024, 2048)
DEFAULT_RATIOS = (0.5, 0.75, 0.9)
DEFAULT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
DEFAULT_TRIALS = 4
QUICK = {"lengths": (512,), "ratios": (0.75, 0.9), "depths": (0.5,), "trials": 2}
PROBE = {"lengths": (1024,), "ratios": (0.5, 0.75)}  # the digit-survival probe's defaults (depths, trials: the job's)
# their tune choices + the paper preset; jacap_obs's is the press JacapPromptPress() builds
PROBE_METHODS = ("jacap_prompt", "jacap_obs", "capkv", "keydiff", "snapkv", "expected_attention", "tova")
PROBE_FILE = "needle_probe.jsonl"
MIN_LENGTH = 64  # the needle and its question fit with filler to spare


def row_key(row: dict) -> tuple:
    return (row["model"], int(row["length"]), float(row["depth"]), int(row["trial"]), str(row["key"]),
            row["method"], float(row["ratio"]), RS.row_mode(row))


def needle_keys(depths, trials: int, seed: int) -> dict:
    """``{(depth, trial): key}``: 5-digit keys from ``random.Random(seed)``, depth by depth, trial by trial."""
    rng = random.Random(seed)
    return {(float(d), t): str(rng.randrange(10000, 100000)) for d in depths for t in range(int(trials))}


# --------------------------------------------------------------------------------------------- choices
def read_choices(path: Path, record: dict, lengths, ratios, *, space: str = "first") -> dict:
    """``choices.json`` if it was made under the evaluation's configuration for this model on the search space
    ``space`` (:data:`~jacap_lib.experiments.protocol.rules.SPACES`) and, for the first space, has a best baseline for every
    (length, ratio) cell asked for; else ``ValueError`` saying what to run."""
    path = Path(path)
    data = RS.read_choices_file(path, flag="--choices")
    cfg = data["config"]
    model = cfg.get("model") or {}
    if (model.get("name"), model.get("sha256")) != (record.get("name"), record.get("sha256")):
        raise ValueError(f"--choices: {path} was made for another model ({model.get('name')}, sha256 "
                         f"{str(model.get('sha256'))[:12]}...) than --model ({record.get('name')}, sha256 "
                         f"{str(record.get('sha256'))[:12]}...); run `jacap evaluate tune` with this model")
    which, table = space, P.SEARCH_SPACE if space == "first" else P.SPACES[space]
    space = {m: list(v) for m, v in table.items()}
    tune = "jacap evaluate tune" + ("" if which == "first" else f" --space {which}")
    if cfg.get("search_space") != space:
        diff = sorted(set(space) ^ set(cfg.get("search_space") or {})) or sorted(
            m for m in space if (cfg.get("search_space") or {}).get(m) != space[m])
        raise ValueError(f"--choices: {path} was made with another search space than the protocol's (differs in: "
                         f"{', '.join(diff)}; a --quick or --methods tune?); use the full tune's choices.json")
    missing = sorted(set(space) - set(data["chosen"]))
    if which != "first":  # the peers' and the context press's needles judge no best baseline; a stage may be pending
        if not data["chosen"]:
            raise ValueError(f"--choices: {path} has no choice yet; finish a method's tune first (`{tune}`)")
        return data
    if missing or "best_baseline" not in data:
        raise ValueError(f"--choices: {path} has no choice for {missing or 'the best baseline'}; rerun `{tune}`")
    cells = data["best_baseline"].get("cells", {})
    lack = [f"{int(L)}/{float(c)}" for L in lengths for c in ratios if f"{int(L)}/{float(c)}" not in cells]
    if lack:
        raise ValueError(f"--lengths/--ratios: {path} has no best baseline for cell(s) {', '.join(lack)} (its cells: "
                         f"{', '.join(cells)}); the needle job compares on the tune's cells")
    return data


def needle_specs(choices: dict, *, quick: bool = False, cells=()) -> list[str]:
    """The settings the needle job runs: :func:`~jacap_lib.experiments.protocol.dev_specs` of the choices
    (each method's choice, the paper preset when it differs); ``quick``: Algorithm 1's tuned Jacap setting, the paper
    preset and the best baseline(s) of ``cells`` (``"L/c"`` names) only."""
    specs = E.dev_specs(choices["chosen"])
    if not quick:
        return specs
    base = [choices["best_baseline"]["cells"][c]["spec"] for c in cells]
    return list(dict.fromkeys([choices["chosen"]["jacap_prompt"], P.PAPER_PRESET, *base]))


def probe_specs(choices: dict) -> list[str]:
    """The probe's settings: Algorithm 1's tuned Jacap setting, the paper preset, then the tune choice of every other
    method of :data:`PROBE_METHODS` (the default press's, ``jacap_obs``, first)."""
    chosen = choices["chosen"]
    missing = [m for m in PROBE_METHODS if m not in chosen]
    if missing:
        raise ValueError(f"--choices: no tune choice for {missing}; the probe runs {list(PROBE_METHODS)}")
    return list(dict.fromkeys([chosen["jacap_prompt"], P.PAPER_PRESET, *(chosen[m] for m in PROBE_METHODS[1:])]))


def needle_groups(specs, lengths, ratios, keys: dict, model_name: str, done=frozenset(),
                  mode: str = DEFAULT_MODE) -> list[NeedleGroup]:
    """Every (setting, ratio), and the uncompressed answer, on every (length, depth, trial) prompt in
    ``mode``, shortest prompts first, minus the keys (:func:`row_key`) in ``done``."""
    jobs = [(FULL, 0.0)] + [(s, float(c)) for s in specs for c in ratios]
    out = []
    for L in sorted(int(x) for x in lengths):
        for (d, t), key in keys.items():
            todo = [(s, c) for s, c in jobs if (model_name, L, float(d), int(t), key, s, c, mode) not in done]
            if todo:
                out.append(NeedleGroup(L, float(d), int(t), key, todo, mode))
    return out


def _press_of(spec: str, ratio: float):
    """The press of one job of a group: ``None`` for the uncompressed answer, else the setting's press."""
    from jacap_lib.presses.registry import press_from_spec

    return None if spec == FULL else press_from_spec(spec, ratio)


def _family_of(spec: str) -> str:
    return FULL if spec == FULL else P.method_of(spec)


def row_measure(model_name: str):
    """The measure of one group (one prefill) for :func:`~jacap_lib.experiments.protocol.run_groups`:
    :func:`jacap_lib.measure.passkey.measure_needle` with this job's presses and row labels (it pickles, for
    spawned workers)."""
    return functools.partial(PK.measure_needle, model_name=model_name, press_of=_press_of, family_of=_family_of)


def prompts_of(depths, trials: int, seed: int) -> list[tuple]:
    """The prompts of a configuration, ``[(depth, trial, key)]`` (what the summary expects in every cell)."""
    return [(d, t, k) for (d, t), k in needle_keys(depths, trials, seed).items()]


# --------------------------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``jacap evaluate needle``."""
    J.shared_options(parser, seed=True)
    J.grid_options(parser, lengths=DEFAULT_LENGTHS, ratios=DEFAULT_RATIOS)
    parser.add_argument("--depths", nargs="+", type=float, default=None,
                        help=f"relative needle depths in [0, 1] (default {' '.join(map(str, DEFAULT_DEPTHS))})")
    parser.add_argument("--trials", type=int, default=None,
                        help=f"keys per depth (default {DEFAULT_TRIALS}; 5-digit keys from random.Random(--seed))")
    parser.add_argument("--choices", type=Path, default=None,
                        help="the tune's choices.json (default: --space's, data/results/eval[/<space>]/choices.json, "
                             "also with --quick)")
    parser.add_argument("--space", choices=sorted(P.SPACES), default="first",
                        help="the search space whose tune choices run (default 'first'; 'peers' or 'context': rows "
                             "in data/results/eval/<space>/needle.jsonl)")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="with --space peers or context: only these methods' tune choices (default: every "
                             "method of the space with a choice)")
    E.folder_options(parser, quick="smoke run: prompt 512, c 0.75/0.9, depth 0.5 x 2 keys, Algorithm 1's tuned Jacap setting, the "
                                   "paper preset and the best baseline")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes, one prefill at a time each, --threads torch threads each (default 2, "
                             "for a 2-core machine; 1 with --quick)")
    parser.add_argument("--mode", default=None,
                        help=f"{' or '.join(MODES)} (default {DEFAULT_MODE}): ask for the key after the context was "
                             "compressed, or put the question inside the compressed prompt (query-aware)")
    parser.add_argument("--probe", action="store_true",
                        help=f"the digit-survival probe -> {PROBE_FILE} (not needle.jsonl): prompt "
                             f"{' '.join(map(str, PROBE['lengths']))}, c {'/'.join(map(str, PROBE['ratios']))}, the "
                             f"tune choices of {', '.join(PROBE_METHODS)} and the paper preset; once per --mode")


@dataclass
class Plan:
    """A checked invocation of the needle job: everything :func:`execute` needs, nothing written yet."""

    out: Path
    model_name: str | None
    record: dict
    choices: dict
    choices_path: Path
    specs: list
    lengths: tuple
    ratios: tuple
    depths: tuple
    trials: int
    seed: int = 0
    mode: str = DEFAULT_MODE
    probe: bool = False
    threads: int = 1
    workers: int = 1
    progress: bool = True
    command: str | None = None


def prepare(args) -> Plan:
    """Check every option (``ValueError`` naming it) and build the :class:`Plan`; loads no model, writes nothing."""
    from jacap_lib.results.paths import data_path
    from jacap_lib.results.provenance import model_record

    quick, probe = bool(args.quick), bool(getattr(args, "probe", False))
    mode = getattr(args, "mode", None) or DEFAULT_MODE
    if mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if quick and probe:
        raise ValueError("--probe and --quick: give one (the probe has its own file and defaults)")
    preset = QUICK if quick else PROBE if probe else {}
    lengths = tuple(args.lengths or preset.get("lengths", DEFAULT_LENGTHS))
    ratios = tuple(float(c) for c in (args.ratios or preset.get("ratios", DEFAULT_RATIOS)))
    depths = tuple(float(d) for d in (args.depths or (QUICK["depths"] if quick else DEFAULT_DEPTHS)))
    trials = args.trials if args.trials is not None else (QUICK["trials"] if quick else DEFAULT_TRIALS)
    for L in lengths:
        if L < MIN_LENGTH:
            raise ValueError(f"--lengths: every prompt length must be >= {MIN_LENGTH} tokens (the needle and its "
                             f"filler), got {L}")
    E.check_ratios(ratios)
    for d in depths:
        if not 0 <= d <= 1:
            raise ValueError(f"--depths: every needle depth must lie in [0, 1], got {d}")
    for name, vals in (("--lengths", lengths), ("--ratios", ratios), ("--depths", depths)):
        if len(set(vals)) != len(vals):
            raise ValueError(f"{name}: list each value once")
    if trials < 1:
        raise ValueError(f"--trials must be >= 1, got {trials}")
    E.check_processes(args, quick=quick)
    J.check_model(args.model)
    which = getattr(args, "space", None) or "first"
    if which not in P.SPACES:
        raise ValueError(f"--space must be one of {sorted(P.SPACES)}, got {which!r}")
    methods = getattr(args, "methods", None)
    if which != "first" and (quick or probe):
        raise ValueError(f"--space {which} with --{'quick' if quick else 'probe'}: the smoke run and the probe use the "
                         "first space's choices; drop one")
    if methods and which == "first":
        raise ValueError("--methods: give it with --space peers or context (the first space runs every choice)")
    out_dir = E.eval_dir(args.dir, quick=quick, space=which)
    sub = () if which == "first" else (which,)
    choices_path = Path(args.choices or data_path("results", "eval", *sub, "choices.json", must_exist=False))
    record = model_record(args.model)
    choices = read_choices(choices_path, record, lengths, ratios, space=which)
    cells = [f"{int(L)}/{c}" for L in lengths for c in ratios]
    if which != "first":
        unknown = sorted(set(methods or ()) - set(choices["chosen"]))
        if unknown:
            raise ValueError(f"--methods: {unknown} have no tune choice in {choices_path} (choices: "
                             f"{sorted(choices['chosen'])})")
        specs = list(dict.fromkeys(choices["chosen"][m] for m in (methods or choices["chosen"])))
    else:
        specs = probe_specs(choices) if probe else needle_specs(choices, quick=quick, cells=cells)
    out = Path(out_dir) / (PROBE_FILE if probe else "needle.jsonl")
    E.check_settings_unchanged(out, None, specs, ratios)
    return Plan(out=out, model_name=args.model, record=record, choices=choices, choices_path=choices_path,
                specs=specs, lengths=lengths, ratios=ratios, depths=depths, trials=int(trials), seed=args.seed,
                mode=mode, probe=probe,
                threads=args.threads, workers=args.workers, progress=not args.no_progress,
                command=getattr(args, "command", None))


def _run_config(plan: Plan, model=None) -> dict:
    from jacap_lib.results.provenance import provenance

    rec = provenance(model, model_name=plan.model_name, command=plan.command)
    return {**rec, "job": "needle", "choices": str(plan.choices_path.name), "choices_fingerprint": plan.choices["fingerprint"],
            "chosen": plan.choices["chosen"], "lengths": list(plan.lengths), "ratios": list(plan.ratios),
            "depths": list(plan.depths), "trials": plan.trials, "seed": plan.seed, "n_new": N_NEW,
            "mode": plan.mode, "probe": plan.probe,
            "keys": [[d, t, k] for d, t, k in prompts_of(plan.depths, plan.trials, plan.seed)],
            "threads": plan.threads, "workers": plan.workers,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "measured": ("the context (filler + needle, exactly `length` tokens) prefilled once per (length, depth, "
                         "trial); every (setting, ratio) replays its press's kvpress hook on that capture, then the "
                         f"question and {N_NEW} greedy tokens on the compressed cache; correct = the key in the answer"
                         if plan.mode == "after" else
                         "the context (filler + needle, exactly `length` tokens) followed by the question but its "
                         "last token prefilled once per (length, depth, trial); every (setting, ratio) replays its "
                         "press's kvpress hook on that capture (the question is inside the compressed prompt), then "
                         f"the question's last token and {N_NEW} greedy tokens on the compressed cache; correct = the "
                         "key in the answer") + "; a press that scores after the prefill (KVzip, KVgrad, the "
                        "context press) cannot replay: it runs the real prefill of that prompt under its own "
                        "`with press(model)` instead (one scoring for every c where its ratio only sets the budget)"
                        "; digit survival: per layer and KV head, the fraction of the key's "
                        "digit tokens (both copies, true positions) and of the needle's other tokens kept",
            **P.settings_record(plan.specs, plan.ratios[0])}


def execute(plan: Plan, *, model=None, tokenizer=None) -> dict:
    """Run a :func:`prepare`d needle job (``model``/``tokenizer``: use these, in this process, instead of
    loading ``plan.model_name``). Returns ``{"rows_written", "file"}``."""
    done = {row_key(r) for r in files.read_jsonl(plan.out)}
    keys = needle_keys(plan.depths, plan.trials, plan.seed)
    groups = needle_groups(plan.specs, plan.lengths, plan.ratios, keys, plan.record["name"], done, mode=plan.mode)
    plan.out.parent.mkdir(parents=True, exist_ok=True)
    files.append_run(plan.out, _run_config(plan, model))
    measure = row_measure(plan.record["name"])
    n = E.run_groups(groups, plan.out, measure=measure, model=model, tokenizer=tokenizer, model_name=plan.model_name,
                     workers=plan.workers, threads=plan.threads, seed=plan.seed, progress=plan.progress)
    return {"rows_written": n, "file": str(plan.out)}


def _needle_run(args):
    plan = J.prepared(prepare, args)
    res = execute(plan)
    where = f" --dir {args.dir}" if args.dir else " --quick" if args.quick else ""
    where += " --probe" if plan.probe else ""
    where += f" --choices {args.choices}" if args.choices else ""
    print(f"wrote {res['rows_written']} new rows to {res['file']}; summarize with `jacap evaluate needle-summary{where}`")
    return res


# --------------------------------------------------------------------------------------------- summary leaf
def _summary_add(parser):
    E.summary_options(parser, "folder of needle.jsonl, where needle_summary.json is written (default "
                              "data/results/eval; with --quick data/results/eval/quick)")
    parser.add_argument("--choices", type=Path, default=None,
                        help="the tune's choices.json (default data/results/eval/choices.json)")
    parser.add_argument("--probe", action="store_true",
                        help=f"summarize the digit-survival probe ({PROBE_FILE}, both modes) -> needle_probe_summary.json")


def _summary_inputs(out_dir: Path, choices_path: Path, name: str = "needle.jsonl",
                    mode: str | None = DEFAULT_MODE) -> tuple[list[dict], dict, dict]:
    """needle rows, choices and the latest run's configuration (of ``mode``; ``None``: of any mode, and every
    mode's latest run must hold the same prompts and settings); ``ValueError`` when a file is missing or the
    runs were made with other choices or another prompt set."""
    rows_path = out_dir / name
    if not rows_path.is_file() or not files.config_path(rows_path).is_file():
        hint = " --probe" if name == PROBE_FILE else ""
        raise ValueError(f"--dir: {rows_path} (or its .config.json) does not exist; run `jacap evaluate needle{hint}` first")
    choices = RS.read_choices_file(choices_path, flag="--choices", baselines=True)
    runs = files.read_runs(rows_path)
    if not runs:
        raise ValueError(f"--dir: {rows_path} holds no run; run `jacap evaluate needle` first")
    mine = [r for r in runs if mode is None or r.get("mode", DEFAULT_MODE) == mode]
    if not mine:
        raise ValueError(f"--dir: {rows_path} holds no run in mode {mode!r}")
    last = mine[-1]
    if mode is None:  # every mode's latest run: its own prompts, the same settings
        last = {r.get("mode", DEFAULT_MODE): r for r in mine}
        if len({json.dumps(list(r["settings"])) for r in last.values()}) > 1:
            raise ValueError(f"--dir: {rows_path}'s modes were run with other settings; summarize runs of one "
                             "configuration (a new --dir)")
    # the latest run names the settings read: it must have been made with these choices (the same fingerprint, or
    # the same choice for every method it ran: a tune that only added methods). Earlier runs' rows are
    # measurements of one setting each, read only where today's settings name them.
    bad = sorted({str(r.get("choices_fingerprint"))[:12] for r in (last.values() if mode is None else [last])
                  if r.get("choices_fingerprint") != choices["fingerprint"]
                  and not (isinstance(r.get("chosen"), dict) and r["chosen"]
                           and all(choices["chosen"].get(m) == s for m, s in r["chosen"].items()))})
    if bad:
        raise ValueError(f"--choices: the latest run of {rows_path.name} was made with other tune choices (fingerprint "
                         f"{', '.join(bad)}...) than {choices_path}; give that choices.json or rerun `jacap evaluate "
                         "needle` (it resumes, measuring only the settings not yet in the file)")
    return files.read_jsonl(rows_path), choices, last


def _summary_run(args):
    from jacap_lib.results.paths import data_path

    choices_path = Path(args.choices or data_path("results", "eval", "choices.json", must_exist=False))
    try:
        if args.quick and getattr(args, "probe", False):
            raise ValueError("--probe and --quick: give one")
        out_dir = E.eval_dir(args.dir, quick=args.quick)
        if getattr(args, "probe", False):
            return _probe_summary_run(args, out_dir, choices_path)
        rows, choices, run = _summary_inputs(out_dir, choices_path)
        prompts = [tuple(p) for p in run["keys"]]
        default = choices["chosen"]["jacap_prompt"]
        paper = None if P.same_setting(P.PAPER_PRESET, default) else P.PAPER_PRESET
        summary = RS.needle_summary(rows, choices, prompts=prompts, settings=list(run["settings"]), seed=args.seed,
                                    paper_preset=paper)
    except (ValueError, FileNotFoundError, KeyError, files.ResultsFileError) as e:
        raise J.BadArgument(str(e)) from None
    config = {"choices_fingerprint": choices["fingerprint"], "chosen": choices["chosen"],
              "inputs": ["needle.jsonl", choices_path.name], "needle_run": run.get("command"),
              "lengths": run["lengths"], "ratios": run["ratios"], "depths": run["depths"], "trials": run["trials"],
              "seed": run["seed"], "settings": list(run["settings"]), "command": getattr(args, "command", None),
              "statistics": _statistics_config(args.seed, "all (length, ratio) cells of Algorithm 1's tuned Jacap setting "
                                                          "against one reference")}
    path = out_dir / "needle_summary.json"
    files.write_json(path, {"config": config, **files.round_floats(summary)})
    print(f"wrote {path}")
    if summary["cells_missing"]:
        print(f"  judged {len(summary['cells_measured'])} complete cells; not yet complete (finish `jacap evaluate "
              f"needle`, it resumes): {', '.join(summary['cells_missing'])}")
    return path


def _statistics_config(seed, holm_family: str) -> dict:
    from jacap_lib.verdicts import intervals as V

    return {"confidence": V.CONFIDENCE, "n_resamples": V.N_RESAMPLES, "method": V.DIFFERENCE_METHOD,
            "seed": V.SEED if seed is None else seed, "alpha": 0.05, "accuracy_interval": "Wilson score",
            "primary": "accuracy difference (default Jacap - reference), percentage points, paired bootstrap over prompts",
            "test": "exact McNemar (two-sided binomial test on the discordant prompts)",
            "verdict": "from the Holm-adjusted exact McNemar p: better or worse (by the sign of wins - losses) where it "
                       "is at most alpha, else no detectable difference; the bootstrap interval of the difference is "
                       "descriptive",
            "holm_family": holm_family}


def _probe_summary_run(args, out_dir: Path, choices_path: Path):
    rows, choices, runs = _summary_inputs(out_dir, choices_path, PROBE_FILE, mode=None)
    prompts = {m: [tuple(p) for p in r["keys"]] for m, r in runs.items()}
    run = runs.get(DEFAULT_MODE) or next(iter(runs.values()))
    summary = RS.needle_probe_summary(rows, choices, prompts=prompts, settings=list(run["settings"]), seed=args.seed)
    modes = {m: {"command": r.get("command"), "lengths": r["lengths"], "ratios": r["ratios"], "depths": r["depths"],
                 "trials": r["trials"], "n_prompts": len(r["keys"])} for m, r in runs.items()}
    stats = _statistics_config(args.seed, "per mode: Algorithm 1's tuned Jacap setting against every other setting, over "
                                          "every (length, ratio) cell; mode effect: every setting x cell")
    config = {"choices_fingerprint": choices["fingerprint"], "chosen": choices["chosen"],
              "inputs": [PROBE_FILE, choices_path.name], "needle_runs": modes, "lengths": run["lengths"],
              "ratios": run["ratios"], "depths": run["depths"], "trials": run["trials"], "seed": run["seed"],
              "settings": list(run["settings"]), "command": getattr(args, "command", None),
              "survival": "key digit tokens: the tokens overlapping either copy of the key in the needle, at their "
                          "true positions; all_kept: every one of them kept in every layer and KV head",
              "statistics": stats}
    path = out_dir / "needle_probe_summary.json"
    files.write_json(path, {"config": config, **files.round_floats(summary)})
    print(f"wrote {path}")
    for mode, s in summary["modes"].items():
        if s["cells_missing"]:
            print(f"  {mode}: not yet complete: {', '.join(s['cells_missing'])}")
    return path


NEEDLE = J.Job("needle retrieval with each method's tuned setting and the paper preset at prompts 512/1024/2048, "
               "c 0.5/0.75/0.9, 5 depths x 4 keys, plus the uncompressed answer -> data/results/eval/needle.jsonl "
               "(needs the tune's choices.json)", add_arguments, _needle_run)
NEEDLE_SUMMARY = J.Job("per cell, each setting's needle accuracy (and the uncompressed ceiling) and Algorithm 1 "
                       "tuned against the best baseline by KL on tune and the paper preset, paired per prompt: "
                       "accuracy difference intervals, McNemar and Holm p, verdicts -> data/results/eval/needle_summary.json",
                       _summary_add, _summary_run)
