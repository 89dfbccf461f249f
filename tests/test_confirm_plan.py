"""The confirmatory plan (results.confirm_plan): protection-filled cells by kvpress's budget arithmetic, the planned
comparisons and their count, the adjustment and the detectable ratios at that count, and the refusals (unfrozen
candidates; an existing plan)."""
from __future__ import annotations

import math

import pytest
from scipy import stats

from jacap_lib.experiments.confirm import plan as CP
from jacap_lib.experiments.candidates import freeze
from jacap_lib.verdicts.intervals import paired_power

ALG1_TUNED = ("jacap_prompt[backend=auto,beta=0.9,centre=tempered,eps=1e-06,gqa=pool,n_future_positions=512,n_queries=none,"
              "n_sink=4,noise=1,tau=3,use_out_proj=false,window=128]")


def test_protection_fills_the_cells_of_algorithm1_tuned():
    # kvpress's budget int(L * (1 - c)) against 4 sinks + a 128-token window: exactly the six cells where it keeps
    # nothing else; jacap_ea's 16-token window fills none (25 slots at 512/0.95 > 20 protected)
    from jacap_lib.experiments.protection import protection_fills_budget

    cells = [(L, c) for L in (512, 1024, 2048) for c in (0.5, 0.75, 0.9, 0.95)]
    filled = {f"{L}/{c}" for L, c in cells if protection_fills_budget(ALG1_TUNED, L, c)}
    assert filled == {"512/0.75", "512/0.9", "512/0.95", "1024/0.9", "1024/0.95", "2048/0.95"}
    assert {f"{L}/{c}" for L, c in cells if L * (1 - c) <= 4 + 128 + 1e-9} == filled  # the arithmetic by hand
    assert not any(protection_fills_budget("jacap_ea", L, c) for L, c in cells)


def _candidates(frozen=True):
    methods = {"expected_attention": {"spec": "expected_attention[n_future_positions=32]", "tune_score": -2.5,
                                      "family": "baseline", "tune_cpu_seconds_per_row": 1.0},
               "kvzip": {"spec": "kvzip", "tune_score": -3.5, "family": "baseline", "tune_cpu_seconds_per_row": 10.0},
               "jacap_prompt": {"spec": ALG1_TUNED, "tune_score": -2.2, "family": "jacap", "tune_cpu_seconds_per_row": 1.0},
               "jacap_ea": {"spec": "jacap_ea", "tune_score": -2.4, "family": "jacap", "tune_cpu_seconds_per_row": 1.0}}
    fam = [{"method": m, "spec": v["spec"], "tune_score": v["tune_score"]} for m, v in methods.items()
           if v["family"] == "jacap"]
    return {"methods": methods, "frozen": frozen, "pending": [] if frozen else ["kvgrad"],
            "spaces": {"first": {"fingerprint": "a"}, "peers": {"fingerprint": "b"}},
            "default": {"eligible": fam, "chosen": fam[1]}}


def _power(sd=0.5):
    return {"cells": [{"cell": f"{L}/{c}", "log_ratio_sd": sd} for L in (512, 1024, 2048) for c in (0.5, 0.75, 0.9, 0.95)]}


