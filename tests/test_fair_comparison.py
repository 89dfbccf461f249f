"""The fair-comparison chapter's exercises and the library pieces it and the baselines chapter add: each against
an independent computation from the committed rows, and each able to fail."""
from __future__ import annotations

from jacap_lib.report import answer as A

import math
import random

import pytest

from jacap_lib import exercises as X
from jacap_lib.experiments import protocol as E
from jacap_lib.results import loaders as R
from jacap_lib.viz import evaluation as VE


@pytest.fixture(autouse=True)
def _not_in_build(monkeypatch):
    monkeypatch.delenv("JACAP_BOOK_BUILD", raising=False)


@pytest.fixture(scope="module")
def committed():
    return R.load_eval_choices(), R.load_eval_summary(), R.load_eval_rows("dev")


def _cell_kls(rows, spec, length, ratio):
    return {r["doc"]: r["kl"] for r in rows if r["method"] == spec and r["length"] == length and r["ratio"] == ratio}


def _word(sentence: str) -> str:
    for w in ("better", "worse", "no detectable difference"):
        if sentence.startswith(w):
            return w
    return "identical"


def test_exercise_1_is_the_geometric_mean_of_the_rows(committed):
    choices, _, rows = committed
    d = X.data("fair-comparison.1")
    assert d["setting"] == choices["chosen"]["jacap_obs"] and d["baseline"].startswith("expected_attention")
    a = _cell_kls(rows, d["setting"], d["length"], d["ratio"])
    b = _cell_kls(rows, d["baseline"], d["length"], d["ratio"])
    assert len(a) == len(choices["config"]["dev_docs"]) and set(a) == set(b)
    gm = math.exp(sum(math.log(a[k] / b[k]) for k in a) / len(a))
    assert X.check("fair-comparison.1", gm)
    ratio_of_means = sum(a.values()) / sum(b.values())
    assert abs(ratio_of_means / gm - 1) > 1e-3 and not X.check("fair-comparison.1", ratio_of_means)


def test_exercise_2_a_plain_percentile_bootstrap_gives_the_summary_verdict(committed):
    _, summary, rows = committed
    d = X.data("fair-comparison.2")
    a = _cell_kls(rows, d["setting"], d["length"], d["ratio"])
    b = _cell_kls(rows, d["baseline"], d["length"], d["ratio"])
    logr = [math.log(a[k] / b[k]) for k in sorted(a)]
    rng = random.Random(0)
    means = sorted(sum(rng.choice(logr) for _ in logr) / len(logr) for _ in range(3000))
    alpha = 0.05 / d["cells_judged"]
    lo, hi = math.exp(means[int(alpha / 2 * len(means))]), math.exp(means[int((1 - alpha / 2) * len(means)) - 1])
    word = "better" if hi < 1 else "worse" if lo > 1 else "no detectable difference"
    assert X.check("fair-comparison.2", word) and X.check("fair-comparison.2", word.upper() + ".")
    assert d["cells_judged"] == len(summary["cells_measured"])
    for other in {"better", "worse", "no detectable difference"} - {word}:
        assert not X.check("fair-comparison.2", other)
    assert "one of" in X.check("fair-comparison.2", "maybe").message
    with pytest.raises(ValueError, match="str"):
        X.check("fair-comparison.2", 1.0)


def test_exercise_3_is_budget_minus_sinks_and_window(committed):
    choices, _, _ = committed
    spec = choices["chosen"]["jacap_prompt"]
    assert "window=128" in spec and "n_sink=4" in spec
    expected = math.floor(2048 * 0.1 + 1e-9) - 4 - 128
    assert expected == 72 and X.check("fair-comparison.3", expected)
    assert "16-token" in X.check("fair-comparison.3", expected + 112).message
    assert "sinks" in X.check("fair-comparison.3", expected + 4).message
    assert not X.check("fair-comparison.3", 0)


