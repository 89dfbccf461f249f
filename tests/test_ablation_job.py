"""The one-knob ablation job (jacap_lib.experiments.ablation, `jacap evaluate ablate|ablate-summary`): rows on the tune
documents only, paired with the default per document, resumable, refusing a spec that now builds another press;
the summary's ratios, simultaneous intervals and per-layer ratios against hand computations on hand-built rows."""
import argparse
import json
import math

import numpy as np
import pytest

kvpress = pytest.importorskip("kvpress")

from jacap_lib.presses.registry import press_from_spec  # noqa: E402
from jacap_lib.experiments import ablation as A  # noqa: E402
from jacap_lib.results import files as io  # noqa: E402
from jacap_lib.verdicts import intervals as V  # noqa: E402
from conftest import CharTokenizer, sharpened_tiny_llama, write_corpus  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return sharpened_tiny_llama()


@pytest.fixture
def corpus(tmp_path):
    """A manifest of 3 tune + 1 dev documents of ~200 characters."""
    return write_corpus(tmp_path, ["tune", "tune", "dev", "tune"])


KNOBS = {"u = W_O v": ("jacap_prompt_wo[window=4]", "u = W_O v"), "flat": ("jacap_prompt[window=4,beta=none]", "flat statistics")}


@pytest.fixture
def knobs(monkeypatch):
    monkeypatch.setattr(A, "knob_table", lambda: ({k: (s, d, A.knob_spec("jacap_prompt[window=4]"))
                                                   for k, (s, d) in KNOBS.items()}, "dev"))
    monkeypatch.setattr(A, "DEFAULT_SPEC", "jacap_prompt[window=4]")


def _args(corpus, out, *extra):
    ap = argparse.ArgumentParser()
    A._add_arguments(ap)
    return ap.parse_args(["--manifest", str(corpus), "--dir", str(out), "--lengths", "80", "--ratios", "0.5", "0.75",
                          "--continuation", "8", "--no-progress", "--workers", "1", *extra])


def test_knob_table_is_one_knob_with_each_base():
    """The job's table is ONE_KNOB, in its order, each ablation with the spec it changes one knob of."""
    from jacap_lib.presses.jacap_ablation import ONE_KNOB, base_spec

    table, source = A.knob_table()
    assert source == "jacap_lib.presses.jacap_ablation.ONE_KNOB" and list(table) == list(ONE_KNOB)
    assert table == {k: (A.knob_spec(s), d, A.knob_spec(base_spec(k))) for k, (s, d) in ONE_KNOB.items()}
    assert table["prior=3-centres"][2] == A.knob_spec("jacap_prompt[beta=none]") and A.DEFAULT_SPEC == "jacap_prompt"
    # each spec written out in full on Algorithm 1 as tuned then, whatever today's defaults are
    default = press_from_spec(A.knob_spec(A.DEFAULT_SPEC), 0.5)
    assert (default.centre, default.tau, default.beta, default.window) == ("tempered", 3, 0.9, 32)
    assert press_from_spec(table["prior=3-centres"][0], 0.5).beta is None  # the multi-centre prior's own flat stats


