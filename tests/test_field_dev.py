"""The field summary on the dev documents: paired ratios against closed forms, the adjustment's m, the labels."""
import math

import numpy as np
import pytest

from jacap_lib.experiments import field as FD
from jacap_lib.report import field as FIE
from jacap_lib.results import loaders
from jacap_lib.experiments.protocol import rules as P


def _specs():
    return {"context": P._context(window=64), "kvzip": "kvzip",
            "one_prefill": loaders.load_eval_choices()["chosen"]["jacap_obs"]}


def _rows(spec, factor, cells, docs, *, split="dev"):
    rng = np.random.default_rng(0)
    base = {d: float(rng.uniform(0.01, 0.1)) for d in docs}  # the same KL per document in every call
    return [{"doc": d, "length": L, "ratio": c, "method": spec, "kl": base[d] * factor(i), "split": split}
            for (L, c) in cells for i, d in enumerate(docs)]


def test_ratios_are_the_paired_geometric_means_and_judged_together():
    specs, docs = _specs(), [f"d{i}" for i in range(8)]
    cells = [(512, 0.5), (512, 0.95)]
    rows = {"context": _rows(specs["context"], lambda i: 0.5, cells, docs),
            "peers": _rows(specs["kvzip"], lambda i: 1.0, cells, docs) + _rows("kvzip", lambda i: 9.0, cells, docs,
                                                                                split="tune"),
            "first": _rows(specs["one_prefill"], lambda i: 2.0 ** (i % 2), cells, docs[:6])}
    out = FD.summarize_field(rows, specs, seed=1)
    assert out["m"] == 3 * 2 and math.isclose(out["confidence"], 1 - 0.05 / 6)
    by = {(b["setting"], b["reference"]): {(r["length"], r["ratio"]): r for r in b["cells"]} for b in out["comparisons"]}
    assert by["context", "kvzip"][512, 0.5]["gm_ratio"] == pytest.approx(0.5)  # the tune row is not a dev row
    assert by["context", "kvzip"][512, 0.5]["n"] == 8 and by["context", "kvzip"][512, 0.5]["wins"] == 8
    # one_prefill / kvzip on 6 documents: three at 1, three at 2 -> 2 ** (1/2)
    assert by["one_prefill", "kvzip"][512, 0.5]["gm_ratio"] == pytest.approx(2 ** 0.5)
    assert by["context", "one_prefill"][512, 0.5]["gm_ratio"] == pytest.approx(0.5 / 2 ** 0.5)
    # the 64-token window and 4 sinks hold more than the 25 tokens a 512-token prompt keeps at c = 0.95
    assert by["context", "kvzip"][512, 0.95]["protection_fills"] == ["context"]
    assert by["context", "kvzip"][512, 0.5]["protection_fills"] == []
    assert out["no_higher"]["context/kvzip"] == {"cells": 2, "of": 2}
    assert out["no_higher"]["one_prefill/kvzip"] == {"cells": 0, "of": 2}


def test_cells_without_three_paired_documents_are_listed_not_judged():
    specs, docs = _specs(), ["a", "b", "c"]
    rows = {"context": _rows(specs["context"], lambda i: 1.0, [(512, 0.5)], docs),
            "peers": _rows(specs["kvzip"], lambda i: 1.0, [(512, 0.5)], docs[:2]),
            "first": _rows(specs["one_prefill"], lambda i: 1.0, [(512, 0.5)], docs)}
    out = FD.summarize_field(rows, specs)
    assert out["m"] == 1 and [b["setting"] + "/" + b["reference"] for b in out["comparisons"]] == ["context/one_prefill"]
    assert {(m["setting"], m["reference"], m["documents"]) for m in out["cells_missing"]} == {
        ("context", "kvzip", 2), ("one_prefill", "kvzip", 2)}
    with pytest.raises(ValueError, match="jacap evaluate dev"):
        FD.summarize_field({"context": rows["context"]}, specs)


def test_settings_name_each_roles_tune_choice():
    first, context = loaders.load_eval_choices(), loaders.load_eval_choices(space="context")
    peers = loaders.load_eval_choices(space="peers")
    specs = FD.settings({"first": first, "context": context, "peers": peers})
    assert specs == {"context": context["chosen"]["jacap"], "kvzip": "kvzip",
                     "one_prefill": first["chosen"]["jacap_obs"]}
    with pytest.raises(ValueError, match="--space context"):
        FD.settings({"first": first, "peers": peers})


