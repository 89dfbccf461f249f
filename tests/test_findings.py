"""The findings sentences come from the summary files: the committed findings file is what the committed summaries
give, a changed summary changes the sentence, and the counts are the verdicts'."""
from __future__ import annotations

import json
import shutil

import pytest

from jacap_lib.report import findings as F
from jacap_lib.experiments import names as N
from jacap_lib.verdicts import words as VW
from jacap_lib.results import loaders as R
from jacap_lib.verdicts import rows as RS
from jacap_lib.verdicts import intervals as V
from jacap_lib.results.paths import data_path


def test_committed_findings_file_is_what_the_committed_summaries_give(tmp_path):
    from jacap_lib.report import confirm as CF

    committed = data_path("results", "eval", F.FILE).read_text(encoding="utf-8")
    dev = F.findings_text(R.load_eval_summary(), R.load_needle_summary())
    confirm = R.load_confirm_summary(part="kl")  # once every confirmatory KL row is there, its findings lead
    assert (dev if confirm is None else CF.findings_text(confirm)) == committed
    for name in ("summary.json", "needle_summary.json"):
        shutil.copy(data_path("results", "eval", name), tmp_path / name)
    assert F.write(tmp_path).read_text(encoding="utf-8") == dev  # no confirmatory summary there: the dev findings
    assert F.write(tmp_path / "empty") is None  # no summary there yet: nothing written


def _row(L, c, lo, hi, spec="snapkv[window_size=16]"):
    return {"length": L, "ratio": c, "baseline_spec": spec, "gm_ratio": (lo * hi) ** 0.5, "gm_low": lo,
            "gm_high": hi, "verdict": V.verdict((lo, hi))}


def _summary(rows):
    return {"config": {}, "families": [{"setting": "jacap_prompt[centre=tempered,tau=3,beta=0.9]", "role": "algorithm 1", "picked_on": "tune",
                                        "label": "picked on tune", "rows": rows}]}


def _words(text: str) -> list[int]:
    """Words per sentence of the findings' prose lines (tables left out)."""
    import re

    prose = " ".join(line for line in text.splitlines() if line and not line.startswith("|"))
    return [len(x.split()) for x in re.split(r"(?<=[.!?:])\s+", prose) if x.strip()]


def test_counts_table_and_losses_from_a_hand_built_summary():
    rows = [_row(512, 0.5, 1.04, 1.40), _row(1024, 0.5, 1.45, 2.12, "expected_attention"),
            _row(512, 0.9, 0.83, 0.93), _row(512, 0.75, 0.94, 1.10), _row(512, 0.95, 1.0, 1.0)]
    assert VW.verdict_counts(rows) == {"better": 1, "worse": 2, "no detectable difference": 1, "identical": 1}
    lines = F.kl_findings(_summary(rows))
    # the counts in a table row: better, worse, undetected, identical, and the losses where sinks + window (4 + 32
    # here) fill the budget: 512 at c = 0.5 keeps 256 > 36, so neither loss is one
    assert "| Algorithm 1 tuned | 1 | 2 | 1 | 1 | 0 |" in lines
    # the largest loss first, with its interval at the precision the interval supports
    at = lines.index("| cell | best baseline | KL ratio [adjusted interval] |")
    assert lines[at + 2:at + 4] == ["| prompt 1024, c = 0.5 | `expected_attention` | 1.75 [1.45, 2.12] |",
                                    "| prompt 512, c = 0.5 | `snapkv[window_size=16]` | 1.21 [1.04, 1.40] |"]
    assert not any("fill the budget." in x for x in lines)
    # a changed summary changes the table
    rows[0] = _row(512, 0.5, 0.70, 0.90)
    assert "| Algorithm 1 tuned | 2 | 1 | 1 | 1 | 0 |" in F.kl_findings(_summary(rows))


