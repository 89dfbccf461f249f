"""The confirmatory summary in words (results.confirm_findings), on a synthetic run with known verdicts: every count
in the answer and the findings is recounted here from the per-document KL ratios and the needle answers, each
sentence of the answer is short, an incomplete run leaves the dev text in place, and a complete one replaces the
landing answer and the findings."""
from __future__ import annotations

import json
import shutil

import pytest

from jacap_lib.report import answer as A
from jacap_lib.report import confirm as CF
from jacap_lib.experiments.confirm import groups as CG
from jacap_lib.experiments.confirm import summary as CS
from jacap_lib.experiments import field as FD
from jacap_lib.report import landing as L
from jacap_lib.report import findings as F
from jacap_lib.results import loaders as R
from jacap_lib.experiments.confirm.plan import SENTENCES
from jacap_lib.experiments.needle import FULL, needle_keys
from jacap_lib.results.paths import data_path

WORKS = {f"d{i}": f"w{i // 2}" for i in range(12)}  # 6 works of 2 excerpts
DESIGN = {"lengths": [512, 1024], "ratios": [0.5], "depths": [0.5], "trials": 4, "modes": ["after"], "seed": 1}
DEFAULT, KVZIP, KVGRAD, EA = "jacap", "kvzip", "kvgrad", "expected_attention"
#: (a, b, purpose, cell, judged); "PROMPT" is the setting JacapPromptPress() builds
PLAN = [(DEFAULT, KVZIP, "the default against kvzip", "512/0.5", True),
        (DEFAULT, KVZIP, "the default against kvzip", "1024/0.5", True),
        (DEFAULT, KVGRAD, "against the best tuned baseline", "512/0.5", True),
        (DEFAULT, EA, "against the best tuned baseline; the default against expected_attention", "1024/0.5", True),
        ("PROMPT", KVGRAD, "against the best tuned baseline", "512/0.5", True),
        ("PROMPT", EA, "against the best tuned baseline", "512/0.95", False)]
#: each setting's KL per cell, as a multiple of the document's base KL: so every ratio is the same on every document
#: (the default / KVzip 0.5 and 2; / KVgrad 1; / Expected Attention 0.25; the prompt press / KVgrad 3)
KL = {"512/0.5": {KVZIP: 2.0, KVGRAD: 1.0, DEFAULT: 1.0, "PROMPT": 3.0},
      "1024/0.5": {KVZIP: 0.5, EA: 4.0, DEFAULT: 1.0},
      "512/0.95": {EA: 1.0, "PROMPT": 1.0}}
#: needle answers per setting (the same at both lengths): right on the first k of the 4 prompts
RIGHT = {FULL: 4, DEFAULT: 4, KVZIP: 3, KVGRAD: 1, EA: 0, "PROMPT": 2}


@pytest.fixture(scope="module")
def prompt():
    return R.load_eval_choices()["chosen"]["jacap_obs"]  # the setting JacapPromptPress() builds


def _plan(prompt):
    comps = []
    for a, b, what, cell, judged in PLAN:
        c = {"a": prompt if a == "PROMPT" else a, "b": b, "what": what, "cell": cell, "judged": judged}
        if not judged:
            c["label"] = "protection fills the budget"
        comps.append(c)
    settings = [DEFAULT, KVZIP, KVGRAD, EA, prompt]
    return {"comparisons": comps, "run": settings, "sentences": SENTENCES, "cells": list(KL),
            "adjustment": {"m": 5, "per_interval": 1 - 0.05 / 5}, "needle": {**DESIGN, "settings": settings}}


def _rows(prompt):
    kl = []
    for i, d in enumerate(WORKS):
        base = 0.01 * (1 + i % 5)
        for cell, by in KL.items():
            L, c = cell.split("/")
            kl += [{"doc": d, "method": prompt if m == "PROMPT" else m, "length": int(L), "ratio": float(c),
                    "kl": base * x} for m, x in by.items()]
    needle = []
    for L in DESIGN["lengths"]:
        for (depth, t), key in needle_keys((0.5,), 4, 1).items():
            for s, k in RIGHT.items():
                needle.append({"method": prompt if s == "PROMPT" else s, "length": L, "ratio": 0.0 if s == FULL else 0.5,
                               "depth": depth, "trial": t, "key": key, "mode": "after", "correct": t < k})
    return kl, needle