def test_field_frame_prints_each_comparison_per_cell_and_marks_protection():
    from jacap_lib.viz.field import field_frame

    specs, docs = _specs(), [f"d{i}" for i in range(8)]
    cells = [(512, 0.5), (512, 0.95)]
    rows = {"context": _rows(specs["context"], lambda i: 0.5, cells, docs),
            "peers": _rows(specs["kvzip"], lambda i: 1.0, cells, docs),
            "first": _rows(specs["one_prefill"], lambda i: 1.0, cells, docs)}
    frame = field_frame(FD.summarize_field(rows, specs, seed=1))
    assert list(frame.columns) == ["default / KVzip", "prompt press / KVzip", "default / prompt press"]
    assert list(frame.index) == ["512 / 0.5", "512 / 0.95"]
    assert frame.loc["512 / 0.5", "default / KVzip"] == "0.50 better"  # 8 of 8 documents halve their KL
    assert frame.loc["512 / 0.95", "default / KVzip"] == "0.50 better (p)"
    assert frame.loc["512 / 0.5", "prompt press / KVzip"] == "1.00 identical"


def _needle(spec, correct, mode="after", L=512, c=0.5):
    return [{"length": L, "depth": 0.5, "trial": t, "key": str(10000 + t), "method": spec, "ratio": c, "mode": mode,
             "correct": bool(x)} for t, x in enumerate(correct)]


def test_needle_pairs_prompts_and_counts_discordant_ones():
    from scipy.stats import binomtest

    specs = _specs()
    rows = {"context": _needle(specs["context"], [1] * 10) + _needle(specs["context"], [1, 0], mode="inside"),
            "peers": _needle(specs["kvzip"], [1, 1] + [0] * 8) + _needle("full", [1] * 10, c=0.0),
            "first": _needle(specs["one_prefill"], [0] * 10)}
    out = FD.summarize_needle(rows, specs)
    cell = out["modes"]["after"]["cells"][0]
    assert cell["uncompressed"] == 1.0 and cell["accuracy"]["kvzip"]["accuracy"] == pytest.approx(0.2)
    by = {(t["setting"], t["reference"]): t for t in cell["comparisons"]}
    assert (by["context", "kvzip"]["wins"], by["context", "kvzip"]["losses"]) == (8, 0)
    assert by["context", "kvzip"]["p_mcnemar"] == pytest.approx(binomtest(8, 8, 0.5).pvalue)
    assert (by["one_prefill", "kvzip"]["wins"], by["one_prefill", "kvzip"]["losses"]) == (0, 2)
    # inside: only the context press has rows, so nothing is paired there; Holm counts the 3 after-mode tests
    assert out["m"] == 3 and out["modes"]["inside"]["cells"][0]["comparisons"] == []
    # Holm: context / one_prefill (10 of 10, the smallest p) is multiplied by 3, this second-smallest by 2
    assert by["context", "kvzip"]["p_holm"] == pytest.approx(2 * binomtest(8, 8, 0.5).pvalue)
    assert by["context", "kvzip"]["verdict"] == "better"


def test_needle_frame_prints_accuracies_and_won_lost_counts():
    from jacap_lib.viz.field import needle_frame

    specs = _specs()
    rows = {"context": _needle(specs["context"], [1] * 10),
            "peers": _needle(specs["kvzip"], [1, 1] + [0] * 8) + _needle("full", [1] * 9 + [0], c=0.0),
            "first": _needle(specs["one_prefill"], [0] * 10)}
    summary = FD.summarize_needle(rows, specs)
    row = needle_frame(summary).loc[("after", "512 / 0.5")]
    assert row["uncompressed"] == "90"
    # Wilson interval of 2 of 10 at 95 %: [5.7 %, 51.0 %]
    assert row["KVzip"] == "20 [6, 51]" and row["default"].startswith("100 [")
    row = needle_frame(summary, "comparisons").loc[("after", "512 / 0.5")]
    assert row["default vs KVzip"] == "8-0 better"
    assert row["prompt press vs KVzip"] == "0-2 n.d."
    assert needle_frame({"modes": {}, "m": 0}).empty
    with pytest.raises(ValueError, match="part"):
        needle_frame(summary, "both")