def test_losses_where_the_window_fills_the_budget_are_counted_and_said():
    # a 128-token window and 4 sinks: 512 at c = 0.75 keeps 128 <= 132 (the score chooses nothing), at c = 0.5 256
    rows = [_row(512, 0.75, 1.3, 1.6), _row(512, 0.5, 1.1, 1.4), _row(1024, 0.5, 0.9, 1.2)]
    s = _summary(rows)
    s["families"][0]["setting"] = "jacap_prompt[beta=0.9,centre=tempered,tau=3,window=128]"
    lines = F.kl_findings(s)
    assert "| Algorithm 1 tuned | 0 | 2 | 1 | 0 | 1 |" in lines
    assert "In 1 of Algorithm 1 tuned's 2 losses, its sinks and recent window fill the budget." in lines


def test_findings_text_is_short_sentences_with_the_source_first():
    from jacap_lib.results import loaders as R

    text = F.findings_text(R.load_eval_summary(), R.load_needle_summary())
    assert text.startswith(F.SOURCE)
    n = _words(text)
    assert max(n) <= 30 and sum(n) / len(n) <= 25, n
    # the needle's reference named beside the Jacap settings' accuracies
    assert ("| L / c | best baseline by KL | best-answering baseline | Algorithm 1 tuned | "
            "Algorithm 1 as published | prompt press | jacap_ea |") in text
    assert "| 512 / 0.5 | 0 | 100 (keydiff) | 20 | 65 | 0 | 5 |" in text
    assert "The uncompressed model answers 100 % of the prompts in every cell." in text
    assert "The best baseline by KL is expected_attention in every cell." in text


def test_adjusted_verdicts_are_said_to_be_adjusted():
    rows = [dict(_row(512, 0.5, 1.02, 1.2), gm_low_adjusted=0.95, gm_high_adjusted=1.30,
                 verdict=V.verdict((0.95, 1.30)), verdict_unadjusted=V.verdict((1.02, 1.2))),
            dict(_row(512, 0.75, 1.1, 1.5), gm_low_adjusted=1.05, gm_high_adjusted=1.7, verdict=V.verdict((1.05, 1.7)))]
    lines = F.kl_findings(_summary(rows))
    assert lines[0] == "Verdicts against the best tuned baseline of each cell (2 cells, from simultaneous 95 % intervals):"
    assert "| prompt 512, c = 0.75 | `snapkv[window_size=16]` | 1.28 [1.05, 1.70] |" in lines


def test_needle_sentences_count_per_comparison():
    def row(L, lo, hi, acc, ref):
        return {"length": L, "ratio": 0.5, "reference_spec": "jacap_prompt[centre=tempered,tau=10,noise=1,beta=none]", "accuracy": acc,
                "reference_accuracy": ref, "diff_low": lo, "diff_high": hi,
                "verdict": V.verdict((lo, hi), scale="points")}

    needle = {"comparisons": [{"setting": "jacap_prompt[centre=tempered,tau=3,beta=0.9]", "reference": "paper preset", "label": "paper",
                               "rows": [row(512, -85.0, -45.0, 0.0, 0.65), row(1024, 0.0, 0.0, 0.0, 0.0)]}]}
    assert F.needle_findings(needle) == [
        "Algorithm 1 tuned against Algorithm 1 as published: worse in 1 and identical on every prompt in 1 of 2 cells.",
        "It loses prompt 512, c = 0.5."]


def test_setting_text_and_verdict_word():
    # a setting by what sets it apart from its name's press at today's defaults (the observed centre, beta 0.9, a
    # 16-token window): the written-out and the short spec of one press read alike
    from jacap_lib.presses.registry import written_out

    tuned = "jacap_prompt[beta=0.9,centre=tempered,tau=3,window=128]"
    assert N.setting_text(tuned) == N.setting_text(written_out(tuned)) == "the tempered centre, τ = 3, window = 128"
    assert (N.setting_text("jacap_prompt[centre=tempered,tau=10,noise=1,beta=none]")
            == "the tempered centre, τ = 10, flat query statistics")
    assert N.setting_text("jacap_prompt[tau=10]") == "jacap_prompt"  # no temperature under the observed centre: the default
    assert N.setting_text("jacap_prompt[noise=deff,window=8]") == "σ² by the effective-dimension rule, window = 8"
    assert N.setting_text("snapkv[window_size=16]") == "window_size = 16" and N.setting_text("tova") == "tova"
    assert VW.verdict_word("no difference: identical on every prompt") == "identical"
    with pytest.raises(ValueError, match="not a verdict sentence"):
        VW.verdict_word("fine")
    with pytest.raises(ValueError, match="spec"):
        N.setting_text("")