def test_answer_sentences_count_the_summary(committed):
    _, summary, _ = committed
    lines = A.predictions_lines(summary)
    assert len(lines) == 4 and all(s.endswith(".") for s in lines)
    fams = {f["role"]: f["rows"] for f in summary["families"] if f["picked_on"] == "tune"}
    better = sum(_word(r["verdict"]) == "better" for rows in fams.values() for r in rows)
    n = len(fams["algorithm 1"])
    assert (f"in any of the {n} cells" in lines[0]) == (better == 0)
    assert f"the {len(fams)} Jacap settings that read the prompt once" in lines[0]  # not the default: it reads twice
    for role, line in (("tuned jacap_obs", lines[1]), ("algorithm 1", lines[2])):
        worse = sum(_word(r["verdict"]) == "worse" for r in fams[role])
        assert (f"worse in {worse}" in line) == (worse > 0), (role, line)
    # the losses where Algorithm 1 tuned's protection (4 sinks + 128 window) fills floor((1 - c) L)
    filled = sum(_word(r["verdict"]) == "worse" and math.floor((1 - r["ratio"]) * r["length"] + 1e-9) <= 132
                 for r in fams["algorithm 1"])
    assert (f"in {filled} of its" in lines[2]) == (filled > 0)
    assert "exploratory" in lines[3]
    with pytest.raises(ValueError, match="evaluate summary"):
        A.predictions_lines({"families": []})


def test_pair_verdict_frame_names_who_fills_the_budget(committed):
    choices, _, rows = committed
    from jacap_lib.experiments.protocol.rules import PAPER_PRESET

    alg1 = choices["chosen"]["jacap_prompt"]
    pairs = E.compare_settings(rows, alg1, PAPER_PRESET)
    frame = VE.pair_verdict_frame(pairs, alg1, PAPER_PRESET)
    assert list(frame.columns)[-1] == "note" and len(frame) == len(pairs)
    for r, note in zip(pairs, frame["note"]):
        budget = math.floor((1 - r["ratio"]) * r["length"] + 1e-9)
        tuned, published = budget <= 4 + 128, budget <= 4 + 32
        want = "both" if tuned and published else "Algorithm 1 tuned" if tuned else "" if not published else "?"
        assert note == (f"protection fills the budget: {want}" if want else ""), (r["cell"], note)
    assert any("both" in n for n in frame["note"]) and any(n == "" for n in frame["note"])


def test_document_ratio_figure_plots_the_rows(committed):
    choices, summary, rows = committed
    default, L, c = choices["chosen"]["jacap_obs"], 1024, 0.5
    base = choices["best_baseline"]["cells"][f"{L}/{c}"]["spec"]
    a, b = _cell_kls(rows, default, L, c), _cell_kls(rows, base, L, c)
    fig = VE.document_ratio_figure(rows, default, base, L, c)
    ys = list(fig.data[-1].y)
    assert ys == sorted(a[k] / b[k] for k in a)
    gm = math.exp(sum(math.log(y) for y in ys) / len(ys))
    assert any(tr.name.startswith(f"KL ratio {gm:.3g} ") and list(tr.y) == [gm, gm] for tr in fig.data)
    assert not any("interval" in tr.name for tr in fig.data)
    row = next(r for f in summary["families"] if f["role"] == "tuned jacap_obs" and f["picked_on"] == "tune"
               for r in f["rows"] if (r["length"], r["ratio"]) == (L, c))
    band = VE.document_ratio_figure(rows, default, base, L, c, verdict=row).data[0]
    assert band.name.startswith("adjusted interval") and min(band.y) == row["gm_low_adjusted"]
    with pytest.raises(ValueError, match="no cell"):
        VE.document_ratio_figure(rows, default, base, 999, c)


def test_verdict_counts_frame_counts_each_family(committed):
    _, summary, _ = committed
    frame = VE.verdict_counts_frame(summary)
    fams = [f for f in summary["families"] if f["picked_on"] == "tune"]
    assert len(frame) == len(fams) and frame.index[0] == "Algorithm 1 tuned"
    assert "the prompt press JacapPromptPress()" in frame.index
    by_total = {int(frame.loc[i, ["better", "worse", "no det. diff.", "identical"]].sum()) for i in frame.index}
    assert by_total == {len(fams[0]["rows"])}
    alg1 = next(f for f in fams if f["role"] == "algorithm 1")
    worse = [r for r in alg1["rows"] if _word(r["verdict"]) == "worse"]
    filled = sum(math.floor((1 - r["ratio"]) * r["length"] + 1e-9) <= 132 for r in worse)
    assert frame.loc["Algorithm 1 tuned", "worse"] == len(worse)
    assert frame.loc["Algorithm 1 tuned", "worse where protection fills the budget"] == filled
    with pytest.raises(ValueError, match="picked on"):
        VE.verdict_counts_frame(summary, picked_on="nowhere")