def test_cost_ratio_sums_a_prompts_ratios_then_takes_the_geometric_mean_over_documents():
    specs = _specs()

    def rows(spec, seconds):  # seconds[doc] = the CPU seconds of each of the prompt's two ratios
        return [{"doc": d, "length": 512, "ratio": c, "method": spec, "kl": 0.1, "split": "dev", "cpu_seconds": s}
                for d, s in seconds.items() for c in (0.5, 0.9)]

    out = FD.summarize_cost({"context": rows(specs["context"], {"a": 3.0, "b": 8.0}),
                             "peers": rows(specs["kvzip"], {"a": 1.0, "b": 2.0}),
                             "first": rows(specs["one_prefill"], {"a": 0.5})}, specs)
    (block,) = out["lengths"]
    by = {(c["setting"], c["reference"]): c for c in block["comparisons"]}
    assert by["context", "kvzip"]["ratio"] == pytest.approx(math.sqrt(3 * 4)) and by["context", "kvzip"]["n"] == 2
    # the one-prefill press replays a captured prefill its rows do not hold: its cost is not compared
    assert set(by) == {("context", "kvzip")}


def _field_rows(spec, kl, docs, cells=((512, 0.5), (512, 0.9)), split="dev"):
    """Dev rows of one setting; ``kl(doc_index, cell_index)`` is each row's KL."""
    return [{"doc": d, "length": L, "ratio": c, "method": spec, "kl": kl(i, j), "split": split}
            for j, (L, c) in enumerate(cells) for i, d in enumerate(docs)]


def test_field_table_ratios_are_paired_geometric_means_to_kvzip_and_sorted():
    docs = ["a", "b", "c", "d"]
    chosen = {"peers": {"kvzip": "kvzip", "cur": "cur[local_window_size=2]", "lagkv": "lagkv[lag_size=16]"},
              "first": {"snapkv": "snapkv[window_size=16]", "knorm": "knorm"}}
    ref = lambda i, j: 0.01 * (i + 1)  # noqa: E731
    rows = {"peers": _field_rows("kvzip", ref, docs) + _field_rows("kvzip", lambda i, j: 5.0, docs, split="tune")
            # cur: twice KVzip's KL in the first cell, half in the second, and a KL of 0 (floored) on one document
            + _field_rows("cur[local_window_size=2]", lambda i, j: ref(i, j) * (2.0 if j == 0 else 0.5), docs)
            # lagkv: three times KVzip's, one document missing in the second cell
            + [r for r in _field_rows("lagkv[lag_size=16]", lambda i, j: 3 * ref(i, j), docs)
               if not (r["doc"] == "d" and r["ratio"] == 0.9)],
            "first": _field_rows("snapkv[window_size=16]", lambda i, j: 0.0 if i == 0 else ref(i, j), docs)}
    out = FD.field_table(rows, chosen)
    by = {m["method"]: m for m in out["methods"]}
    assert out["reference_spec"] == "kvzip" and out["missing"] == [{"method": "knorm", "space": "first", "spec": "knorm"}]
    assert by["cur"]["cells"][0]["gm_ratio"] == pytest.approx(2.0) and by["cur"]["cells"][1]["gm_ratio"] == pytest.approx(0.5)
    assert by["cur"]["gm_ratio"] == pytest.approx(1.0) and by["cur"]["cells_lower"] == 1 and by["cur"]["complete"]
    # the tune rows of KVzip (KL 5) are not dev rows: KVzip against itself is 1 in every cell
    assert by["kvzip"]["gm_ratio"] == pytest.approx(1.0)
    assert by["lagkv"]["complete"] is False and by["lagkv"]["cells"][1]["n"] == 3
    assert by["lagkv"]["gm_ratio"] == pytest.approx(3.0)
    # snapkv: KL 0 on document a is floored at the rule's floor, 1e-8, against KVzip's 0.01
    expected = math.exp((math.log(1e-8 / 0.01) + 0.0 * 3) / 4)
    assert by["snapkv"]["cells"][0]["gm_ratio"] == pytest.approx(expected)
    assert by["snapkv"]["cells"][0]["gm_kl"] == pytest.approx(math.exp(
        (math.log(1e-8) + math.log(0.02) + math.log(0.03) + math.log(0.04)) / 4))
    assert [m["method"] for m in out["methods"]] == ["snapkv", "cur", "kvzip", "lagkv"]
    with pytest.raises(ValueError, match="reference"):
        FD.field_table(rows, chosen, reference="tova")
    with pytest.raises(ValueError, match="jacap evaluate dev --space peers --methods kvzip"):
        FD.field_table({"first": rows["first"]}, chosen)