@pytest.fixture(scope="module")
def summary(prompt):
    kl, needle = _rows(prompt)
    out = CS.summarize(_plan(prompt), "sha", kl, needle, WORKS, n_resamples=500)
    assert out["complete"]
    return out


def test_groups_count_the_plans_verdicts(summary, prompt):
    groups = {(g["a"], g["reference"]): g for g in CG.verdict_groups(summary)}
    # recount from the per-document ratios: a constant ratio r gives the interval [r, r]
    want = {(DEFAULT, "kvzip"): {"better": 1, "worse": 1},
            (DEFAULT, CG.BEST_BASELINE): {"better": 1, "no detectable difference": 1},  # 0.25 vs EA, 1.0 vs KVgrad
            (DEFAULT, "expected_attention"): {"better": 1},
            (prompt, CG.BEST_BASELINE): {"worse": 1, "protection fills the budget": 1}}
    assert set(groups) == set(want)
    for key, counts in want.items():
        assert groups[key]["counts"] == {**dict.fromkeys(CG.VERDICTS, 0), **counts}, key
    assert groups[DEFAULT, CG.BEST_BASELINE]["references"] == [KVGRAD, EA]
    assert [g["what"] for g in CG.verdict_groups(summary)][0] == "against the best tuned baseline"


def test_needle_accuracy_is_pooled_over_lengths(summary, prompt):
    acc = CG.needle_accuracy(summary)["after"]
    for s, k in RIGHT.items():
        assert acc[prompt if s == "PROMPT" else s] == {0.5: pytest.approx(k / 4)}


def test_kl_ratio_to_kvzip_is_the_geometric_mean_over_documents(summary, prompt):
    got = {(e["setting"], e["cell"]): e for e in summary["kl"]["to_reference"]}
    # every cell where a setting and KVzip both have rows, and no other: the constant multiples of KL above
    want = {(DEFAULT, "512/0.5"): 0.5, (KVGRAD, "512/0.5"): 0.5, (prompt, "512/0.5"): 1.5, (DEFAULT, "1024/0.5"): 2.0,
            (EA, "1024/0.5"): 8.0}
    assert set(got) == set(want)
    for key, r in want.items():
        assert got[key]["ratio"] == pytest.approx(r) and got[key]["n_documents"] == 12 and got[key]["complete"], key
    # a ratio that differs per document: the geometric mean, by hand
    kl, _ = _rows(prompt)
    kl = [dict(r, kl=r["kl"] * (4.0 if r["doc"] == "d0" and r["method"] == DEFAULT else 1.0)) for r in kl]
    one = {(e["setting"], e["cell"]): e["ratio"] for e in CS.to_reference(_plan(prompt), kl, list(WORKS))}
    assert one[DEFAULT, "512/0.5"] == pytest.approx(0.5 * 4.0 ** (1 / 12))


def test_plane_points_pair_each_ratio_with_its_needle_accuracy(summary, prompt):
    from jacap_lib.viz.plane import kl_retrieval_figure

    points = CG.plane_points(summary)
    by = {(p["spec"], p["cell"]): p for p in points}
    # a point needs KL rows beside KVzip's in the cell and needle answers there: KVgrad has no KL at 1024/0.5, nor
    # Expected Attention at 512/0.5; KVzip sits at 1
    assert set(by) == {(DEFAULT, "512/0.5"), (DEFAULT, "1024/0.5"), (KVZIP, "512/0.5"), (KVZIP, "1024/0.5"),
                       (KVGRAD, "512/0.5"), (prompt, "512/0.5"), (EA, "1024/0.5")}
    assert by[DEFAULT, "1024/0.5"]["kl_ratio"] == pytest.approx(2.0) and by[KVZIP, "512/0.5"]["kl_ratio"] == 1.0
    assert by[KVGRAD, "512/0.5"]["accuracy"] == 0.25 and by[KVGRAD, "512/0.5"]["correct"] == 1
    assert all(p["full_accuracy"] == 1.0 and p["n_prompts"] == 4 and p["n_docs"] == 12 for p in points)
    assert {p["split"] for p in points} == {"confirm"} and by[DEFAULT, "512/0.5"]["name"] == "default JacapPress()"
    fig = kl_retrieval_figure(points)
    assert "12 fresh confirmatory documents" in fig.layout.annotations[-1].text
    # nothing until the needle mode is complete
    kl, needle = _rows(prompt)
    part = CS.summarize(_plan(prompt), "sha", kl, needle[:-1], WORKS, n_resamples=200)
    assert CG.plane_points(part) == [] and CG.plane_points(summary, mode="inside") == []


