"""The analysis chapters' exercises (error-decomposition, baselines, critique, failure-cases): each expected
answer against an independent computation, and a wrong answer is rejected."""
from __future__ import annotations

import math

import pytest
import torch

from jacap_lib import exercises as E


def test_error_decomposition_by_eigenvalues_and_closed_form():
    d = E.data("error-decomposition.1")
    K, V, mu, lam = d["K"], d["V"], d["mu"], d["lam"]
    alpha = torch.softmax(K @ mu / (d["tau"] * math.sqrt(K.shape[1])), -1)
    w = (alpha * (1 - alpha)) ** 2 * (K**2 * lam).sum(-1) / K.shape[1]
    ev = torch.linalg.eigvalsh((V * w[:, None]).T @ V)
    assert E.check("error-decomposition.1", float((ev / (ev + 1)).sum()))
    assert not E.check("error-decomposition.1", 2 * float((ev / (ev + 1)).sum()))
    d = E.data("error-decomposition.2")
    K, U, q, i = d["K"], d["U"], d["q"], d["i"]
    a = torch.softmax(K @ q / math.sqrt(K.shape[1]), -1)
    f = U @ a
    f_without = (f - a[i] * U[:, i]) / (1 - a[i])
    assert E.check("error-decomposition.2", float((a[i] * (U[:, i] - f_without)).norm()))


def test_baselines_against_scipy():
    from scipy import stats

    from jacap_lib.results import loaders

    d = E.data("baselines.1")
    a, b = d["a"], d["b"]
    n = len(loaders.load_eval_choices()["config"]["dev_docs"])
    assert len(a) == n >= 48 and set(a) == set(b) and d["snapkv"].startswith("snapkv")
    logr = [math.log(a[s] / b[s]) for s in sorted(a)]
    assert E.check("baselines.1", math.exp(sum(logr) / n))
    assert E.check("baselines.2", sum(x < 0 for x in logr))
    assert E.check("baselines.3", stats.wilcoxon(logr).pvalue)
    assert not E.check("baselines.1", (sum(a.values()) / n) / (sum(b.values()) / n) * 1.01 + 0.5)
    assert not E.check("baselines.2", sum(x < 0 for x in logr) + 1)


def test_critique_by_grid_search_and_arithmetic():
    d = E.data("critique.1")
    ev, target = d["eigenvalues"], d["target"]
    grid = torch.logspace(-9, 0, 90001, dtype=torch.float64)
    deff = (ev[None, :] / (ev[None, :] + grid[:, None])).sum(-1)
    s2 = float(grid[(deff - target).abs().argmin()])
    assert E.check("critique.1", s2)
    assert E.check("critique.2", math.floor(512 * 0.1) - 4 - 16)
    assert not E.check("critique.2", math.floor(512 * 0.1) - 4)


def test_failure_cases_closed_forms():
    assert E.check("failure-cases.1", 0.9**10)
    assert not E.check("failure-cases.1", 1 - 0.9**10)
    assert E.check("failure-cases.2", math.log(2) / -math.log(0.99))
