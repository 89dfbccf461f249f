"""The KL–retrieval plane (results.plane, viz.plane) against independent computations from the committed rows:
a geometric mean recomputed by hand from dev.jsonl, accuracies counted from needle.jsonl and needle_probe.jsonl,
the Jacap settings' ratios against summary.json, and the figure's traces, colours and axes."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from jacap_lib.experiments import plane as PL
from jacap_lib.report import plane as PLA

EVAL = Path(__file__).resolve().parents[1] / "data" / "results" / "eval"
CELL = (1024, 0.75)


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (EVAL / name).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def points():
    return PL.kl_retrieval_points()


@pytest.fixture(scope="module")
def choices():
    return json.loads((EVAL / "choices.json").read_text())


def _point(points, spec, length, ratio):
    (p,) = [p for p in points if p["spec"] == spec and p["length"] == length and math.isclose(p["ratio"], ratio)]
    return p


def _hand_ratio(spec, ref, length, ratio):
    """exp(mean over the documents of log KL(spec) - log KL(ref)), from the raw lines of dev.jsonl."""
    kl = {}
    for r in _jsonl("dev.jsonl"):
        if r["length"] == length and r["ratio"] == ratio and r["method"] in (spec, ref):
            kl.setdefault(r["method"], {})[r["doc"]] = max(r["kl"], 1e-8)
    docs = sorted(set(kl[spec]) & set(kl[ref]))
    return math.exp(sum(math.log(kl[spec][d]) - math.log(kl[ref][d]) for d in docs) / len(docs)), len(docs)


def _hand_accuracy(spec, length, ratio, name="needle.jsonl", mode="after"):
    """Share of the distinct prompts (depth, trial, key) answered right, counted from the raw lines."""
    got = {}
    for r in _jsonl(name):
        if (r["method"] == spec and r["length"] == length and r.get("mode", "after") == mode
                and (spec == "full" or r["ratio"] == ratio)):
            got[(r["depth"], r["trial"], r["key"])] = bool(r["correct"])
    return sum(got.values()) / len(got), len(got)


def test_one_point_by_hand(points, choices):
    L, c = CELL
    ref = choices["best_baseline"]["cells"][f"{L}/{c}"]["spec"]
    p = _point(points, "keydiff", L, c)
    ratio, n = _hand_ratio("keydiff", ref, L, c)
    assert p["reference_spec"] == ref and p["reference"].startswith("the best baseline by KL")
    assert p["kl_ratio"] == pytest.approx(ratio, rel=1e-12) and p["n_docs"] == n == 48
    acc, n_prompts = _hand_accuracy("keydiff", L, c)
    assert p["accuracy"] == pytest.approx(acc) and p["n_prompts"] == n_prompts == 20
    assert p["full_accuracy"] == pytest.approx(_hand_accuracy("full", L, c)[0])
    assert p["family"] == "keydiff" and p["name"] == "KeyDiff" and p["split"] == "dev"
    # the reference itself sits at x = 1, and its accuracy is counted like any other
    r = _point(points, ref, L, c)
    assert r["kl_ratio"] == pytest.approx(1.0, abs=1e-15)
    assert r["accuracy"] == pytest.approx(_hand_accuracy(ref, L, c)[0])


def test_every_point_of_one_cell_by_hand(points, choices):
    L, c = 512, 0.9
    ref = choices["best_baseline"]["cells"][f"{L}/{c}"]["spec"]
    cell = PL.cell_points(points, L, c)
    assert len(cell) == len(json.loads((EVAL / "needle_summary.json").read_text())["config"]["settings"])
    for p in cell:
        assert p["kl_ratio"] == pytest.approx(_hand_ratio(p["spec"], ref, L, c)[0], rel=1e-12), p["spec"]
        assert p["accuracy"] == pytest.approx(_hand_accuracy(p["spec"], L, c)[0]), p["spec"]


def test_jacap_ratios_are_the_summarys(points):
    summary = json.loads((EVAL / "summary.json").read_text())
    checked = 0
    for fam in summary["families"]:
        if fam["picked_on"] != "tune":
            continue
        for r in fam["rows"]:
            ps = [p for p in points if p["spec"] == fam["setting"] and p["length"] == r["length"]
                  and math.isclose(p["ratio"], r["ratio"])]
            if ps:
                assert ps[0]["kl_ratio"] == pytest.approx(r["gm_ratio"], rel=1e-4)
                assert ps[0]["reference_spec"] == r["baseline_spec"]
                checked += 1
    assert checked == 5 * 9  # five Jacap families x the nine needle cells


def test_question_inside_counted_from_the_probe(points):
    L, c = 1024, 0.5
    tuned = json.loads((EVAL / "choices.json").read_text())["chosen"]["jacap_prompt"]
    p = _point(points, tuned, L, c)
    inside, n = _hand_accuracy(tuned, L, c, "needle_probe.jsonl", "inside")
    after, _ = _hand_accuracy(tuned, L, c, "needle_probe.jsonl", "after")
    assert p["name"] == "Algorithm 1 tuned"
    assert p["accuracy_inside"] == pytest.approx(inside) and p["n_prompts_inside"] == n
    assert p["probe_after_accuracy"] == pytest.approx(after) and inside > after
    assert p["inside_verdict"] == "better"
    # a cell or a setting the probe did not measure has no inside value
    assert _point(points, tuned, 1024, 0.9)["accuracy_inside"] is None
    assert _point(points, "knorm", L, c)["accuracy_inside"] is None
    assert all(q["accuracy_inside"] is None for q in PL.kl_retrieval_points(probe={}))


def test_named_reference(points, choices):
    L, c = CELL
    tova = choices["chosen"]["tova"]
    named = PL.kl_retrieval_points(reference=tova, probe={})
    p = _point(named, "keydiff", L, c)
    assert p["reference_spec"] == tova and p["reference"] == "TOVA"  # a kvpress press by its reader name
    assert p["kl_ratio"] == pytest.approx(_hand_ratio("keydiff", tova, L, c)[0], rel=1e-12)
    # the same documents: a ratio to tova is the ratio to the best baseline divided by tova's
    assert p["kl_ratio"] == pytest.approx(_point(points, "keydiff", L, c)["kl_ratio"]
                                          / _point(points, tova, L, c)["kl_ratio"], rel=1e-9)
    with pytest.raises(ValueError, match="no dev rows"):
        PL.kl_retrieval_points(reference="tova[made_up=1]", probe={})


def test_names_follow_the_glossary(points, choices):
    names = {p["spec"]: p["name"] for p in points}
    assert names[choices["chosen"]["jacap_prompt"]] == "Algorithm 1 tuned"
    assert names[choices["chosen"]["jacap_obs"]] == "JacapPromptPress()"  # plain text for the figure
    prose = {p["spec"]: p["prose_name"] for p in points}  # for a sentence
    assert prose[choices["chosen"]["jacap_obs"]] == "the prompt press `JacapPromptPress()`"
    assert prose[choices["chosen"]["jacap_ea"]] == "`jacap_ea`" and names[choices["chosen"]["jacap_ea"]] == "jacap_ea"
    assert "Algorithm 1 as published" in names.values()
    assert names[choices["chosen"]["snapkv"]] == "SnapKV"
    assert len(set(names.values())) == len(names)


def test_answer_lines_count_from_the_points(points):
    lines = PLA.answer_lines(points)
    assert 3 <= len(lines) <= 4
    cells = {p["cell"] for p in points}
    ref_acc = {p["accuracy"] for p in points if p["spec"] == p["reference_spec"]}
    assert ref_acc == {0.0} and "finds it in 0 % of them" in lines[0] and "Expected Attention" in lines[0]
    # the lowest-KL setting of each cell against the cell's best accuracy, counted here independently
    n = sum(min(ps, key=lambda p: p["kl_ratio"])["accuracy"] == max(p["accuracy"] for p in ps)
            for ps in ([p for p in points if p["cell"] == k] for k in cells))
    assert lines[1].startswith(f"In {n} of the {len(cells)} cells")
    assert "KeyDiff finds it most often" in lines[2]


def test_figure(points):
    from jacap_lib.viz import plane as VP
    from jacap_lib.viz.style import METHOD_STYLES

    fig = VP.kl_retrieval_figure(points)
    markers = [t for t in fig.data if t.mode == "markers"]
    assert len(markers) == len(points)  # one marker per point, nothing dropped
    shown = [t.name for t in markers if t.showlegend]
    assert len(shown) == len(set(shown)) == len({p["spec"] for p in points})
    assert {"Algorithm 1 tuned", "Algorithm 1 as published", "JacapPromptPress()", "KeyDiff"} <= set(shown)
    tuned = next(t for t in markers if t.name == "Algorithm 1 tuned")
    assert tuned.marker.color == METHOD_STYLES["jacap_prompt[centre=tempered,tau=3,window=128]"][0]
    assert next(t for t in markers if t.name == "JacapPromptPress()").marker.color == METHOD_STYLES["jacap_obs"][0]
    assert next(t for t in markers if t.name == "KeyDiff").marker.color == METHOD_STYLES["keydiff"][0]
    colours = {t.name: t.marker.color for t in markers}
    assert len(set(colours.values())) == len(colours)  # one colour per method
    # a marker's coordinates are its point's
    p = _point(points, "keydiff", *CELL)
    assert any(t.x[0] == p["kl_ratio"] and t.y[0] == 100 * p["accuracy"] for t in markers if t.name == "KeyDiff")
    layout = fig.layout
    axes = [k for k in layout.to_plotly_json() if k.startswith("xaxis")]
    assert len(axes) == 9 and all(layout[a].type == "log" for a in axes)
    assert layout.xaxis.tickvals and 1 in layout.xaxis.tickvals  # readable round ticks, 1 among them
    ones = [t for t in fig.data if t.mode == "lines" and list(t.x) == [1, 1]]
    fulls = [t for t in fig.data if t.legendgroup == "full"]
    assert len(ones) == len(fulls) == 9 and all(list(t.y) == [100.0, 100.0] for t in fulls)
    texts = " ".join(a.text for a in layout.annotations)
    assert "dev documents" in texts and "exploratory" in texts and "KL ratio to Expected Attention" in texts
    assert layout.legend.y < 0 and layout.margin.b > 22 * 4  # the legend under the panels, with room for it
    one = VP.kl_retrieval_figure(points, lengths=[1024])
    assert len([t for t in one.data if t.mode == "markers"]) == len(PL.cell_points(points, 1024, 0.5)) * 3
    with pytest.raises(ValueError, match="no point"):
        VP.kl_retrieval_figure(points, lengths=[4096])
    with pytest.raises(ValueError, match="empty"):
        VP.kl_retrieval_figure([])
    with pytest.raises(ValueError, match="points: they mix"):  # one figure, one run's documents
        VP.kl_retrieval_figure(points[:1] + [dict(points[1], split="confirm")])


def test_planes_of_different_runs_never_share_a_title(points):
    """The facts chapter's plane (dev documents, each cell's best baseline) and the landing page's (confirmatory
    documents, KVzip) name their reference and documents in their default titles, so their titles differ."""
    from jacap_lib.report import landing
    from jacap_lib.viz.plane import kl_retrieval_figure

    dev, confirm = kl_retrieval_figure(points), kl_retrieval_figure(landing.plane_points(), lengths=[1024])
    texts = [f.layout.title.text.replace("<br>", " ") for f in (dev, confirm)]
    assert texts[0] != texts[1]
    assert "dev documents" in texts[0] and "confirmatory documents" in texts[1] and "KVzip" in texts[1]
