"""The confirmatory run (results.confirm_run): it refuses a plan that is not committed as it stands, a manifest or a
model the plan does not name, and bad options, before writing anything; it measures exactly the plan's run settings
at the plan's cells on the confirmatory documents (rows equal to an independent measurement, resumable), and the
needle with the plan's fresh keys."""
from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from jacap_lib.experiments.confirm import run as CR
from jacap_lib.results import files
from jacap_lib.results.paths import data_path


def _git(where, *args):
    return subprocess.run(["git", "-C", str(where), "-c", "user.email=t@example.org", "-c", "user.name=t", *args],
                          capture_output=True, text=True, check=True)


def _manifest_sha():
    return hashlib.sha256(data_path("texts", "confirm", "manifest.json").read_bytes()).hexdigest()


def _plan(tmp_path, **over):
    plan = {"run": ["knorm", "kvzip"], "cells": ["64/0.5"], "continuation": 8, "model": None,
            "documents": {"sha256": _manifest_sha()},
            "needle": {"lengths": [64], "ratios": [0.5], "depths": [0.5], "trials": 1, "modes": ["after"], "seed": 1}}
    plan.update(over)
    (tmp_path / "confirm").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "confirm" / "plan.json"
    path.write_text(json.dumps(plan))
    return plan, path


def test_uncommitted_says_why(tmp_path):
    assert "not in a git work tree" in CR.uncommitted(_plan(tmp_path)[1])
    _git(tmp_path, "init", "-q")
    path = _plan(tmp_path)[1]
    assert "untracked" in CR.uncommitted(path)
    _git(tmp_path, "add", "confirm/plan.json")
    _git(tmp_path, "commit", "-qm", "plan")
    assert CR.uncommitted(path) is None
    path.write_text(path.read_text().replace('"trials": 1', '"trials": 2'))
    assert "differs from its last commit" in CR.uncommitted(path)
    with pytest.raises(ValueError, match="commit the plan before any confirmatory row"):
        CR.load_plan(tmp_path)


def test_load_plan_refuses_what_the_plan_does_not_name(tmp_path):
    with pytest.raises(ValueError, match="no plan"):
        CR.load_plan(tmp_path, require_commit=False)
    _plan(tmp_path, documents={"sha256": "0" * 64})
    with pytest.raises(ValueError, match="not the plan's"):
        CR.load_plan(tmp_path, require_commit=False)
    _plan(tmp_path, model={"sha256": "f" * 64})
    with pytest.raises(ValueError, match="bundled model's sha256"):
        CR.load_plan(tmp_path, require_commit=False)
    plan, path = _plan(tmp_path)
    loaded, sha = CR.load_plan(tmp_path, require_commit=False)
    assert loaded == plan and sha == hashlib.sha256(path.read_bytes()).hexdigest()
    assert CR.plan_cells({"cells": ["1024/0.9", "512/0.5", "512/0.9"]}) == ((512, 1024), (0.5, 0.9))


def test_the_command_refuses_before_writing(tmp_path, capsys):
    from jacap_lib.cli import main

    _plan(tmp_path)
    for argv, word in (([], "--part"), (["--part", "needle"], "--mode"), (["--part", "kl", "--mode", "after"], "--mode"),
                       (["--part", "kl", "--workers", "0"], "--workers"), (["--part", "kl"], "not in a git work tree")):
        with pytest.raises(SystemExit) as e:
            main(["evaluate", "confirm", "--dir", str(tmp_path), *argv])
        assert e.value.code == 2 and word in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "confirm").iterdir()) == ["plan.json"]


