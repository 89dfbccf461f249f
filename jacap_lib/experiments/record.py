"""The dev record: every setting ever run on the dev documents, with its round and what it led to.

The 48 dev documents were measured in rounds: after each round the tune choices (and the library's default)
changed, and the new choices were run on the same documents. This job reads the committed rows file
(``dev.jsonl``), its runs (``dev.config.json``), the tune choices (``choices.json``) and the split migration's
record (``split_migration.json``: the rounds from git history and the facts each round led to) and writes
``dev_record.json``: per setting, its short label (:func:`~jacap_lib.experiments.names.short_spec`), the round and
the run that first measured it (time, git commit, command), its number of dev rows, whether it is a current
tune choice, the paper preset or superseded, and what it led to.

Which run wrote which row: a run records ``rows_before``, the rows its file held when it began
(:func:`~jacap_lib.experiments.protocol.execute`; the migration set it for the historic runs where git shows it);
a row belongs to the last run that began at or before it. A run's round is the ``round`` it records, else the
next round when its rows measure a setting no earlier row measured, else the round it continues (a resumed run).
A setting's first run is the earliest run of its round whose recorded settings hold it (else the run that wrote
its first row).

The other search spaces (kvpress's newer presses in ``peers/``, the context press in ``context/``) measure their
tune choices on the same dev documents from their own folders; :func:`merge_spaces` adds their settings to the
record, each round numbered on after the first space's four in the order it began, every setting with its space.

``jacap evaluate record`` -> ``data/results/eval/dev_record.json`` (reads committed files only; seconds).
"""
from __future__ import annotations

from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments import job as J

__all__ = ["row_runs", "run_rounds", "dev_record", "merge_spaces", "record_table", "RECORD", "ablation_counts",
           "ablation_copies"]

FILE = "dev_record.json"


def row_runs(n_rows: int, runs: list[dict]) -> list[int | None]:
    """Per row index, the index of the run that wrote it: the last run whose ``rows_before`` is at most the
    index (runs without ``rows_before`` own no rows; ``None`` before the first such run)."""
    starts = [(r["rows_before"], i) for i, r in enumerate(runs) if r.get("rows_before") is not None]
    for (a, i), (b, j) in zip(starts, starts[1:]):
        if b < a:
            raise ValueError(f"runs: run {j} begins at row {b}, before run {i} (row {a}); runs are listed in order")
    if starts and starts[-1][0] > n_rows:
        raise ValueError(f"runs: the last run begins at row {starts[-1][0]}, past the file's {n_rows} rows")
    out, k = [], -1
    for idx in range(n_rows):
        while k + 1 < len(starts) and starts[k + 1][0] <= idx:
            k += 1
        out.append(starts[k][1] if k >= 0 else None)
    return out


def run_rounds(rows: list[dict], runs: list[dict], owner: list[int | None]) -> list[int | None]:
    """Each run's round: the ``round`` it records (``None`` allowed: a run with no rows), else counted: a run
    whose rows measure a setting no earlier row measured starts the next round, one that only adds rows of
    measured settings continues the round; a run that wrote no rows and records none has ``None``."""
    new: dict[int, bool] = {}
    seen: set = set()
    for r, i in zip(rows, owner):
        if i is not None:
            new[i] = new.get(i, False) or r["method"] not in seen
        seen.add(r["method"])
    out, current = [], 0
    for i, run in enumerate(runs):
        if "round" in run:
            out.append(run["round"])
            current = max(current, run["round"] or 0)
        elif i in new:
            current = current + 1 if new[i] or current == 0 else current
            out.append(current)
        else:
            out.append(None)
    return out


