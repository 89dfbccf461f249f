"""The worked examples behind the corrections of the theory chapters: exact eviction loss, deletion
damage, and the non-monotone, non-submodular kept-set capacity (checked against independent computations)."""
import itertools
import math

import pytest
import torch

from jacap_lib import examples as EX
from jacap_lib import theory as T

f64 = torch.float64


def test_removal_loss_is_minus_log_one_minus_score_and_not_the_second_copy_gain():
    c = EX.random_cache(n=7, seed=5)
    s = T.algorithm1_scores(c["K"], c["U"], c["mu"], c["lam"], tau=1.0, noise=0.5)
    loss = T.removal_loss(c["U"], s["weight"], noise=0.5)
    # independent: slogdet of A with and without the token, built column by column
    w = s["weight"] / 0.5
    for i in range(7):
        cols = [j for j in range(7) if j != i]
        A = torch.eye(3, dtype=f64) + sum(w[j] * torch.outer(c["U"][:, j], c["U"][:, j]) for j in range(7))
        A_minus = torch.eye(3, dtype=f64) + sum(w[j] * torch.outer(c["U"][:, j], c["U"][:, j]) for j in cols)
        ref = torch.linalg.slogdet(A)[1] - torch.linalg.slogdet(A_minus)[1]
        assert float(loss[i]) == pytest.approx(float(ref), rel=1e-10)
    assert torch.allclose(loss, -torch.log1p(-s["score"]), rtol=1e-10)
    assert bool((s["score"] < 1).all())
    # the second-copy gain log(1 + r) is strictly smaller than the loss for every r > 0
    assert bool((torch.log1p(s["score"]) < loss).all())
    # the three rank tokens identically
    assert torch.equal(loss.argsort(), s["score"].argsort())


def test_removal_loss_rejects_bad_weight():
    with pytest.raises(ValueError, match="weight"):
        T.removal_loss(torch.ones(2, 3, dtype=f64), torch.ones(2, dtype=f64))
    with pytest.raises(ValueError, match="weight"):
        T.removal_loss(torch.ones(2, 3, dtype=f64), -torch.ones(3, dtype=f64))


def test_deletion_damage_closed_form_and_bound():
    c = EX.random_cache(n=6, seed=2)
    q = 3 * c["mu"]
    for i in range(6):
        d = EX.deletion_damage(c["K"], c["U"], q, i)
        assert torch.allclose(d["change"], d["closed_form"], atol=1e-12)
        assert d["damage"] <= d["bound"] + 1e-12 <= d["spread"] + 1e-12
    # two tokens by hand: f = a u1 + (1-a) u2, deleting token 1 leaves u2
    K = torch.tensor([[2.0], [0.0]], dtype=f64)
    U = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=f64)
    a = 1 / (1 + math.exp(-2.0))
    d = EX.deletion_damage(K, U, torch.tensor([1.0], dtype=f64), 0)
    assert d["damage"] == pytest.approx(a * math.sqrt(2), rel=1e-12)
    with pytest.raises(ValueError, match="`i`"):
        EX.deletion_damage(K, U, torch.tensor([1.0], dtype=f64), 2)


def test_deletion_damage_curve_saturates_sensitivity_but_not_damage():
    c = EX.random_cache()
    cur = EX.deletion_damage_curve(c["K"], c["U"], c["mu"], 2, [0.0, 12.0])
    assert cur["alpha"][1] > 0.999 and cur["rho"][1] < 1e-3 and cur["jacobian_norm"][1] < 1e-2
    assert cur["damage"][1] > 10 * cur["damage"][0]
    assert max(cur["damage"]) <= cur["spread"]


def _cap(c, subset):
    return float(T.subset_capacity(c["K"], c["U"], c["mu"], c["lam"], list(subset))) if len(subset) > 1 else 0.0


def test_counterexamples_are_real():
    c = EX.random_cache()
    mono = EX.monotonicity_counterexample(**c)
    assert mono["after"] < mono["before"]
    assert mono["before"] == pytest.approx(_cap(c, mono["subset"]), abs=1e-12)
    assert mono["after"] == pytest.approx(_cap(c, sorted(mono["subset"] + (mono["added"],))), abs=1e-12)
    assert mono["n_pairs"] == 8 * 2**7   # every (set, token outside it) pair
    sub = EX.submodularity_counterexample(**c)
    assert set(sub["small"]) < set(sub["large"]) and sub["added"] not in sub["large"]
    g_small = _cap(c, sorted(sub["small"] + (sub["added"],))) - _cap(c, sub["small"])
    g_large = _cap(c, sorted(sub["large"] + (sub["added"],))) - _cap(c, sub["large"])
    assert g_large > g_small
    assert sub["gain_small"] == pytest.approx(g_small, abs=1e-12) and sub["gain_large"] == pytest.approx(g_large, abs=1e-12)


def test_selection_by_budget_matches_brute_force_and_shows_the_non_monotone_optimum():
    c = EX.random_cache()
    rows = EX.selection_by_budget(c["K"], c["U"], c["mu"], c["lam"], range(2, 6))
    for row in rows:
        b = row["budget"]
        best = max(_cap(c, s) for s in itertools.combinations(range(8), b))
        assert row["exhaustive capacity"] == pytest.approx(best, abs=1e-12)
        assert row["greedy capacity"] <= best + 1e-12 and row["one-shot capacity"] <= best + 1e-12
    opt = [r["exhaustive capacity"] for r in rows]
    assert opt[0] > opt[-1]          # the best kept set gets worse as the budget grows
    assert any(r["greedy capacity"] < r["one-shot capacity"] for r in rows)