@pytest.mark.model
def test_kl_rows_are_the_plans_settings_at_its_cells(bundled, tmp_path):
    from jacap_lib.measure.quality import full_reference, next_token_kl, prompt_and_continuation
    from jacap_lib.presses.registry import press_from_spec
    from jacap_lib.results.texts import load_corpus

    model, tok = bundled
    # KVzip is named only at c = 0.5 (say, the best baseline of that cell alone): it is measured there only
    plan, _ = _plan(tmp_path, cells=["64/0.5", "64/0.75"], run_cells={"knorm": ["64/0.5", "64/0.75"],
                                                                      "kvzip": ["64/0.5"]})
    res = CR.run_kl(tmp_path, plan, "abc", model=model, tokenizer=tok, workers=1, progress=False, limit_docs=2)
    rows = files.read_jsonl(tmp_path / "confirm" / "kl.jsonl")
    docs = load_corpus(split="confirm", which="confirm")[:2]
    assert res["rows_written"] == len(rows) == 6
    assert {(r["doc"], r["length"], r["ratio"], r["method"], r["split"]) for r in rows} == {
        (d["id"], 64, c, s, "confirm") for d in docs for s, c in (("knorm", 0.5), ("knorm", 0.75), ("kvzip", 0.5))}
    # each row is what a separate measurement of that press on that prompt gives (kvpress's own path)
    for r in rows:
        doc = next(d for d in docs if d["id"] == r["doc"])
        prompt, cont = prompt_and_continuation(tok, doc["text"], 64, 8)
        ref = full_reference(model, None, prompt, cont)
        own = next_token_kl(model, None, prompt, cont, press_from_spec(r["method"], r["ratio"]), reference=ref)
        assert r["kl"] == pytest.approx(own.kl, rel=1e-4, abs=1e-6) and r["kept_tokens"] == own.kept_tokens
    run = files.read_runs(tmp_path / "confirm" / "kl.jsonl")[0]
    assert run["plan_sha256"] == "abc" and run["cells"] == ["64/0.5", "64/0.75"] and len(run["documents"]) == 2
    again = CR.run_kl(tmp_path, plan, "abc", model=model, tokenizer=tok, workers=1, progress=False, limit_docs=2)
    assert again["rows_written"] == 0 and len(files.read_jsonl(tmp_path / "confirm" / "kl.jsonl")) == 6


@pytest.mark.model
def test_needle_rows_use_the_plans_fresh_keys(bundled, tmp_path):
    from jacap_lib.experiments.needle import needle_keys

    model, tok = bundled
    plan, _ = _plan(tmp_path)
    plan["needle"]["settings"] = ["knorm"]  # the needle's own settings, not every run setting
    with pytest.raises(ValueError, match="needle modes"):
        CR.run_needle(tmp_path, plan, "abc", mode="inside", model=model, tokenizer=tok, workers=1, progress=False)
    CR.run_needle(tmp_path, plan, "abc", mode="after", model=model, tokenizer=tok, workers=1, progress=False)
    rows = files.read_jsonl(tmp_path / "confirm" / "needle.jsonl")
    key = needle_keys((0.5,), 1, 1)[0.5, 0]
    assert key != needle_keys((0.5,), 1, 0)[0.5, 0]  # not the dev needle's key
    assert sorted(r["method"] for r in rows) == ["full", "knorm"] and {r["key"] for r in rows} == {key}
    assert {r["mode"] for r in rows} == {"after"} and all(r["length"] == 64 for r in rows)
    assert files.read_runs(tmp_path / "confirm" / "needle.jsonl")[0]["choices_fingerprint"] == "abc"


def test_the_committed_plan_came_before_its_rows():
    """The repository's own plan: it names the committed manifest and the frozen candidates' settings, and git's
    history adds it before any confirmatory row file (skipped until the plan is committed)."""
    from jacap_lib.results import loaders

    path = data_path("results", "eval", "confirm", "plan.json", must_exist=False)
    if not path.is_file():
        pytest.skip("no confirmatory plan committed yet")
    plan = loaders.load_confirm_plan()
    assert plan["documents"]["sha256"] == _manifest_sha()
    cand = loaders.load_candidates()
    assert cand["frozen"] and plan["candidates_fingerprints"] == {s: v["fingerprint"] for s, v in cand["spaces"].items()}
    assert plan["settings"] == list(dict.fromkeys(v["spec"] for v in cand["methods"].values()))
    assert set(plan["run"]) == {s for c in plan["comparisons"] for s in (c["a"], c["b"])}

    def first_commit(rel):
        try:
            out = subprocess.run(["git", "-C", str(path.parent), "log", "--format=%ct %H", "--diff-filter=A", "--",
                                  rel], capture_output=True, text=True, check=True).stdout.split()
        except (FileNotFoundError, subprocess.CalledProcessError):
            pytest.skip("not a git checkout")
        return out

    plan_added = first_commit("plan.json")
    if not plan_added:
        pytest.skip("the plan is not committed yet")
    for rows in ("kl.jsonl", "needle.jsonl"):
        added = first_commit(rows)
        if added:  # the rows' first commit descends from the plan's
            ok = subprocess.run(["git", "-C", str(path.parent), "merge-base", "--is-ancestor", plan_added[-1],
                                 added[-1]], capture_output=True).returncode == 0
            assert ok and added[-1] != plan_added[-1], f"{rows} was committed before (or with) the plan"