def test_field_needle_pools_lengths_per_mode_and_c():
    chosen = {"peers": {"kvzip": "kvzip"}, "first": {"knorm": "knorm"}}
    rows = {"peers": _needle("kvzip", [1] * 6 + [0] * 4) + _needle("kvzip", [1] * 10, L=1024)
            + _needle("kvzip", [0] * 10, mode="inside") + _needle("full", [1] * 10, c=0.0)
            # a first-space setting in the peers' file is not the peers' choice: left out
            + _needle("knorm", [1] * 10),
            "first": _needle("knorm", [0] * 10) + _needle("full", [1] * 9 + [0], c=0.0)}
    out = FD.field_needle(rows, chosen)
    after = out["modes"]["after"]
    (kv,) = after["methods"]["kvzip"]
    assert kv["n"] == 20 and kv["accuracy"] == pytest.approx(16 / 20) and kv["low"] < 0.8 < kv["high"]
    assert after["methods"]["knorm"] == [{"ratio": 0.5, "accuracy": 0.0, "low": 0.0, "high": pytest.approx(0.2775, abs=1e-3),
                                          "n": 10}]
    # the first space's uncompressed answers come first: 9 of 10
    assert after["uncompressed"] == [{"length": 512, "accuracy": 0.9, "n": 10}]
    assert out["modes"]["inside"]["methods"]["kvzip"][0]["accuracy"] == 0.0
    assert after["partial"] == {} and out["modes"]["inside"]["partial"] == {}
    # a run still going: the uncompressed model answered 10 inside prompts at 512; KVzip has 4 of them at c = 0.5
    # and all 10 at c = 0.75 -> KVzip is left out of the inside mode (methods and cells), its 14 rows counted
    rows["peers"] += _needle("full", [1] * 10, mode="inside", c=0.0) + _needle("kvzip", [1] * 10, mode="inside",
                                                                              c=0.75)
    rows["peers"] = [r for r in rows["peers"] if not (r["mode"] == "inside" and r["ratio"] == 0.5 and r["trial"] > 3)]
    inside = FD.field_needle(rows, chosen)["modes"]["inside"]
    assert inside["methods"] == {} and inside["cells"] == {} and inside["partial"] == {"kvzip": 14}
    assert inside["uncompressed"] == [{"length": 512, "accuracy": 1.0, "n": 10}]
    assert FD.field_needle(rows, chosen)["modes"]["after"] == after  # the other mode is untouched
    # a run stopped between two prompt lengths: the peers' uncompressed model also answered 10 prompts at 1,024 with
    # the question after, where KVzip has rows at 512 only -> KVzip is still running there, not complete at 512
    stopped = {**rows, "peers": [r for r in rows["peers"] if not (r["method"] == "kvzip" and r["length"] == 1024)]
               + _needle("full", [1] * 10, L=1024, c=0.0)}
    after2 = FD.field_needle(stopped, chosen)["modes"]["after"]
    assert "kvzip" not in after2["methods"] and after2["partial"] == {"kvzip": 10}
    assert after2["methods"]["knorm"] == after["methods"]["knorm"]  # the first space's file asked 512 only
    # with its 1,024 rows back KVzip is complete again, its 20 prompts pooled
    back = FD.field_needle({**stopped, "peers": stopped["peers"] + _needle("kvzip", [1] * 10, L=1024)}, chosen)
    assert back["modes"]["after"]["partial"] == {} and back["modes"]["after"]["methods"]["kvzip"][0]["n"] == 20


def test_field_figures_draw_complete_methods_and_name_the_rest():
    from jacap_lib.viz.field import field_heatmap, field_needle_frame, field_needle_note

    docs = ["a", "b", "c"]
    chosen = {"peers": {"kvzip": "kvzip", "cur": "cur[local_window_size=2]"},
              "first": {"knorm": "knorm", "tova": "tova"}}
    rows = {"peers": _field_rows("kvzip", lambda i, j: 0.1, docs)
            + _field_rows("cur[local_window_size=2]", lambda i, j: 0.4, docs[:2]),
            "first": _field_rows("knorm", lambda i, j: 0.05, docs)}
    table = FD.field_table(rows, chosen)
    fig = field_heatmap(table)
    (trace,) = fig.data
    assert list(trace.y) == ["KVzip (1.00)", "KNorm (0.50)"]  # best at the top: plotly's last row
    assert trace.z[1][0] == pytest.approx(-1.0) and trace.text[1][0] == "0.50"
    note = fig.layout.annotations[-1].text
    assert "cur" in note and "tova" in note
    with pytest.raises(ValueError, match="complete"):
        field_heatmap({**table, "methods": [m for m in table["methods"] if not m["complete"]]})
    needle = FD.field_needle({"peers": _needle("kvzip", [1] * 3 + [0]) + _needle("full", [1] * 4, c=0.0)}, chosen)
    frame = field_needle_frame(needle)
    assert frame.loc["uncompressed", ("question after", "c = 0.5")] == "100"
    assert frame.loc["KVzip", ("question after", "c = 0.5")] == "75"
    assert field_needle_frame({"modes": {}}).empty
    assert field_needle_note(needle).startswith("No method is left out")
    # KVzip still answering with the question inside: named under the table with its rows so far, not in it
    needle = FD.field_needle({"peers": _needle("kvzip", [1] * 3 + [0]) + _needle("full", [1] * 4, c=0.0)
                              + _needle("full", [1] * 4, c=0.0, mode="inside")
                              + _needle("kvzip", [1, 1], mode="inside")}, chosen)
    assert field_needle_note(needle) == ("Left out where its prompts are not all answered yet: KVzip (2 answers so "
                                         "far with the question inside).")
    assert field_needle_frame(needle).loc["KVzip", ("question inside", "c = 0.5")] == ""


