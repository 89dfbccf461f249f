"""Algorithm 2 vs kvpress DecodingPress, the measurement (jacap_lib.measure.decoding_compare), on a tiny model.

The kept tokens' positions the measurement reports are checked independently: layer 0's keys depend only on
token and position, so every slot of the final layer-0 cache equals the uncompressed run's key at exactly
one position.
"""
from __future__ import annotations

import logging
import math

import pytest
import torch
from transformers import DynamicCache

from jacap_lib.measure.quality import kl_from_logits
from jacap_lib.measure.decoding_compare import AGE_EDGES, compare_decoding, decoding_methods, teacher_forced

logging.getLogger("kvpress").setLevel(logging.ERROR)
T, N_PROMPT, BUDGET, INTERVAL, WINDOW = 90, 20, 32, 8, 8


@pytest.fixture(scope="module")
def seq():
    return torch.randint(0, 96, (1, T), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def full_keys(tiny_llama, seq):
    cache = DynamicCache()
    with torch.no_grad():
        tiny_llama(input_ids=seq[:, :T - 1], past_key_values=cache)
    return cache.layers[0].keys[0]  # (H, T-1, d)


@pytest.mark.parametrize("method", ["alg2", "jacap_prompt", "streaming_llm", "tova"])
def test_reported_positions_are_the_kept_tokens(tiny_llama, seq, full_keys, method):
    run = teacher_forced(tiny_llama, seq, N_PROMPT, method, budget=BUDGET, interval=INTERVAL, window=WINDOW)
    kept = run["cache"].layers[0].keys[0]  # (H, L, d)
    positions = run["positions"][0]  # (H, L)
    assert positions.shape == kept.shape[:2]
    dist = torch.cdist(kept, full_keys, compute_mode="donot_use_mm_for_euclid_dist")
    assert float(dist.min(-1).values.max()) < 1e-4
    assert torch.equal(dist.argmin(-1), positions)
    # ages histogram: every slot of every layer and head counted once
    assert sum(run["age_counts"]) == sum(p.numel() for p in run["positions"])
    # the cache never holds more than budget + interval slots once compression has started
    assert run["peak_cache"] <= max(BUDGET + INTERVAL, N_PROMPT + INTERVAL)
    if method in ("alg2", "jacap_prompt"):  # both protect 4 sinks and the last WINDOW positions
        for h in range(positions.shape[0]):
            row = sorted(positions[h].tolist())
            assert row[:4] == [0, 1, 2, 3] and row[-WINDOW:] == list(range(T - 1 - WINDOW, T - 1))


def test_no_compression_is_the_reference(tiny_llama, seq):
    res = compare_decoding(tiny_llama, seq, N_PROMPT, ["alg2", "knorm"], budget=200, interval=8, bins=4)
    for row in res["methods"].values():
        assert row["mean_kl"] < 1e-8 and row["top1_agree"] == 1.0
        assert row["peak_cache"] == T - 1 and row["first_compressed_step"] == T - N_PROMPT
        assert len(row["kl"]) == T - N_PROMPT and len(row["kl_binned"]) == 4


def test_kl_rows_match_an_independent_replay(tiny_llama, seq):
    """The KL of a DecodingPress run equals KL(reference || replay) computed here from kvpress directly."""
    import kvpress

    from jacap_lib.presses.jacap import JacapPromptPress

    res = compare_decoding(tiny_llama, seq, N_PROMPT, ["jacap_prompt"], budget=BUDGET, interval=INTERVAL, window=WINDOW)
    row = res["methods"]["jacap_prompt"]

    def replay(press):
        cache, out = DynamicCache(), []
        ctx = press(tiny_llama) if press is not None else torch.no_grad()
        with ctx, torch.no_grad():
            out.append(tiny_llama(input_ids=seq[:, :N_PROMPT], past_key_values=cache).logits[:, -1])
            for t in range(N_PROMPT, T - 1):
                pos = torch.tensor([t])
                out.append(tiny_llama(input_ids=seq[:, t:t + 1], past_key_values=cache, cache_position=pos,
                                      position_ids=pos[None]).logits[:, -1])
        return torch.cat(out)

    press = kvpress.DecodingPress(base_press=JacapPromptPress(n_sink=4, window=WINDOW), compression_interval=INTERVAL,
                                  target_size=BUDGET)
    kl = kl_from_logits(replay(None), replay(press))
    torch.testing.assert_close(torch.tensor(row["kl"]), kl, rtol=1e-4, atol=1e-7)
    assert row["mean_kl"] > 0  # compression did change the predictions
    assert 0 < row["scoring_share"] < 1


def test_bad_method_names_the_valid_ones():
    with pytest.raises(ValueError, match="alg2"):
        decoding_methods(["alg3"])
    assert AGE_EDGES[0] == 0 and AGE_EDGES == sorted(AGE_EDGES)


def test_job_refuses_a_bad_out_before_loading(capsys):
    from jacap_lib.experiments.decoding_comparison import JOB

    with pytest.raises(SystemExit):
        JOB.main(["--out", "x.txt"])
    assert "--out x.txt must end in .json" in capsys.readouterr().err


def test_committed_decoding_comparison_is_complete():
    import math

    from jacap_lib.experiments.decoding_comparison import CONFIG, decoding_summary, decoding_verdicts, generation_keys
    from jacap_lib.results.loaders import load_decoding_comparison

    config, rows = load_decoding_comparison()
    if "seeds" not in config:
        pytest.skip("data/serving/decoding_comparison.json predates the (prompt, seed) design: run "
                    "`jacap compare-decoding` to regenerate it")
    assert config["provenance"]["model"]["sha256"] and config["provenance"]["versions"]["kvpress"]
    assert config["prompts"] == CONFIG["prompts"] and config["methods"] == CONFIG["methods"]
    assert config["generations_done"] == [list(k) for k in generation_keys(config)]
    keys = [(r["prompt"], r["seed"], r["method"]) for r in rows]
    assert len(set(keys)) == len(keys) == len(generation_keys(config)) * (len(config["methods"]) + 1)
    for r in rows:
        if r["method"] == "uncompressed":
            continue
        assert len(r["kl"]) == config["n_new"] and all(math.isfinite(x) and x >= 0 for x in r["kl"])
        assert r["peak_cache"] <= config["budget"] + config["interval"]
        assert sum(r["age_counts"]) > 0 and 0 < r["scoring_share"] < 1
        assert r["first_compressed_step"] < config["n_new"]  # every method did compress
    assert set(decoding_summary(rows, n_resamples=200)) == set(config["methods"])
    assert decoding_verdicts(rows, n_resamples=200)[0]["cell"] == "alg2 vs alg2_flat"


def test_decoding_findings_by_hand():
    """Rankings (geometric-mean KL), age order and old-token fractions of a hand-built summary."""
    from jacap_lib.experiments.decoding_comparison import decoding_findings, decoding_summary

    def row(p, method, kl, age, counts, share):
        return {"prompt": p, "seed": 0, "method": method, "mean_kl": kl, "mean_kl_compressed": kl, "p90_kl": kl,
                "top1_agree": 1.0, "peak_cache": 10, "scoring_share": share, "mean_age": age,
                "age_edges": [0, 256, 512, 1024], "age_counts": counts, "kl_binned": [kl], "bin_edges": [0, 1],
                "seconds": 1.0}

    rows = [row(0, "alg2", 0.10, 100, [6, 2, 2, 0], 0.2), row(1, "alg2", 0.40, 200, [4, 4, 1, 1], 0.4),
            row(0, "tova", 0.20, 50, [10, 0, 0, 0], 0.0), row(1, "tova", 0.10, 70, [9, 1, 0, 0], 0.1),
            row(0, "jacap_prompt", 0.40, 300, [2, 2, 4, 2], 0.1), row(1, "jacap_prompt", 0.40, 100, [5, 5, 0, 0], 0.1),
            {"prompt": 0, "seed": 0, "method": "uncompressed"}]
    s = decoding_summary(rows)
    # geometric means: alg2 sqrt(0.1*0.4) = 0.2, tova sqrt(0.02) = 0.141, jacap 0.4 (2 prompts: no interval)
    assert s["alg2"]["gm_kl"] == pytest.approx(0.2) and math.isnan(s["alg2"]["gm_low"])
    f = decoding_findings(s, old_after=512)
    assert f["ranking"] == ["tova", "alg2", "jacap_prompt"]
    # mean ages: tova 60, alg2 150, jacap 200
    assert list(f["by_age"]) == ["tova", "alg2", "jacap_prompt"] and f["by_age"]["alg2"] == pytest.approx(150)
    # pooled age counts, bins starting at >= 512: alg2 (2+0 + 1+1)/20, tova 0/20, jacap (4+2)/20
    assert f["old_fraction"] == pytest.approx({"alg2": 4 / 20, "tova": 0.0, "jacap_prompt": 6 / 20})
    assert f["scoring_share"] == pytest.approx({"alg2": 0.3, "tova": 0.05, "jacap_prompt": 0.1})
    assert decoding_findings(s, old_after=256)["old_fraction"]["tova"] == pytest.approx(1 / 20)
    with pytest.raises(ValueError, match="reference"):
        decoding_findings(s, reference="knorm")
