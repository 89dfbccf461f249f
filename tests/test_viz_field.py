"""viz.field's ladder table and figure read the ladder summary as written: one row per cell, each step's ratio and
verdict word, the total; one bar trace per step with its adjusted interval as error bars."""
from __future__ import annotations

import pytest

from jacap_lib.viz import field as VF


def _summary():
    def step(name, r, lo, hi, verdict):
        return {"step": name, "gm_ratio": r, "gm_low": lo, "gm_high": hi, "verdict": verdict}

    cells = [{"length": 512, "ratio": 0.5, "total_L3_over_L0": 0.5, "total_verdict": "better by 10–60 %",
              "steps": [step("L1", 1.0, 0.8, 1.25, "no detectable difference; the interval is −20 % to +25 %"),
                        step("L3", 0.5, 0.4, 0.9, "better by 10–60 %")]},
             {"length": 1024, "ratio": 0.9, "total_L3_over_L0": 2.0, "total_verdict": "worse by 50–150 %",
              "steps": [step("L1", 2.0, 1.5, 2.5, "worse by 50–150 %"),
                        step("L3", 1.0, 0.9, 1.1, "no detectable difference; the interval is −10 % to +10 %")]}]
    return {"cells": cells}


def test_ladder_frame_rows_are_cells_and_entries_ratio_and_verdict():
    frame = VF.ladder_frame(_summary())
    assert list(frame.index) == ["512 / 0.5", "1024 / 0.9"] and list(frame.columns) == ["L1", "L3", "KVzip / prompt press"]
    assert frame.loc["512 / 0.5", "L3"] == "0.50 better" and frame.loc["1024 / 0.9", "L1"] == "2.00 worse"
    assert frame.loc["512 / 0.5", "L1"] == "1.00 n.d." and frame.loc["1024 / 0.9", "KVzip / prompt press"] == "2.00 worse"


def test_ladder_figure_one_trace_per_step_with_its_interval():
    fig = VF.ladder_figure(_summary())
    assert [t.name for t in fig.data] == [VF.STEP_NAMES["L1"], VF.STEP_NAMES["L3"]]
    l3 = fig.data[1]
    assert list(l3.y) == [0.5, 1.0] and list(l3.x) == ["512 / 0.5", "1024 / 0.9"]
    assert list(l3.error_y.array) == pytest.approx([0.4, 0.1]) and list(l3.error_y.arrayminus) == pytest.approx([0.1, 0.1])
    assert len({t.marker.color for t in fig.data}) == 2 and fig.layout.yaxis.type == "log"
    with pytest.raises(ValueError, match="cells"):
        VF.ladder_figure({"cells": []})
