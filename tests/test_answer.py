"""The landing page's answer (jacap_lib.report.answer): generated from the committed files, at most five sentences
of at most 30 words, labelled by the summary it reads, and every number in it recomputed here from the files."""
from __future__ import annotations

import math
import re
import shutil

import pytest

from jacap_lib.report import answer as A
from jacap_lib.results import loaders as R
from jacap_lib.results.paths import data_path


def _inputs():
    _, mech = R.load_mechanisms()
    return R.load_eval_summary(), R.load_needle_summary(), mech, R.load_ladder_summary(), R.load_field_summary()


def _sentences(text: str) -> list[str]:
    body = text.split(":*", 1)[1]
    return [s for s in re.split(r"(?<=\.)\s+(?=[A-Z])", body.strip()) if s]


def test_committed_answer_is_what_the_files_say(tmp_path):
    committed = data_path("results", "eval", A.FILE).read_text(encoding="utf-8")
    confirm = R.load_confirm_summary(part="kl")  # the confirmatory KL verdicts lead once every KL row is there
    assert A.answer_text(*_inputs(), confirm=confirm) == committed
    # write() reads the same files from a folder laid out like data/: results/eval (+ peers) and diagnostics
    root = tmp_path / "data"
    (root / "results" / "eval" / "peers").mkdir(parents=True)
    (root / "diagnostics").mkdir()
    for name in ("summary.json", "needle_summary.json"):
        shutil.copy(data_path("results", "eval", name), root / "results" / "eval" / name)
    for name in ("ladder_summary.json", "field_summary.json"):
        shutil.copy(data_path("results", "eval", "peers", name), root / "results" / "eval" / "peers")
    shutil.copy(data_path("diagnostics", "mechanisms.json"), root / "diagnostics")
    if confirm is not None:
        (root / "results" / "eval" / "confirm").mkdir()
        shutil.copy(data_path("results", "eval", "confirm", "summary.json"), root / "results" / "eval" / "confirm")
    assert A.write(root / "results" / "eval").read_text(encoding="utf-8") == committed
    assert A.write(tmp_path / "empty") is None


def test_answer_is_short_plain_and_labelled():
    text = A.answer_text(*_inputs())
    assert text.startswith("*The answer, from the exploratory dev summary")
    sentences = _sentences(text)
    assert 1 <= len(sentences) <= A.MAX_SENTENCES
    for s in sentences:
        assert len(s.split()) <= A.MAX_WORDS, s


def test_answer_from_the_field_recomputed_from_the_files():
    """With the whole field on the dev documents, the answer names the presses of lowest KL, the closest one-prefill
    press and the default by their ratios to KVzip, the fact keepers and the cost, each recomputed from the rows."""
    from jacap_lib.presses.registry import RECONSTRUCTION_METHODS
    from jacap_lib.experiments import field as FD
    from jacap_lib.results import files
    from jacap_lib.experiments.names import spec_name

    summary, needle, mech, ladder, field = _inputs()
    text = A.answer_text(summary, needle, mech, ladder, field)
    # recompute the field table from the dev rows of the three spaces, with every space's tune choices
    root = data_path("results", "eval")
    folders = {"first": root, "peers": root / "peers", "context": root / "context"}
    rows = {s: files.read_jsonl(f / "dev.jsonl") for s, f in folders.items()}
    chosen = {s: R.load_eval_choices(space=s)["chosen"] for s in folders}
    table = FD.field_table(rows, chosen)
    done = [m for m in table["methods"] if m["complete"]]
    top = [spec_name(m["spec"]) for m in done[:2]]
    assert f"use {top[0]} or {top[1]}: the lowest KL of the {len(done)} presses" in text
    once = next(m for m in done if m["method"] not in RECONSTRUCTION_METHODS)
    assert f"{spec_name(once['spec'])} comes closest, at {once['gm_ratio']:.2f} times KVzip's KL" in text
    prompt = next(m for m in done if m["method"] == "jacap_obs")  # the prompt press, JacapPromptPress()'s setting
    assert f"the prompt press `JacapPromptPress()` keeps {prompt['gm_ratio']:.2f} times" in text
    # the rule's Jacap-family choice is the context press, which JacapPress() builds: named "the default"
    assert spec_name(chosen["context"]["jacap"]) == "the default `JacapPress()`"
    # the fact keepers: the highest lowest accuracy at c <= 0.75, question after the compression, over the raw rows
    needles = {s: files.read_jsonl(f / "needle.jsonl") for s, f in folders.items() if (f / "needle.jsonl").is_file()}
    by: dict = {}
    owner = {spec: (s, m) for s, ch in chosen.items() for m, spec in ch.items()}
    for s, rs in needles.items():
        for r in rs:
            if r.get("mode", "after") == "after" and r["method"] in owner and owner[r["method"]][0] == s \
                    and r["ratio"] <= 0.75:
                by.setdefault(owner[r["method"]][1], {}).setdefault(r["ratio"], []).append(bool(r["correct"]))
    lows = {m: min(sum(v) / len(v) for v in cs.values()) for m, cs in by.items() if len(cs) == 2}
    assert f"answers {100 * max(lows.values()):.0f} % of needle prompts at c ≤ 0.75" in text
    ratios = [t["kvzip"]["cpu_seconds"] / t["none"]["cpu_seconds"] for t in ladder["prefill_timing"]]
    assert f"costs {min(ratios):.1f}–{max(ratios):.1f} times an uncompressed one" in text


