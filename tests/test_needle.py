"""Needle retrieval with the tuned methods (jacap_lib.results.needle, `jacap evaluate needle`): the paired 0/1
statistics against hand computations, the verdict on the points scale, the job's refusals before any model
load, and resumable keyed rows on a tiny model."""
import argparse
import json
import math

import numpy as np
import pytest
import torch

pytest.importorskip("kvpress")

from jacap_lib import cli  # noqa: E402
from jacap_lib.measure.kvpress_grid import tiny_model  # noqa: E402
from jacap_lib.results import files as io  # noqa: E402
from jacap_lib.results import needle as N  # noqa: E402
from jacap_lib.results import protocol as P  # noqa: E402
from jacap_lib.results import verdicts as V  # noqa: E402
from jacap_lib.results.provenance import model_record  # noqa: E402
from jacap_lib.viz.evaluation import needle_frame, needle_verdict_frame  # noqa: E402

# --------------------------------------------------------------------------------------------- statistics
# 10 prompts: the method right on 8, the reference on 4; only the method right on 5, only the reference on 1
A = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]
B = [1, 1, 0, 0, 0, 0, 0, 1, 1, 0]


def test_accuracy_difference_equals_the_hand_value_and_its_interval_holds_it():
    d = V.accuracy_difference(A, B)
    assert d.estimate == pytest.approx(100 * (8 / 10 - 4 / 10)) and d.n == 10 and d.method == "percentile"
    assert d.low < d.estimate < d.high and -100 <= d.low and d.high <= 100
    # an independent paired bootstrap (prompts resampled, the pair kept) lands on nearly the same ends
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 10, size=(20000, 10))
    boot = 100 * (np.asarray(A)[idx].mean(1) - np.asarray(B)[idx].mean(1))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    assert abs(d.low - lo) <= 10 and abs(d.high - hi) <= 10  # one discordant prompt is 10 points
    assert d.low == pytest.approx(0.0, abs=10) and d.high == pytest.approx(70.0, abs=10)


def test_all_pairs_agree_gives_a_point_interval_and_p_one():
    same = [1, 0, 1, 1, 0]
    d = V.accuracy_difference(same, same)
    assert (d.estimate, d.low, d.high) == (0.0, 0.0, 0.0)
    assert V.mcnemar_p(same, same) == 1.0
    d = V.accuracy_difference([1, 1, 1], [0, 0, 0])  # every prompt +1: every resample +100
    assert (d.estimate, d.low, d.high) == (100.0, 100.0, 100.0)
    assert V.verdict(d, scale="points") == "better by 100 points"


def test_mcnemar_is_the_exact_binomial_on_the_discordant_prompts():
    # 5 wins, 1 loss: p = 2 * P(X <= 1), X ~ Bin(6, 1/2) = 2 * (1 + 6) / 64
    assert V.mcnemar_p(A, B) == pytest.approx(2 * (1 + 6) / 64)
    assert V.mcnemar_p(B, A) == pytest.approx(2 * (1 + 6) / 64)
    assert V.mcnemar_p([1] * 7, [0] * 7) == pytest.approx(2 / 2 ** 7)
    with pytest.raises(ValueError, match="0/1"):
        V.mcnemar_p([1, 2], [0, 1])
    with pytest.raises(ValueError, match="same length"):
        V.mcnemar_p([1, 0], [0])


def test_accuracy_interval_is_wilsons():
    a, lo, hi = V.accuracy_interval(A)
    z = 1.959963984540054
    n, p = 10, 0.8
    mid, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert a == 0.8 and lo == pytest.approx(mid - half) and hi == pytest.approx(mid + half)
    assert V.accuracy_interval([0, 0, 0])[:2] == (0.0, 0.0)


