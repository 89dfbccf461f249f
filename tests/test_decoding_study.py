"""The decode-time comparison's design: the alg2/alg2_flat isolation, StreamingLLM's sinks under DecodingPress,
the paired statistics against hand-computed values, resumability and the job's refusals."""
from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from jacap_lib.measure.decoding_compare import (build_alg2, build_decoding_press, decoding_methods,
                                                positional_decoding_press, teacher_forced)
from jacap_lib.experiments import decoding_comparison as DC

logging.getLogger("kvpress").setLevel(logging.ERROR)


# ------------------------------------------------------------------ alg2 vs alg2_flat: only the statistics differ
def _state(ctrl) -> dict:
    skip = {"model", "attn_modules", "_handles"}
    return {k: v for k, v in vars(ctrl).items() if k not in skip}


def test_alg2_flat_differs_from_alg2_only_in_beta(tiny_llama):
    a = build_alg2(tiny_llama, "alg2", budget=32, interval=8, n_sink=4, window=8, beta=0.9)
    f = build_alg2(tiny_llama, "alg2_flat", budget=32, interval=8, n_sink=4, window=8, beta=0.9)
    sa, sf = _state(a), _state(f)
    assert set(sa) == set(sf)
    diff = sorted(k for k in sa if sa[k] != sf[k])
    assert diff == ["beta"] and sa["beta"] == 0.9 and sf["beta"] is None
    assert a.attn_modules == f.attn_modules and a.model is f.model


def test_flat_statistics_are_the_cumulative_mean_and_variance(tiny_llama):
    from jacap_lib.stats import EMAQueryStats, flat_query_stats

    q = torch.randn(3, 11, 8, generator=torch.Generator().manual_seed(1))
    s = EMAQueryStats(None)
    s.update(q[:, :4], chunk=True)
    for t in range(4, 11):
        s.update(q[:, t])
    mu, lam = flat_query_stats(q)
    torch.testing.assert_close(s.mu, mu, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s.lam, lam, rtol=1e-5, atol=1e-6)
    ema = EMAQueryStats(0.9).update(q, chunk=True)
    assert not torch.allclose(ema.mu, mu, atol=1e-3)  # the EMA is something else


def test_alg2_flat_changes_the_kept_tokens(tiny_llama):
    seq = torch.randint(0, 96, (1, 90), generator=torch.Generator().manual_seed(7))
    kw = dict(budget=32, interval=8, window=8)
    a, f = teacher_forced(tiny_llama, seq, 20, "alg2", **kw), teacher_forced(tiny_llama, seq, 20, "alg2_flat", **kw)
    assert a["lengths"] == f["lengths"]  # same watermarks and schedule
    assert any(not torch.equal(x, y) for x, y in zip(a["positions"], f["positions"]))


def test_decoding_method_specs():
    assert decoding_methods(["alg2", "alg2_flat", "alg2[beta=0.5]", "streaming_llm[n_sink=1]"])
    for bad in (["alg3"], ["alg2[tau=1]"], ["alg2[beta=1.5]"], ["tova[nope=1]"]):
        with pytest.raises(ValueError):
            decoding_methods(bad)


# ------------------------------------------------------------------ StreamingLLM keeps its sinks
class _Module:
    layer_idx, head_dim = 0, 4


def test_positional_decoding_press_keeps_the_sinks_on_a_hand_built_cache():
    """Key channel 0 holds the original position; after every compression the first n_sink positions are there,
    and the slots are in position order."""
    from kvpress import StreamingLLMPress

    n_sink, budget, step = 3, 8, 4
    press = positional_decoding_press(StreamingLLMPress(0.0, n_sink=n_sink), compression_interval=step,
                                      target_size=budget)
    pos = torch.arange(12.0)
    for _ in range(6):
        keys = torch.zeros(1, 2, pos.numel(), 4)
        keys[..., 0] = pos
        keys[..., 1] = torch.randn(pos.numel())  # something for a scorer to look at
        k, v = press.compress(_Module(), torch.zeros(1, step, 8), keys, keys.clone(), None, {})
        kept = k[0, :, :, 0]
        assert k.shape[2] == budget
        for h in range(2):
            assert kept[h, :n_sink].tolist() == list(range(n_sink))
            assert torch.all(kept[h, 1:] > kept[h, :-1])  # position order
        pos = torch.cat([kept[0], torch.arange(pos.max() + 1, pos.max() + 1 + step)])


def test_streaming_llm_keeps_its_sinks_through_the_replay(tiny_llama):
    seq = torch.randint(0, 96, (1, 90), generator=torch.Generator().manual_seed(3))
    run = teacher_forced(tiny_llama, seq, 20, "streaming_llm[n_sink=2]", budget=24, interval=8)
    cur = 90 - 2
    for p in run["positions"]:  # recovered by matching keys (independent of the slot order)
        for h in range(p.shape[0]):
            row = sorted(p[h].tolist())
            n = len(row) - 2  # the rest: the most recent tokens, contiguous
            assert row[:2] == [0, 1] and row[2:] == list(range(cur - n + 1, cur + 1))
            assert p[h].tolist() == row  # slots are in position order