def test_family_counts_is_one_line_per_family():
    s = _summary([_row(512, 0.5, 1.04, 1.40), _row(512, 0.9, 0.83, 0.93)])
    s["families"].append(dict(s["families"][0], picked_on="dev", label="picked on dev"))
    assert F.family_counts(s) == [
        "jacap_prompt[centre=tempered,tau=3,beta=0.9] (algorithm 1) against the best baseline picked on tune: better in 1 and worse in 1 of 2 cells",
        "jacap_prompt[centre=tempered,tau=3,beta=0.9] (algorithm 1) against the best baseline picked on dev: better in 1 and worse in 1 of 2 cells"]
    assert json.dumps(VW.verdict_counts([]))  # zeros for every kind


def _obs_summary():
    row = {"length": 512, "ratio": 0.5, "baseline_spec": "snapkv[window_size=16]", "gm_ratio": 0.8, "gm_low": 0.7,
           "gm_high": 0.9, "gm_low_adjusted": 0.65, "gm_high_adjusted": 0.95, "verdict": "better by 5–35 %",
           "verdict_unadjusted": "better by 10–30 %", "n": 8, "wins": 8, "ties": 0, "losses": 0}
    row2 = {**row, "ratio": 0.95, "gm_ratio": 1.1, "gm_low": 0.9, "gm_high": 1.3, "gm_low_adjusted": 0.85,
            "gm_high_adjusted": 1.4, "verdict": "no detectable difference; the interval is −15 % to +40 %"}
    return {"families": [{"setting": "jacap_prompt[centre=tempered,tau=3,beta=0.9]", "role": "algorithm 1", "picked_on": "tune",
                          "label": "picked on tune (the protocol)", "rows": [row2]},
                         {"setting": "jacap_obs[window=32]", "role": "tuned jacap_obs", "picked_on": "tune",
                          "label": "picked on tune (the protocol)", "rows": [row, row2]}]}


def test_tuned_jacap_methods_get_their_row_and_needle_accuracy():
    """Every tuned Jacap method other than Algorithm 1's gets a row of verdict counts; its needle accuracy sits beside
    the uncompressed model's; the setting JacapPromptPress() builds is named the default."""
    summary = _obs_summary()
    needle = {"cells": [{"length": 512, "ratio": r, "full": {"accuracy": 0.9},
                         "settings": [{"spec": "jacap_obs[window=32]", "accuracy": a}, {"spec": "knorm", "accuracy": 0.1}]}
                        for r, a in ((0.5, 0.85), (0.75, 0.95), (0.9, 0.2))]}
    assert "| `jacap_obs` | 1 | 0 | 1 | 0 | 0 |" in F.kl_findings(summary)
    table = F.needle_table(summary, needle)
    assert table[0] == "| L / c | best baseline by KL | best-answering baseline | Algorithm 1 tuned | jacap_obs |"
    assert table[2:] == ["| 512 / 0.5 | – | 10 (knorm) | – | 85 |", "| 512 / 0.75 | – | 10 (knorm) | – | 95 |",
                         "| 512 / 0.9 | – | 10 (knorm) | – | 20 |"]
    assert F.accuracy_findings(needle, "jacap_obs[window=32]") == ("On the needle task `jacap_obs[window=32]` answers prompt 512, c = 0.5 "
                                                        "85 % (uncompressed 90 %); prompt 512, c = 0.75 95 % "
                                                        "(uncompressed 90 %).")
    assert F.accuracy_findings(needle, "tova") is None
    # the setting JacapPromptPress() builds today is named as the default (jacap_obs at a 16-token window)
    summary["families"][1]["setting"] = "jacap_obs[window=16]"
    assert "| The prompt press `JacapPromptPress()` | 1 | 0 | 1 | 0 | 0 |" in F.kl_findings(summary)
    assert not RS.is_prompt_default("jacap_obs[window=32]") and not RS.is_prompt_default("jacap_prompt[centre=tempered,tau=3,beta=0.9]")