@pytest.mark.parametrize("interval,kw,sentence", [
    ((3.3, 20.0), {}, "better by 3–20 points"),
    ((-20.0, -3.3), {}, "worse by 3–20 points"),
    ((-6.7, 10.0), {}, "no detectable difference; the interval is −7 to +10 points"),
    ((-10.0, 10.0), {}, "no detectable difference; the interval is ±10 points"),
    ((0.0, 0.0), {}, "no difference: identical on every prompt"),
    ((-10.0, 0.0), {}, "no detectable difference; the interval is −10 to 0 points"),
    ((3.3, 20.0), {"higher_is_better": False}, "worse by 3–20 points"),  # the direction is the argument's
    ((0.8, 0.9), {}, "better by 10–20 %"),  # the ratio scale: lower is better, unchanged
    ((0.8, 0.9), {"higher_is_better": True}, "worse by 10–20 %"),
])
def test_verdict_on_the_points_scale(interval, kw, sentence):
    scale = "ratio" if interval[0] > 0.5 and interval[1] < 1 else "points"
    assert V.verdict(interval, scale=scale, **kw) == sentence


def test_verdict_refuses_an_unknown_scale():
    with pytest.raises(ValueError, match="scale"):
        V.verdict((1, 2), scale="percent")


# --------------------------------------------------------------------------------------------- the summary
DEF, BASE = "jacap[window=4]", "snapkv[window_size=8]"
CHOSEN = {"knorm": "knorm", "snapkv": BASE, "jacap": DEF}


def _choices(lengths=(128,), ratios=(0.5, 0.75), record=None):
    space = {"knorm": ("knorm",), "snapkv": ("snapkv", BASE), "jacap": ("jacap", DEF)}
    record = record or model_record(None)
    cfg = P.protocol_config(model=record, lengths=lengths, ratios=ratios, continuation=8, space=space,
                            docs=[{"id": "u", "sha256": "s", "split": "tune"}, {"id": "t", "sha256": "s", "split": "test"}])
    cells = {f"{L}/{float(c)}": {"length": L, "ratio": float(c), "method": "snapkv", "spec": BASE}
             for L in lengths for c in ratios}
    return {"config": cfg, "fingerprint": P.fingerprint(cfg), "chosen": dict(CHOSEN),
            "best_baseline": {"picked_on": "tune", "cells": cells}}, space


def _rows(outcomes: dict, L=128):
    """``{(method, ratio): [0/1 per prompt]}`` -> needle rows on prompts (depth 0.5, trial t, key str(t))."""
    return [{"model": "SmolLM2-135M-Instruct", "length": L, "depth": 0.5, "trial": t, "key": f"1000{t}",
             "method": m, "ratio": c, "correct": bool(x)} for (m, c), xs in outcomes.items() for t, x in enumerate(xs)]


def test_needle_summary_against_hand_values_and_holm():
    choices, _ = _choices()
    full = [1] * 10
    rows = _rows({("full", 0.0): full, (DEF, 0.5): A, (BASE, 0.5): B, (P.PAPER_PRESET, 0.5): A,
                  (DEF, 0.75): [1] * 7 + [0] * 3, (BASE, 0.75): [0] * 10, (P.PAPER_PRESET, 0.75): [1] * 10})
    s = N.needle_summary(rows, choices, settings=[DEF, BASE, P.PAPER_PRESET])
    assert s["cells_measured"] == ["128/0.5", "128/0.75"] and s["cells_missing"] == []
    cell = s["cells"][0]
    assert cell["n_prompts"] == 10 and cell["full"]["accuracy"] == 1.0
    assert [a["accuracy"] for a in cell["settings"]] == [0.8, 0.4, 0.8]
    base, paper = s["comparisons"]
    assert base["label"] == "best baseline by KL on tune" and paper["label"] == "paper preset"
    r05, r075 = base["rows"]
    assert (r05["reference_spec"], r05["diff_points"], r05["wins"], r05["losses"]) == (BASE, pytest.approx(40.0), 5, 1)
    assert r05["p_mcnemar"] == pytest.approx(2 * 7 / 64)
    assert (r075["diff_points"], r075["wins"], r075["losses"]) == (pytest.approx(70.0), 7, 0)
    p075 = 2 / 2 ** 7
    assert r075["p_mcnemar"] == pytest.approx(p075)
    # Holm by hand over the family's two cells: the smaller p times 2, then max(that, the larger p times 1)
    assert r075["p_holm"] == pytest.approx(2 * p075)
    assert r05["p_holm"] == pytest.approx(max(2 * p075, 2 * 7 / 64))
    # the verdict is the Holm-adjusted exact test's: 2 p075 = 1/32 <= 0.05 -> better; 0.5 is not
    assert r075["verdict"] == "better" and r075["diff_low"] > 0
    assert r05["verdict"] == "no detectable difference" and r05["p_holm"] > 0.05
    # against the paper preset: equal at 0.5 (a point interval), worse by 30 points at 0.75
    q05, q075 = paper["rows"]
    assert (q05["diff_points"], q05["diff_low"], q05["diff_high"], q05["p_mcnemar"]) == (0.0, 0.0, 0.0, 1.0)
    assert q05["verdict"] == "no difference: identical on every prompt"
    assert q075["diff_points"] == pytest.approx(-30.0) and q075["losses"] == 3 and q075["wins"] == 0
    # the resamples without a loss give 0: the percentile interval touches 0; McNemar p = 1/4, Holm 1/2
    assert q075["diff_high"] == 0.0 and q075["diff_low"] < -30.0
    assert q075["p_holm"] == pytest.approx(2 * 2 / 2 ** 3) and q075["verdict"] == "no detectable difference"
    # the book's tables
    f = needle_frame(s)
    assert list(f.index) == ["uncompressed (ceiling)", DEF, BASE, P.PAPER_PRESET]
    assert f.loc[BASE, "128 / 0.5"].startswith("40% [")
    v = needle_verdict_frame(s)
    assert len(v) == 4 and v.iloc[0]["wins/losses"] == "5/1"


