"""The book's evaluation tables: one precision rule (digits from the interval), short verdict words, narrow
headline tables with their supporting columns in a details form, no cut text, identical cells said so."""
from __future__ import annotations

import pandas as pd
import pytest

from jacap_lib.experiments.protocol import rules as P

from jacap_lib.verdicts import precision as NUM
from jacap_lib.verdicts import intervals as V
from jacap_lib.viz import evaluation as VE
from jacap_lib.viz import serving as VS


# ------------------------------------------------------------------------------------------- the precision rule
@pytest.mark.parametrize("lo, hi, est, want", [
    (0.9, 1.1, 1.0, 2),         # ±10 %: two decimals, not three
    (0.99, 1.01, 1.0, 3),       # ±1 %
    (1.45, 2.12, 1.74, 2),      # width 0.67
    (1.7, 3.04, 2.3, 1),        # width 1.34
    (10.0, 60.0, 30.0, 0),      # width 50
    (0.0105, 0.0146, 0.0123, 4),
    (1.0, 1.0, 1.0, 2),         # a point: three significant digits of the estimate
    (0.0, 0.0, 0.0, 0),
    (1.0, 1.0 + 1e-12, 1.0, 2),  # rounding-width: a point
    (0.9999991, 1.0000012, 1.0000003, 2),  # near-zero width: a point at three significant digits, not 6 decimals
    (12.29, 12.31, 12.3, 1),    # ends equal at three significant digits: a point, 12.3
    (12.2, 12.4, 12.3, 2),      # ends differ at three significant digits: the width rule
    (-0.001, 0.002, 0.0, 4),    # an estimate of 0 does not make the interval a point
])
def test_decimals_follow_the_interval_width(lo, hi, est, want):
    assert NUM.decimals(lo, hi, est) == want