def test_every_decodingpress_is_the_positional_one():
    press = build_decoding_press("tova", budget=16, interval=4)
    assert type(press).__name__ == "PositionalDecodingPress" and press.target_size == 16


# ------------------------------------------------------------------ configuration
def test_config_uses_the_prefill_tune_choices_and_fits():
    from jacap_lib.results.paths import data_path

    space = json.loads(data_path("results", "eval", "choices.json").read_text())["config"]["search_space"]
    specs = DC.CONFIG["methods"]
    assert specs["alg2"] == "alg2" and specs["alg2_flat"] == "alg2[beta=none]"
    assert specs["jacap_prompt"] == "jacap_prompt[centre=tempered]"  # the controller's score inside kvpress's wrapper
    chosen = json.loads(data_path("results", "eval", "choices.json").read_text())["chosen"]
    for label, spec in specs.items():  # each baseline the evaluation's prefill tune choice
        if label not in ("alg2", "alg2_flat", "jacap_prompt"):
            assert spec in space[label] and spec == chosen[label], label
    assert len(DC.CONFIG["prompts"]) == 24 and len(set(DC.CONFIG["prompts"])) == 24 and DC.CONFIG["seeds"] == [0, 1]
    from jacap_lib.config import DEFAULTS

    assert (DC.CONFIG["beta"], DC.CONFIG["window"], DC.CONFIG["n_sink"]) == (DEFAULTS.decode_beta, DEFAULTS.window, DEFAULTS.n_sink)
    opts = DC._check_config(DC.CONFIG)
    assert opts["alg2_flat"] == {**opts["alg2"], "beta": None}


# ------------------------------------------------------------------ statistics by hand
def _row(p, s, method, kl):
    return {"prompt": p, "seed": s, "method": method, "mean_kl": kl, "mean_kl_compressed": kl, "p90_kl": kl,
            "top1_agree": 1.0, "peak_cache": 10, "scoring_share": 0.1, "mean_age": 5.0, "age_edges": [0, 4, 8],
            "age_counts": [1, 1], "kl_binned": [kl], "bin_edges": [0, 1], "seconds": 1.0, "seconds_per_step": 0.01}


KL = {  # (prompt, seed) -> (alg2, alg2_flat)
    (0, 0): (0.1, 0.2), (0, 1): (0.4, 0.2), (1, 0): (0.2, 0.8), (1, 1): (0.2, 0.2), (2, 0): (0.3, 0.6),
    (2, 1): (0.1, 0.4), (3, 0): (0.5, 1.0), (3, 1): (0.2, 0.4)}


def _rows():
    rows = []
    for (p, s), (a, f) in KL.items():
        rows += [_row(p, s, "alg2", a), _row(p, s, "alg2_flat", f), {"prompt": p, "seed": s, "method": "uncompressed"}]
    return rows


def test_summary_geometric_means_by_hand():
    s = DC.decoding_summary(_rows(), n_resamples=200)
    gm = math.exp(sum(math.log(a) for a, _ in KL.values()) / 8)
    assert s["alg2"]["gm_kl"] == pytest.approx(gm) and s["alg2"]["n_generations"] == 8 and s["alg2"]["n_units"] == 4
    assert s["alg2"]["gm_low"] < gm < s["alg2"]["gm_high"]
    g = DC.decoding_summary(_rows(), unit="generation", n_resamples=200)["alg2_flat"]
    assert g["gm_kl"] == pytest.approx(math.exp(sum(math.log(f) for _, f in KL.values()) / 8)) and g["n_units"] == 8
    assert s["alg2"]["mean_kl"] == pytest.approx(sum(a for a, _ in KL.values()) / 8)


def test_verdicts_pair_by_prompt_by_hand():
    v = DC.decoding_verdicts(_rows(), n_resamples=200)
    assert [r["cell"] for r in v] == ["alg2 vs alg2_flat"]
    r = v[0]
    # per prompt: geometric mean over the two seeds of alg2/flat ratios: p0 (0.5*2)^.5=1, p1 (.25*1)^.5=.5,
    # p2 (.5*.25)^.5, p3 (.5*.5)^.5=.5
    ratios = [1.0, 0.5, math.sqrt(0.125), 0.5]
    assert r["n"] == 4 and r["wins"] == 3 and r["ties"] == 1
    assert r["gm_ratio"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 4))
    assert r["method"] == "alg2" and r["reference"] == "alg2_flat" and "statistics" in r["isolates"]
    assert r["verdict"].startswith(("better", "no detectable"))
    g = DC.decoding_verdicts(_rows(), unit="generation", n_resamples=200)[0]
    assert g["n"] == 8 and g["wins"] == 6 and g["gm_ratio"] == pytest.approx(r["gm_ratio"])