def brute_mcnemar(wins, losses):
    """Exact two-sided binomial p by enumeration: the probability, under 1/2 per discordant prompt, of every
    split of the n = wins + losses discordant prompts no more likely than the one seen."""
    n = wins + losses
    prob = [math.comb(n, k) / 2 ** n for k in range(n + 1)]
    return min(1.0, sum(q for q in prob if q <= prob[wins] * (1 + 1e-9)))


def test_needle_verdict_is_the_holm_adjusted_exact_mcnemar():
    """Three cells, 10 prompts each: wins/losses 7/0, 6/1 and 0/6. Unadjusted, 7/0 (p 1/64) and 0/6 (p 1/32)
    pass 0.05; Holm over the three keeps only 7/0 (3/64 = 0.047), 0/6 becomes 2/32 = 0.0625. The bootstrap
    interval of 6/1 (+50 points) lies above 0 but its exact p (1/8) does not decide anything."""
    choices, _ = _choices(ratios=(0.5, 0.75, 0.9))
    rows = _rows({("full", 0.0): [1] * 10,
                  (DEF, 0.5): [1] * 7 + [0] * 3, (BASE, 0.5): [0] * 10,
                  (DEF, 0.75): [1] * 6 + [0] * 4, (BASE, 0.75): [0] * 6 + [1] + [0] * 3,
                  (DEF, 0.9): [0] * 10, (BASE, 0.9): [1] * 6 + [0] * 4})
    (comp,) = N.needle_summary(rows, choices, settings=[DEF, BASE])["comparisons"]
    by = {r["ratio"]: r for r in comp["rows"]}
    assert [(by[c]["wins"], by[c]["losses"]) for c in (0.5, 0.75, 0.9)] == [(7, 0), (6, 1), (0, 6)]
    p = {c: brute_mcnemar(by[c]["wins"], by[c]["losses"]) for c in by}
    assert p == pytest.approx({0.5: 1 / 64, 0.75: 1 / 8, 0.9: 1 / 32})
    assert {c: by[c]["p_mcnemar"] for c in by} == pytest.approx(p)
    # Holm by hand: 3 x 1/64, then max(that, 2 x 1/32), then max(that, 1 x 1/8)
    holm = {0.5: 3 / 64, 0.9: max(3 / 64, 2 / 32), 0.75: max(3 / 64, 2 / 32, 1 / 8)}
    assert {c: by[c]["p_holm"] for c in by} == pytest.approx(holm)
    assert {c: by[c]["verdict"] for c in by} == {0.5: "better", 0.75: "no detectable difference",
                                                 0.9: "no detectable difference"}
    assert by[0.75]["diff_low"] > 0  # the descriptive interval alone would have said "better"