def test_field_points_pair_each_cells_kl_ratio_with_its_needle_accuracy():
    from jacap_lib.viz.plane import kl_retrieval_figure

    docs = ["a", "b", "c"]
    chosen = {"peers": {"kvzip": "kvzip", "cur": "cur[local_window_size=2]"}, "first": {"knorm": "knorm"}}
    cells = ((512, 0.5), (1024, 0.5))
    rows = {"peers": _field_rows("kvzip", lambda i, j: 0.1, docs, cells)
            + _field_rows("cur[local_window_size=2]", lambda i, j: 0.4, docs[:2], cells),  # incomplete: no point
            "first": _field_rows("knorm", lambda i, j: 0.05 * (j + 1), docs, cells)}
    # each space's file asks its own prompt lengths: the peers' 512, the first space's 1,024
    needle = {"peers": _needle("kvzip", [1, 1, 1, 0]) + _needle("full", [1] * 4, c=0.0)
              + _needle("cur[local_window_size=2]", [1] * 4),
              "first": _needle("knorm", [1, 0, 0, 0], L=1024) + _needle("full", [1, 1, 0, 0], L=1024, c=0.0)}
    summary = {"table": FD.field_table(rows, chosen), "needle_table": FD.field_needle(needle, chosen)}
    points = FD.field_points(summary)
    by = {(p["family"], p["length"]): p for p in points}
    assert set(by) == {("kvzip", 512), ("knorm", 1024)}  # knorm has no needle rows at 512; cur is incomplete
    assert by["knorm", 1024]["kl_ratio"] == pytest.approx(1.0) and by["knorm", 1024]["accuracy"] == 0.25
    assert by["knorm", 1024]["full_accuracy"] == 0.5 and by["kvzip", 512]["correct"] == 3
    assert by["kvzip", 512]["reference_name"] == "KVzip" and by["knorm", 1024]["name"] == "KNorm"
    fig = kl_retrieval_figure(points)
    assert {tr.name for tr in fig.data if tr.mode == "markers"} == {"KVzip", "KNorm"}
    assert FD.field_points({**summary, "needle_table": {"modes": {}}}) == []


def test_target_lines_read_the_worst_cell_the_lowest_accuracy_and_the_cost():
    spec = "jacap[budget=global,window=64]"
    cells = [{"length": 512, "ratio": 0.5, "gm_ratio": 0.8}, {"length": 2048, "ratio": 0.9, "gm_ratio": 1.3}]
    acc = lambda a: {"context": {"accuracy": a}}  # noqa: E731
    summary = {"settings": {"context": spec},
               "comparisons": [{"setting": "one_prefill", "reference": "kvzip", "cells": [{"gm_ratio": 9.0}]},
                               {"setting": "context", "reference": "kvzip", "cells": cells}],
               "no_higher": {"context/kvzip": {"cells": 1, "of": 2}},
               "needle": {"modes": {"inside": {"cells": [{"ratio": 0.5, "accuracy": acc(0.9)},
                                                         {"ratio": 0.9, "accuracy": acc(0.1)}]},  # c > 0.75: left out
                                    "after": {"cells": [{"ratio": 0.5, "accuracy": acc(1.0)},
                                                        {"ratio": 0.75, "accuracy": acc(0.85)},
                                                        {"ratio": 0.5, "accuracy": {}}]}}},  # not measured there
               "cost": {"lengths": [{"length": 512, "comparisons": [{"ratio": 1.234, "n": 3}]}]}}
    assert FIE.target_lines(summary) == [
        "default JacapPress() against KVzip, dev documents:",
        "  KL at most KVzip's: 1 of 2 cells (worst 1.30x, prompt 2048, c = 0.9)",
        "  needle, question after: lowest accuracy at c <= 0.75 is 85 %",
        "  needle, question inside: lowest accuracy at c <= 0.75 is 90 %",
        "  CPU time at prompt 512: 1.23x KVzip's (3 documents)"]
