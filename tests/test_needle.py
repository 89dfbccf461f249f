"""Needle retrieval with the tuned methods (jacap_lib.experiments.needle, `jacap evaluate needle`): the paired 0/1
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
from jacap_lib.experiments import needle as N  # noqa: E402
from jacap_lib.experiments.protocol import rules as P  # noqa: E402
from jacap_lib.verdicts import rows as RS  # noqa: E402
from jacap_lib.verdicts import intervals as V  # noqa: E402
from jacap_lib.results.provenance import model_record  # noqa: E402
from jacap_lib.viz.evaluation import needle_frame, needle_verdict_frame  # noqa: E402
from conftest import CharTokenizer  # noqa: E402

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
DEF, BASE = "jacap_prompt[window=4]", "snapkv[window_size=8]"
CHOSEN = {"knorm": "knorm", "snapkv": BASE, "jacap_prompt": DEF}


def _choices(lengths=(128,), ratios=(0.5, 0.75), record=None):
    space = {"knorm": ("knorm",), "snapkv": ("snapkv", BASE), "jacap_prompt": ("jacap_prompt", DEF)}
    record = record or model_record(None)
    cfg = P.protocol_config(model=record, lengths=lengths, ratios=ratios, continuation=8, space=space,
                            docs=[{"id": "u", "sha256": "s", "split": "tune"}, {"id": "t", "sha256": "s", "split": "dev"}])
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
    s = RS.needle_summary(rows, choices, settings=[DEF, BASE, P.PAPER_PRESET], paper_preset=P.PAPER_PRESET)
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
    # rows named as the figures name them (setting_names): the two Jacap settings would both be "jacap_prompt", so the tuned
    # one shows its short spec; the paper's preset and SnapKV's setting by their book names
    assert [name for _, name in f.index] == ["uncompressed (ceiling)", "jacap_prompt[window=4]", "snapkv",
                                             "Algorithm 1 as published"]
    assert f.loc[(128, "snapkv"), "c = 0.5"].startswith("40 [")
    v = needle_verdict_frame(s)
    assert len(v) == 4 and v.iloc[0]["won/lost"] == "5/1"
    assert needle_verdict_frame(s).loc[("paper's settings", "128 / 0.5"), "verdict"] == "identical on every prompt"


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
    (comp,) = RS.needle_summary(rows, choices, settings=[DEF, BASE])["comparisons"]
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
    s = RS.needle_summary(rows, choices, settings=[DEF, BASE])
    assert s["cells_measured"] == ["128/0.5"] and s["cells_missing"] == ["128/0.75"]
    with pytest.raises(ValueError, match="no complete"):
        RS.needle_summary(rows[:3], choices, settings=[DEF, BASE])


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
    assert ch["chosen"]["jacap_prompt"] in specs and P.PAPER_PRESET in specs and len(specs) == len(set(specs)) >= 10
    quick = N.needle_specs(ch, quick=True, cells=["512/0.75", "512/0.9"])
    assert quick[:2] == [ch["chosen"]["jacap_prompt"], P.PAPER_PRESET] and 3 <= len(quick) <= 4


# --------------------------------------------------------------------------------------------- the job, resumable
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
    assert {r["family"] for r in rows} == {"full", "knorm", "snapkv", "jacap_prompt"}
    run = io.read_runs(out / "needle.jsonl")[0]
    assert run["choices_fingerprint"] == choices["fingerprint"] and run["model"]["sha256"]
    assert run["trials"] == 2 and run["depths"] == [0.2, 0.8] and run["settings"][DEF]["window"] == 4
    # a rerun decodes nothing; a dropped row is decoded again, with the same answer
    import jacap_lib.measure.passkey as PK
    calls = []
    real = PK.needle_trial
    monkeypatch.setattr(PK, "needle_trial", lambda *a, **k: calls.append(1) or real(*a, **k))
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
    assert [f["label"] for f in s["comparisons"]] == [RS.BASELINE_LABEL, RS.PAPER_LABEL]
    # choices re-made with a method added (another fingerprint, the same choice for every method the runs used):
    # the runs stay valid; a changed choice makes them foreign
    cfg = {**choices["config"], "search_space": {**choices["config"]["search_space"], "jacap_obs": ["jacap_obs"]}}
    added = {**choices, "config": cfg, "fingerprint": P.fingerprint(cfg),
             "chosen": {**choices["chosen"], "jacap_obs": "jacap_obs"}}
    assert added["fingerprint"] != choices["fingerprint"]
    assert cli.main(["evaluate", "needle-summary", "--dir", str(out), "--choices", str(_write(tmp_path, added))]) == 0
    moved = {**added, "chosen": {**added["chosen"], "knorm": "knorm[x=1]"}}
    with pytest.raises(SystemExit) as e:
        cli.main(["evaluate", "needle-summary", "--dir", str(out), "--choices", str(_write(tmp_path, moved))])
    assert e.value.code == 2


def test_a_group_and_its_measure_travel_to_spawned_workers():
    """``--workers N`` sends each group and the measure to spawned processes: both must pickle."""
    import pickle

    from jacap_lib.measure.passkey import measure_needle

    plan_measure = N.row_measure("m")
    g = N.needle_groups(["knorm"], (128,), (0.5,), N.needle_keys((0.5,), 1, 0), "m")[0]
    back = pickle.loads(pickle.dumps((plan_measure, g)))
    assert back[0].func is measure_needle and back[1].jobs == [("full", 0.0), ("knorm", 0.5)]
    assert back[0].keywords["press_of"]("full", 0.0) is None and back[0].keywords["family_of"]("knorm") == "knorm"


# --------------------------------------------------------------------------------------------- digit survival, modes
class SpellTokenizer:
    """One token per printable character, id = ord(ch) - 32 (below the tiny model's 96), decoded back exactly."""

    def __call__(self, text, return_tensors=None, add_special_tokens=False):
        return type("Enc", (), {"input_ids": torch.tensor([[ord(ch) - 32 for ch in text]])})()

    def decode(self, ids):
        return "".join(chr(int(i) + 32) for i in ids)


def _fixed_press(scores, ratio):
    """A kvpress ScorerPress whose score is ``scores (H, N)`` whatever the layer: it keeps each head's top
    ``n_kept`` positions and writes them back in score order (kvpress's gather), not in position order."""
    from kvpress import ScorerPress

    class Fixed(ScorerPress):
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            return scores.unsqueeze(0).to(keys.dtype)

    return Fixed(compression_ratio=ratio)


def test_needle_layout_finds_the_key_digits_at_their_positions():
    from jacap_lib.measure.passkey import needle_layout, passkey_prompt

    tok = SpellTokenizer()
    for depth in (0.0, 0.37, 1.0):
        ctx, _ = passkey_prompt(tok, 150, depth, "40917")
        lay = needle_layout(tok, 150, depth, "40917")
        text = tok.decode(ctx[0])
        # brute force: the characters of every copy of the key in the context (one token per character)
        start, copies = lay["needle"][0], []
        at = text.find("40917", start)
        while 0 <= at < lay["needle"][1]:
            copies.append(list(range(at, at + 5)))
            at = text.find("40917", at + 5)
        assert lay["copies"] == copies and len(copies) == 2 and lay["key"] == copies[0] + copies[1]
        assert text[lay["needle"][0]:lay["needle"][1]] == " The pass key is 40917. Remember it. 40917 is the pass key. "
        assert sorted(lay["key"] + lay["other"]) == list(range(*lay["needle"]))


def test_digit_survival_equals_the_brute_force_intersection_at_true_positions():
    """A press with a known kept set per head, written back in score order: the recorded survival is the set
    intersection of the kept positions and the key's positions, computed by hand."""
    from jacap_lib.measure import passkey as PK
    from jacap_lib.measure.eviction import kept_positions
    from jacap_lib.measure.quality import capture_prefill, replay_press

    tok, model = SpellTokenizer(), tiny_model("llama", layers=2, seed=0)
    n, ratio = 128, 0.5
    ids, question, lay = PK.passkey_inputs(tok, n, 0.5, "40917", "after")
    gen = torch.Generator().manual_seed(3)
    scores = torch.rand(2, n, generator=gen)  # 2 KV heads
    scores[0, lay["key"][:3]] = 2.0  # head 0 surely keeps the first three digits, head 1 surely drops the key
    scores[1, lay["key"]] = -1.0
    cap = capture_prefill(model, ids)
    cache = replay_press(model, cap, _fixed_press(scores, ratio))
    n_kept = n - int(n * ratio)
    kept_sets = [set(scores[h].topk(n_kept).indices.tolist()) for h in range(2)]
    # the cache rows are in score order, so slot index != position: reading slots as positions would be wrong
    slots_in_order = torch.equal(cache.layers[0].keys[0, 0], cap.layers[0]["keys"][0, 0, sorted(kept_sets[0])])
    assert not slots_in_order
    mask = kept_positions(model, cap, cache)
    assert mask.shape == (2, 2, n)
    for layer in range(2):
        for h in range(2):
            assert set(torch.nonzero(mask[layer, h]).flatten().tolist()) == kept_sets[h]
    surv = PK.digit_survival(mask, lay)
    key, other = set(lay["key"]), set(lay["other"])
    by_hand = [len(kept_sets[h] & key) / len(key) for h in range(2)]
    assert surv["key_kept"] == [[round(x, 4) for x in by_hand]] * 2 and by_hand[1] == 0.0 and by_hand[0] >= 0.3
    assert surv["needle_other_kept"] == [[round(len(kept_sets[h] & other) / len(other), 4) for h in range(2)]] * 2
    assert surv["key_kept_frac"] == round(sum(by_hand) / 2, 4) and surv["key_all_kept"] is False
    span = set(range(*lay["needle"]))
    assert surv["needle_kept_frac"] == round(sum(len(kept_sets[h] & span) for h in range(2)) / (2 * len(span)), 4)
    whole = [any(set(c) <= kept_sets[h] for c in lay["copies"]) for h in range(2)]
    assert surv["key_copy_kept"] == sum(whole) / 2
    # a press that keeps the whole needle everywhere: all key digits survive
    keep_all = torch.zeros(2, n)
    keep_all[:, lay["needle"][0]:lay["needle"][1]] = 1.0
    full = PK.digit_survival(kept_positions(model, cap, replay_press(model, cap, _fixed_press(keep_all, ratio))), lay)
    assert full["key_all_kept"] is True and full["key_kept_frac"] == 1.0 and full["key_copy_kept"] == 1.0


def test_kept_positions_drop_the_keys_a_head_wise_press_masked():
    from jacap_lib.measure.eviction import kept_positions
    from jacap_lib.measure.quality import capture_prefill, replay_press

    model = tiny_model("llama", layers=2, seed=0)
    cap = capture_prefill(model, torch.arange(40).unsqueeze(0))
    cache = replay_press(model, cap, None)
    attn = model.model.layers[1].self_attn
    attn.masked_key_indices = (torch.tensor([0, 0, 0]), torch.tensor([0, 1, 1]), torch.tensor([5, 7, 39]))
    try:
        mask = kept_positions(model, cap, cache)
    finally:
        attn.masked_key_indices = None
    assert mask[0].all()
    assert {tuple(x) for x in torch.nonzero(~mask[1]).tolist()} == {(0, 5), (1, 7), (1, 39)}


def test_inside_mode_compresses_the_question_and_matches_after_without_compression():
    """``inside`` prefills the context and the question but its last token; uncompressed, both modes are the
    same computation, so they give the same greedy answer."""
    from jacap_lib.measure import passkey as PK
    from jacap_lib.measure.quality import capture_prefill

    tok, model = SpellTokenizer(), tiny_model("llama", layers=2, seed=1)
    ctx, q, lay = PK.passkey_inputs(tok, 96, 0.3, "55555", "after")
    pre, last, lay2 = PK.passkey_inputs(tok, 96, 0.3, "55555", "inside")
    assert lay == lay2 and torch.equal(pre, torch.cat([ctx, q[:, :-1]], 1)) and torch.equal(last, q[:, -1:])
    a = PK.needle_trial(model, tok, capture_prefill(model, ctx), None, q, lay, n_new=6)
    b = PK.needle_trial(model, tok, capture_prefill(model, pre), None, last, lay, n_new=6)
    assert a["answer"] == b["answer"] and a["kept_tokens"] == 96 and b["kept_tokens"] == 96 + q.shape[1] - 1
    assert a["key_all_kept"] and b["key_all_kept"]
    with pytest.raises(ValueError, match="mode"):
        PK.passkey_inputs(tok, 96, 0.3, "55555", "before")


def test_modes_are_keyed_apart_and_old_rows_read_as_after(tmp_path, monkeypatch):
    choices, space = _choices(ratios=(0.5,))
    monkeypatch.setattr(P, "SEARCH_SPACE", space)
    path = _write(tmp_path, choices)
    out = tmp_path / "e"
    base = ["--dir", str(out), "--choices", str(path), "--lengths", "128", "--ratios", "0.5", "--depths", "0.5",
            "--trials", "1", "--no-progress"]
    model, tok = tiny_model("llama", layers=2, seed=0), SpellTokenizer()
    n_after = N.execute(N.prepare(_parse(base)), model=model, tokenizer=tok)["rows_written"]
    n_inside = N.execute(N.prepare(_parse(base + ["--mode", "inside"])), model=model, tokenizer=tok)["rows_written"]
    rows = io.read_jsonl(out / "needle.jsonl")
    assert n_after == n_inside == 1 + 4 and len(rows) == 10 and len({N.row_key(r) for r in rows}) == 10
    assert [r["mode"] for r in rows] == ["after"] * 5 + ["inside"] * 5
    assert [r["mode"] for r in io.read_runs(out / "needle.jsonl")] == ["after", "inside"]
    assert all(len(r["key_kept"]) == 2 and len(r["key_kept"][0]) == 2 for r in rows)
    # a row made before the option (no "mode") is an "after" row: resuming in "after" skips it
    legacy = {k: v for k, v in rows[0].items() if k != "mode"}
    assert N.row_key(legacy) == N.row_key(rows[0])
    assert N.execute(N.prepare(_parse(base + ["--mode", "inside"])), model=model, tokenizer=tok)["rows_written"] == 0
    # the protocol's summary reads one mode
    s_after = RS.needle_summary(rows, choices, settings=[DEF, BASE, P.PAPER_PRESET], paper_preset=P.PAPER_PRESET)
    s_in = RS.needle_summary(rows, choices, settings=[DEF, BASE, P.PAPER_PRESET], mode="inside", paper_preset=P.PAPER_PRESET)
    assert [a["correct"] for a in s_after["cells"][0]["settings"]] == [int(r["correct"]) for r in rows[1:4]]
    assert [a["correct"] for a in s_in["cells"][0]["settings"]] == [int(r["correct"]) for r in rows[6:9]]


@pytest.mark.parametrize("extra,msg", [(["--mode", "before"], "--mode"), (["--probe", "--quick"], "--probe")])
def test_bad_mode_or_probe_calls_exit_2(extra, msg, tmp_path, no_model, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["evaluate", "needle", "--dir", str(tmp_path / "e")] + extra)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and err.startswith("usage: jacap evaluate needle ")
    assert list(tmp_path.iterdir()) == []


def test_probe_summary_against_hand_values():
    choices, _ = _choices(ratios=(0.5,))
    specs = [DEF, BASE, P.PAPER_PRESET]
    outcomes = {("full", 0.0): [1] * 10, (DEF, 0.5): A, (BASE, 0.5): B, (P.PAPER_PRESET, 0.5): [1] * 10}
    rows = []
    for mode, flip in (("after", False), ("inside", True)):
        for r in _rows(outcomes):
            r = dict(r, mode=mode)
            if flip and r["method"] == DEF:
                r["correct"] = True
            # key survival: all digits kept on the even trials; per layer (2) x head (2) fractions
            allk = r["trial"] % 2 == 0
            r.update(key_kept=[[1.0, 1.0], [1.0, 1.0 if allk else 0.5]], key_kept_frac=1.0 if allk else 0.875,
                     needle_kept_frac=0.9, key_all_kept=allk, key_copy_kept=1.0 if allk else 0.75)
            rows.append(r)
    s = RS.needle_probe_summary(rows, choices, settings=specs)
    after = s["modes"]["after"]
    sv = {x["spec"]: x for x in after["survival"]}[DEF]
    assert sv["key_kept_mean"] == pytest.approx((5 * 1.0 + 5 * 0.875) / 10) and sv["all_kept_fraction"] == 0.5
    assert sv["key_kept_by_layer"] == pytest.approx([1.0, 0.875])
    even, odd = A[0::2], A[1::2]  # trials 0, 2, ... have every digit
    assert sv["accuracy_all_kept"]["accuracy"] == sum(even) / 5 and sv["accuracy_not_all_kept"]["accuracy"] == sum(odd) / 5
    assert sv["accuracy_all_kept"]["low"] < sv["accuracy_all_kept"]["accuracy"] <= sv["accuracy_all_kept"]["high"]
    # default against each other setting; Holm over the mode's two comparisons by hand
    comp = {f["reference"]: f["rows"][0] for f in after["comparisons"]}
    assert set(comp) == {BASE, P.PAPER_PRESET}
    p_base, p_paper = V.mcnemar_p(A, B), V.mcnemar_p(A, [1] * 10)
    lo, hi = sorted([p_base, p_paper])
    holm = {lo: min(1, 2 * lo), hi: min(1, max(2 * lo, hi))}
    assert comp[BASE]["p_holm"] == pytest.approx(holm[p_base]) and comp[P.PAPER_PRESET]["p_holm"] == pytest.approx(holm[p_paper])
    # inside vs after, per setting: the default gains the prompts it missed, the others are identical
    eff = {e["spec"]: e for e in s["mode_effect"]}
    assert (eff[DEF]["wins"], eff[DEF]["losses"]) == (10 - sum(A), 0) and eff[BASE]["diff_points"] == 0.0
    assert s["modes"]["inside"]["cells"][0]["settings"][0]["accuracy"] == 1.0
    # pooled over the three settings (30 rows): the bins of key_kept_frac and the per-layer means, by hand
    pooled = after["pooled"]
    comp_rows = [r for r in rows if r["mode"] == "after" and r["method"] != "full"]
    assert pooled["n"] == 30 and [b["n"] for b in pooled["bins"]] == [0, 0, 0, 30]
    assert pooled["bins"][-1]["accuracy"] == pytest.approx(sum(r["correct"] for r in comp_rows) / 30)
    wrong = [r for r in comp_rows if not r["correct"]]
    assert pooled["n_wrong"] == len(wrong)
    assert pooled["key_kept_by_layer_wrong"] == pytest.approx([1.0, sum(0.75 if r["trial"] % 2 else 1.0 for r in wrong) / len(wrong)])


def test_survival_figure_and_tables_draw_the_summary():
    from jacap_lib.viz.needle import mode_effect_frame, style_key, survival_figure, survival_frame
    from jacap_lib.viz.style import METHOD_STYLES

    choices, _ = _choices(ratios=(0.5, 0.75))
    rows = []
    for mode in ("after", "inside"):
        for c in (0.5, 0.75):
            for r in _rows({("full", 0.0): [1] * 4, (DEF, c): [1, 0, 1, 0], ("capkv[tau=10]", c): [1, 1, 1, 1]}):
                if r["method"] == "full" and c == 0.75:
                    continue
                r.update(mode=mode, key_kept=[[1.0, 0.5], [0.0, 0.0], [1.0, 1.0]], key_kept_frac=0.5833,
                         needle_kept_frac=0.6, key_all_kept=False, key_copy_kept=0.3)
                rows.append(r)
    s = RS.needle_probe_summary(rows, choices, settings=[DEF, "capkv[tau=10]"])
    fig = survival_figure(s, "after")
    assert len(fig.data) == 2 * 2  # two settings x two panels
    first = fig.data[0]
    assert list(first.y) == pytest.approx([0.75, 0.0, 1.0]) and list(first.x) == [0, 1, 2]
    assert first.name == f"{DEF}: accuracy 50%, 50%" and first.line.color == METHOD_STYLES["jacap_prompt"][0]
    cap = [t for t in fig.data if t.name.startswith("capkv")][0]
    assert style_key("capkv[tau=10]") == "capkv" and cap.line.color == METHOD_STYLES["capkv"][0]
    assert fig.layout.xaxis.title.text == "layer" and fig.layout.xaxis2.title.text == "layer"
    assert fig.layout.yaxis.title.text and fig.layout.yaxis2.title.text
    f = survival_frame(s, "inside")  # a narrow headline table; the supporting columns in its details
    assert list(f.columns) == ["accuracy [95 % CI]", "key digits kept", "needle kept"]
    assert f.loc[(DEF, 128, 0.5), "key digits kept"] == "58%" and f.loc[(DEF, 128, 0.5), "needle kept"] == "60%"
    d = survival_frame(s, "inside", details=True)
    assert list(d.columns) == ["caches with a whole copy", "every digit everywhere", "accuracy, every digit kept",
                               "accuracy, some digit lost"]
    assert d.loc[(DEF, 128, 0.5), "accuracy, some digit lost"] == "50% (2/4)"
    assert d.loc[(DEF, 128, 0.5), "accuracy, every digit kept"] == "–"
    assert d.loc[(DEF, 128, 0.5), "caches with a whole copy"] == "30%"
    m = mode_effect_frame(s)
    assert len(m) == 4 and list(m.columns) == ["inside", "after", "verdict"]
    md = mode_effect_frame(s, details=True)
    assert list(md.columns) == ["n", "difference, pts [95 % CI]", "wins/losses", "McNemar p", "Holm p"]
    e = s["mode_effect"][0]
    assert md.iloc[0]["difference, pts [95 % CI]"].split(" ", 1)[0] == f"{e['diff_points']:.0f}".replace("-", "−")
    with pytest.raises(ValueError, match="mode"):
        survival_figure(s, "before")


def test_probe_specs_are_algorithm1_the_paper_the_default_press_and_the_baselines():
    from jacap_lib.experiments.protocol.rules import PAPER_PRESET

    chosen = {"jacap_prompt": "jacap_prompt[tau=3]", "jacap_obs": "jacap_obs[window=16]", "capkv": "capkv[tau=50]",
              "keydiff": "keydiff", "snapkv": "snapkv[window_size=16]", "expected_attention": "expected_attention",
              "tova": "tova", "knorm": "knorm"}
    assert N.probe_specs({"chosen": chosen}) == ["jacap_prompt[tau=3]", PAPER_PRESET, "jacap_obs[window=16]", "capkv[tau=50]",
                                                 "keydiff", "snapkv[window_size=16]", "expected_attention", "tova"]
    del chosen["jacap_obs"]
    with pytest.raises(ValueError, match="jacap_obs"):
        N.probe_specs({"chosen": chosen})


def test_probe_figure_draws_each_jacap_setting_in_its_own_colour():
    """Algorithm 1 tuned and Algorithm 1 as published are two settings of one method: the probe figure gives each its
    own colour (its short spec's style), named as the book names them."""
    from jacap_lib.results import loaders as R
    from jacap_lib.experiments.protocol import rules as P
    from jacap_lib.viz import needle as VN
    from jacap_lib.viz.style import METHOD_STYLES

    assert VN.style_key(P.PAPER_PRESET) in METHOD_STYLES and VN.style_key(P.PAPER_PRESET) != "jacap_prompt"
    fig = VN.survival_figure(R.load_needle_probe_summary())
    colours = {t.name.split(":")[0]: t.line.color for t in fig.data if t.showlegend}
    assert colours["Algorithm 1 tuned"] != colours["Algorithm 1 as published"]
    assert len(set(colours.values())) == len(colours)


def test_space_runs_that_spaces_choices_into_its_folder(tmp_path):
    """--space context: the context space's own choices.json, its choice as the one setting, rows in its folder;
    --quick/--probe/--methods refused where they have no meaning, before any work."""
    from jacap_lib.results.paths import data_path

    ch = io.read_json(data_path("results", "eval", "context", "choices.json"))
    plan = N.prepare(_parse(["--space", "context", "--dir", str(tmp_path / "c"), "--no-progress"]))
    assert plan.specs == [ch["chosen"]["jacap"]] and plan.out == tmp_path / "c" / "needle.jsonl"
    assert plan.choices_path == data_path("results", "eval", "context", "choices.json")
    peers = io.read_json(data_path("results", "eval", "peers", "choices.json"))
    plan = N.prepare(_parse(["--space", "peers", "--methods", "kvzip", "--dir", str(tmp_path / "p")]))
    assert plan.specs == [peers["chosen"]["kvzip"]]
    for argv, match in ((["--space", "peers", "--quick"], "--quick"), (["--space", "context", "--probe"], "--probe"),
                        (["--methods", "kvzip"], "--methods"), (["--space", "peers", "--methods", "nope"], "nope")):
        with pytest.raises(ValueError, match=match):
            N.prepare(_parse(argv + ["--dir", str(tmp_path / "x")]))
    assert not (tmp_path / "x").exists() and not (tmp_path / "c").exists()