def test_target_lines_check_the_bar_from_the_counts_and_the_needle_cells():
    """The bar (better in at least half of the cells, worse in none, needle >= 90 % at every c <= 0.75 cell), checked
    against hand-built summaries: one better and one undetected cell with the needle kept clears it; the same with one
    needle cell at 85 %, or with the second cell worse, does not; a missing needle cell is said, not skipped."""
    summary = _obs_summary()

    def needle(a05, a075=0.95, spec="jacap_obs[window=32]"):
        return {"cells": [{"length": 512, "ratio": r, "full": {"accuracy": 1.0},
                           "settings": [{"spec": spec, "accuracy": a}]}
                          for r, a in ((0.5, a05), (0.75, a075), (0.9, 0.0))]}

    lines = F.target_lines(summary, needle(0.9), "tuned jacap_obs")
    assert lines == ["jacap_obs[window=32] against the best tuned baseline of each cell: better in 1 and no detectable "
                     "difference in 1 of 2 cells", "needle at c <= 0.75: 90 %, 95 %", "the bar is cleared"]
    assert F.target_lines(summary, needle(0.85), "tuned jacap_obs")[-1] == "the bar is not cleared"
    assert F.target_lines(summary, needle(0.9, spec="knorm"), "tuned jacap_obs")[1:] == [
        "needle at c <= 0.75: not measured, not measured", "the bar is not cleared"]
    summary["families"][1]["rows"][1]["verdict"] = "worse by 5–40 %"
    assert F.target_lines(summary, needle(1.0, 1.0), "tuned jacap_obs")[-1] == "the bar is not cleared"
    with pytest.raises(ValueError, match="tuned jacap_ea"):
        F.target_lines(summary, needle(1.0), "tuned jacap_ea")


def test_kl_and_needle_frame_puts_both_objectives_side_by_side():
    from jacap_lib.viz import evaluation as VE

    summary = _obs_summary()
    needle = {"cells": [{"length": 512, "ratio": 0.5, "full": {"accuracy": 1.0},
                         "settings": [{"spec": "jacap_obs[window=32]", "accuracy": 0.85, "low": 0.64, "high": 0.95}]}]}
    frame = VE.kl_and_needle_frame(summary, needle, role="tuned jacap_obs")
    assert list(frame.index) == ["512 / 0.5", "512 / 0.95"]
    assert frame.loc["512 / 0.5", "KL ratio [adjusted CI]"] == "0.80 [0.65, 0.95]"
    assert frame.loc["512 / 0.5", "needle % [95 % CI]"] == "85 [64, 95]"
    assert frame.loc["512 / 0.5", "uncompr. %"] == "100"
    assert frame.loc["512 / 0.95", "needle % [95 % CI]"] == "–"  # no needle cell at c = 0.95
    assert frame.loc["512 / 0.5", "baseline"] == "snapkv"
    line, spec = VE.tuned_line(summary, "tuned jacap_obs")
    assert spec == "jacap_obs[window=32]" and line.endswith("better in 1 and no detectable difference in 1 of 2 cells")
    with pytest.raises(ValueError, match="tuned jacap_prompt_adakv"):
        VE.kl_and_needle_frame(summary, needle, role="tuned jacap_prompt_adakv")