def test_job_rows_pair_with_the_default_and_resume(tiny, corpus, tmp_path, monkeypatch, knobs):
    tok = CharTokenizer()
    out = tmp_path / "eval"
    res = A.execute(A.prepare(_args(corpus, out), tokenizer=tok), model=tiny, tokenizer=tok)
    rows = io.read_jsonl(out / A.FILE)
    assert res["rows_written"] == len(rows) == 3 * 1 * 2 * 3  # tune docs x lengths x ratios x (default + 2)
    assert {r["doc"] for r in rows} == {"kind/d0", "kind/d1", "kind/d3"} and {r["split"] for r in rows} == {"tune"}
    default = A.knob_spec("jacap_prompt[window=4]")
    assert {r["method"] for r in rows} == {default, "jacap_prompt_wo[window=4]", "jacap_prompt[window=4,beta=none]"}
    assert all(len(r["attn_rel_error_per_layer"]) == 2 and r["kl"] >= 0 for r in rows)
    cfg = io.read_runs(out / A.FILE)[0]
    assert cfg["ablations"]["flat"] == {"spec": "jacap_prompt[window=4,beta=none]", "description": "flat statistics",
                                        "base": default,
                                        "options": cfg["settings"]["jacap_prompt[window=4,beta=none]"]}
    assert cfg["settings"]["jacap_prompt_wo[window=4]"]["use_out_proj"] is True and cfg["versions"]["kvpress"]
    assert cfg["grid_choice"] == "given by --lengths / --ratios" and cfg["lengths"] == [80]
    # the summary pairs each ablation's row with the default's on the same document and cell
    s = A.summarize_ablation(rows, io.read_runs(out / A.FILE), n_resamples=999)
    kl = {(r["method"], r["ratio"], r["doc"]): r["kl"] for r in rows}
    for a in s["ablations"]:
        for r in a["rows"]:
            logs = [math.log(kl[(a["spec"], r["ratio"], d)] / kl[(default, r["ratio"], d)])
                    for d in ("kind/d0", "kind/d1", "kind/d3")]
            assert r["n"] == 3 and r["gm_ratio"] == pytest.approx(math.exp(sum(logs) / 3), rel=1e-9)
    assert s["m"] == 4 and s["cells_measured"] == ["80/0.5", "80/0.75"]
    # a rerun measures nothing; a dropped row is measured again, with the same value
    calls = []
    import jacap_lib.measure.quality as Q
    real = Q.next_token_kl
    monkeypatch.setattr(Q, "next_token_kl", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert A.execute(A.prepare(_args(corpus, out), tokenizer=tok), model=tiny, tokenizer=tok)["rows_written"] == 0
    assert not calls
    (out / A.FILE).write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    assert A.execute(A.prepare(_args(corpus, out), tokenizer=tok), model=tiny, tokenizer=tok)["rows_written"] == 1
    assert io.read_jsonl(out / A.FILE)[-1]["kl"] == pytest.approx(rows[-1]["kl"], rel=1e-6)
    assert len(io.read_runs(out / A.FILE)) == 3
    # a spec whose recorded options differ from what it builds today is refused before any work
    runs = io.read_runs(out / A.FILE)
    io.append_run(out / A.FILE, {**runs[-1], "settings": {**runs[-1]["settings"], "jacap_prompt_wo[window=4]": {
        **runs[-1]["settings"]["jacap_prompt_wo[window=4]"], "n_future_positions": 99}}})
    with pytest.raises(ValueError, match=r"jacap_prompt_wo\[window=4\].*n_future_positions.*new --dir"):
        A.prepare(_args(corpus, out), tokenizer=tok)


def test_bad_options_raise_before_work(corpus, tmp_path, knobs):
    tok = CharTokenizer()
    for extra, match in ((["--ratios", "1.0"], "ratios"), (["--lengths", "8"], "lengths"),
                         (["--ablations", "nope"], "ablations"), (["--workers", "0"], "workers"),
                         (["--continuation", "0"], "continuation"), (["--lengths", "500"], "tokens")):
        with pytest.raises(ValueError, match=match):
            A.prepare(_args(corpus, tmp_path / "x", *extra), tokenizer=tok)
    assert not (tmp_path / "x").exists()


def _hand_rows(seed=0, docs=5, layers=3):
    """Rows of a default and three ablations on ``docs`` documents in cells 512/0.5 and 512/0.9 (the third
    ablation's base is the first)."""
    rng = np.random.default_rng(seed)
    rows = []
    for spec in ("jacap_prompt", "a1", "a2", "a3"):
        for c in (0.5, 0.9):
            for d in range(docs):
                rows.append({"model": "M", "doc": f"k/{d}", "split": "tune", "length": 512, "continuation": 8,
                             "ratio": c, "method": spec, "kl": float(rng.lognormal(-3, 1)), "top1_agreement": 0.9,
                             "attn_rel_error": 0.1,
                             "attn_rel_error_per_layer": [float(x) for x in rng.uniform(0.01, 0.5, layers)]})
    run = {"default": "jacap_prompt", "model": {"name": "M"}, "continuation": 8, "lengths": [512], "ratios": [0.5, 0.9],
           "documents": [{"id": f"k/{d}", "split": "tune"} for d in range(docs)],
           "ablations": {"one": {"spec": "a1", "description": "x"}, "two": {"spec": "a2", "description": "y"},
                         "three": {"spec": "a3", "description": "z", "base": "a1"}}}
    return rows, [run]


def test_summary_ratios_intervals_and_layers_by_hand():
    rows, runs = _hand_rows()
    s = A.summarize_ablation(rows, runs, n_resamples=4999)
    assert s["m"] == 6 and s["confidence"] == pytest.approx(1 - 0.05 / 6)
    assert [a["base"] for a in s["ablations"]] == ["jacap_prompt", "jacap_prompt", "a1"]
    kl = {(r["method"], r["ratio"], r["doc"]): r["kl"] for r in rows}
    err = {(r["method"], r["ratio"], r["doc"]): r["attn_rel_error_per_layer"] for r in rows}
    docs = [f"k/{d}" for d in range(5)]
    for a in s["ablations"]:
        for r in a["rows"]:
            x = np.array([kl[(a["spec"], r["ratio"], d)] for d in docs])
            y = np.array([kl[(a["base"], r["ratio"], d)] for d in docs])
            assert r["gm_ratio"] == pytest.approx(float(np.exp(np.mean(np.log(x / y)))), rel=1e-12)
            assert r["wins"] == int(np.sum(x < y)) and r["losses"] == int(np.sum(x > y))
            assert r["gm_low"] <= r["gm_low_95"] <= r["gm_ratio"] <= r["gm_high_95"] <= r["gm_high"]
            assert r["gm_low"] < r["gm_low_95"] or r["gm_high"] > r["gm_high_95"]  # strictly wider somewhere
            assert r["verdict"] == V.verdict((r["gm_low"], r["gm_high"]))
            assert r["p_holm_all"] >= r["p_holm"] >= r["p_wilcoxon"]
        # per layer: geometric mean over documents of the error ratio, per cell and pooled
        for c in (0.5, 0.9):
            want = np.exp(np.mean([np.log(np.array(err[(a["spec"], c, d)]) / np.array(err[(a["base"], c, d)]))
                                   for d in docs], axis=0))
            assert a["layers"][f"512/{c}"] == pytest.approx(want.tolist(), rel=1e-12)
        pooled = np.exp(np.mean([np.log(np.array(err[(a["spec"], c, d)]) / np.array(err[(a["base"], c, d)]))
                                 for c in (0.5, 0.9) for d in docs], axis=0))
        assert a["layers"]["all"] == pytest.approx(pooled.tolist(), rel=1e-12)
    # the simultaneous level is Bonferroni's over every comparison judged
    p = [r["p_wilcoxon"] for a in s["ablations"] for r in a["rows"]]
    assert [r["p_holm_all"] for a in s["ablations"] for r in a["rows"]] == pytest.approx(V.holm(p).tolist())


def test_summary_judges_only_complete_cells():
    rows, runs = _hand_rows()
    rows = [r for r in rows if not (r["method"] == "a2" and r["ratio"] == 0.9 and r["doc"] == "k/3")]
    s = A.summarize_ablation(rows, runs, n_resamples=999)
    assert s["m"] == 5 and s["confidence"] == pytest.approx(1 - 0.05 / 5)
    two = next(a for a in s["ablations"] if a["label"] == "two")
    assert [r["ratio"] for r in two["rows"]] == [0.5] and set(two["layers"]) == {"512/0.5", "all"}
    rows = [r for r in rows if r["method"] != "jacap_prompt" or r["ratio"] != 0.5]  # the default lacks a cell
    s = A.summarize_ablation(rows, runs, n_resamples=999)
    assert s["cells_missing"] == ["512/0.5"] and s["m"] == 2  # one and three at c 0.9 (two lacks a document)
    # a spec recorded under two labels (an earlier run's) is judged once, under the latest label
    runs2 = [{**runs[0], "ablations": {"old name": {"spec": "a1"}}}, runs[0]]
    assert [a["label"] for a in A.summarize_ablation(rows, runs2, n_resamples=999)["ablations"]] == ["one", "two", "three"]
    with pytest.raises(ValueError, match="no .*cell"):
        A.summarize_ablation([r for r in rows if r["method"] != "jacap_prompt"], runs)


def test_ablation_frame_shows_each_cell():
    from jacap_lib.viz.ablation import ablation_frame, layer_figure

    rows, runs = _hand_rows()
    s = A.summarize_ablation(rows, runs, n_resamples=999)
    frames = ablation_frame(s)
    assert list(frames) == [0.5, 0.9]
    f = frames[0.9]
    assert list(f.index) == ["one", "two", "three"] and list(f.columns) == ["prompt 512"]
    r = next(r for r in s["ablations"][2]["rows"] if r["ratio"] == 0.9)
    from jacap_lib.verdicts.precision import interval_text
    assert f.loc["three", "prompt 512"].startswith(interval_text(r["gm_ratio"], r["gm_low"], r["gm_high"]))
    fig = layer_figure(s)
    assert list(fig.data[0].y) == ["one", "two", "three"] and len(fig.data[0].x) == 3


def test_committed_summary_matches_its_rows():
    """ablation_summary.json (when committed) against ablation.jsonl: every ratio by hand, the simultaneous level
    from the number of comparisons, each simultaneous interval holding the 95 % one."""
    from jacap_lib.results import paths
    from jacap_lib.results.loaders import load_ablation_summary

    path = paths.data_path("results", "eval", "ablation_summary.json", must_exist=False)
    if not path.is_file():
        pytest.skip("no committed ablation summary")
    s = load_ablation_summary(path)
    rows = io.read_jsonl(path.parent / A.FILE)
    kl = {(r["method"], r["length"], r["ratio"], r["doc"]): r["kl"] for r in rows}
    docs = s["config"]["documents"]
    judged = [(a, r) for a in s["ablations"] for r in a["rows"]]
    assert len(judged) == s["m"] and s["confidence"] == pytest.approx(1 - 0.05 / s["m"], rel=1e-4)
    for a, r in judged:
        logs = [math.log(kl[(a["spec"], r["length"], r["ratio"], d)] / kl[(a["base"], r["length"], r["ratio"], d)])
                for d in docs]
        assert r["n"] == len(docs) == 18
        assert r["gm_ratio"] == pytest.approx(math.exp(sum(logs) / len(logs)), rel=1e-4)
        assert r["gm_low"] <= r["gm_low_95"] and r["gm_high_95"] <= r["gm_high"]