def dev_record(rows: list[dict], runs: list[dict], choices: dict, led_to: dict | None = None) -> dict:
    """The record of ``rows`` (the rows of ``dev.jsonl``, in file order) and ``runs`` (their file's runs, in order):
    ``{"settings": [...], "rounds": [...]}``. ``choices``: ``choices.json``'s content (which settings are
    current); ``led_to``: ``{spec: {"text", "commit"}}``, facts from the history (else derived: a superseded
    setting is "superseded by" its method's current choice)."""
    from jacap_lib.experiments import names as N
    from jacap_lib.experiments.protocol import rules as P
    from jacap_lib.experiments.protocol import dev_specs

    if not rows:
        raise ValueError("rows: no dev rows; run `jacap evaluate dev`")
    other = sorted({str(r.get("split")) for r in rows} - {"dev"})
    if other:
        raise ValueError(f"rows: the dev file holds rows of split {other}; pass the rows of dev.jsonl")
    owner = row_runs(len(rows), runs)
    rounds = run_rounds(rows, runs, owner)
    current = dev_specs(choices["chosen"])
    first: dict = {}
    counts: dict = {}
    for idx, r in enumerate(rows):
        first.setdefault(r["method"], idx)
        counts[r["method"]] = counts.get(r["method"], 0) + 1
    led_to = led_to or {}
    out = []
    for spec, idx in sorted(first.items(), key=lambda kv: kv[1]):
        i = owner[idx]
        rnd = rounds[i] if i is not None else None
        same = [j for j, run in enumerate(runs) if rounds[j] == rnd and rnd is not None
                and spec in (run.get("settings") or {})]
        j = same[0] if same else i
        run = runs[j] if j is not None else {}
        method = P.method_of(spec)
        if spec in choices["chosen"].values():
            status = "current choice"
        elif P.same_setting(spec, P.PAPER_PRESET):
            status = "paper preset"
        else:
            status = "superseded"
        fact = led_to.get(spec) or {}
        text = fact.get("text", "")
        if not text and status == "superseded" and method in choices["chosen"]:
            text = f"superseded by {N.short_spec(choices['chosen'][method])}"
        out.append({"spec": spec, "label": N.short_spec(spec), "method": method, "round": rnd,
                    "first_run": {"time": run.get("time"), "git": run.get("git"), "command": run.get("command")},
                    "first_row": idx, "n_rows": counts[spec], "status": status, "current": spec in current,
                    "led_to": text, "led_to_commit": fact.get("commit")})
    by_round: dict = {}
    for s in out:
        b = by_round.setdefault(s["round"], {"round": s["round"], "settings": 0, "rows": 0})
        b["settings"] += 1
    for r, i in zip(rows, owner):
        rnd = rounds[i] if i is not None else None
        by_round.setdefault(rnd, {"round": rnd, "settings": 0, "rows": 0})["rows"] += 1
    for b in by_round.values():
        times = [run["time"] for run, rr in zip(runs, rounds) if rr == b["round"] and run.get("time")]
        b["first_run"], b["last_run"] = (min(times), max(times)) if times else (None, None)
    return {"settings": out, "rounds": sorted(by_round.values(), key=lambda b: (b["round"] is None, b["round"] or 0))}


def merge_spaces(first: dict, others: dict[str, dict]) -> dict:
    """One record of every search space's dev rows. ``first``: :func:`dev_record` of the first space (its rounds keep
    their numbers); ``others``: ``{space: dev_record(...) of that space's folder}``. Each other space's rounds are
    numbered on after the first space's last round, all of them in the order of their first run (a look at the dev
    documents is a round whichever folder it writes to); every setting and round says its ``space``."""
    last = max((b["round"] for b in first["rounds"] if b["round"] is not None), default=0)
    blocks = sorted(((space, b) for space, rec in others.items() for b in rec["rounds"] if b["round"] is not None),
                    key=lambda sb: (sb[1]["first_run"] or "", sb[0], sb[1]["round"]))
    number = {(space, b["round"]): last + k for k, (space, b) in enumerate(blocks, start=1)}
    settings = [{**s, "space": "first"} for s in first["settings"]]
    rounds = [{**b, "space": "first"} for b in first["rounds"]]
    for space, rec in others.items():
        settings += [{**s, "space": space, "round": number.get((space, s["round"]))} for s in rec["settings"]]
        rounds += [{**b, "space": space, "round": number.get((space, b["round"]))} for b in rec["rounds"]]
    key = lambda x: (x["round"] is None, x["round"] or 0)  # noqa: E731
    return {"settings": sorted(settings, key=key), "rounds": sorted(rounds, key=key)}


def record_table(record: dict) -> list[dict]:
    """The book's table: one row per setting, few short columns."""
    return [{"round": s["round"], "setting": s["label"], "dev rows": s["n_rows"],
             "first run": (s["first_run"]["time"] or "")[5:16].replace("T", " "),
             "status": s["status"], "led to": s["led_to"]} for s in record["settings"]]


def _add(parser):
    parser.add_argument("--dir", default=None, help="folder of dev.jsonl, choices.json and split_migration.json, "
                                                    "where dev_record.json is written (default data/results/eval)")


