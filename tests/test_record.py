"""The dev record (``jacap evaluate record`` -> ``dev_record.json``): rows assigned to the runs that wrote them,
rounds counted from new settings, and the committed record against the committed rows; the split migration's
fingerprints."""
from __future__ import annotations

import collections

import pytest

from jacap_lib import cli
from jacap_lib.results import files as io
from jacap_lib.results import loaders
from jacap_lib.experiments.protocol import rules as P
from jacap_lib.experiments import record as REC
from jacap_lib.results.paths import data_path


def _rows(spec: str, docs, lengths=(512,), ratios=(0.5, 0.9)) -> list[dict]:
    return [{"doc": d, "split": "dev", "length": L, "ratio": c, "method": spec, "kl": 0.1}
            for L in lengths for d in docs for c in ratios]


def _run(time: str, git: str, settings, rows_before=None, **extra) -> dict:
    run = {"time": time, "git": git, "command": f"jacap evaluate dev  # {time}", "settings": dict.fromkeys(settings, {})}
    if rows_before is not None:
        run["rows_before"] = rows_before
    return {**run, **extra}


def _folder(tmp_path, rows, runs, chosen):
    out = tmp_path / "eval"
    out.mkdir()
    for r in rows:
        io.append_jsonl(out / "dev.jsonl", r)
    for run in runs:
        io.append_run(out / "dev.jsonl", run)
    io.write_json(out / "choices.json", {"chosen": chosen, "fingerprint": "f"})
    return out


def test_two_runs_make_two_rounds(tmp_path):
    """Run 1 measures knorm and snapkv; run 2 adds tova (a new setting: round 2) and finishes snapkv at 1024;
    run 3 only adds more tova rows (a resumed run: still round 2)."""
    r1 = _rows("knorm", "ab") + _rows("snapkv", "ab")
    r2 = _rows("tova", "ab") + _rows("snapkv", "ab", lengths=(1024,))
    r3 = _rows("tova", "ab", lengths=(1024,))
    runs = [_run("2026-01-01T10:00:00+00:00", "aaa", ["knorm", "snapkv"], 0),
            _run("2026-01-02T10:00:00+00:00", "bbb", ["knorm", "snapkv", "tova"], len(r1)),
            _run("2026-01-02T12:00:00+00:00", "ccc", ["knorm", "snapkv", "tova"], len(r1) + len(r2))]
    out = _folder(tmp_path, r1 + r2 + r3, runs, {"snapkv": "snapkv", "knorm": "knorm"})
    assert cli.main(["evaluate", "record", "--dir", str(out)]) == 0
    rec = io.read_json(out / "dev_record.json")
    by = {s["spec"]: s for s in rec["settings"]}
    assert [s["spec"] for s in rec["settings"]] == ["knorm", "snapkv", "tova"]  # order of first row
    assert {k: v["round"] for k, v in by.items()} == {"knorm": 1, "snapkv": 1, "tova": 2}
    assert {k: v["n_rows"] for k, v in by.items()} == {"knorm": 4, "snapkv": 8, "tova": 8}
    assert by["tova"]["first_run"] == {"time": runs[1]["time"], "git": "bbb", "command": runs[1]["command"]}
    assert by["snapkv"]["first_run"]["git"] == "aaa" and by["tova"]["first_row"] == len(r1)
    # status: chosen, or superseded by nothing (tova is no method of the choices: nothing derived)
    assert by["snapkv"]["status"] == "current choice" and by["tova"]["status"] == "superseded"
    assert by["tova"]["led_to"] == ""
    assert [(b["round"], b["settings"], b["rows"]) for b in rec["rounds"]] == [(1, 2, 8), (2, 1, 12)]
    assert rec["rounds"][1]["first_run"] == runs[1]["time"] and rec["rounds"][1]["last_run"] == runs[2]["time"]


def test_recorded_rounds_and_runs_without_a_start():
    """A run's recorded round wins; a run without rows_before owns no rows (its round's rows belong to the run
    before it); a setting's first run is the earliest run of its round that lists it."""
    rows = _rows("knorm", "ab") + _rows("tova", "ab") + _rows("keydiff", "ab")
    runs = [_run("t1", "a", ["knorm"], 0, round=1),
            _run("t2", "b", ["knorm"], 4, round=2),           # round 2 begins with a run that lists no new setting
            _run("t3", "c", ["knorm", "tova", "keydiff"], None, round=2)]
    rec = REC.dev_record(rows, runs, {"chosen": {"knorm": "knorm", "keydiff": "keydiff"}},
                         led_to={"tova": {"text": "dropped", "commit": "abc"}})
    by = {s["spec"]: s for s in rec["settings"]}
    assert REC.row_runs(len(rows), runs) == [0] * 4 + [1] * 8
    assert {k: v["round"] for k, v in by.items()} == {"knorm": 1, "tova": 2, "keydiff": 2}
    assert by["tova"]["first_run"]["git"] == "c"  # t2 (the run that owns the rows) does not list tova
    assert by["tova"]["led_to"] == "dropped" and by["tova"]["led_to_commit"] == "abc"
    # superseded, derived: the method's current choice
    rec = REC.dev_record(_rows("snapkv", "a") + _rows("snapkv[window_size=16]", "a"), [_run("t", "a", [], 0)],
                         {"chosen": {"snapkv": "snapkv[window_size=16]"}})
    assert rec["settings"][0]["status"] == "superseded"
    assert rec["settings"][0]["led_to"] == "superseded by snapkv[window_size=16]"
    assert rec["settings"][1]["status"] == "current choice" and rec["settings"][0]["round"] == 1