def test_plan_counts_comparisons_and_plans_power_at_that_count():
    manifest = {"documents": [{"id": f"d{i}", "kind": "prose", "group": f"w{i // 2}"} for i in range(40)]}
    best = {f"{L}/{c}": "kvzip" for L in (512, 1024, 2048) for c in (0.5, 0.75, 0.9, 0.95)}
    plan = CP.make_plan(_candidates(), _power(), manifest, best_per_cell=best, manifest_sha256="x")
    comps = plan["comparisons"]
    # 2 family settings vs the best baseline + the default vs KVzip and vs Expected Attention, 12 cells each; KVzip
    # is every cell's best baseline here, so the default's two comparisons with it are one test, listed once;
    # Algorithm 1 tuned is not judged in its 6 protection-filled cells (jacap_ea's window 16 fills none)
    assert len(comps) == 3 * 12 and plan["judged"] == 36 - 6
    assert len({(c["a"], c["b"], c["cell"]) for c in comps}) == len(comps)
    both = [c for c in comps if c["a"] == "jacap_ea" and c["b"] == "kvzip"]
    assert len(both) == 12 and all(c["what"] == "against the best tuned baseline; the default against kvzip" for c in both)
    assert all(c["label"] == "protection fills the budget" for c in comps if not c["judged"])
    assert {c["cell"] for c in comps if not c["judged"]} == {"512/0.75", "512/0.9", "512/0.95", "1024/0.9",
                                                              "1024/0.95", "2048/0.95"}
    assert plan["adjustment"]["per_interval"] == pytest.approx(1 - 0.05 / 30)
    assert plan["documents"]["works"] == 20
    r = plan["power"]["detectable_ratio_80"]["512/0.5"]
    assert paired_power(-math.log(r), 0.5, 20, 30) == pytest.approx(0.8, abs=5e-4)  # r rounded to 4 decimals
    # by hand: the two-sided t test at level 0.05/30 on 20 works has power 0.8 at that ratio (noncentral t)
    crit, nc = stats.t.isf(0.05 / 30 / 2, 19), -math.log(r) * math.sqrt(20) / 0.5
    assert stats.nct.sf(crit, 19, nc) + stats.nct.cdf(-crit, 19, nc) == pytest.approx(0.8, abs=5e-4)
    assert plan["cost_cpu_hours"] == pytest.approx((1 + 10 + 1 + 1) * 40 * 12 / 3600, abs=0.01)
    assert plan["default"]["method"] == "jacap_ea"


def test_each_comparison_is_planned_with_its_own_spread_where_the_dev_rows_hold_it():
    manifest = {"documents": [{"id": f"d{i}", "kind": "prose", "group": f"w{i}"} for i in range(30)]}
    best = {f"{L}/{c}": "kvzip" for L in (512, 1024, 2048) for c in (0.5, 0.75, 0.9, 0.95)}
    power = {**_power(0.5), "comparisons": [{"a": "jacap_ea", "b": "kvzip", "cell": "512/0.5", "log_ratio_sd": 0.2}]}
    plan = CP.make_plan(_candidates(), power, manifest, best_per_cell=best, manifest_sha256="x")
    per = {(p["a"], p["b"], p["cell"]): p for p in plan["power"]["per_comparison"]}
    assert len(plan["power"]["per_comparison"]) == plan["judged"] == 30  # one entry per judged comparison
    own, other = per["jacap_ea", "kvzip", "512/0.5"], per["jacap_ea", "kvzip", "512/0.75"]
    assert own["log_ratio_sd"] == 0.2 and own["sd_from"] == "its two settings' dev rows"
    assert other["log_ratio_sd"] == 0.5 and other["sd_from"].startswith("the cell's spread")
    # 30 works at level 0.05/30: a smaller spread detects a ratio closer to 1, at 80 % power each
    assert own["detectable_ratio_80"] > other["detectable_ratio_80"]
    for p in (own, other):
        assert paired_power(-math.log(p["detectable_ratio_80"]), p["log_ratio_sd"], 30, 30) == pytest.approx(0.8, abs=5e-4)
    assert plan["power"]["ten_percent_detectable_comparisons"] == sum(
        p["detectable_ratio_80"] >= 0.9 for p in per.values())


def test_unfrozen_candidates_are_refused():
    with pytest.raises(ValueError, match="not frozen.*kvgrad"):
        CP.make_plan(_candidates(frozen=False), _power(), {"documents": []}, best_per_cell={}, manifest_sha256="x")


