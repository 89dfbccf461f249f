"""Mechanism diagnostics and query-statistics errors against independent computations."""
from __future__ import annotations

import pytest
import torch

from jacap_lib import jacap_scores
from jacap_lib.measure.diagnostics import mechanism_diagnostics, prompt_estimators, query_stat_errors

f64 = torch.float64


def heads(seed=0, n=80, d=8):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(3, n, d, generator=g, dtype=f64)
    v = torch.randn(3, n, d, generator=g, dtype=f64)
    mu = 3 * torch.randn(3, d, generator=g, dtype=f64)
    lam = 0.1 + torch.rand(3, d, generator=g, dtype=f64)
    return k, v, mu, lam


def test_deff_and_norm_against_scores_and_dense_matrix():
    k, v, mu, lam = heads()
    res = mechanism_diagnostics(k, v, mu, lam, budget=20, tau=1.0, noise=0.01)
    s = jacap_scores(k, v, mu, lam, tau=1.0, noise=0.01)
    torch.testing.assert_close(res["deff"], s.score.double().sum(-1), rtol=1e-5, atol=0)
    A = torch.eye(8, dtype=f64) + torch.einsum("hn,hni,hnj->hij", s.weight.double() / 0.01, v, v)
    torch.testing.assert_close(res["a_minus_i"], torch.linalg.matrix_norm(A - torch.eye(8, dtype=f64), ord=2),
                               rtol=1e-5, atol=0)
    # overlap by hand: top-20 of Jacap's score vs top-20 of w |u|^2
    plain = s.weight.double() * v.square().sum(-1)
    for h in range(3):
        a = set(s.score[h].topk(20).indices.tolist())
        b = set(plain[h].topk(20).indices.tolist())
        assert res["overlap"][h] == pytest.approx(len(a & b) / 20)


def test_overlap_is_one_when_A_is_identity_and_deff_rule_reaches_target():
    k, v, mu, lam = heads(seed=1)
    far = mechanism_diagnostics(k, v, mu, lam, budget=20, tau=10.0, noise=1e9)
    assert bool((far["overlap"] == 1).all()) and bool((far["a_minus_i"] < 1e-6).all())
    rule = mechanism_diagnostics(k, v, mu, lam, budget=20, tau=10.0, noise="deff", deff_target=4.0)
    torch.testing.assert_close(rule["deff"], torch.full((3,), 4.0, dtype=f64), rtol=1e-6, atol=0)
    assert bool((rule["overlap"] < 1).any())  # the capacity term now changes the kept set


def test_saturated_count():
    k, v, mu, lam = heads(seed=2)
    k[0, 5] = 50 * mu[0] / mu[0].norm()  # one key aligned with the centre dominates head 0 at tau = 1
    res = mechanism_diagnostics(k, v, mu, lam, budget=10, tau=1.0)
    assert res["n_saturated"][0] == 1 and res["alpha_max"][0] > 0.5


def test_prompt_estimators_against_hand_formulas():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 40, 4, generator=g, dtype=f64)
    est = prompt_estimators(q, ("flat", "last8", "ema0.9"), skip=4)
    torch.testing.assert_close(est["flat"][0], q[:, 4:].mean(1))
    torch.testing.assert_close(est["last8"][1], q[:, -8:].var(1, unbiased=False))
    mu = q[:, 4]
    for t in range(5, 40):
        mu = 0.9 * mu + 0.1 * q[:, t]
    torch.testing.assert_close(est["ema0.9"][0], mu)


def test_query_stat_errors_flat_by_hand(tiny_llama):
    from jacap_lib.hf import capture_heads

    ids = torch.randint(0, 96, (1, 48), generator=torch.Generator().manual_seed(3))
    recs = query_stat_errors(tiny_llama, ids, 40, ("flat",), skip=4)
    assert len(recs) == 2 * 2  # 2 layers x 2 KV heads
    q = capture_heads(tiny_llama, ids, layers=[1])[1].queries_prerope.double()  # (4, 48, 16)
    grp = q[2:4]  # query heads 2, 3 read KV head 1
    mu_hat = grp[:, 4:40].reshape(-1, 16).mean(0)
    cont = grp[:, 40:].reshape(-1, 16)
    want = float((mu_hat - cont.mean(0)).norm() / cont.mean(0).norm())
    rec = next(r for r in recs if r["layer"] == 1 and r["head"] == 1)
    assert rec["mu_err"] == pytest.approx(want, rel=1e-6)


def test_defaults_note_reads_the_committed_file():
    import statistics

    from jacap_lib.results.loaders import load_mechanisms
    from jacap_lib.viz import diagnostics as VD

    _, rows = load_mechanisms()
    d = VD.defaults_summary(rows)
    sel = [r for r in rows if r["tau"] == 10.0 and r["rule"] == "fixed=1" and r["ratio"] == 0.9]  # the paper's tau
    assert d["deff"] == statistics.median(r["deff"] for r in sel) and d["n_heads"] == len(sel)
    html = VD.defaults_note("leverage").data
    assert f"{d['overlap']:.0%}" in html and "admonition" in html
    fig = VD.mechanism_figure(rows)
    assert fig.layout.yaxis.type == "log" and len(fig.data) > 0
    legend = [t for t in fig.data if t.showlegend]  # one entry per (rule, tau), each its own colour
    combos = {(r["rule"], r["tau"]) for r in rows if r["ratio"] == 0.9}
    assert len(legend) == len(combos) == len({t.line.color for t in legend})
    assert all(fig.layout[f"yaxis{k or ''}"].title.text for k in range(4))  # every panel's y axis is titled
    with pytest.raises(ValueError, match="topic"):
        VD.defaults_note("nope")