def test_interval_text_by_hand():
    assert NUM.interval_text(1.0, 0.9, 1.1) == "1.00 [0.90, 1.10]"
    assert NUM.interval_text(0.89, 0.83, 0.93) == "0.89 [0.83, 0.93]"
    assert NUM.interval_text(0.0123, 0.01049, 0.01462) == "0.0123 [0.0105, 0.0146]"
    assert NUM.interval_text(-15.0, -30.0, 0.0) == "−15 [−30, 0]"
    assert NUM.interval_text(0.0, -0.0001, 0.0001, scale=100, unit=" %") == "0.000 [−0.010, 0.010] %"
    assert NUM.interval_text(1.0000000001, 1.0, 1.0000000002) == "1.00 [1.00, 1.00]"
    assert NUM.interval_text(1.0000003, 0.9999991, 1.0000012) == "1.00 [1.00, 1.00]"  # not "1.000000 [...]"
    assert NUM.interval_text(0.0312, 0.031195, 0.031204) == "0.0312 [0.0312, 0.0312]"
    with pytest.raises(ValueError, match="low .* above high"):
        NUM.decimals(2.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        NUM.interval_text(float("nan"), 0.0, 1.0)


# ---------------------------------------------------------------------------------------------- verdict words
@pytest.mark.parametrize("interval, scale, want", [
    ((0.83, 0.93), "ratio", "better 7–17 %"),
    ((1.45, 2.12), "ratio", "worse 45–112 %"),
    ((0.89, 1.04), "ratio", "no det. diff. (−11 to +4 %)"),
    ((0.92, 1.08), "ratio", "no det. diff. (±8 %)"),
    ((1.0, 1.05), "ratio", "no det. diff. (0 to +5 %)"),
    ((1.0, 1.0), "ratio", "identical on every document"),
    ((5.0, 40.0), "points", "better 5–40 pts"),
    ((-30.0, 0.0), "points", "no det. diff. (−30 to 0 pts)"),
    ((0.0, 0.0), "points", "identical on every prompt"),
])
def test_short_verdict_of_every_sentence_form(interval, scale, want):
    assert VE.short_verdict(V.verdict(interval, scale=scale)) == want


def test_short_verdict_of_a_tests_bare_words():
    assert [VE.short_verdict(w) for w in ("better", "worse", "no detectable difference")] == [
        "better", "worse", "no det. diff."]


# ------------------------------------------------------------------------------------------- hand-built summary
def _row(L, c, lo, hi, **kw):
    est = kw.pop("gm_ratio", (lo * hi) ** 0.5)
    return {"length": L, "ratio": c, "baseline": "snapkv", "baseline_spec": "snapkv[window_size=16]", "n": 48,
            "wins": 30, "losses": 18, "ties": 0, "gm_ratio": est, "gm_low": lo, "gm_high": hi, "mean_ratio": est,
            "mean_low": lo * 0.9, "mean_high": hi * 1.1, "p_wilcoxon": 0.01, "p_holm": 0.04,
            "verdict": V.verdict((lo, hi)), **kw}


def _summary(rows, **fam):
    return {"config": {}, "cells_missing": [], "families": [
        {"setting": "jacap_prompt[centre=tempered,tau=3,beta=0.9]", "role": "algorithm 1", "picked_on": "tune", "label": "picked on tune",
         "rows": rows, **fam}]}


def _no_cut_text(frame: pd.DataFrame) -> None:
    with pd.option_context("display.max_colwidth", 50):  # pandas' default: what a fresh kernel shows
        html = frame.to_html()
    assert "..." not in html and "…" not in html
    for v in frame.to_numpy().ravel():
        assert len(str(v)) <= 50, v


def test_verdict_frame_headline_and_details_columns():
    rows = [_row(512, 0.5, 0.83, 0.93), _row(512, 0.9, 1.0, 1.0, wins=24, losses=20, ties=4)]
    head = VE.verdict_frame(_summary(rows))
    assert list(head.columns) == ["baseline", "KL ratio [95 % CI]", "verdict", "note"]
    assert head.index.names == ["Jacap", "prompt / c"]
    assert head.loc[("Algorithm 1 tuned", "512 / 0.5"), "verdict"] == "better 7–17 %"
    assert head.loc[("Algorithm 1 tuned", "512 / 0.5"), "KL ratio [95 % CI]"] == "0.88 [0.83, 0.93]"
    assert head.loc[("Algorithm 1 tuned", "512 / 0.9"), "verdict"] == "identical on every document"
    assert head.loc[("Algorithm 1 tuned", "512 / 0.5"), "baseline"] == "snapkv"
    assert set(head["note"]) == {""}  # 4 sinks + a 16-token window: 512 at c = 0.9 keeps 51, the score chooses 31
    wide = VE.verdict_frame(_summary(rows, setting="jacap_prompt[centre=tempered,tau=3,beta=0.9,window=128]"))
    assert list(wide["note"]) == ["", "protection fills the budget"]  # 256 > 132 >= 51 kept
    det = VE.verdict_frame(_summary(rows), details=True)
    assert list(det.columns) == ["baseline setting", "mean-KL [95 % CI]", "won/lost", "Wilcoxon p (Holm)"]
    assert det.loc[("Algorithm 1 tuned", "512 / 0.9"), "won/lost"] == "all tied"  # not "24/20" beside an identical cell
    assert det.loc[("Algorithm 1 tuned", "512 / 0.5"), "baseline setting"] == "snapkv[window_size=16]"
    assert det.loc[("Algorithm 1 tuned", "512 / 0.5"), "Wilcoxon p (Holm)"] == (
        f"{rows[0]['p_wilcoxon']:.2g} ({rows[0]['p_holm']:.2g})")  # Holm's adjustment in brackets
    _no_cut_text(head), _no_cut_text(det)


def test_verdict_frame_shows_the_adjusted_interval_first_and_the_unadjusted_one_in_the_details():
    r = _row(1024, 0.5, 1.10, 1.45, gm_ratio=1.28, verdict=V.verdict((1.02, 1.60)), gm_low_adjusted=1.02,
             gm_high_adjusted=1.60, verdict_unadjusted=V.verdict((1.10, 1.45)))
    head = VE.verdict_frame(_summary([r]))
    assert list(head.columns) == ["baseline", "KL ratio [adjusted CI]", "verdict", "note"]
    assert head.iloc[0]["verdict"] == "worse 2–60 %"
    assert head.iloc[0]["KL ratio [adjusted CI]"] == "1.28 [1.02, 1.60]"
    det = VE.verdict_frame(_summary([r]), details=True)
    assert list(det.columns) == ["baseline setting", "KL ratio [95 % CI]", "mean-KL [95 % CI]", "won/lost",
                                 "Wilcoxon p (Holm)"]
    assert det.iloc[0]["KL ratio [95 % CI]"] == "1.28 [1.10, 1.45]"  # the cell's own interval


def test_pair_target_cells_and_choices_frames():
    rows = [_row(512, 0.5, 0.83, 0.93), _row(512, 0.95, 1.0, 1.0, wins=0, losses=0, ties=48)]
    pair = VE.pair_frame(rows)
    assert list(pair.columns) == ["KL ratio [95 % CI]", "verdict"] and list(pair.index) == ["512 / 0.5", "512 / 0.95"]
    assert pair.loc["512 / 0.95", "verdict"] == "identical on every document"
    assert list(VE.pair_frame(rows, details=True).columns) == ["mean-KL [95 % CI]", "won/lost",
                                                               "Wilcoxon p (Holm)"]
    status = [{"length": 2048, "ratio": 0.75, "requirement": "not worse", "met": False,
               "baseline": "streaming_llm[n_sink=1]", "gm_ratio": 1.35, "gm_low": 1.09, "gm_high": 1.69,
               "verdict": "worse by 9–69 %", "shortfall": 0.093}]
    t = VE.target_frame(status)
    assert list(t.columns) == ["target", "baseline", "KL ratio [95 % CI]", "met", "missed by"]
    assert t.loc["2048 / 0.75"].tolist() == ["not worse", "streaming_llm", "1.35 [1.09, 1.69]", "no", "9.3 %"]
    cells = [{"method": m, "length": 512, "ratio": c, "n_docs": 8, "kl_geomean": 0.0123, "kl_low": 0.01049,
              "kl_high": 0.01462, "top1_agreement": 0.9, "attn_rel_error": 0.1}
             for m in ("jacap_prompt[centre=tempered,tau=3,beta=0.9]", "snapkv[window_size=16]") for c in (0.5, 0.75)]
    f = VE.cells_frame(cells)
    assert list(f.columns) == ["c = 0.5", "c = 0.75"]  # never "0.500000"
    # rows named as the figures name them (setting_names): jacap's only setting here by its method's name, SnapKV's
    # tune choice by its reader name
    assert f.loc[(512, "jacap_prompt"), "c = 0.5"] == "0.0123"  # four decimals: the interval is ±0.002
    assert VE.cells_frame(cells, details=True).loc[(512, "SnapKV"), "c = 0.75"] == "[0.0105, 0.0146]"
    # SnapKV as shipped beside its tune choice: the two would share the reader name, so each row shows its short spec
    both = cells + [{**c, "method": "snapkv"} for c in cells if c["method"].startswith("snapkv")]
    assert sorted({k[1] for k in VE.cells_frame(both).index}) == ["jacap_prompt", "snapkv", "snapkv[window_size=16]"]
    with pytest.raises(ValueError, match="value"):
        VE.cells_frame(cells, value="kl")
    choices = {"choices": {"snapkv": {"chosen": "snapkv[window_size=16]", "candidates": [
        {"spec": "snapkv", "score": -2.0}, {"spec": "snapkv[window_size=16]", "score": -2.2}]}}}
    c = VE.choices_frame(choices)
    assert list(c.index) == [("snapkv", "(default)"), ("snapkv", "window_size=16")]
    assert c["tune KL (nats)"].tolist() == ["0.135", "0.111"] and c["chosen"].tolist() == ["", "yes"]
    for frame in (pair, t, f, c):
        _no_cut_text(frame)


def test_needle_frames_by_hand():
    def acc(spec, k):
        return {"spec": spec, "accuracy": k / 20, "low": max(0.0, k / 20 - 0.2), "high": min(1.0, k / 20 + 0.2)}

    s = {"cells": [{"length": 512, "ratio": 0.5, "full": acc("full", 20),
                    "settings": [acc("jacap_prompt[centre=tempered,tau=3,beta=0.9]", 0), acc("capkv[tau=10]", 19)]}],
         "comparisons": [{"setting": "jacap_prompt[centre=tempered,tau=3,beta=0.9]", "reference": "paper preset", "label": "paper preset",
                          "rows": [{"length": 512, "ratio": 0.5, "reference_spec": P.PAPER_PRESET,
                                    "n": 20, "accuracy": 0.0, "reference_accuracy": 0.65, "diff_points": -65.0,
                                    "diff_low": -85.0, "diff_high": -45.0, "wins": 0, "losses": 13,
                                    "p_mcnemar": 0.00024, "p_holm": 0.0012,
                                    "verdict": V.verdict((-85.0, -45.0), scale="points")}]}]}
    f = VE.needle_frame(s)
    assert list(f.columns) == ["c = 0.5"]
    assert f.loc[(512, "capkv"), "c = 0.5"] == "95 [75, 100]"
    v = VE.needle_verdict_frame(s)
    assert list(v.columns) == ["reference", "Jacap %", "ref. %", "won/lost", "Holm p", "verdict"]
    assert v.iloc[0].tolist() == ["paper's", "0", "65", "0/13", "0.0012", "worse 45–85 pts"]
    d = VE.needle_verdict_frame(s, details=True)
    assert list(d.columns) == ["reference setting", "difference, pts [95 % CI]", "McNemar p"]
    assert d.iloc[0]["difference, pts [95 % CI]"] == "−65 [−85, −45]"
    s["comparisons"][0]["rows"][0]["verdict"] = "worse"  # a test's verdict (Holm-adjusted McNemar)
    assert VE.needle_verdict_frame(s).iloc[0]["verdict"] == "worse"
    for frame in (f, v, d):
        _no_cut_text(frame)


def test_decoding_tables_by_hand():
    v = {"method": "jacap_prompt", "reference": "tova", "n": 24, "wins": 13, "unit": "prompt", "gm_ratio": 0.91,
         "gm_low": 0.75, "gm_high": 1.09, "p_holm": 1.0, "verdict": V.verdict((0.75, 1.09)),
         "isolates": "the selection rule, same DecodingPress wrapper: Jacap's score with its sinks"}
    t = VS.decoding_verdict_table([v])
    assert t.loc["DP(Jacap) vs DP(TOVA)"].tolist() == ["0.91 [0.75, 1.09]", "no det. diff. (−25 to +9 %)"]
    d = VS.decoding_verdict_table([v], details=True)
    assert d.iloc[0]["isolates"] == "the selection rule, same DecodingPress wrapper"
    adj = dict(v, gm_low_adjusted=0.70, gm_high_adjusted=1.17, verdict=V.verdict((0.70, 1.17)))
    assert VS.decoding_verdict_table([adj]).iloc[0].tolist() == ["0.91 [0.70, 1.17]", "no det. diff. (−30 to +17 %)"]
    assert VS.decoding_verdict_table([adj], details=True).iloc[0]["95 % CI"] == "0.91 [0.75, 1.09]"
    assert "with its adjusted interval 0.91 [0.70, 1.17]" in VS.decoding_verdict_sentences([dict(adj, holm_significant=False)])
    s = {"alg2": {"gm_kl": 0.0296, "gm_low": 0.0232, "gm_high": 0.0366, "top1_agree": 0.946, "peak_cache": 79,
                  "scoring_share": 0.171, "mean_age": 51.9, "seconds_per_step": 0.0806}}
    row = VS.decoding_summary_table(s).loc["Alg. 2"]
    assert row["KL [95 % CI]"] == "0.030 [0.023, 0.037]" and row["ms / step"] == "81"
    for frame in (t, d):
        _no_cut_text(frame)


def test_committed_results_tables_cut_no_text():
    """Every table the chapters show from the committed summaries, in a fresh kernel's pandas settings."""
    from jacap_lib.experiments import protocol as E
    from jacap_lib.results import loaders as R

    summary, needle = R.load_eval_summary(), R.load_needle_summary()
    frames = [VE.verdict_frame(summary, picked_on=p, details=d) for p in ("tune", "dev") for d in (False, True)]
    frames += [VE.target_frame(E.target_status(summary)), VE.needle_frame(needle), VE.choices_frame(R.load_eval_choices())]
    frames += [VE.needle_verdict_frame(needle, details=d) for d in (False, True)]
    for f in frames:
        _no_cut_text(f)


# ------------------------------------------------------------------------------------- tables that fit the column
def test_wrapped_frame_keeps_its_values_and_wraps_only_between_tokens():
    from jacap_lib.viz.style import wrapped

    frame = pd.DataFrame({"KL ratio [95 % CI]": ["1.19 [1.04, 1.40]"], "verdict": ["better 7–17 %"],
                          "licence": ["MIT; the novels (1811-1817) are PD"], "baseline setting": ["streaming_llm[n_sink=1]"]},
                         index=pd.Index(["Jacap the tempered centre, τ = 3"], name="setting"))
    w = wrapped(frame, ["licence", "baseline setting", "setting"])
    assert w.to_dict("index") == frame.to_dict("index")  # the values are the frame's own
    html = w._repr_html_()
    assert "white-space: normal" in html and "..." not in html
    assert "[1.04,\u00a01.40]" in html and "7–\u206017\u00a0%" in html and "1811\u20111817" in html  # no break inside
    assert "streaming_<wbr>llm[<wbr>n_<wbr>sink=1]" in html  # a spec wraps at <wbr>, copies as written
    assert "τ\u00a0=\u00a03" in html and "[95\u00a0%\u00a0CI]" in html
    with pytest.raises(ValueError, match="neither columns nor index levels"):
        wrapped(frame, ["no such column"])


def test_chapter_five_tables_by_hand():
    from jacap_lib.viz import kernels as VK

    f = {"jacap_over_capkv_scoring": {(2048, 0.6): 0.4123, (2048, 0.8): 1.5},
         "jacap_over_capkv_decode": {(2048, 0.6): 1.1049, (2048, 0.8): 0.8}}
    t = VK.press_ratio_table(f, decode_note="same kept tokens")
    assert list(t.columns) == ["scoring: Jacap / CapPress", "decode (same kept tokens): Jacap / CapPress"]
    assert list(t.index) == [(2048, "0.6"), (2048, "0.8")]  # never "0.600000"
    assert t.iloc[0].tolist() == ["0.41", "1.10"] and t.iloc[1].tolist() == ["1.50", "0.80"]
    with pytest.raises(ValueError, match="findings"):
        VK.press_ratio_table({"jacap_over_capkv_scoring": {}, "jacap_over_capkv_decode": {}})
    rows = [dict(prompt_tokens=2048, method="none", ratio=0.0, prefill_s=12.14, scoring_s=0.0, total_s=30.0,
                 decode_ms_per_token=133.4, scoring_share_of_total=0.0),
            dict(prompt_tokens=2048, method="jacap_prompt", ratio=0.6, prefill_s=14.3, scoring_s=1.2734, total_s=25.0,
                 decode_ms_per_token=1091.6, scoring_share_of_total=0.0509)]
    e = VK.end_to_end_table({"rows": rows})
    assert e.loc[(2048, "jacap_prompt", "0.6")].tolist() == ["14.3", "1.27", "8.9%", "5.1%", "1092"]
    assert e.loc[(2048, "none", "—"), "prefill (s)"] == "12.1"


def test_verdict_tables_label_the_cells_where_protection_fills_the_budget():
    """pair_frame, target_frame and kl_and_needle_frame note every cell whose Jacap setting keeps only its sinks and
    window: the note is there exactly where the budget floor((1 - c) P) is at most the protected tokens."""
    from jacap_lib.presses.registry import press_from_spec
    from jacap_lib.experiments import protocol as E
    from jacap_lib.results import loaders as R
    from jacap_lib.experiments.protocol import rules as P

    choices, rows, summary = R.load_eval_choices(), R.load_eval_rows("dev"), R.load_eval_summary()
    alg1 = choices["chosen"]["jacap_prompt"]

    def fills(spec, L, c):  # independent of results.protection: the press's own sink and window counts
        press = press_from_spec(spec, c)
        return int(L * (1 - c)) <= press.n_sink + press.window

    pairs = E.compare_settings(rows, alg1, P.PAPER_PRESET)
    frame = VE.pair_frame(pairs)
    for r in pairs:
        note = frame.loc[f"{r['length']} / {r['ratio']:g}", "note"]
        both = fills(alg1, r["length"], r["ratio"]) and fills(P.PAPER_PRESET, r["length"], r["ratio"])
        one = fills(alg1, r["length"], r["ratio"]) or fills(P.PAPER_PRESET, r["length"], r["ratio"])
        assert (note == "protection fills the budget") == both and bool(note) == one, (r["length"], r["ratio"], note)
    status = E.target_status(summary)
    target = VE.target_frame(status)
    for s in status:
        assert bool(target.loc[f"{s['length']} / {s['ratio']:g}", "note"]) == fills(alg1, s["length"], s["ratio"])
    assert "note" not in VE.pair_frame([{k: v for k, v in r.items() if k not in ("setting", "reference")}
                                        for r in pairs])
