"""Query statistics against explicit loops and numpy."""
import numpy as np
import pytest
import torch

from jacap_lib.stats import EMAQueryStats, ema_query_stats, ema_weights, flat_query_stats


def test_flat_stats_match_numpy():
    q = torch.randn(2, 3, 40, 8)
    mu, lam = flat_query_stats(q)
    np.testing.assert_allclose(mu.numpy(), q.numpy().mean(-2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lam.numpy(), q.numpy().var(-2), rtol=1e-4, atol=1e-6)


def test_variance_floor():
    q = torch.ones(5, 4)
    _, lam = flat_query_stats(q, eps=1e-3)
    assert torch.equal(lam, torch.full((4,), 1e-3))


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 0.99])
def test_ema_closed_form_equals_the_recursion(beta):
    q = torch.randn(2, 25, 6, dtype=torch.float64)
    mu_r, m_r = q[:, 0].clone(), q[:, 0] ** 2
    for t in range(1, 25):
        mu_r = beta * mu_r + (1 - beta) * q[:, t]
        m_r = beta * m_r + (1 - beta) * q[:, t] ** 2
    mu, lam = ema_query_stats(q, beta, eps=1e-9)
    torch.testing.assert_close(mu.double(), mu_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lam.double(), (m_r - mu_r**2).clamp_min(1e-9), rtol=1e-4, atol=1e-6)
    assert float(ema_weights(25, beta).sum()) == pytest.approx(1.0, abs=1e-6)


def test_streaming_equals_batch_and_rows_do_not_mix():
    q = torch.randn(2, 30, 4)
    s = EMAQueryStats(0.8)
    for t in range(10):
        s.update(q[:, t])
    s.update(q[:, 10:], chunk=True)
    mu, lam = ema_query_stats(q, 0.8)
    torch.testing.assert_close(s.mu, mu, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s.lam, lam, rtol=1e-4, atol=1e-6)
    alone = EMAQueryStats(0.8).update(q[1], chunk=True)
    torch.testing.assert_close(s.mu[1], alone.mu, rtol=1e-5, atol=1e-6)


def test_small_beta_follows_a_phase_change_faster():
    q = torch.cat([torch.zeros(50, 2), torch.ones(10, 2)])
    fast, _ = ema_query_stats(q, 0.5)
    slow, _ = ema_query_stats(q, 0.99)
    assert float(fast[0]) > 0.99 and float(slow[0]) < 0.1


def test_errors():
    with pytest.raises(ValueError, match="beta"):
        EMAQueryStats(1.0)
    with pytest.raises(ValueError, match="beta"):
        ema_query_stats(torch.randn(3, 2), -0.1)
    with pytest.raises(ValueError, match="eps"):
        flat_query_stats(torch.randn(3, 2), eps=0)
    with pytest.raises(ValueError, match="T = 0"):
        flat_query_stats(torch.randn(0, 2))
    with pytest.raises(ValueError, match="`q`"):
        flat_query_stats(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="no query"):
        EMAQueryStats(0.9).mu