def test_runs_out_of_order_are_refused():
    with pytest.raises(ValueError, match="before run 0"):
        REC.row_runs(8, [_run("t1", "a", [], 4), _run("t2", "b", [], 2)])
    with pytest.raises(ValueError, match="past the file"):
        REC.row_runs(3, [_run("t1", "a", [], 4)])
    with pytest.raises(ValueError, match="no dev rows"):
        REC.dev_record([], [], {"chosen": {}})
    with pytest.raises(ValueError, match=r"split \['tune'\]"):
        REC.dev_record([dict(_rows("knorm", "a")[0], split="tune")], [], {"chosen": {}})


def test_the_committed_record_agrees_with_the_rows():
    """Every setting of dev_record.json has exactly its number of dev rows in dev.jsonl, every dev setting is
    listed once, the rounds are 1-4, and the job recomputes the same record from the committed files."""
    rec = loaders.load_dev_record()
    rows = loaders.load_eval_rows("dev")
    counts = collections.Counter(r["method"] for r in rows if r["split"] == "dev")
    first = {"settings": [s for s in rec["settings"] if s["space"] == "first"],
             "rounds": [b for b in rec["rounds"] if b["space"] == "first"]}
    assert {s["spec"]: s["n_rows"] for s in first["settings"]} == dict(counts)
    assert sum(b["rows"] for b in first["rounds"]) == len(rows)
    assert sorted({s["round"] for s in first["settings"]}) == [1, 2, 3, 4]
    runs = loaders.load_eval_runs("dev")
    migration = io.read_json(data_path("results", "eval", "split_migration.json"))
    again = REC.dev_record(rows, runs, loaders.load_eval_choices(), migration["led_to"])
    strip = lambda xs: [{k: v for k, v in x.items() if k != "space"} for x in xs]  # noqa: E731
    assert again["settings"] == strip(first["settings"]) and again["rounds"] == strip(first["rounds"])
    assert all(s["current"] == (s["status"] != "superseded") for s in rec["settings"])
    # the other spaces: every dev row of their folders is counted once, in rounds after the first space's
    for space in ("peers", "context"):
        theirs = collections.Counter(r["method"] for r in loaders.load_eval_rows("dev", space=space))
        assert {s["spec"]: s["n_rows"] for s in rec["settings"] if s["space"] == space} == dict(theirs)
        assert all(s["round"] > 4 for s in rec["settings"] if s["space"] == space)


def test_other_spaces_rounds_follow_the_first_spaces_in_time_order():
    first = REC.dev_record(_rows("knorm", "ab"), [_run("2026-01-01T10:00:00+00:00", "a", [], 0)],
                           {"chosen": {"knorm": "knorm"}})
    late = REC.dev_record(_rows("kvzip", "ab"), [_run("2026-01-03T10:00:00+00:00", "a", [], 0)],
                          {"chosen": {"kvzip": "kvzip"}})
    early = REC.dev_record(_rows("cur", "ab"), [_run("2026-01-02T10:00:00+00:00", "a", [], 0)],
                           {"chosen": {"cur": "cur"}})
    rec = REC.merge_spaces(first, {"peers": late, "context": early})
    assert [(s["space"], s["round"], s["spec"]) for s in rec["settings"]] == [
        ("first", 1, "knorm"), ("context", 2, "cur"), ("peers", 3, "kvzip")]
    assert [(b["space"], b["round"], b["rows"]) for b in rec["rounds"]] == [("first", 1, 4), ("context", 2, 4),
                                                                           ("peers", 3, 4)]


def test_the_split_migration_left_consistent_fingerprints():
    """After the one-time rename (split_migration.json): no "test" split or test_docs anywhere in the eval
    folder's protocol records, every recorded fingerprint is its configuration's, and the files that point at
    a tune choice point at a migrated fingerprint."""
    mig = io.read_json(data_path("results", "eval", "split_migration.json"))
    new = set(mig["fingerprints"].values())
    assert len(new) == len(mig["fingerprints"]) and not new & set(mig["fingerprints"])
    choices = loaders.load_eval_choices()
    assert choices["fingerprint"] == P.fingerprint(choices["config"]) and "dev_docs" in choices["config"]
    assert len(choices["config"]["dev_docs"]) == 48 and "test_docs" not in choices["config"]
    for split in ("tune", "dev"):
        for run in loaders.load_eval_runs(split):
            assert run["fingerprint"] == P.fingerprint(run["protocol"]) and run["fingerprint"] in new
            assert {d["split"] for d in run["documents"]} <= {"tune", "dev"}
    summary = loaders.load_eval_summary()
    assert summary["config"]["fingerprint"] == choices["fingerprint"]
    assert {f["picked_on"] for f in summary["families"]} == {"tune", "dev"}
    for run in loaders.load_needle_runs():
        assert run["choices_fingerprint"] in new
    assert [r["round"] for r in mig["rounds"]] == [1, 2, 3, 4]


def test_the_record_table_fits_the_text_column():
    """The appendix's table: one row per setting, indexed by round and short label, four short columns."""
    from jacap_lib.viz import evaluation as VE

    rec = REC.dev_record(_rows("knorm", "ab") + _rows("snapkv", "a"), [_run("2026-01-01T10:00:00+00:00", "a", [], 0)],
                         {"chosen": {"snapkv": "snapkv[window_size=16]", "knorm": "knorm"}})
    frame = VE.record_frame(rec)
    assert list(frame.index) == [(1, "knorm"), (1, "snapkv")]
    assert list(frame.columns) == ["dev rows", "first run", "status", "led to"]
    assert frame.loc[(1, "snapkv")].tolist() == [2, "01-01 10:00", "superseded", "superseded by snapkv[window_size=16]"]
    committed = VE.record_frame(loaders.load_dev_record())
    every = sum(len(loaders.load_eval_rows("dev", space=space)) for space in ("first", "peers", "context"))
    assert committed["dev rows"].sum() == every