def test_needle_summary_names_incomplete_cells():
    choices, _ = _choices()
    rows = _rows({("full", 0.0): [1, 1], (DEF, 0.5): [1, 0], (BASE, 0.5): [0, 0], (DEF, 0.75): [1, 0]})
    s = N.needle_summary(rows, choices, settings=[DEF, BASE])
    assert s["cells_measured"] == ["128/0.5"] and s["cells_missing"] == ["128/0.75"]
    with pytest.raises(ValueError, match="no complete"):
        N.needle_summary(rows[:3], choices, settings=[DEF, BASE])


def test_keys_are_seeded_five_digit_and_distinct_per_prompt():
    k = N.needle_keys((0.1, 0.5), 3, seed=0)
    assert list(k) == [(0.1, 0), (0.1, 1), (0.1, 2), (0.5, 0), (0.5, 1), (0.5, 2)]
    assert all(len(v) == 5 and v.isdigit() for v in k.values()) and k == N.needle_keys((0.1, 0.5), 3, seed=0)
    assert k != N.needle_keys((0.1, 0.5), 3, seed=1)


# --------------------------------------------------------------------------------------------- refusals
@pytest.fixture
def no_model(monkeypatch):
    import jacap_lib.models

    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(jacap_lib.models, "load_model", boom)


@pytest.mark.parametrize("extra,msg", [
    (["--choices", "{tmp}/none.json"], "does not exist"),
    (["--trials", "0"], "--trials"),
    (["--lengths", "32"], "--lengths"),
    (["--depths", "1.5"], "--depths"),
    (["--ratios", "1.0"], "--ratios"),
    (["--workers", "0"], "--workers"),
])
def test_bad_calls_exit_2_before_any_model_and_write_nothing(extra, msg, tmp_path, no_model, capsys):
    argv = ["evaluate", "needle", "--dir", str(tmp_path / "e")] + [a.replace("{tmp}", str(tmp_path)) for a in extra]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and err.startswith("usage: jacap evaluate needle ")
    assert list(tmp_path.iterdir()) == []


def _write(tmp_path, data):
    path = tmp_path / "choices.json"
    path.write_text(json.dumps(data))
    return path


def test_choices_of_another_configuration_are_refused(tmp_path, monkeypatch, no_model, capsys):
    choices, space = _choices()
    monkeypatch.setattr(P, "SEARCH_SPACE", space)
    rec = model_record(None)
    # accepted as made
    assert N.read_choices(_write(tmp_path, choices), rec, (128,), (0.5,))["chosen"] == CHOSEN
    cases = [
        ({**choices, "fingerprint": "0" * 64}, "fingerprint"),
        (_choices(record={"name": rec["name"], "sha256": "f" * 64})[0], "another model"),
        (_choices(lengths=(256,))[0], "no best baseline"),  # the asked cell 128/0.5 is not among its cells
    ]
    for data, msg in cases:
        with pytest.raises(ValueError, match=msg):
            N.read_choices(_write(tmp_path, data), rec, (128,), (0.5,))
    monkeypatch.setattr(P, "SEARCH_SPACE", {**space, "tova": ("tova",)})
    with pytest.raises(ValueError, match="another search space"):
        N.read_choices(_write(tmp_path, choices), rec, (128,), (0.5,))
    out = tmp_path / "e"
    with pytest.raises(SystemExit) as e:  # through the command line: exit 2, nothing written
        cli.main(["evaluate", "needle", "--dir", str(out), "--choices", str(tmp_path / "choices.json"),
                  "--lengths", "128", "--ratios", "0.5"])
    assert e.value.code == 2 and "another search space" in capsys.readouterr().err and not out.exists()


def test_the_committed_choices_are_accepted():
    """The evaluation's own choices.json passes the checks for the job's default cells (full and quick)."""
    from jacap_lib.results.paths import data_path

    path = data_path("results", "eval", "choices.json")
    ch = N.read_choices(path, model_record(None), N.DEFAULT_LENGTHS, N.DEFAULT_RATIOS)
    specs = N.needle_specs(ch)
    assert ch["chosen"]["jacap"] in specs and P.PAPER_PRESET in specs and len(specs) == len(set(specs)) >= 10
    quick = N.needle_specs(ch, quick=True, cells=["512/0.75", "512/0.9"])
    assert quick[:2] == [ch["chosen"]["jacap"], P.PAPER_PRESET] and 3 <= len(quick) <= 4


# --------------------------------------------------------------------------------------------- the job, resumable
V96 = 96


