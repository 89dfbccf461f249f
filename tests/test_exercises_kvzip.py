"""The KVzip chapter's exercises: each expected answer against a computation straight from the committed ladder rows
(read here with json, paired by hand) and against the committed ladder summary; a wrong answer is rejected."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from jacap_lib import exercises as E

PEERS = Path(__file__).resolve().parents[1] / "data" / "results" / "eval" / "peers"


def _rows():
    return [json.loads(line) for line in (PEERS / "ladder.jsonl").read_text().splitlines() if line.strip()]


def _summary():
    return json.loads((PEERS / "ladder_summary.json").read_text())


def _kl(rows, spec, length, ratio):
    return {r["doc"]: r["kl"] for r in rows if r["method"] == spec and r["length"] == length and r["ratio"] == ratio}


def _cell(summary, length, ratio):
    return next(c for c in summary["cells"] if c["length"] == length and c["ratio"] == ratio)


def test_the_data_are_the_committed_rows_and_steps():
    d = E.data("kvzip.1")
    assert len(d["rows"]) == len(_rows()) and d["steps"] == _summary()["steps"]
    assert d["steps"]["L0"].startswith("jacap_prompt[") and d["steps"]["L3"].startswith("jacap[")


def test_kvzip_over_default_by_hand_and_against_the_summary():
    rows, summary = _rows(), _summary()
    steps = summary["steps"]
    a, b = _kl(rows, steps["L3"], 1024, 0.5), _kl(rows, steps["L0"], 1024, 0.5)
    docs = sorted(a)
    assert set(a) == set(b) and len(docs) == len(summary["config"]["documents"])
    gm = math.exp(sum(math.log(a[k] / b[k]) for k in docs) / len(docs))
    assert E.check("kvzip.1", gm)
    assert gm == pytest.approx(_cell(summary, 1024, 0.5)["total_L3_over_L0"], rel=1e-4)  # the summary rounds to 5 digits
    assert gm < 1  # KVzip's KL is the lower one in this cell
    assert not E.check("kvzip.1", 1 / gm)  # the ratio upside down
    assert not E.check("kvzip.1", (sum(a.values()) / len(a)) / (sum(b.values()) / len(b)))  # ratio of means


def test_step_d_wins_by_hand_and_against_the_summary():
    rows, summary = _rows(), _summary()
    steps = summary["steps"]
    a, b = _kl(rows, steps["d"], 1024, 0.95), _kl(rows, steps["L3"], 1024, 0.95)
    wins = sum(a[k] < b[k] for k in a)
    step = next(s for s in _cell(summary, 1024, 0.95)["steps"] if s["step"] == "d")
    assert wins == step["wins"] and step["n"] == len(a)
    assert E.check("kvzip.2", wins)
    assert not E.check("kvzip.2", len(a) - wins)
    assert "KVzip is lower" in E.check("kvzip.2", len(a) - wins).message
