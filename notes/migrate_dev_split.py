"""One-time migration: the evaluation's 48 "test" documents become "dev" documents (the split, the files, the
protocol's document list), recorded in data/results/eval/split_migration.json.

Why: the 48 documents were measured in four rounds, and the library's default was chosen after seeing them;
they no longer test anything (a fresh confirmatory set, data/texts/confirm, split "confirm", does). One name per
thing: they are "dev" documents everywhere.

What it does, once, in a results folder (default data/results/eval) and the corpus manifest:

* ``test.jsonl`` -> ``dev.jsonl`` and ``test.config.json`` -> ``dev.config.json`` (``git mv`` when tracked); each
  row's ``"split": "test"`` -> ``"dev"`` (nothing else in a row changes);
* every recorded protocol configuration (the run configs of tune and dev, ``choices.json``, ``summary.json``):
  the key ``test_docs`` -> ``dev_docs`` (same documents, same order) and each recorded document's split; the
  fingerprint recomputed from the renamed configuration (``protocol.fingerprint``) and every file that records
  one (needle and needle-probe runs' ``choices_fingerprint``, the needle summaries, power.json, anatomy.json)
  mapped old -> new;
* ``summary.json``: the baseline line ``picked_on`` "test" -> "dev" (its label too), ``test_runs`` -> ``dev_runs``,
  ``inputs``; the ablation runs' and anatomy's recorded documents' split;
* the dev runs: each historic run gets ``round`` (1-4) and, where git shows it, ``rows_before`` (the rows the file
  held when it began), from the git history of the rows file (``derive_rounds``: a round begins with a commit of
  rows that measures a setting not measured before; a commit that only completes settings already measured
  belongs to the round it continues);
* the corpus manifest: split values, the split rule's text, the counts, and a note on the dev split.

    PYTHONPATH=$PWD python notes/migrate_dev_split.py            # data/results/eval and data/texts/corpus
    PYTHONPATH=$PWD python notes/migrate_dev_split.py --dir data/results/eval/peers --no-manifest   # tune only
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments.protocol import rules as P

ROOT = Path(__file__).resolve().parents[1]
WHEN = "2026-12-03"
REASON = ("the 48 documents of split 'test' were measured in four rounds and the library's default was chosen "
          "after seeing them, so they no longer test anything; a fresh confirmatory set (data/texts/confirm, split "
          "'confirm', 96 documents) will be run once after a committed plan. One name per thing: they are 'dev' "
          "documents (exploratory) everywhere")
DEV_NOTE = ("the 48 'dev' documents (called 'test' until 2026-12-03) were measured in four rounds of the evaluation "
            "(2026-12-01 to 2026-12-02; data/results/eval/dev_record.json lists every setting run on them, with its "
            "round), and the library's default (JacapPromptPress's observed centre with a 16-token window) was chosen "
            "after seeing them: they are exploratory, not a test; the confirmatory documents are data/texts/confirm")

J1 = "backend=auto,beta=0.9,centre=tempered,eps=1e-06,gqa=pool,n_future_positions=512,n_queries=none,n_sink=4,noise=1"
# What a dev setting led to, where a commit message of the history says it (the commit named); the record job
# (jacap evaluate record) reads these and derives "superseded by ..." for the rest.
LED_TO = {
    f"jacap[{J1},tau=3,use_out_proj=false,window=32]":
        {"text": "window widened to 128 on tune", "commit": "4cc4333"},
    f"jacap_adakv[alpha_safeguard=0.2,{J1},tau=3,use_out_proj=false,window=32]":
        {"text": "window widened to 128 on tune", "commit": "4cc4333"},
    "capkv[tau=50]": {"text": "sinks removed (n_sink 0) on tune", "commit": "4cc4333"},
    "streaming_llm[n_sink=2]": {"text": "1 sink chosen again on 18 tune documents", "commit": "c29fcf7"},
    "expected_attention[n_future_positions=32]": {"text": "the best baseline of every cell", "commit": "c29fcf7"},
    "jacap_obs[backend=auto,beta=0.9,centre=observed,eps=1e-06,gqa=pool,n_future_positions=512,n_queries=none,"
    "n_sink=4,noise=1,use_out_proj=false,window=16]":
        {"text": "chosen as the library default", "commit": "f6058c1"},
    f"jacap[{J1},tau=3,use_out_proj=false,window=128]":
        {"text": "τ 1 and 10 tried again at window 128; τ = 3 kept", "commit": "12f7307"},
}


def renamed_protocol(cfg: dict) -> dict:
    """A protocol configuration with ``test_docs`` renamed ``dev_docs`` (same place in the key order)."""
    return {("dev_docs" if k == "test_docs" else k): v for k, v in cfg.items()}


def renamed_documents(docs: list[dict]) -> list[dict]:
    return [{**d, "split": "dev"} if d.get("split") == "test" else d for d in docs]


def git(*args) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def derive_rounds(rel_rows="data/results/eval/test.jsonl", rel_cfg="data/results/eval/test.config.json"):
    """The rounds of the rows file and where each run began, from the git history of the rows file and its runs.

    Walks every commit that changed either file, oldest first. A commit whose new rows measure a setting not in
    the earlier rows starts a round; one whose new rows only complete settings already measured continues the
    round. Returns ``(rounds, runs)``: ``rounds`` ``[{"round", "commits": [{"commit", "committed", "rows":
    [first, end), "runs", "subject"}]}]``; ``runs`` ``{run time: {"round", "rows_before"}}`` for every run: the
    round of the commit that first recorded it (``None`` when that commit added no rows: the run found its rows
    measured), and ``rows_before`` where git shows it (the only new run of its commit, or the first of several;
    ``None`` otherwise)."""
    log = git("log", "--format=%H %cI", "--reverse", "--", rel_rows, rel_cfg).split("\n")
    seen, n_before, rounds, known, runs = set(), 0, [], set(), {}
    for line in filter(None, log):
        sha, when = line.split(" ", 1)
        rows = [json.loads(x) for x in git("show", f"{sha}:{rel_rows}").splitlines() if x.strip()]
        times = [r["time"] for r in json.loads(git("show", f"{sha}:{rel_cfg}"))["runs"]]
        fresh = [t for t in times if t not in known]
        known |= set(times)
        rnd = None
        if len(rows) > n_before:
            new = {r["method"] for r in rows[n_before:]}
            part = {"commit": sha[:7], "committed": when, "rows": [n_before, len(rows)], "runs": fresh,
                    "subject": git("log", "-1", "--format=%s", sha).strip()[:240]}
            if new - seen or not rounds:
                rounds.append({"round": len(rounds) + 1, "commits": [part]})
            else:
                rounds[-1]["commits"].append(part)
            rnd = rounds[-1]["round"]
            seen |= new
        for i, t in enumerate(fresh):
            runs[t] = {"round": rnd, "rows_before": n_before if (i == 0 or rnd is None) else None}
        n_before = len(rows)
    return rounds, runs


def _mapped(x, mapping: dict):
    """``x`` with every string equal to an old fingerprint of ``mapping`` replaced by its new one."""
    if isinstance(x, dict):
        return {k: _mapped(v, mapping) for k, v in x.items()}
    if isinstance(x, list):
        return [_mapped(v, mapping) for v in x]
    return mapping.get(x, x) if isinstance(x, str) else x


def migrate_config(path: Path, mapping: dict, *, rounds=None) -> None:
    data = files.read_json(path)
    out = []
    for run in data["runs"]:
        run = dict(run)
        if "protocol" in run:
            old = run["fingerprint"]
            if old != P.fingerprint(run["protocol"]):
                raise SystemExit(f"{path}: a run's fingerprint is not its protocol's; not migrating")
            run["protocol"] = renamed_protocol(run["protocol"])
            run["fingerprint"] = mapping.setdefault(old, P.fingerprint(run["protocol"]))
        if "choices_fingerprint" in run:
            run["choices_fingerprint"] = mapping.get(run["choices_fingerprint"], run["choices_fingerprint"])
        if "documents" in run:
            run["documents"] = renamed_documents(run["documents"])
        if rounds is not None:
            where = rounds[run["time"]]
            run["round"] = where["round"]
            if where["rows_before"] is not None:
                run["rows_before"] = where["rows_before"]
        out.append(run)
    files.write_json(path, {**data, "runs": out})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=str(ROOT / "data/results/eval"))
    ap.add_argument("--no-manifest", action="store_true", help="leave data/texts/corpus/manifest.json alone")
    ap.add_argument("--no-rounds", action="store_true", help="no rounds from git (a folder without that history)")
    args = ap.parse_args(argv)
    d = Path(args.dir)
    if (d / "split_migration.json").exists():
        raise SystemExit(f"{d}/split_migration.json exists: this folder is migrated")
    has_rows = (d / "test.jsonl").exists()  # a tune-only folder (the peers') has none
    rounds, run_rounds = (None, None) if args.no_rounds or not has_rows else derive_rounds()
    rel = lambda p: str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p)  # noqa: E731
    tracked = has_rows and bool(git("ls-files", rel(d / "test.jsonl")).strip())
    for a, b in (("test.jsonl", "dev.jsonl"), ("test.config.json", "dev.config.json")) if has_rows else ():
        if tracked:
            git("mv", rel(d / a), rel(d / b))
        else:
            (d / a).rename(d / b)
    if has_rows:  # the rows: only the split field (one per line, written by files.append_jsonl)
        lines = (d / "dev.jsonl").read_text().splitlines()
        new = [x.replace('"split": "test"', '"split": "dev"', 1) for x in lines]
        assert all(json.loads(x)["split"] == "dev" for x in new) and len(new) == len(lines)
        (d / "dev.jsonl").write_text("\n".join(new) + "\n")

    mapping: dict = {}
    migrate_config(d / "tune.config.json", mapping)
    if has_rows:
        migrate_config(d / "dev.config.json", mapping, rounds=run_rounds)
    if (d / "choices.json").exists():
        choices = files.read_json(d / "choices.json")
        old = choices["fingerprint"]
        assert old == P.fingerprint(choices["config"])
        choices["config"] = renamed_protocol(choices["config"])
        choices["fingerprint"] = mapping.setdefault(old, P.fingerprint(choices["config"]))
        assert choices["fingerprint"] == P.fingerprint(choices["config"])
        files.write_json(d / "choices.json", choices)

    for name in ("needle.config.json", "needle_probe.config.json", "ablation.config.json",
                 "ablation-c0.75/ablation.config.json", "ablation-c0.9/ablation.config.json"):
        if (d / name).exists():
            migrate_config(d / name, mapping)
    if (d / "summary.json").exists():
        s = files.read_json(d / "summary.json")
        cfg = dict(s["config"])
        cfg["protocol"] = renamed_protocol(cfg["protocol"])
        cfg["fingerprint"] = mapping[cfg["fingerprint"]]
        assert cfg["fingerprint"] == P.fingerprint(cfg["protocol"])
        cfg["inputs"] = ["dev.jsonl" if x == "test.jsonl" else x for x in cfg.get("inputs", [])]
        cfg = {("dev_runs" if k == "test_runs" else k): v for k, v in cfg.items()}
        fams = [{**f, "picked_on": "dev", "label": f["label"].replace("picked on test", "picked on dev")}
                if f.get("picked_on") == "test" else f for f in s["families"]]
        files.write_json(d / "summary.json", {**s, "config": cfg, "families": fams})
    for name in ("needle_summary.json", "needle_probe_summary.json", "power.json"):
        if (d / name).exists():
            s = files.read_json(d / name)
            fp = s["config"].get("choices_fingerprint")
            s["config"]["choices_fingerprint"] = mapping.get(fp, fp)
            if name == "power.json":
                s["config"]["rows"] = s["config"]["rows"].replace("test.jsonl", "dev.jsonl").replace(
                    " (split 'test' in the file; used in four", " (used in four")
            files.write_json(d / name, s)
    if (d / "candidates.json").exists():  # the frozen candidates name each space's choices by fingerprint
        s = files.read_json(d / "candidates.json")
        for v in s["spaces"].values():
            v["fingerprint"] = mapping.get(v["fingerprint"], v["fingerprint"])
        files.write_json(d / "candidates.json", s)
    if (d / "confirm" / "plan.json").exists():  # the plan names the candidates' fingerprints: renamed, not re-planned
        files.write_json(d / "confirm" / "plan.json", _mapped(files.read_json(d / "confirm" / "plan.json"), mapping))
    if (d / "anatomy.json").exists():
        s = files.read_json(d / "anatomy.json")
        cfg = s["config"]
        cfg["fingerprint"] = mapping.get(cfg["fingerprint"], cfg["fingerprint"])
        cfg["documents"] = renamed_documents(cfg.get("documents", []))
        cfg["rows_from"] = ["dev.jsonl" if x == "test.jsonl" else x for x in cfg.get("rows_from", [])]
        files.write_json(d / "anatomy.json", s)

    if not args.no_manifest:
        mp = ROOT / "data/texts/corpus/manifest.json"
        m = files.read_json(mp)
        m["split_rule"] = m["split_rule"].replace("is 'test'", "is 'dev'")
        m["counts"] = {k: {("dev" if s == "test" else s): n for s, n in v.items()} for k, v in m["counts"].items()}
        m["documents"] = renamed_documents(m["documents"])
        m["dev_note"] = DEV_NOTE
        files.write_json(mp, m)

    record = {"description": "The one-time migration of the evaluation's split 'test' to 'dev' "
                             "(notes/migrate_dev_split.py)",
              "when": WHEN, "reason": REASON,
              "renamed": {"files": {"test.jsonl": "dev.jsonl", "test.config.json": "dev.config.json"},
                          "split value": {"test": "dev"},
                          "protocol key": {"test_docs": "dev_docs"},
                          "summary": {"test_runs": "dev_runs", "picked_on test": "picked_on dev",
                                      "picked on test (stricter)": "picked on dev (stricter)"},
                          "job": {"jacap evaluate test": "jacap evaluate dev"}},
              "fingerprints": mapping,
              "rounds": rounds,
              "led_to": LED_TO,
              "rounds_rule": ("a round begins with a commit of the rows file whose new rows measure a setting not "
                              "measured before; a commit that only completes settings already measured (a resumed "
                              "run) belongs to the round it continues; each dev run records the round of the commit "
                              "that first recorded it, and rows_before where git shows it")}
    files.write_json(d / "split_migration.json", record)
    print(f"migrated {d}: {len(mapping)} fingerprints, {len(rounds or [])} rounds; "
          f"{dt.datetime.now(dt.timezone.utc):%H:%M} UTC")


if __name__ == "__main__":
    main()
