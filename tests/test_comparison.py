"""results.comparison.run_summary on a small synthetic grid: the tune choices and the target come from
the rows as the rules say (checked by hand)."""
from __future__ import annotations

import json
import math

import pytest

from jacap_lib.results import comparison as C
from jacap_lib.results import files


def _rows():
    rows = []
    segs = [("t1", "tune"), ("t2", "tune"), ("s1", "test"), ("s2", "test"), ("s3", "test")]
    kl = {"tova": 1.0, "snapkv": 2.0, "capkv": 3.0, "jacap": 0.8, "jacap[window=0]": 1.5,
          "jacap[window=32]": 0.8, "jacap[window=64]": 0.9}
    for L in (512, 1024):
        for c in (0.75, 0.9):
            for i, (seg, split) in enumerate(segs):
                for m, v in kl.items():
                    rows.append({"task": "kl", "model": "m", "segment": seg, "kind": "prose", "split": split,
                                 "length": L, "continuation": 32, "method": m, "ratio": c, "kl": v * (1 + 0.1 * i),
                                 "attn_rel_error": 0.1, "top1_agreement": 1.0})
    return rows


def test_run_summary_choices_and_target(tmp_path, monkeypatch):
    rows = _rows()
    grid, tune = tmp_path / "grid.jsonl", tmp_path / "tune.jsonl"
    for r in rows:
        files.append_jsonl(grid, r) if "window" not in r["method"] else files.append_jsonl(tune, r)
    monkeypatch.setattr(C, "JACAP_SPECS", ("jacap",))
    out = C.run_summary(grid=grid, tune=tune, out=tmp_path / "s.json", n_boot=200)
    s = json.loads(out.read_text())
    win = s["choices"]["window"]
    assert [w["method"] for w in win] == ["jacap[window=32]", "jacap[window=64]", "jacap[window=0]"]
    # score = 4 settings x (log mean ratio + log geo ratio), both 0.8 for window 32 vs the best baseline tova
    assert win[0]["score"] == pytest.approx(8 * math.log(0.8))
    t = s["target"]
    assert t["chosen"] == "jacap" and t["reached"] and t["test_worst_ratio"] == pytest.approx(0.8)
    comp = next(c for c in s["comparisons"] if c["method"] == "jacap" and c["split"] == "test")
    assert comp["vs_capkv"]["wins"] == 3 and comp["vs_capkv"]["mean_ratio"] == pytest.approx(0.8 / 3.0)
