"""The confirmatory plan's power analysis (data/results/eval/power.json, written by notes/power_analysis.py):
every cell's spread is the sd of the per-document log KL ratios of the Jacap default over the cell's best
tuned baseline on the dev rows, recomputed here from dev.jsonl and choices.json, and its detectable ratios
are detectable_ratio's at the recorded (m, n)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jacap_lib.results import loaders as R
from jacap_lib.results import paths
from jacap_lib.verdicts.intervals import detectable_ratio, paired_power


@pytest.fixture(scope="module")
def power():
    return json.loads(paths.data_path("results", "eval", "power.json").read_text())


def test_power_json_recomputes_from_the_dev_rows(power):
    cfg = power["config"]
    choices = R.load_eval_choices()
    setting = choices["chosen"]["jacap_obs"]  # the tune choice, written out: today's JacapPromptPress()
    assert setting in cfg["comparison"] and cfg["n"] == [48, 96, 144] and cfg["m"] == [24, 48]
    assert cfg["choices_fingerprint"] == choices["fingerprint"]
    kl = {}
    for r in R.load_eval_rows("dev"):
        kl[(r["method"], r["length"], r["ratio"], r["doc"])] = r["kl"]
    docs = [d for d, _ in choices["config"]["dev_docs"]]
    assert len(power["cells"]) == len(choices["best_baseline"]["cells"]) == 12
    for cell in power["cells"]:
        base = choices["best_baseline"]["cells"][cell["cell"]]["spec"]
        assert cell["baseline_spec"] == base
        d = np.array([math.log(kl[(setting, cell["length"], cell["ratio"], doc)]
                               / kl[(base, cell["length"], cell["ratio"], doc)]) for doc in docs])
        assert cell["n_dev"] == len(docs) == 48
        sd = float(np.sqrt(np.sum((d - d.mean()) ** 2) / (d.size - 1)))
        assert cell["log_ratio_sd"] == pytest.approx(sd, rel=1e-12)
        assert cell["dev_gm_ratio"] == pytest.approx(math.exp(d.mean()), rel=1e-12)
        assert len(cell["detectable"]) == 6
        for entry in cell["detectable"].values():
            assert entry["ratio_t"] == pytest.approx(detectable_ratio(sd, entry["n"], entry["m"]), rel=1e-9)
            assert entry["ratio_t"] < entry["ratio_normal"] < 1
            assert entry["power_at_dev_effect_t"] == pytest.approx(
                paired_power(math.log(cell["dev_gm_ratio"]), sd, entry["n"], entry["m"]), rel=1e-9)
        # more planned documents detect a ratio closer to 1
        r = [cell["detectable"][f"m=48,n={n}"]["ratio_t"] for n in (48, 96, 144)]
        assert r[0] < r[1] < r[2]


def test_each_planned_comparisons_spread_recomputes_from_its_two_settings_rows(power):
    """power.json's ``comparisons``: the plan's comparisons with dev rows of both settings, each spread the sd of
    the per-document log KL ratios (KL floored at 1e-8) over the 48 dev documents, read from every space's rows."""
    from jacap_lib.experiments.confirm import plan as CP

    if "comparisons" not in power:
        pytest.skip("power.json predates the per-comparison spreads")
    kl = {(r["method"], r["length"], r["ratio"], r["doc"]): max(r["kl"], 1e-8)
          for space in ("first", "peers", "context") for r in R.load_eval_rows("dev", space=space)}
    docs = [d for d, _ in R.load_eval_choices()["config"]["dev_docs"]]
    assert power["comparisons"], "no planned comparison has dev rows"
    for c in power["comparisons"]:
        L, ratio = int(c["cell"].split("/")[0]), float(c["cell"].split("/")[1])
        d = np.array([math.log(kl[(c["a"], L, ratio, doc)] / kl[(c["b"], L, ratio, doc)]) for doc in docs])
        assert c["log_ratio_sd"] == pytest.approx(float(np.std(d, ddof=1)), rel=1e-12)
        m = power["m_planned"]
        assert c["detectable"][f"m={m},n=96"] == pytest.approx(detectable_ratio(c["log_ratio_sd"], 96, m), rel=1e-9)
    # every planned comparison is either measured or listed as missing
    cand = R.load_candidates()
    cells = [(int(k.split("/")[0]), float(k.split("/")[1])) for k in R.load_eval_choices()["best_baseline"]["cells"]]
    planned = CP.planned_comparisons(cand, cells, CP.best_per_cell(paths.data_path("results", "eval")))
    assert len(power["comparisons"]) + len(power["comparisons_missing"]) == len(planned)
    assert power["m_planned"] == sum(p["judged"] for p in planned)