class CharTokenizer:
    """One token per character (ids below the tiny model's vocabulary); decodes ids back to characters."""

    def __call__(self, text, return_tensors=None, add_special_tokens=False):
        return type("Enc", (), {"input_ids": torch.tensor([[ord(ch) % V96 for ch in text]])})()

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _parse(argv):
    ap = argparse.ArgumentParser()
    N.add_arguments(ap)
    return ap.parse_args(argv)


def test_job_writes_keyed_rows_and_resumes(tmp_path, monkeypatch):
    choices, space = _choices(ratios=(0.5, 0.75))
    monkeypatch.setattr(P, "SEARCH_SPACE", space)
    path = _write(tmp_path, choices)
    out = tmp_path / "e"
    argv = ["--dir", str(out), "--choices", str(path), "--lengths", "128", "--ratios", "0.5", "0.75",
            "--depths", "0.2", "0.8", "--trials", "2", "--no-progress"]
    model, tok = tiny_model("llama", layers=2, seed=0), CharTokenizer()
    plan = N.prepare(_parse(argv))
    assert plan.specs == [*dict.fromkeys(CHOSEN.values()), P.PAPER_PRESET]
    res = N.execute(plan, model=model, tokenizer=tok)
    rows = io.read_jsonl(out / "needle.jsonl")
    n_prompts, per_prompt = 2 * 2, 1 + 4 * 2  # depths x trials; full + 4 settings x 2 ratios
    assert res["rows_written"] == len(rows) == n_prompts * per_prompt
    assert len({N.row_key(r) for r in rows}) == len(rows)
    keys = N.needle_keys((0.2, 0.8), 2, seed=0)
    assert all(r["key"] == keys[(r["depth"], r["trial"])] and r["correct"] == (r["key"] in r["answer"]) for r in rows)
    full = [r for r in rows if r["method"] == "full"]
    assert len(full) == n_prompts and all(r["kept_tokens"] == 128 and r["ratio"] == 0.0 for r in full)
    assert all(r["kept_tokens"] == int(128 * (1 - r["ratio"])) for r in rows if r["method"] in (DEF, BASE, "knorm"))
    assert {r["family"] for r in rows} == {"full", "knorm", "snapkv", "jacap"}
    run = io.read_runs(out / "needle.jsonl")[0]
    assert run["choices_fingerprint"] == choices["fingerprint"] and run["model"]["sha256"]
    assert run["trials"] == 2 and run["depths"] == [0.2, 0.8] and run["settings"][DEF]["window"] == 4
    # a rerun decodes nothing; a dropped row is decoded again, with the same answer
    import jacap_lib.measure.passkey as PK
    calls = []
    real = PK.passkey_trial
    monkeypatch.setattr(PK, "passkey_trial", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert N.execute(N.prepare(_parse(argv)), model=model, tokenizer=tok)["rows_written"] == 0 and not calls
    (out / "needle.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    assert N.execute(N.prepare(_parse(argv)), model=model, tokenizer=tok)["rows_written"] == 1 and len(calls) == 1
    assert io.read_jsonl(out / "needle.jsonl")[-1]["answer"] == rows[-1]["answer"]
    assert len(io.read_runs(out / "needle.jsonl")) == 3
    # the summary leaf on these rows
    assert cli.main(["evaluate", "needle-summary", "--dir", str(out), "--choices", str(path)]) == 0
    s = json.loads((out / "needle_summary.json").read_text())
    assert s["cells_measured"] == ["128/0.5", "128/0.75"] and s["config"]["trials"] == 2
    assert [c["n_prompts"] for c in s["cells"]] == [4, 4]
    assert [f["label"] for f in s["comparisons"]] == [N.BASELINE_LABEL, N.PAPER_LABEL]


def test_a_group_and_its_measure_travel_to_spawned_workers():
    """``--workers N`` sends each group and the measure to spawned processes: both must pickle."""
    import pickle

    plan_measure = __import__("functools").partial(N.measure_needle, model_name="m")
    g = N.needle_groups(["knorm"], (128,), (0.5,), N.needle_keys((0.5,), 1, 0), "m")[0]
    back = pickle.loads(pickle.dumps((plan_measure, g)))
    assert back[0].func is N.measure_needle and back[1].jobs == [("full", 0.0), ("knorm", 0.5)]