def test_spec_name_is_the_one_naming_of_settings():
    """One home names a setting for prose and legends, on the committed specs: the paper preset, the tune choice of
    jacap (not any tempered-centre setting), the press JacapPromptPress() builds, kvpress presses by their reader names,
    the uncompressed model, other tune choices by their registry names, any other setting by its short spec; the
    legend form drops the markup only."""
    from jacap_lib.presses.registry import build_press, method_options, with_options
    from jacap_lib.experiments.protocol import rules as P

    choices = json.loads(data_path("results", "eval", "choices.json").read_text())
    chosen = choices["chosen"]
    record = method_options(build_press("jacap_prompt", 0.5))  # JacapPromptPress()'s options, written out one by one
    default = with_options("jacap_prompt", **{k: v for k, v in record.items() if k not in ("class", "compression_ratio")})
    assert "centre=observed" in default and "window=16" in default
    tempered = [c["spec"] for c in choices["choices"]["jacap_prompt"]["candidates"]  # a candidate the tune did not choose
                if "beta=0.9" in c["spec"] and "tau=10" in c["spec"] and "window=128" in c["spec"]]
    assert len(tempered) == 1 and not P.same_setting(tempered[0], chosen["jacap_prompt"])
    context = P._context(window=64)  # written out in full: the fourth round's choice, window=64
    assert context in P.CONTEXT_SPACE["jacap"]
    assert context.startswith("jacap[budget=global,") and "window=64" in context
    cases = {P.PAPER_PRESET: ("Algorithm 1 as published", "Algorithm 1 as published"),
             chosen["jacap_prompt"]: ("Algorithm 1 tuned", "Algorithm 1 tuned"),
             "jacap_prompt[centre=tempered,tau=3,window=128]": ("Algorithm 1 tuned", "Algorithm 1 tuned"),  # the same press
             tempered[0]: ("`jacap_prompt[centre=tempered,tau=10,window=128]`", "jacap_prompt[centre=tempered,tau=10,window=128]"),
             default: ("the prompt press `JacapPromptPress()`", "JacapPromptPress()"),
             "jacap_prompt": ("the prompt press `JacapPromptPress()`", "JacapPromptPress()"),
             chosen["jacap_obs"]: ("the prompt press `JacapPromptPress()`", "JacapPromptPress()"),
             chosen["jacap_ea"]: ("`jacap_ea`", "jacap_ea"),
             chosen["expected_attention"]: ("Expected Attention", "Expected Attention"),
             chosen["snapkv"]: ("SnapKV", "SnapKV"),
             "keydiff": ("KeyDiff", "KeyDiff"),
             "snapkv[window_size=32]": ("`snapkv[window_size=32]`", "snapkv[window_size=32]"),  # not SnapKV's choice
             "full": ("uncompressed", "uncompressed"),
             context: ("the default `JacapPress()`", "default JacapPress()"),  # the tune choice: JacapPress()'s defaults
             "jacap": ("the default `JacapPress()`", "default JacapPress()"),
             P._context(): ("`jacap[window=0]`", "jacap[window=0]")}  # its first grid's defaults
    for spec, (prose, legend) in cases.items():
        assert N.spec_name(spec) == prose, spec
        assert N.spec_name(spec, legend=True) == legend, spec
        assert N.spec_name(spec, choices=choices) == prose, spec  # the committed choices are the default ones
    # "Algorithm 1 tuned" is the tune choice of the choices given, whatever its options
    other = {"chosen": {**chosen, "jacap_prompt": tempered[0]}}
    assert N.spec_name(tempered[0], choices=other) == "Algorithm 1 tuned"
    assert N.spec_name(chosen["jacap_prompt"], choices=other) == "`jacap_prompt[centre=tempered,tau=3,window=128]`"
    for bad in ("", None):
        with pytest.raises(ValueError, match="spec"):
            N.spec_name(bad)
    assert N.setting_name({"role": "tuned jacap_ea", "setting": "jacap_ea"}) == "`jacap_ea`"
    assert N.setting_name({"role": "tuned jacap_obs", "setting": default}) == "the prompt press `JacapPromptPress()`"
    # the findings' family names agree with spec_name on the committed summary's settings
    summary = json.loads(data_path("results", "eval", "summary.json").read_text())
    for fam in F.tuned_families(summary):
        assert N.setting_name(fam) == N.spec_name(fam["setting"]), fam["role"]