def test_answer_sentences_are_the_counts_in_plain_words(summary):
    lines = CF.answer_lines(summary)
    assert lines[0] == ("On 12 fresh documents from 6 works, the default `JacapPress()` against KVzip is better in 1, "
                        "worse in 1 and not distinguishable in 0 of 2 judged cells.")
    assert lines[1] == ("Against each cell's best tuned baseline (KVgrad or Expected Attention), the default is better "
                        "in 1, worse in 0 and not distinguishable in 1 of 2 judged cells.")
    assert lines[2] == ("The prompt press `JacapPromptPress()`, which reads the prompt once, is better in 0, worse in 1 "
                        "and not distinguishable in 0 of 1 judged cells.")
    assert lines[3] == ("To keep a fact of the prompt, use the default `JacapPress()`: it answers 100 % of needle "
                        "prompts at c ≤ 0.75, question after.")
    for s in lines:
        assert len(s.split()) <= A.MAX_WORDS, s
    # with the cost sentence the landing answer stays within its limits and is labelled confirmatory
    _, mech = R.load_mechanisms()
    text = A.answer_lines(R.load_eval_summary(), R.load_needle_summary(), mech, R.load_ladder_summary(),
                          R.load_field_summary(), confirm=summary)
    assert text[0].startswith("*The answer, from the confirmatory run") and text[1:5] == lines
    assert len(text) - 1 <= A.MAX_SENTENCES and text[-1].startswith("The second reading has a price")


def test_findings_table_counts_and_needle(summary, prompt):
    text = CF.findings_text(summary)
    assert text.startswith("*From the confirmatory run.* 12 documents from 6 works")
    assert "adjusted for the plan's 5 judged comparisons (level 0.99000)" in text
    assert "| default JacapPress() | KVzip | 1 | 1 | 0 | 0 |" in text
    assert "| JacapPromptPress() | best tuned baseline | 0 | 1 | 0 | 1 |" in text
    assert "A cell's best tuned baseline is the one the tune documents picked there: KVgrad or Expected Attention." in text
    assert "| uncompressed | 100 % |" in text and "| KVgrad | 25 % |" in text and "| Expected Attention | 0 % |" in text
    # the judged pairs at the needle cells 512/0.5 (3) and 1024/0.5 (2): four prompts each
    pairs = summary["needle"]["after"]["pairs"]
    assert len(pairs) == 5 and all(p["verdict"] != "better" or p["holm_p"] <= 0.05 for p in pairs)
    # by hand: the default answers every prompt, KVzip 3, KVgrad 1, Expected Attention 0, the prompt press 2; the
    # exact test on 1, 3, 4 and 1 discordant prompts gives p 1, 0.25, 0.125 and 1: nothing detectable at 4 prompts
    assert {(p["a"], p["b"], p["cell"]): (p["wins"], p["losses"]) for p in pairs} == {
        (DEFAULT, KVZIP, "512/0.5"): (1, 0), (DEFAULT, KVZIP, "1024/0.5"): (1, 0), (DEFAULT, KVGRAD, "512/0.5"): (3, 0),
        (DEFAULT, EA, "1024/0.5"): (4, 0), (prompt, KVGRAD, "512/0.5"): (1, 0)}
    assert "over the mode's 5 planned pairs" in text
    assert "| default JacapPress() | KVzip | 0 | 0 | 2 | 0 |" in text  # two cells
    assert "| default JacapPress() | best tuned baseline | 0 | 0 | 2 | 0 |" in text  # KVgrad, Expected Attention
    assert "| default JacapPress() | Expected Attention | 0 | 0 | 1 | 0 |" in text  # the pair named twice
    assert "| JacapPromptPress() | best tuned baseline | 0 | 0 | 1 | 0 |" in text
    # a verdict moves its group's count, and only that group's
    moved = json.loads(json.dumps(summary))
    for p in moved["needle"]["after"]["pairs"]:
        if p["b"] == KVZIP and p["cell"] == "512/0.5":
            p["verdict"] = "worse"
    counts = {(g["a"], g["reference"]): g["counts"] for g in CG.needle_groups(moved, "after")}
    assert counts[DEFAULT, KVZIP] == {**dict.fromkeys(CG.NEEDLE_VERDICTS, 0), "worse": 1, "no detectable difference": 1}
    assert counts[DEFAULT, CG.BEST_BASELINE]["worse"] == 0 and CG.needle_groups(moved, "inside") == []