def test_verdict_family_and_holm():
    rows = []
    for p in range(4):
        for m, kl in (("alg2", 0.1), ("alg2_flat", 0.2), ("jacap_prompt", 0.3), ("tova", 0.15 + 0.01 * p)):
            rows.append(_row(p, 0, m, kl * (1 + 0.1 * p)))
    v = DC.decoding_verdicts(rows, n_resamples=200)
    assert [r["cell"] for r in v] == ["alg2 vs alg2_flat", "alg2 vs jacap_prompt", "alg2 vs tova", "jacap_prompt vs tova"]
    assert all(r["p_holm"] >= r["p_wilcoxon"] for r in v)
    with pytest.raises(ValueError, match="lack"):
        DC.decoding_verdicts(rows, family=[("alg2", "knorm", "x")])


# ------------------------------------------------------------------ resumability and refusals
def _fake_cfg():
    return {**DC.QUICK, "prompts": ["a", "b", "c"], "seeds": [0, 1], "methods": {"alg2": "alg2", "tova": "tova"}}


@pytest.fixture
def fake_generation(monkeypatch):
    calls = []

    def run_generation(model, tok, cfg, p, s):
        calls.append((p, s))
        return [_row(p, s, m, 0.1 + p + s) for m in cfg["methods"]] + [{"prompt": p, "seed": s, "method": "uncompressed"}]

    monkeypatch.setattr(DC, "run_generation", run_generation)
    monkeypatch.setattr(DC, "provenance", lambda model: {"model": "fake"})
    return calls


def test_rerun_skips_done_generations(tmp_path, fake_generation):
    from jacap_lib.results import files

    out = tmp_path / "dc.json"
    cfg = _fake_cfg()
    DC.run_decoding_comparison(object(), None, config=cfg, out=out, progress=False, log=lambda m: None)
    assert fake_generation == DC.generation_keys(cfg) == [(p, s) for p in range(3) for s in (0, 1)]
    config, rows = files.read_results(out)
    assert len(rows) == 6 * 3 and config["generations_done"] == [[p, s] for p in range(3) for s in (0, 1)]
    assert len({(r["prompt"], r["seed"], r["method"]) for r in rows}) == len(rows)
    # drop one generation (and a half-written one's method rows): only it is run again
    kept = [r for r in rows if (r["prompt"], r["seed"]) != (1, 1) and not (r["prompt"] == 2 and r["seed"] == 0
                                                                            and r["method"] == "uncompressed")]
    files.write_results(out, config, kept)
    fake_generation.clear()
    DC.run_decoding_comparison(object(), None, config=cfg, out=out, progress=False, log=lambda m: None)
    assert sorted(fake_generation) == [(1, 1), (2, 0)]
    assert len(files.read_results(out)[1]) == 18
    fake_generation.clear()  # nothing left: no generation runs, no model is needed, the record stays
    DC.run_decoding_comparison(None, None, config=cfg, out=out, workers=2, progress=False, log=lambda m: None)
    assert fake_generation == [] and files.read_results(out)[0]["provenance"] == {"model": "fake"}
    with pytest.raises(ValueError, match="another configuration.*budget"):
        DC.run_decoding_comparison(object(), None, config={**cfg, "budget": 99}, out=out, progress=False,
                                   log=lambda m: None)


@pytest.mark.parametrize("argv, message", [
    (["--out", "x.txt"], "must end in .json"),
    (["--workers", "0"], "--workers must be >= 1"),
])
def test_job_refuses_before_loading(tmp_path, monkeypatch, capsys, argv, message):
    import jacap_lib.experiments.protocol as E

    monkeypatch.setattr(E, "_init_worker", lambda *a: pytest.fail("the model was loaded"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        DC.JOB.main(argv + (["--out", str(tmp_path / "o.json")] if "--out" not in argv else []))
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_job_refuses_a_file_of_another_configuration(tmp_path, monkeypatch, capsys):
    import jacap_lib.experiments.protocol as E
    from jacap_lib.results import files

    monkeypatch.setattr(E, "_init_worker", lambda *a: pytest.fail("the model was loaded"))
    out = tmp_path / "o.json"
    files.write_results(out, {**DC.QUICK, "budget": 7}, [])
    before = out.read_text()
    with pytest.raises(SystemExit) as e:
        DC.JOB.main(["--quick", "--out", str(out)])
    assert e.value.code == 2 and "another configuration" in capsys.readouterr().err
    assert out.read_text() == before


def test_plain_kvpress_decodingpress_loses_the_sinks(tiny_llama, monkeypatch):
    """Why the wrapper exists: kvpress 0.5.5's DecodingPress writes kept tokens in score order, and StreamingLLM
    then protects whatever sits in the first slots (if kvpress changes this, this test says so)."""
    import kvpress

    import jacap_lib.measure.decoding_compare as M

    monkeypatch.setattr(M, "positional_decoding_press", lambda base, **kw: kvpress.DecodingPress(base_press=base, **kw))
    with pytest.raises(AssertionError):
        test_streaming_llm_keeps_its_sinks_through_the_replay(tiny_llama)