def test_plan_frame_rows_are_the_plans_purposes():
    from jacap_lib.viz.evaluation import plan_frame

    manifest = {"documents": [{"id": f"d{i}", "kind": "prose", "group": f"w{i}"} for i in range(30)]}
    best = {f"{L}/{c}": ("kvzip" if c < 0.9 else "expected_attention[n_future_positions=32]")
            for L in (512, 1024, 2048) for c in (0.5, 0.75, 0.9, 0.95)}
    power = {**_power(0.5), "comparisons": [{"a": "jacap_ea", "b": "kvzip", "cell": "512/0.5", "log_ratio_sd": 0.2}]}
    plan = CP.make_plan(_candidates(), power, manifest, best_per_cell=best, manifest_sha256="x")
    frame = plan_frame(plan).reset_index()
    assert len(frame) == 4  # two family settings against the best baseline, the default against KVzip and EA
    alg1 = frame.iloc[0]
    assert alg1["against"] == "the cell's best tuned baseline" and alg1["cells judged"] == 6
    assert alg1["left out (protection fills the budget)"].split(", ") == ["512/0.75", "512/0.9", "512/0.95",
                                                                           "1024/0.9", "1024/0.95", "2048/0.95"]
    vs_kvzip = frame[(frame["against"] == "KVzip")].iloc[0]
    det = [p["detectable_ratio_80"] for p in plan["power"]["per_comparison"] if p["a"] == "jacap_ea" and p["b"] == "kvzip"]
    assert vs_kvzip["cells judged"] == 12 and len(det) == 12  # at c < 0.9 also the best-baseline comparison: one test
    assert vs_kvzip["detectable ratio (80 % power)"] == f"{min(det):.2f}–{max(det):.2f}"
    assert {r["cells judged"] for _, r in frame.iterrows()} == {6, 12}


def test_reading_a_budget_prints_no_kvpress_warning(caplog):
    """The plan and every verdict table ask where protection fills the budget; building KVzip's subclass for that
    must not print kvpress's prefill-cost warning into the book."""
    import logging

    from jacap_lib.experiments.protection import budget_split

    with caplog.at_level(logging.WARNING, logger="kvpress"):
        split = budget_split("jacap[window=64]", 512, 0.95)
    assert not [r for r in caplog.records if r.name.startswith("kvpress")]
    assert split is not None and split["window"] + split["sinks"] >= split["kept"]


def test_each_setting_runs_where_a_comparison_names_it():
    manifest = {"documents": [{"id": f"d{i}", "kind": "prose", "group": f"w{i}"} for i in range(30)]}
    cells = [(L, c) for L in (512, 1024, 2048) for c in (0.5, 0.75, 0.9, 0.95)]
    # KNorm is the best baseline of 512/0.95 alone, KVzip of every other cell; KeyDiff is frozen but never named
    best = {f"{L}/{c}": "kvzip" for L, c in cells} | {"512/0.95": "knorm"}
    cand = _candidates()
    for name in ("knorm", "keydiff"):
        cand["methods"][name] = {"spec": name, "tune_score": -1.0, "family": "baseline", "tune_cpu_seconds_per_row": 1.0}
    plan = CP.make_plan(cand, _power(), manifest, best_per_cell=best, manifest_sha256="x")
    assert "keydiff" in plan["settings"] and "keydiff" not in plan["run"]
    assert plan["run_cells"]["knorm"] == ["512/0.95"]
    assert plan["run_cells"]["kvzip"] == [f"{L}/{c}" for L, c in cells]  # the default against KVzip: every cell
    assert plan["run_cells"][ALG1_TUNED] == [f"{L}/{c}" for L, c in cells]  # listed even where not judged
    # the cost counts each setting's own cells: 4 settings x 12 cells (one CPU-second a row, KVzip's 10) + KNorm x 1
    assert plan["cost_cpu_hours"] == round(((1 + 10 + 1 + 1) * 12 + 1) * 30 / 3600, 2)  # rounded as recorded
    # the needle's settings: those of the judged comparisons at c 0.5-0.9, so not KNorm (named at c = 0.95 only)
    assert set(plan["needle"]["settings"]) == {ALG1_TUNED, "jacap_ea", "kvzip", "expected_attention[n_future_positions=32]"}