def test_kl_verdicts_lead_while_the_needle_run_goes_on(tmp_path, summary, prompt):
    """Every KL row there, half of the needle prompts: the answer and the findings give the KL verdicts, print no
    needle accuracy or test (a Holm adjustment over part of the pairs is not the plan's), say how far the needle run
    has got, and the answer's fact sentence is the dev documents', labelled so."""
    kl, needle = _rows(prompt)
    part = CS.summarize(_plan(prompt), "sha", kl, needle[: len(needle) // 2], WORKS, n_resamples=500)
    assert part["kl"]["complete"] and not part["complete"] and not CG.needle_done(part, "after")
    # by hand: 2 lengths x 1 cell x 4 prompts x (5 settings + the uncompressed answer) = 48 planned; the first
    # half of the rows is the whole of prompt length 512
    assert CG.needle_progress(part, "after") == (24, 48) and CG.needle_accuracy(part) == {}
    lines = CF.answer_lines(part)
    assert lines == CF.answer_lines(summary)[:3]  # the same KL sentences, no fact sentence
    field = R.load_field_summary()
    _, mech = R.load_mechanisms()
    text = A.answer_lines(R.load_eval_summary(), R.load_needle_summary(), mech, R.load_ladder_summary(), field,
                          confirm=part)
    assert text[0].startswith("*The answer, from the confirmatory run's KL verdicts") and "dev" in text[0]
    assert text[1:4] == lines and text[4] == A._field_facts(field) and text[4].startswith("To keep a fact")
    assert len(text) - 1 <= A.MAX_SENTENCES
    findings = CF.findings_text(part)
    assert "| default JacapPress() | KVzip | 1 | 1 | 0 | 0 |" in findings
    assert "Needle accuracy" not in findings and "paired test" not in findings
    assert ("The needle run with the question after compression is not finished: 24 of 48 planned prompts are "
            "answered.") in findings
    with pytest.raises(ValueError, match="part"):
        R.load_confirm_summary(tmp_path, part="needle")


def test_write_uses_the_confirmatory_summary_only_when_complete(tmp_path, summary):
    root = tmp_path / "data"
    ev = root / "results" / "eval"
    (ev / "peers").mkdir(parents=True)
    (ev / "confirm").mkdir()
    (root / "diagnostics").mkdir()
    for name in ("summary.json", "needle_summary.json"):
        shutil.copy(data_path("results", "eval", name), ev / name)
    for name in ("ladder_summary.json", "field_summary.json"):
        shutil.copy(data_path("results", "eval", "peers", name), ev / "peers")
    shutil.copy(data_path("diagnostics", "mechanisms.json"), root / "diagnostics")
    _, mech = R.load_mechanisms()
    dev_answer = A.answer_text(R.load_eval_summary(), R.load_needle_summary(), mech, R.load_ladder_summary(),
                               R.load_field_summary())
    dev_findings = F.findings_text(R.load_eval_summary(), R.load_needle_summary())
    missing_kl = {**summary, "complete": False, "kl": {**summary["kl"], "complete": False}}
    (ev / "confirm" / "summary.json").write_text(json.dumps(missing_kl))
    assert R.load_confirm_summary(ev) is None and R.load_confirm_summary(ev, part="kl") is None
    assert R.load_confirm_summary(ev, part=None)["complete"] is False
    assert A.write(ev).read_text(encoding="utf-8") == dev_answer
    assert F.write(ev).read_text(encoding="utf-8") == dev_findings
    # the landing plane comes from the dev field until the confirmatory KL and needle rows are complete
    dev_points = L.plane_points(ev)
    assert dev_points and dev_points == FD.field_points(R.load_field_summary())
    (ev / "confirm" / "summary.json").write_text(json.dumps(summary))
    assert R.load_confirm_summary(ev)["complete"] is True
    assert L.plane_points(ev) == CG.plane_points(json.loads(json.dumps(summary)))
    assert {p["split"] for p in L.plane_points(ev)} == {"confirm"}
    assert A.write(ev).read_text(encoding="utf-8").startswith("*The answer, from the confirmatory run")
    assert CF.write(ev).read_text(encoding="utf-8") == CF.findings_text(json.loads(json.dumps(summary)))
    # a later dev summary job leaves the confirmatory findings as they are
    assert F.write(ev).read_text(encoding="utf-8") == CF.findings_text(json.loads(json.dumps(summary)))
    (ev / "confirm" / "summary.json").unlink()
    assert CF.write(ev) is None and F.write(ev).read_text(encoding="utf-8") == dev_findings


def test_an_unknown_purpose_or_verdict_is_refused(summary):
    bad = json.loads(json.dumps(summary))
    bad["kl"]["comparisons"][0]["what"] = "something else"
    with pytest.raises(ValueError, match="unknown purpose"):
        CG.verdict_groups(bad)
    bad = json.loads(json.dumps(summary))
    bad["kl"]["comparisons"][0]["verdict"] = "incomplete"
    with pytest.raises(ValueError, match="incomplete"):
        CG.verdict_groups(bad)


def test_the_forest_draws_every_judged_comparison_once_per_pair(summary, prompt):
    from jacap_lib.viz.evaluation import confirm_forest

    fig = confirm_forest(summary)
    labels = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext))
    points = [t for t in fig.data if t.x[0] is not None]
    drawn = sorted((labels[round(t.y[0])], t.hovertemplate.split(":")[0].rsplit(", ", 2)[1], t.x[0],
                    t.marker.symbol) for t in points)
    # the constant per-document ratios of KL give each interval [r, r]: filled unless r = 1; circles at 512,
    # squares at 1024; the unjudged 512/0.95 cell draws nothing
    want = sorted([("default JacapPress() / KVzip", "prompt 512", 0.5, "circle"),
                   ("default JacapPress() / KVzip", "prompt 1024", 2.0, "square"),
                   ("default JacapPress() / best tuned baseline", "prompt 512", 1.0, "circle-open"),
                   ("default JacapPress() / best tuned baseline", "prompt 1024", 0.25, "square"),
                   ("default JacapPress() / Expected Attention", "prompt 1024", 0.25, "square"),
                   ("JacapPromptPress() / best tuned baseline", "prompt 512", 3.0, "circle")])
    assert [(a, b, pytest.approx(x), s) for a, b, x, s in drawn] == want
    for t in points:  # each interval's ends are the summary's
        assert t.x[0] - t.error_x.arrayminus[0] == pytest.approx(t.x[0]) and t.error_x.array[0] == pytest.approx(0)
    assert [a.text for a in fig.layout.annotations] == ["c = 0.5", "c = 0.95", "● prompt 512   ■ prompt 1024<br>"
                                                        "filled: the interval excludes 1"]


