"""The reading of the losing cells that the critique chapter and the appendix print: loss rows, kind counts, the swap's
and the ladder's adjusted verdicts, the book's names, the ablation counts, the figures' labels and colours, and the
chapter's exercises 3 and 4 — each against an independent computation from the committed files."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from jacap_lib import exercises as E
from jacap_lib.presses.registry import press_from_spec
from jacap_lib.experiments import anatomy as A
from jacap_lib.report import findings as F
from jacap_lib.experiments import names as N
from jacap_lib.results import loaders as R
from jacap_lib.experiments.protocol import rules as P
from jacap_lib.experiments import record as RC
from jacap_lib.verdicts import rows as RS
from jacap_lib.viz import anatomy as VA
from jacap_lib.viz.style import METHOD_STYLES

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "data" / "results" / "eval"
CHAPTERS = ROOT / "book" / "chapters"


@pytest.fixture(autouse=True)
def _not_in_build(monkeypatch):
    monkeypatch.delenv("JACAP_BOOK_BUILD", raising=False)


@pytest.fixture(scope="module")
def anatomy():
    return json.loads((EVAL / "anatomy.json").read_text())


@pytest.fixture(scope="module")
def summary():
    return json.loads((EVAL / "summary.json").read_text())


@pytest.fixture(scope="module")
def alg1():
    return json.loads((EVAL / "choices.json").read_text())["chosen"]["jacap_prompt"]


def _family(summary, role):
    return next(f for f in summary["families"] if f["role"] == role and f["picked_on"] == "tune")


def _kept(length, ratio):
    return int(math.floor((1 - ratio) * length + 1e-9))  # kvpress: floor((1 - c) L)


def test_loss_rows_list_every_losing_cell_and_whether_protection_fills_it(summary, alg1):
    fam = _family(summary, "algorithm 1")
    rows = A.loss_rows(fam)
    expect = [r for r in fam["rows"] if r["verdict"].startswith("worse") or r["verdict_unadjusted"].startswith("worse")]
    assert [(r["length"], r["ratio"]) for r in rows] == [(r["length"], r["ratio"]) for r in expect]
    press = press_from_spec(alg1, 0.5)
    protected = press.n_sink + press.window
    for r in rows:
        kept = _kept(r["length"], r["ratio"])
        assert r["kept"] == kept
        assert r["fills"] == (kept <= protected)
        assert r["scored"] == max(0, kept - protected)
        assert (r["scored"] == 0) == r["fills"]
    assert any(r["fills"] for r in rows) and not all(r["fills"] for r in rows)
    frame = VA.loss_frame(rows)
    said = ["protection fills the budget" in v for v in frame["tokens the score chooses"]]
    assert said == [r["fills"] for r in rows]
    assert "against" not in frame.columns  # one baseline, Expected Attention, in every cell: named in the text
    assert {N.spec_name(r["baseline"]) for r in rows} == {"Expected Attention"}


def test_the_default_never_fills_its_budget_where_it_loses(summary):
    role = RS.default_role(summary)
    rows = A.loss_rows(_family(summary, role))
    assert rows and not any(r["fills"] for r in rows)
    assert all(r["scored"] == r["kept"] - 20 for r in rows)  # 4 sinks + a 16-token window


def test_kind_counts_against_a_recount(anatomy):
    counts = A.kind_counts(anatomy)
    cells = anatomy["kinds"]
    for kind, k in counts.items():
        largest = sum(max((x for x in c["kinds"] if x["kind"] != "all"), key=lambda x: x["ratio"])["kind"] == kind
                      for c in cells)
        above = sum(next(x for x in c["kinds"] if x["kind"] == kind)["low"] > 1 for c in cells)
        assert (k["largest"], k["above"], k["cells"]) == (largest, above, len(cells))
    assert sum(k["largest"] for k in counts.values()) == len(cells)
    assert "all" not in counts
    # the findings line says the same of dialogue
    d = counts["dialogue"]
    assert F.kind_lines(anatomy)[-1] == (f"dialogue has the largest ratio in {d['largest']} of {d['cells']} losing "
                                         f"cells; its interval lies above 1 in {d['above']}")


def test_swap_verdicts_are_the_adjusted_ones_and_named_in_words(anatomy):
    docs = anatomy["documents"]
    rows = A.swap_verdicts(docs)
    keys = [k for k in docs[0]["kl"] if k != "default" and k not in RS.LADDER_ONLY]
    assert {r["key"] for r in rows} == set(keys)
    assert {r["group"] for r in rows} == {"all documents", "dialogue", "other kinds"}
    plain = {(r["key"]): r for r in RS.swap_ratios(docs)}
    for r in (x for x in rows if x["group"] == "all documents"):
        p = plain[r["key"]]
        assert r["low"] <= p["low"] + 1e-12 and r["high"] >= p["high"] - 1e-12  # adjusted: wider
        assert r["name"] == A.SWAP_NAMES[r["key"]] and "_" not in r["name"]
        # the estimate is the geometric mean of the per-document ratios
        x = np.array([d["kl"][r["key"]]["kl"] for d in docs])
        y = np.array([d["kl"]["default"]["kl"] for d in docs])
        assert r["ratio"] == pytest.approx(float(np.exp(np.mean(np.log(x / y)))), rel=1e-9)
    lines = F.swap_lines(docs)
    prot = next(r for r in rows if r["group"] == "all documents" and r["key"] == "jacap_baseline_protection")
    assert lines[3].endswith(f"adjusted: {prot['verdict']}")
    assert f"{100 * prot['confidence']:.1f} % interval)" in lines[1]


def test_ladder_rungs_multiply_to_the_whole_distance(anatomy):
    docs = anatomy["documents"]
    rows = A.ladder_verdicts(docs)
    for group, sel in (("all documents", docs), ("dialogue", [d for d in docs if d["kind"] == "dialogue"])):
        rungs = [r for r in rows if r["group"] == group]
        assert [r["key"] for r in rungs] == list(RS.LADDER[1:])
        last = np.array([d["kl"][RS.LADDER[-1]]["kl"] for d in sel])
        first = np.array([d["kl"]["default"]["kl"] for d in sel])
        assert math.prod(r["ratio"] for r in rungs) == pytest.approx(float(np.exp(np.mean(np.log(last / first)))),
                                                                     rel=1e-6)
        assert all(r["n"] == len(sel) for r in rungs)
    assert {r["confidence"] for r in rows} == {1 - 0.05 / (len(RS.LADDER) - 1)}


def test_book_names(alg1, anatomy):
    """The anatomy's settings by findings.spec_name, the one home of the book's names."""
    assert N.spec_name(alg1) == "Algorithm 1 tuned"
    assert N.spec_name(P.PAPER_PRESET) == "Algorithm 1 as published"
    assert N.spec_name(anatomy["library_default"]["setting"], legend=True) == "JacapPromptPress()"
    assert N.spec_name(anatomy["config"]["default"]) == "Algorithm 1 tuned"  # the anatomy's Jacap setting
    assert N.spec_name(anatomy["config"]["baseline"]) == "Expected Attention"
    assert N.spec_name("snapkv[window_size=16]") == "SnapKV"  # SnapKV's tune choice
    assert N.spec_name("jacap_prompt[window=64]") == "`jacap_prompt[window=64]`"  # no book name: its short spec
    with pytest.raises(ValueError, match="spec"):
        N.spec_name("")


def test_ablation_counts_against_the_raw_rows():
    summaries = [json.loads(p.read_text()) for p in sorted(EVAL.glob("ablation*/ablation_summary.json"))]
    summaries.append(json.loads((EVAL / "ablation_summary.json").read_text()))
    loaded = R.load_ablation_summaries()
    assert len(loaded) == len(summaries)
    counts = RC.ablation_counts(loaded)
    copies = RC.ablation_copies(loaded)
    assert copies == {"budget=heads": "budget=layer"}
    assert "budget=heads" not in counts
    raw: dict = {}
    for s in summaries:
        for a in s["ablations"]:
            for r in a["rows"]:
                word = next(w for w in ("better", "worse", "no detectable", "no difference") if r["verdict"].startswith(w))
                raw.setdefault(a["label"], []).append(word)
    for label, k in counts.items():
        assert sum(k.values()) == len(raw[label])
        assert k["better"] == raw[label].count("better") and k["worse"] == raw[label].count("worse")
        assert k["identical"] == raw[label].count("no difference")


def _legend_colours(fig):
    out = {}
    for tr in fig.data:
        if tr.showlegend is not False and tr.name:
            out.setdefault(tr.name, set()).add(tr.marker.color)
    return out


def test_figures_name_settings_as_the_book_does_and_in_their_colours(anatomy):
    a_col = METHOD_STYLES["jacap_prompt[centre=tempered,tau=3,window=128]"][0]
    b_col = METHOD_STYLES["expected_attention"][0]
    forest = VA.swap_forest(anatomy)
    ea_names = {A.SWAP_NAMES["baseline"], A.SWAP_NAMES["baseline_jacap_protection"]}
    for tr in forest.data:
        assert "[" not in (tr.name or "") and all("[" not in str(y) for y in tr.y)
        if tr.x[0] is not None:
            assert tr.marker.color == (b_col if tr.y[0] in ea_names else a_col)
            assert tr.error_x.color == tr.marker.color
    legend = _legend_colours(forest)
    assert len(legend) == 2 and all(len(c) == 1 for c in legend.values())
    assert len({c for cs in legend.values() for c in cs}) == 2
    assert "[" not in forest.layout.title.text
    ladder = VA.ladder_figure(anatomy)
    assert {tr.marker.color for tr in ladder.data} == {a_col, b_col}
    pos = VA.kept_position_figure(anatomy)
    assert {tr.name for tr in pos.data} == {"kept by Algorithm 1 tuned only", "kept by Expected Attention only"}
    for tr in pos.data:
        assert tr.marker.color == (b_col if tr.legendgroup == "b_only" else a_col)
    kinds = VA.kind_figure(anatomy)
    legend = _legend_colours(kinds)
    assert len({c for cs in legend.values() for c in cs}) == len(legend) == 5
    assert "[" not in kinds.layout.title.text and "Expected Attention" in kinds.layout.title.text
    for tr in kinds.data:
        assert tr.error_x.color == tr.marker.color
    assert "[" not in VA.named_layer_figure(anatomy).layout.title.text
    assert "JacapPromptPress()" in VA.kind_figure(anatomy["library_default"]).layout.title.text


def test_ablation_count_figure_stacks_every_cell():
    loaded = R.load_ablation_summaries()
    fig = VA.ablation_count_figure(loaded)
    counts = RC.ablation_counts(loaded)
    totals = {}
    for tr in fig.data:
        for label, x in zip(tr.y, tr.x):
            totals[label] = totals.get(label, 0) + x
    assert totals == {k: sum(v.values()) for k, v in counts.items()}
    assert len({tr.marker.color for tr in fig.data}) == len(fig.data)


def test_exercises_3_and_4_against_a_recount(anatomy, summary, alg1):
    cells = E.data("critique.3")["cells"]
    assert len(cells) == len(anatomy["kinds"])
    wins: dict = {}
    for c in anatomy["kinds"]:
        k = max((x for x in c["kinds"] if x["kind"] != "all"), key=lambda x: x["ratio"])["kind"]
        wins[k] = wins.get(k, 0) + 1
    best = max(wins, key=wins.get)
    assert E.check("critique.3", best) and E.check("critique.3", best.upper())
    for other in set(wins) - {best}:
        assert not E.check("critique.3", other)
    assert "pools" in E.check("critique.3", "all").message
    d = E.data("critique.4")
    press = press_from_spec(alg1, 0.5)
    assert (d["n_sink"], d["window"]) == (press.n_sink, press.window)
    adjusted = [r for r in _family(summary, "algorithm 1")["rows"] if r["verdict"].startswith("worse")]
    assert [(c["length"], c["ratio"]) for c in d["cells"]] == [(r["length"], r["ratio"]) for r in adjusted]
    n = sum(_kept(r["length"], r["ratio"]) <= press.n_sink + press.window for r in adjusted)
    assert E.check("critique.4", n) and not E.check("critique.4", n + 1)
    assert "chooses none" in E.check("critique.4", len(adjusted) - n).message


def test_the_chapter_keeps_its_sections_and_links_the_appendix():
    text = (CHAPTERS / "10_critique.md").read_text()
    appendix = (CHAPTERS / "appendix_record.md").read_text()
    labels = set(re.findall(r"^\(([\w-]+)\)=", text, re.M))
    for moved in ("critique-budget-split", "critique-settings", "critique-heads", "critique-target",
                  "critique-capacity-press", "critique-ea-press", "critique-needle", "critique-needle-digits"):
        assert moved not in labels
    for kept in ("critique", "critique-mechanisms", "critique-noise-rule", "critique-ablations", "critique-losses",
                 "critique-why-documents", "critique-why-layers", "critique-why-tokens", "critique-why-swap",
                 "critique-why-default"):
        assert kept in labels
    used = set(re.findall(r"\{ref\}`(?:[^`<]*<)?(record-[\w-]+)>?`", text))
    defined = set(re.findall(r"^\(([\w-]+)\)=", appendix, re.M))
    assert used and used <= defined
    checked = re.findall(r'exercises\.check\("(critique\.\d+)"', text)
    assert sorted(set(checked)) == sorted(i for i in E.ids() if i.startswith("critique.")) == \
        [f"critique.{n}" for n in range(1, 5)]