def _inputs(args):
    from jacap_lib.results.paths import data_path

    d = Path(args.dir) if args.dir else data_path("results", "eval", must_exist=False)
    for name, job in (("dev.jsonl", "dev"), ("choices.json", "tune")):
        if not (d / name).is_file():
            raise ValueError(f"--dir: {d / name} does not exist; run `jacap evaluate {job}` first")
    if not files.config_path(d / "dev.jsonl").is_file():
        raise ValueError(f"--dir: {files.config_path(d / 'dev.jsonl')} does not exist; rerun `jacap evaluate dev`")
    migration = files.read_json(d / "split_migration.json") if (d / "split_migration.json").is_file() else {}
    return d, files.read_jsonl(d / "dev.jsonl"), files.read_runs(d / "dev.jsonl"), \
        files.read_json(d / "choices.json"), migration


def _other_spaces(d: Path) -> dict:
    """``{space: (rows, runs, choices)}`` of every other search space's folder under ``d`` that has dev rows."""
    from jacap_lib.experiments.protocol.rules import SPACES

    out = {}
    for space in SPACES:
        f = d / space
        if space != "first" and (f / "dev.jsonl").is_file() and files.config_path(f / "dev.jsonl").is_file() \
                and (f / "choices.json").is_file():
            out[space] = (files.read_jsonl(f / "dev.jsonl"), files.read_runs(f / "dev.jsonl"),
                          files.read_json(f / "choices.json"))
    return out


def _run(args):
    from jacap_lib.results.provenance import provenance

    d, rows, runs, choices, migration = J.prepared(_inputs, args)
    others = _other_spaces(d)
    rec = merge_spaces(dev_record(rows, runs, choices, migration.get("led_to")),
                       {space: dev_record(*inputs) for space, inputs in others.items()})
    config = {**provenance(command=getattr(args, "command", None)), "inputs": ["dev.jsonl", "dev.config.json",
              "choices.json"] + (["split_migration.json"] if migration else [])
              + [f"{space}/{name}" for space in others for name in ("dev.jsonl", "dev.config.json", "choices.json")],
              "fingerprint": choices.get("fingerprint"),
              "rule": ("a row belongs to the last run that began at or before it (rows_before); a run's round is "
                       "the round it records, else the next when its rows measure a new setting, else the round it "
                       "continues; a setting's first run is the earliest run of its round whose settings hold it; "
                       "status: current choice (choices.json), paper preset, or superseded; led to: a fact of the "
                       "history (split_migration.json led_to, with its commit), else the method's current choice")}
    path = files.write_json(d / FILE, {"config": config, **rec})
    print(f"wrote {path}: {len(rec['settings'])} settings in "
          f"{sum(b['round'] is not None for b in rec['rounds'])} rounds, {sum(b['rows'] for b in rec['rounds'])} rows")
    return path


RECORD = J.Job("every setting ever run on the dev documents, with its round, first run, rows and what it led to "
               "-> data/results/eval/dev_record.json (reads the committed dev rows and runs)", _add, _run)


# --------------------------------------------------------------------------------------------- the ablations (tune)
def ablation_copies(summaries: list[dict]) -> dict[str, str]:
    """``{label: label it copies}``: the ablations of the tune summaries (``ablation_summary.json`` and its per-ratio
    siblings, :func:`jacap_lib.results.loaders.load_ablation_summaries`) whose every row (cell, ratio and interval)
    equals a row of another ablation measured in more cells (an earlier name of the same setting)."""
    rows: dict[str, dict] = {}
    for s in summaries:
        for a in s["ablations"]:
            for r in a["rows"]:
                rows.setdefault(a["label"], {})[(r["length"], r["ratio"])] = (r["gm_ratio"], r["gm_low"], r["gm_high"])
    out = {}
    for a, ra in rows.items():
        for b, rb in rows.items():
            if a != b and len(rb) > len(ra) and ra.items() <= rb.items():
                out[a] = b
                break
    return out


def ablation_counts(summaries: list[dict]) -> dict[str, dict[str, int]]:
    """Per ablation label of the tune summaries (in their order; copies, :func:`ablation_copies`, left out), how
    many cells each verdict kind (:data:`jacap_lib.verdicts.words.WORDS`) holds: ``{label: {word: cells}}``, the
    verdicts those of the intervals adjusted for each summary's comparisons."""
    from jacap_lib.verdicts.words import WORDS, verdict_word

    copies = ablation_copies(summaries)
    out: dict[str, dict[str, int]] = {}
    for s in summaries:
        for a in s["ablations"]:
            if a["label"] in copies:
                continue
            counts = out.setdefault(a["label"], dict.fromkeys(WORDS, 0))
            for r in a["rows"]:
                counts[verdict_word(r["verdict"])] += 1
    return out
