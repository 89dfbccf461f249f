"""Tests for jacap_lib.measure.failures (the note's §20 demos)."""
import math

import pytest
import torch

from jacap_lib.measure import failures as F
from jacap_lib.presses.jacap_rank1 import JacapRank1Press
from jacap_lib.stats import ema_weights


def test_rank_one_press_components_match_dense_softmax_jacobian():
    """Per head, against the dense N x N softmax Jacobian S = Diag(alpha) - alpha alpha^T: with
    g_i = U S e_i sqrt(kappa_i / d) (column i), A = I + sum_i g_i g_i^T and r_i = g_i^T A^-1 g_i."""
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(1, 3, 20, 8, generator=g), torch.randn(1, 3, 20, 8, generator=g)
    mu, lam = torch.randn(1, 3, 8, generator=g), torch.rand(1, 3, 8, generator=g) + 0.1
    press = JacapRank1Press(compression_ratio=0.5, tau=3.0)
    got = press.components(keys, values, mu, lam, module=None)
    for h in range(3):
        K, V, m, l = (t[0, h].double() for t in (keys, values, mu, lam))
        alpha = torch.softmax(K @ m / (3.0 * math.sqrt(8)), -1)
        S = torch.diag(alpha) - torch.outer(alpha, alpha)
        kappa = (K.square() * l).sum(-1)
        G = V.T @ S * (kappa / 8).sqrt()
        A = torch.eye(8, dtype=torch.float64) + G @ G.T
        score = (G * torch.linalg.solve(A, G)).sum(0)
        torch.testing.assert_close(got.score[0, h].double(), score, rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(got.weight[0, h].double(), alpha.square() * kappa / 8, rtol=1e-5, atol=1e-12)


def test_query_lag_closed_form():
    """Phase A queries = e1, phase B = e2: the EMA centre is w_old e1 + (1 - w_old) e2, so its
    distance to e2 is w_old * sqrt(2), with w_old the EMA weight left on phase A."""
    Tlen, switch, d = 40, 30, 4
    q = torch.zeros(2, Tlen, d, dtype=torch.float64)
    q[:, :switch, 0] = 1.0
    q[:, switch:, 1] = 1.0
    future = torch.zeros(2, 5, d, dtype=torch.float64)
    future[..., 1] = 1.0
    r = F.query_lag(q, switch, (0.5, 0.9, 0.99), future=future)
    for beta in (0.5, 0.9, 0.99):
        w_old = float(ema_weights(Tlen, beta)[:switch].sum())
        assert math.isclose(r["old_phase_weight"][beta], w_old, rel_tol=1e-6)
        assert math.isclose(r["distance"][beta], w_old * math.sqrt(2), rel_tol=1e-5)
    assert math.isclose(r["distance"]["flat"], switch / Tlen * math.sqrt(2), rel_tol=1e-6)
    assert r["distance"][0.99] > r["distance"][0.9] > r["distance"][0.5]
    with pytest.raises(ValueError, match="switch"):
        F.query_lag(q, 0, (0.5,), future=future)


@pytest.fixture(scope="module")
def model_tok():
    from jacap_lib import load_model

    return load_model(device="cpu")


@pytest.mark.model
def test_kept_indices_match_the_compressed_cache(model_tok):
    """The 'critical kept' metric re-derives kvpress's kept indices from the traced scores: they
    must be exactly the rows left in the compressed cache."""
    from transformers import DynamicCache

    model, tok = model_tok
    ids = tok(F._FILLER, return_tensors="pt").input_ids[:, :80]
    full = DynamicCache()
    with torch.no_grad():
        model(ids, past_key_values=full, use_cache=True)
    press = JacapRank1Press(compression_ratio=0.75, n_sink=4)
    press.trace = {}
    comp = DynamicCache()
    with torch.no_grad(), press(model):
        model(ids, past_key_values=comp, use_cache=True)
    kept = F._kept_indices(press.trace, ids.shape[1], 0.75, press)
    for layer in (0, 17):
        K_full, K_comp = full.layers[layer].keys[0], comp.layers[layer].keys[0]  # (H_kv, N, d)
        for h in range(K_full.shape[0]):
            match = torch.cdist(K_comp[h], K_full[h]).argmin(-1)
            assert sorted(match.tolist()) == sorted(kept[layer][h].tolist())
            assert set(range(4)) <= set(match.tolist())  # sinks protected


@pytest.mark.model
def test_delayed_constraint_runs_and_protection_keeps_the_code(model_tok):
    model, tok = model_tok
    demo = F.delayed_constraint(model, tok, ratios=(0.9,))
    assert demo.reference.kl == 0.0 and demo.reference.critical_kept == 1.0
    assert demo.reference.answer_correct  # the uncompressed model recalls the code
    protected = [c for c in demo.cases if c.options["n_sink"] > 4]
    assert len(protected) == 1 and protected[0].critical_kept == 1.0
    assert all(math.isfinite(c.answer_logprob) for c in demo.cases)
    rows = demo.table()
    assert len(rows) == 3 and rows[0]["label"] == "full cache"
