"""JacapPromptPress: the recent window and the sinks under tight budgets, and the noise="deff" option.

Kept sets are checked on a real prefill of a tiny random GQA Llama (conftest) against what the budget
arithmetic says must be kept; the "deff" scores against jacap_scores with the per-head sigma^2 solved
independently by a brute-force grid over sigma^2.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

from jacap_lib import jacap_scores
from jacap_lib.presses.jacap import JacapPromptPress


def prefill(model, press, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 96, (1, n), generator=g)
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    return cache


def kept_positions(model, press, n=64):
    """Original positions kept per (layer, KV head), recovered by matching keys against an uncompressed cache."""
    full = prefill(model, JacapPromptPress(0.0), n)
    comp = prefill(model, press, n)
    out = []
    for lf, lc in zip(full.layers, comp.layers):
        kf, kc = lf.keys[0], lc.keys[0]  # (H, N, d), (H, n_kept, d)
        d = torch.cdist(kc, kf)  # (H, n_kept, N)
        out.append(d.argmin(-1))
    return out


@pytest.mark.parametrize("ratio,window", [(0.5, 8), (0.75, 8), (0.9, 4)])
def test_window_and_sinks_kept_when_they_fit(tiny_llama, ratio, window):
    n = 64
    press = JacapPromptPress(ratio, window=window, n_sink=2)
    assert 2 + window <= compute_n_kept(n, ratio)
    for pos in kept_positions(tiny_llama, press, n):
        for head in pos:
            s = set(head.tolist())
            assert {0, 1} <= s and set(range(n - window, n)) <= s


def test_window_larger_than_budget_shrinks_and_keeps_sinks(tiny_llama):
    n, ratio = 64, 0.9  # keeps 6 tokens; sinks 4 + window 32 do not fit
    n_kept = compute_n_kept(n, ratio)
    press = JacapPromptPress(ratio, window=32, n_sink=4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        kept = kept_positions(tiny_llama, press, n)
    assert sum("window was shrunk to 2" in str(x.message) for x in w) == 1  # warned once per press
    for pos in kept:
        for head in pos:
            assert sorted(head.tolist()) == [0, 1, 2, 3, n - 2, n - 1]  # sinks, then the newest n_kept - 4
    assert n_kept == 6


def test_budget_below_sinks_keeps_the_earliest_sinks_and_warns(tiny_llama):
    press = JacapPromptPress(0.95, n_sink=8, window=16)  # 64 tokens -> 3 kept < 8 sinks
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        kept = kept_positions(tiny_llama, press, 64)
    assert any("only the first 3 sinks" in str(x.message) for x in w)
    for pos in kept:
        for head in pos:
            assert sorted(head.tolist()) == [0, 1, 2]


def test_deff_option_matches_brute_force_sigma2(tiny_llama):
    """Scores under noise='deff' equal jacap_scores at the sigma^2 a grid search finds for the target."""
    n, ratio, frac = 64, 0.75, 0.5
    press = JacapPromptPress(ratio, noise="deff", deff_frac=frac, n_sink=0, centre="tempered")
    attn = tiny_llama.model.layers[0].self_attn
    attn.rotary_emb = tiny_llama.model.rotary_emb
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, n, 64, generator=g)
    keys, values = torch.randn(1, 2, n, 16, generator=g), torch.randn(1, 2, n, 16, generator=g)
    mu, lam = press.query_statistics(attn, hidden, keys, {})
    got = press.token_scores(keys, values, mu, lam, attn)
    target = frac * min(compute_n_kept(n, ratio), 16)
    assert target == 8.0
    torch.testing.assert_close(got.double().sum(-1), torch.full((1, 2), target, dtype=torch.float64), rtol=1e-4, atol=0)
    grid = torch.logspace(-10, 6, 961, dtype=torch.float64)
    for h in range(2):
        sums = torch.stack([jacap_scores(keys[0, h], values[0, h], mu[0, h], lam[0, h], noise=float(s)).score.sum()
                            for s in grid])
        s2 = float(grid[(sums.double() - target).abs().argmin()])
        ref = jacap_scores(keys[0, h], values[0, h], mu[0, h], lam[0, h], noise=s2).score
        torch.testing.assert_close(got[0, h], ref, rtol=0.05, atol=0)  # within one grid step (10^(1/60))


@pytest.mark.parametrize("kw,msg", [({"noise": "auto"}, "'deff'"), ({"noise": 0.0}, "noise"),
                                    ({"noise": "deff", "deff_frac": 0.0}, "deff_frac"),
                                    ({"deff_frac": 1.5}, "deff_frac")])
def test_bad_noise_options(kw, msg):
    with pytest.raises(ValueError, match=msg):
        JacapPromptPress(0.5, **kw)


def test_decode_controller_deff_option(tiny_llama):
    from jacap_lib.controller import JacapDecodeController

    with pytest.raises(ValueError, match="'deff'"):
        JacapDecodeController(tiny_llama, high=48, budget=24, window=4, noise="auto")
    ctrl = JacapDecodeController(tiny_llama, high=48, budget=24, interval=8, window=4, noise="deff", deff_frac=0.25)
    keys = torch.randn(1, 2, 40, 16)
    assert ctrl._deff_target(keys) == 0.25 * 16
    ids = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), ctrl:
        tiny_llama.generate(input_ids=ids, max_new_tokens=30, min_new_tokens=30, do_sample=False)
    assert ctrl.events and all(e.method == "jacap" for e in ctrl.events)


@pytest.mark.parametrize("n,ratio,n_sink,window", [(243, 0.5, 4, 32), (243, 0.75, 4, 32), (243, 0.9, 4, 32),
                                                   (64, 0.9, 4, 32), (10, 0.5, 8, 4), (30, 0.0, 4, 32),
                                                   (6, 0.5, 4, 32), (3, 0.5, 4, 2)])
def test_budget_split_counts_what_protected_keeps(n, ratio, n_sink, window):
    """budget_split's arithmetic against the mask protected() builds on a prefill-shaped cache, and kvpress's budget."""
    press = JacapPromptPress(ratio, n_sink=n_sink, window=window)
    keys = torch.zeros(1, 1, n, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mask = press.protected(torch.zeros(1, n, 8), keys, {})
    split = press.budget_split(n)
    n_kept = n if ratio == 0 else min(compute_n_kept(n, ratio), n)
    assert split["kept"] == n_kept == split["sinks"] + split["window"] + split["scored"]
    assert split["sinks"] + split["window"] == int(mask.sum())
    assert split["sinks"] == int(mask[:min(n_sink, n)].sum())
    with pytest.raises(ValueError, match="n_tokens"):
        press.budget_split(0)