def test_needle_progress_counts_rows_with_one_uncompressed_answer_per_length():
    """The uncompressed answer does not depend on c: the run writes it once per prompt length, the summary repeats it
    in each cell of that length, and the progress counts it once. By hand: 2 prompts per cell, 2 settings, 2 lengths x
    2 ratios -> 2 x (2 x 4 + 2) = 20 planned rows; answered: the uncompressed 2 at 512 (shown in both of its cells),
    setting a 2 and setting b 1 at 512/0.5 -> 5."""
    design = {"lengths": [512, 1024], "ratios": [0.5, 0.75], "depths": [0.1], "trials": 2, "settings": ["a", "b"]}
    acc = [{"setting": "full", "cell": "512/0.5", "n": 2}, {"setting": "full", "cell": "512/0.75", "n": 2},
           {"setting": "a", "cell": "512/0.5", "n": 2}, {"setting": "b", "cell": "512/0.5", "n": 1}]
    summary = {"config": {"needle_design": design}, "needle": {"after": {"accuracy": acc}}}
    assert CG.needle_progress(summary, "after") == (5, 20)
    assert CG.needle_progress(summary, "inside") == (0, 20)


def test_fact_sentence_reads_every_complete_needle_mode(prompt):
    """With both needle modes complete, the fact sentence picks the setting whose lowest accuracy over both modes is
    highest and gives its accuracy per mode; the default's follows when another setting is picked; a mode with a
    missing prompt is left out. By hand (4 prompts per cell, the same at both lengths): after, the default 4 of 4,
    KVzip 3; inside, the default 3, KVzip 2, KVgrad 4 -> the lowest: the default 75 %, KVzip 50 %, KVgrad 25 %."""
    kl, after = _rows(prompt)
    inside_right = {FULL: 4, DEFAULT: 3, KVZIP: 2, KVGRAD: 4, EA: 1, "PROMPT": 0}
    inside = [dict(r, mode="inside", correct=r["trial"] < inside_right[
        "PROMPT" if r["method"] == prompt else r["method"]]) for r in after]
    plan = _plan(prompt)
    plan["needle"] = {**plan["needle"], "modes": ["after", "inside"]}
    both = CS.summarize(plan, "sha", kl, after + inside, WORKS, n_resamples=200)
    assert CG.needle_done(both, "after") and CG.needle_done(both, "inside")
    fact = CF.fact_sentence(both)
    assert fact == ("To keep a fact, use the default `JacapPress()`: at c ≤ 0.75 it answers 100 % of needle prompts "
                    "asked after, 75 % asked inside."), fact
    assert len(fact.split()) <= A.MAX_WORDS and CF.answer_lines(both)[-1] == fact
    text = CF.needle_text(both, fact=True)  # the facts chapter's block: the sentence, then both modes' tables
    assert text.startswith(fact + "\n\nNeedle accuracy") and "| default JacapPress() | 100 % | 75 % |" in text
    assert "not finished" not in text and CF.needle_text(both) == text[len(fact) + 2:]
    # every prompt answered in both modes: one accuracy for both, said once
    same = [dict(r, mode="inside") for r in after]
    assert CF.fact_sentence(CS.summarize(plan, "sha", kl, after + same, WORKS, n_resamples=200)) == (
        "To keep a fact, use the default `JacapPress()`: at c ≤ 0.75 it answers 100 % of needle prompts, asked after "
        "or inside.")
    # KVgrad answers every inside prompt: with inside alone it is picked, and the default's accuracy follows
    only_inside = CS.summarize(plan, "sha", kl, after[:-1] + inside, WORKS, n_resamples=200)
    assert not CG.needle_done(only_inside, "after")
    assert CF.fact_sentence(only_inside) == ("To keep a fact of the prompt, use KVgrad: it answers 100 % of needle "
                                             "prompts at c ≤ 0.75, question inside the prompt; the default answers 75 %.")
    # after alone: the sentence the landing page has printed since the after mode finished
    assert CF.fact_sentence(CS.summarize(plan, "sha", kl, after + inside[:-1], WORKS, n_resamples=200)) == (
        "To keep a fact of the prompt, use the default `JacapPress()`: it answers 100 % of needle prompts at c ≤ 0.75, "
        "question after.")
