"""Exercises of the serving and kvpress-usage chapters: the reference solution (computed independently here,
by brute force or from the formula) passes, a wrong answer fails with the hint for its slip."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from jacap_lib import exercises as E


def msg(exercise_id, answer, **given):
    verdict = E.check(exercise_id, answer, **given)
    assert not verdict
    return verdict.message


def test_serving_1_bytes_after_an_eviction():
    # SmolLM2-135M's shape: 30 layers, 3 KV heads, head_dim 64; float32; a budget of 40 slots
    ctrl = SimpleNamespace(events=[SimpleNamespace(kv_bytes_after=2 * 30 * 1 * 3 * 40 * 64 * 4)])
    right = 2 * 30 * 3 * 40 * 64 * 4
    assert E.check("serving.1", right, controller=ctrl)
    assert "factor 2" in msg("serving.1", right // 2, controller=ctrl)
    assert "KV heads" in msg("serving.1", 3 * right, controller=ctrl)
    assert not E.check("serving.1", right + 1, controller=ctrl)
    with pytest.raises(ValueError, match="controller"):
        E.check("serving.1", right, controller=SimpleNamespace(events=[]))


def test_serving_2_ema_tail_by_brute_force():
    beta, k = 0.9, 0
    while (1 - beta) * beta ** k >= 0.01 * (1 - beta):  # weight of a k-step-old query vs the newest one
        k += 1
    assert E.check("serving.2", k)
    assert "still above" in msg("serving.2", k - 1)
    assert "mean age" in msg("serving.2", round(1 / (1 - beta)))
    assert not E.check("serving.2", k + 1)


def test_serving_3_best_beta_against_an_independent_lag_error():
    g = torch.Generator().manual_seed(0)
    q = torch.cumsum(0.3 * torch.randn(300, generator=g), 0) + torch.randn(300, generator=g)  # drift + noise
    horizon = 16

    def lag_error(beta):  # mean |EMA mean at t - mean of the next `horizon` queries|, the recursion written out
        mu, errs = q[0].item(), []
        for t in range(1, len(q) - horizon):
            mu = beta * mu + (1 - beta) * q[t].item()
            errs.append(abs(mu - q[t + 1:t + 1 + horizon].mean().item()))
        return sum(errs) / len(errs)

    grid = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    mine = min(grid, key=lag_error)
    expected = E.get("serving.3").expected(q=q, horizon=horizon)
    assert expected in grid
    assert E.check("serving.3", expected, q=q, horizon=horizon)
    assert not E.check("serving.3", next(b for b in grid if b != expected), q=q, horizon=horizon)
    assert mine == expected or math.isclose(lag_error(mine), lag_error(expected), rel_tol=0.05)


def test_kvpress_usage_budgets_by_hand():
    # JacapPromptPress defaults: 4 sinks, a 16-token window; kvpress keeps int(N (1 - c))
    assert E.check("kvpress-usage.1", int(1000 * (1 - 0.75)) - 4 - 16)
    assert "every kept token" in msg("kvpress-usage.1", int(1000 * (1 - 0.75)))
    n = next(n for n in range(1, 2000) if int(n * (1 - 0.9)) > 20)
    assert n == 211 and E.check("kvpress-usage.2", n)
    assert "floating point" in msg("kvpress-usage.2", 210)  # the by-hand answer, 21 / 0.1
    assert "only the sinks" in msg("kvpress-usage.2", next(n for n in range(1, 2000) if int(n * (1 - 0.9)) >= 20))
    assert E.check("kvpress-usage.3", 96 - 4 - 16)
    assert "protected" in msg("kvpress-usage.3", 96)


def test_new_chapters_check_their_exercises():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "book" / "chapters"
    for name, label in (("07_serving.md", "serving"), ("07b_kvpress.md", "kvpress-usage")):
        text = (root / name).read_text()
        for ex_id in E.ids(label):
            assert text.count(f'exercises.check("{ex_id}"') >= 2, (name, ex_id)  # the reader's cell and the solution
