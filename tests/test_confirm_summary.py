"""The confirmatory summary (results.confirm_summary) on synthetic rows with known answers: a constant ratio gives
that ratio as a point interval and its verdict, the estimate is the geometric mean of the per-document ratios, the
level is the plan's, Holm is over the judged comparisons, an unjudged cell keeps the plan's label, missing rows give
no verdict; the needle's McNemar p is the exact binomial test of the discordant prompts, Holm over a mode."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest, wilcoxon

from jacap_lib.experiments.confirm import summary as CS
from jacap_lib.experiments.confirm.plan import SENTENCES
from jacap_lib.experiments.needle import needle_keys
from jacap_lib.report import confirm as RC
from jacap_lib.verdicts.intervals import holm

WORKS = {f"d{i}": f"w{i // 2}" for i in range(12)}  # 6 works of 2 excerpts
DESIGN = {"lengths": [512], "ratios": [0.5], "depths": [0.5], "trials": 6, "modes": ["after", "inside"], "seed": 1}


def _plan():
    comps = [{"a": "jacap", "b": "kvzip", "what": "x", "cell": "512/0.5", "judged": True},
             {"a": "jacap", "b": "kvzip", "what": "x", "cell": "1024/0.5", "judged": True},
             {"a": "jacap_ea", "b": "kvzip", "what": "y", "cell": "512/0.5", "judged": True},
             {"a": "jacap_prompt", "b": "kvzip", "what": "y", "cell": "512/0.95", "judged": False,
              "label": "protection fills the budget"}]
    return {"comparisons": comps, "run": ["jacap", "kvzip", "jacap_ea", "jacap_prompt"], "sentences": SENTENCES,
            "adjustment": {"m": 3, "per_interval": 1 - 0.05 / 3}, "needle": DESIGN,
            "cells": ["512/0.5", "1024/0.5", "512/0.95"]}


def _rows(g):
    rows = []
    for i, d in enumerate(WORKS):
        base = float(g.lognormal(-3, 1))
        for spec, L, kl in (("kvzip", 512, base), ("jacap", 512, base * 0.5),
                            ("jacap_ea", 512, base * math.exp(g.normal(0, 0.3))), ("kvzip", 1024, base)):
            rows.append({"doc": d, "method": spec, "length": L, "ratio": 0.5, "kl": kl})
    rows.append({"doc": "d0", "method": "jacap", "length": 1024, "ratio": 0.5, "kl": 0.1})  # one of 12
    return rows


def test_kl_verdicts_follow_the_plan():
    g = np.random.default_rng(0)
    rows = _rows(g)
    s = CS.summarize_kl(_plan(), rows, WORKS, n_resamples=2000)
    const, missing, noisy, unjudged = s["comparisons"]
    # every document's ratio is 0.5: the interval is the point 0.5, and the plan's "better" sentence prints
    assert const["ratio"] == pytest.approx(0.5) and const["low"] == const["high"] == pytest.approx(0.5)
    assert const["verdict"] == "better" and RC.plan_sentence(const, _plan()).startswith("In 512/0.5, jacap keeps a lower KL")
    assert const["level"] == pytest.approx(1 - 0.05 / 3) and const["n_works"] == 6
    assert missing["verdict"] == "incomplete" and missing["n_documents"] == 1 and not s["complete"]
    assert unjudged["verdict"] == "protection fills the budget" and "not judged" in RC.plan_sentence(unjudged, _plan())
    assert RC.plan_sentence(missing, _plan()) is None and "sentence" not in const  # the summary holds numbers only
    # the noisy pair: its estimate is the geometric mean of its ratios; its p the works-level Wilcoxon
    kl = {(r["doc"], r["method"]): r["kl"] for r in rows if r["length"] == 512}
    logs = np.array([math.log(kl[d, "jacap_ea"] / kl[d, "kvzip"]) for d in WORKS])
    assert noisy["ratio"] == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    per_work = logs.reshape(6, 2).mean(1)
    assert noisy["wilcoxon_p"] == pytest.approx(wilcoxon(per_work).pvalue)
    assert noisy["verdict"] == ("better" if noisy["high"] < 1 else "worse" if noisy["low"] > 1
                                else "no detectable difference")
    assert noisy["low"] < noisy["ratio"] < noisy["high"]
    # Holm over the two judged comparisons that have every row
    want = holm([const["wilcoxon_p"], noisy["wilcoxon_p"]])
    assert [const["holm_p"], noisy["holm_p"]] == pytest.approx(list(want))
    assert s["counts"] == {"x": {"better": 1, "incomplete": 1}, "y": {noisy["verdict"]: 1}}  # unjudged: not counted
    # the plane's KL ratios to KVzip: every run setting with rows beside KVzip's, over the documents both have
    ref = {(e["setting"], e["cell"]): e for e in s["to_reference"]}
    assert set(ref) == {("jacap", "512/0.5"), ("jacap_ea", "512/0.5"), ("jacap", "1024/0.5")}
    assert ref["jacap", "512/0.5"]["ratio"] == pytest.approx(0.5) and ref["jacap", "512/0.5"]["complete"]
    assert ref["jacap_ea", "512/0.5"]["ratio"] == pytest.approx(noisy["ratio"], rel=1e-12)
    one = ref["jacap", "1024/0.5"]  # d0 alone: 0.1 over its KVzip KL
    assert not one["complete"] and one["n_documents"] == 1 and one["ratio"] == pytest.approx(0.1 / kl["d0", "kvzip"])


def test_needle_pairs_are_exact_mcnemar_with_holm_over_the_mode():
    keys = needle_keys((0.5,), 6, 1)
    plan = _plan()
    a_right = [1, 1, 1, 1, 1, 0]
    b_right = [0, 0, 0, 0, 1, 0]
    rows = []
    for (d, t), k in keys.items():
        base = {"length": 512, "depth": d, "trial": t, "key": k, "mode": "after"}
        rows.append({**base, "method": "full", "ratio": 0.0, "correct": True})
        for spec, right in (("jacap", a_right[t]), ("kvzip", b_right[t]), ("jacap_ea", b_right[t]),
                            ("jacap_prompt", 0)):
            rows.append({**base, "method": spec, "ratio": 0.5, "correct": bool(right)})
    out = CS.summarize_needle(plan, rows)
    assert set(out) == {"after"}  # no inside rows
    acc = {e["setting"]: e for e in out["after"]["accuracy"]}
    assert acc["full"]["accuracy"] == 1 and acc["jacap"]["accuracy"] == pytest.approx(5 / 6)
    pairs = {(t["a"], t["b"]): t for t in out["after"]["pairs"]}
    # the judged comparisons of the needle cell 512/0.5 (jacap's is at 512/0.95 and not judged): two pairs
    assert set(pairs) == {("jacap", "kvzip"), ("jacap_ea", "kvzip")}
    first = pairs["jacap", "kvzip"]
    assert (first["wins"], first["losses"]) == (4, 0)
    assert first["p"] == pytest.approx(binomtest(4, 4, 0.5).pvalue)
    assert pairs["jacap_ea", "kvzip"]["verdict"] == "no difference: identical on every prompt"
    want = holm([t["p"] for t in out["after"]["pairs"]])
    assert [t["holm_p"] for t in out["after"]["pairs"]] == pytest.approx(list(want))
    assert out["after"]["complete"]
    whole = CS.summarize(plan, "sha", _rows(np.random.default_rng(0)), rows, WORKS, n_resamples=2000)
    assert not whole["complete"] and whole["config"]["works"] == 6
