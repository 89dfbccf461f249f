"""The facts chapter's exercises: each expected answer against an independent computation from the raw lines of the
committed files (and the needle summary's own McNemar p), and a wrong answer is rejected."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from jacap_lib.exercises import facts as X

EVAL = Path(__file__).resolve().parents[1] / "data" / "results" / "eval"


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (EVAL / name).read_text().splitlines() if line.strip()]


def _grade(n: int, answer) -> bool:
    ex = X.EXERCISES[n - 1]
    return ex.grade(answer, ex.expected())[0]


@pytest.fixture(scope="module")
def settings():
    return json.loads((EVAL / "needle_summary.json").read_text())["config"]["settings"]


def test_chapter_label():
    assert X.CHAPTER == "facts" and len(X.EXERCISES) == 3


def test_predict_the_keeper_by_counting(settings):
    L, c = X.PREDICT_CELL
    right = {}
    for r in _jsonl("needle.jsonl"):
        if r["method"] in settings and r["length"] == L and r["ratio"] == c:
            right.setdefault(r["family"], set())
            if r["correct"]:
                right[r["family"]].add((r["method"], r["depth"], r["trial"], r["key"]))
    best = max(right, key=lambda f: len(right[f]))
    assert best == "keydiff" and len(right[best]) == 20
    assert _grade(1, best) and _grade(1, "keydiff")
    assert not _grade(1, "expected_attention") and not _grade(1, "knorm") and not _grade(1, None)
    d = X.EXERCISES[0].data()
    assert len(d["rows"]) == 20 * len(settings) and set(d["names"]) == set(settings)


def test_mcnemar_against_the_summary_and_scipy():
    from jacap_lib.experiments.protocol.rules import PAPER_PRESET

    L, c = X.PAIR_CELL
    tuned = json.loads((EVAL / "choices.json").read_text())["chosen"]["jacap_prompt"]
    got = {}
    for r in _jsonl("needle.jsonl"):
        if r["method"] in (tuned, PAPER_PRESET) and r["length"] == L and r["ratio"] == c:
            got.setdefault(r["method"], {})[(r["depth"], r["trial"], r["key"])] = r["correct"]
    a, b = got[tuned], got[PAPER_PRESET]
    only_a = sum(a[k] and not b[k] for k in a)
    only_b = sum(b[k] and not a[k] for k in a)
    assert (only_a, only_b) == (1, 10)
    p = stats.binomtest(only_a, only_a + only_b, 0.5).pvalue
    summary = json.loads((EVAL / "needle_summary.json").read_text())
    fam = next(f for f in summary["comparisons"] if f["reference"] == "paper preset")
    row = next(r for r in fam["rows"] if r["length"] == L and r["ratio"] == c)
    assert (row["wins"], row["losses"]) == (only_a, only_b) and row["p_mcnemar"] == pytest.approx(p, rel=1e-4)
    assert _grade(2, p)
    assert not _grade(2, p / 2)  # the one-sided p
    assert not _grade(2, stats.binomtest(only_a, 20, 0.5).pvalue)  # every prompt counted, not the discordant ones


def test_plane_point_by_hand():
    L, c = X.PLANE_CELL
    ref = json.loads((EVAL / "choices.json").read_text())["best_baseline"]["cells"][f"{L}/{c}"]["spec"]
    kl = {}
    for r in _jsonl("dev.jsonl"):
        if r["length"] == L and r["ratio"] == c and r["method"] in ("keydiff", ref):
            kl.setdefault(r["method"], {})[r["doc"]] = r["kl"]
    docs = sorted(kl["keydiff"])
    gm = math.exp(sum(math.log(kl["keydiff"][d] / kl[ref][d]) for d in docs) / len(docs))
    assert _grade(3, gm) and gm > 1
    means = (sum(kl["keydiff"].values()) / len(docs)) / (sum(kl[ref].values()) / len(docs))
    assert not _grade(3, means)
    d = X.EXERCISES[2].data()
    assert d["reference"] == ref and d["a"] == kl["keydiff"] and d["b"] == kl[ref]