def test_answer_numbers_recomputed_from_the_files():
    """Without the field summary, the first rounds' summary answers (the fallback while no field is measured)."""
    summary, needle, mech, ladder, _ = _inputs()
    text = A.answer_text(summary, needle, mech, ladder)
    # the best tuned baseline: the one press named in every cell of Algorithm 1 tuned's family picked on tune
    fam = next(f for f in summary["families"] if f["role"] == "algorithm 1" and f["picked_on"] == "tune")
    names = {r["baseline_spec"].split("[", 1)[0] for r in fam["rows"]}
    if names == {"expected_attention"}:
        assert f"use Expected Attention, the best tuned baseline in all {len(fam['rows'])} cells" in text
    worse = sum(r["verdict"].startswith("worse") for r in fam["rows"])
    assert f"against {worse} for Algorithm 1 tuned" in text
    # the fact keeper: the baseline whose lowest accuracy over the cells with c <= 0.75 is highest
    cells = [c for c in needle["cells"] if c["ratio"] <= 0.75]
    low = {}
    for c in cells:
        for x in c["settings"]:
            if not x["spec"].startswith("jacap"):
                low[x["spec"]] = min(low.get(x["spec"], 1.0), x["accuracy"])
    best = max(low.values())
    assert any(f"it answers {100 * best:.0f}" in text for _ in [0])
    # the mechanisms: the share of rows (tau 10, sigma^2 1, c 0.9) with a token above 1/2, and the median overlap
    sel = [r for r in mech if r["tau"] == 10.0 and r["rule"] == "fixed=1" and r["ratio"] == 0.9]
    overlaps = sorted(r["overlap"] for r in sel)
    n = len(overlaps)
    median = overlaps[n // 2] if n % 2 else (overlaps[n // 2 - 1] + overlaps[n // 2]) / 2
    assert f"changes {100 * (1 - median):.0f} % of the kept tokens" in text
    if not any(r["n_saturated"] for r in sel):
        assert f"no token saturates in any of {n} heads" in text
    # KVzip: cells whose whole-gap interval lies below / above 1
    lower = sum(c["total_high"] < 1 for c in ladder["cells"])
    higher = sum(c["total_low"] > 1 for c in ladder["cells"])
    assert f"lower KL than the prompt press in {lower} of {len(ladder['cells'])} cells and a higher one in {higher}" in text
    ratios = [t["kvzip"]["cpu_seconds"] / t["none"]["cpu_seconds"] for t in ladder["prefill_timing"]]
    assert f"{min(ratios):.1f}" in text and f"{max(ratios):.1f}" in text


def test_answer_without_optional_files_still_answers_the_predictions():
    summary = R.load_eval_summary()
    text = A.answer_text(summary)
    assert 2 == len(_sentences(text))
    with pytest.raises(ValueError, match="jacap evaluate summary"):
        A.answer_text({"config": {}, "families": []})


def test_every_kvpress_press_has_a_reader_name():
    """press_name covers every kvpress press of the registry, and agrees with the name its description ends with."""
    from jacap_lib.presses.registry import BASELINES, METHODS, PRESS_NAMES, press_name

    assert set(PRESS_NAMES) == set(BASELINES)
    for name in BASELINES:
        m = re.search(r"\(([^(),]*)[,)]", METHODS[name].description)
        if m and m.group(1)[0].isupper() and " " not in m.group(1).strip("'s"):
            assert press_name(name) == m.group(1) or press_name(name) in METHODS[name].description, name
    assert press_name("expected_attention[n_future_positions=32]") == "Expected Attention"
    assert press_name("jacap_ea") == "jacap_ea"


def test_field_lines_are_the_answers_field_sentences():
    """The predictions chapter's field lines are the landing answer's first three sentences, and nothing without a
    field of at least two complete methods."""
    summary, needle, mech, ladder, field = _inputs()
    lines = A.answer_lines(summary, needle, mech, ladder, field)[1:]
    assert A.field_lines(field) == [lines[0], lines[1], lines[2]]
    assert lines[2].startswith("To keep a fact")
    one = {**field, "table": {**field["table"], "methods": field["table"]["methods"][:1]}}
    assert A.field_lines(one) == []


def test_field_fact_sentence_keeps_its_word_limit_when_many_presses_keep_the_fact():
    """The fact sentence names every keeper; the clause on the closest one-reading press goes when it would push the
    sentence past MAX_WORDS (and stays while it fits)."""
    import copy

    field = R.load_field_summary()
    fact = A._field_facts(field)
    assert len(fact.split()) <= A.MAX_WORDS and "; " in fact  # the committed field: keepers and the clause fit
    many = copy.deepcopy(field)
    after = many["needle_table"]["modes"]["after"]["methods"]
    keepers = sorted(after)[:8]  # eight presses now answer every prompt at c <= 0.75, with the question after
    for m in keepers:
        for v in after[m]:
            if v["ratio"] <= 0.75:
                v["accuracy"] = 1.0
    fact = A._field_facts(many)
    assert fact.endswith("each answers 100 % of needle prompts at c ≤ 0.75.") and "; " not in fact
    from jacap_lib.experiments.names import spec_name

    chosen = {m["method"]: m["spec"] for m in field["table"]["methods"]}
    assert all(spec_name(chosen[m]) in fact for m in keepers)
