"""The ladder summary (jacap_lib.experiments.ladder.summarize_ladder) on made-up rows whose step ratios are known."""
import math

import numpy as np
import pytest

from jacap_lib.experiments import ladder as LD


def _rows(factors, docs=6, kvzip_differs=False):
    """Rows where step k's KL is the step before's times factors[k] (times a per-document wobble), at 512/0.5."""
    specs = {k: f"spec-{k}" for k in LD.STEPS}
    rng = np.random.default_rng(0)
    rows = []
    for i in range(docs):
        kl = {"L0": 0.1 * (1 + i)}
        for (a, b) in LD.LADDER + LD.EXTRA:
            kl[a] = kl[b] * factors[a] * math.exp(0.05 * rng.standard_normal())
        for k, v in kl.items():
            rows.append({"doc": f"d{i}", "length": 512, "ratio": 0.5, "continuation": 8, "method": specs[k], "kl": v,
                         "kept_tokens": 1.0, "cpu_seconds": 1.0, "prefill_cpu_seconds": 2.0})
        if i == 0:
            rows.append({"doc": "d0", "length": 512, "ratio": 0.5, "continuation": 8, "method": LD.CHECK,
                         "kl": kl["L3"] * (2 if kvzip_differs else 1), "kept_tokens": 1.0, "cpu_seconds": 1.0})
    runs = [{"steps": {k: {"spec": s} for k, s in specs.items()}, "documents": [{"id": f"d{i}"} for i in range(docs)],
             "continuation": 8}]
    return rows, runs


def test_steps_multiply_to_the_total_and_shares_add_to_one():
    factors = {"L1": 1.5, "L1b": 1.1, "L2": 1.2, "L3": 0.2, "d": 0.8}
    rows, runs = _rows(factors)
    out = LD.summarize_ladder(rows, runs, seed=0)
    cell = out["cells"][0]
    steps = {s["step"]: s for s in cell["steps"]}
    prod = math.prod(steps[a]["gm_ratio"] for a, _ in LD.LADDER)
    assert prod == pytest.approx(cell["total_L3_over_L0"], rel=1e-9)
    assert sum(steps[a]["share_of_log_gap"] for a, _ in LD.LADDER) == pytest.approx(1.0, abs=1e-9)
    assert cell["carrier"] == "L3" and out["pooled_share_of_log_gap"]["kvzip_lower"]["carrier"] == "L3"
    assert steps["L3"]["gm_high"] < 1 and steps["L3"]["verdict"].startswith("better")
    assert out["m"] == 5 and out["kvzip_check"][0]["equal"]


def test_l3_must_equal_kvzip():
    rows, runs = _rows({"L1": 1.0, "L1b": 1.0, "L2": 1.0, "L3": 0.5, "d": 1.0}, kvzip_differs=True)
    with pytest.raises(ValueError, match="kvzip"):
        LD.summarize_ladder(rows, runs)
