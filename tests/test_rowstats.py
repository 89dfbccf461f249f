"""The one home of row statistics (jacap_lib.verdicts.rows): its floors are the ones the jobs use, its reader of
choices.json refuses what the jobs refuse, and its per-layer error ratios match an independent computation."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jacap_lib.experiments import decoding_comparison as DC
from jacap_lib.experiments.protocol import rules as P
from jacap_lib.verdicts import rows as RS
from jacap_lib.verdicts import intervals as V


def test_one_kl_floor():
    # the protocol's rule and the decoding comparison floor the KL at the same value (1e-8 nats)
    assert RS.KL_FLOOR == P.KL_FLOOR == DC.CONFIG["kl_floor"] == 1e-8
    assert P.selection_score([0.0, 1.0]) == pytest.approx(math.log(RS.KL_FLOOR) / 2, rel=1e-15)


def _choices(tmp_path, **change):
    cfg = {"model": {"name": "m"}, "search_space": {"knorm": ["knorm"]}}
    data = {"config": cfg, "fingerprint": P.fingerprint(cfg), "chosen": {"knorm": "knorm"},
            "best_baseline": {"picked_on": "tune", "cells": {}}, **change}
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "choices.json"
    path.write_text(json.dumps(data))
    return path


def test_the_choices_reader_refuses_what_no_job_can_use(tmp_path):
    good = _choices(tmp_path)
    assert RS.read_choices_file(good, baselines=True)["chosen"] == {"knorm": "knorm"}
    with pytest.raises(ValueError, match=r"^--dir: .*nothing\.json does not exist; run `jacap evaluate tune`"):
        RS.read_choices_file(tmp_path / "nothing.json", flag="--dir")
    with pytest.raises(ValueError, match="fingerprint does not match its configuration"):
        RS.read_choices_file(_choices(tmp_path, fingerprint="0" * 64))
    no_base = _choices(tmp_path, best_baseline=None)
    assert "best_baseline" not in RS.read_choices_file(no_base)  # the reader alone does not need it
    with pytest.raises(ValueError, match=r"^--choices: .* has no best baseline"):
        RS.read_choices_file(no_base, flag="--choices", baselines=True)
    with pytest.raises(ValueError, match="chosen"):
        RS.read_choices_file(_choices(tmp_path, chosen=None))


def _rows(err_a, err_b, cells=((64, 0.5),)):
    rows = []
    for L, c in cells:
        for i, (a, b) in enumerate(zip(err_a, err_b)):
            for method, e in (("a", a), ("b", b)):
                rows.append({"method": method, "length": L, "ratio": c, "doc": f"d{i}", "kind": "k",
                             "kl": 1.0, "attn_rel_error_per_layer": e})
    return rows


def test_layer_error_geomeans_pool_the_cells_and_floor_a_zero_error():
    a = [[0.2, 0.0], [0.4, 0.3], [0.1, 0.6]]
    b = [[0.1, 0.1], [0.1, 0.3], [0.4, 0.2]]
    cells = [(64, 0.5), (128, 0.5)]
    out = RS.layer_error_geomeans(_rows(a, b, cells), "a", "b", ["d0", "d1", "d2"], cells)
    want = [math.exp(np.mean(np.log(np.maximum(np.array(a)[:, i], 1e-12) / np.array(b)[:, i]))) for i in range(2)]
    assert out["64/0.5"] == pytest.approx(want, rel=1e-12) and out["128/0.5"] == pytest.approx(want, rel=1e-12)
    assert out["all"] == pytest.approx(want, rel=1e-12)  # the same rows in both cells: pooling changes nothing
    assert out["all"][1] == pytest.approx((1e-12 / 0.1 * 1.0 * 3.0) ** (1 / 3), rel=1e-12)


def test_layer_error_ratios_are_the_paired_interval_per_layer():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.1, 1, (6, 3)), rng.uniform(0.1, 1, (6, 3))
    out = RS.layer_error_ratios(_rows(a.tolist(), b.tolist()), "a", "b", 64, 0.5, n_resamples=999)
    for layer, r in enumerate(out):
        iv = V.geometric_mean_ratio(a[:, layer], b[:, layer], n_resamples=999)
        assert r == {"layer": layer, "ratio": iv.estimate, "low": iv.low, "high": iv.high, "n": 6}
        assert r["ratio"] == pytest.approx(math.exp(np.mean(np.log(a[:, layer] / b[:, layer]))), rel=1e-12)
