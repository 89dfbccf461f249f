"""jacap_lib.theory against autograd, eigen-decompositions and the reading note's hand examples."""
import math

import numpy as np
import pytest
import torch

from jacap_lib import theory as T
from jacap_lib.scoring import leverage

f64 = torch.float64


def rand_cache(n=6, d=4, d_out=3, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    K = scale * torch.randn(n, d, generator=g, dtype=f64)
    U = torch.randn(d_out, n, generator=g, dtype=f64)
    mu = torch.randn(d, generator=g, dtype=f64)
    lam = torch.rand(d, generator=g, dtype=f64) + 0.1
    return K, U, mu, lam


def test_softmax_jacobian_equals_autograd():
    z = torch.randn(3, 7, dtype=f64)
    alpha = torch.softmax(z, -1)
    S = T.softmax_jacobian(alpha)
    for b in range(3):
        auto = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), z[b])
        torch.testing.assert_close(S[b], auto, rtol=1e-12, atol=1e-12)


def test_softmax_jacobian_annihilates_ones_and_is_symmetric_psd():
    alpha = torch.softmax(torch.randn(5, 9, dtype=f64), -1)
    S = T.softmax_jacobian(alpha)
    torch.testing.assert_close(S @ torch.ones(9, dtype=f64), torch.zeros(5, 9, dtype=f64), atol=1e-15, rtol=0)
    torch.testing.assert_close(S, S.transpose(-1, -2))
    assert torch.linalg.eigvalsh(S).min() > -1e-14


def test_note_values_of_S():
    S = T.softmax_jacobian(torch.tensor([0.5, 0.5], dtype=f64))
    torch.testing.assert_close(S, torch.tensor([[0.25, -0.25], [-0.25, 0.25]], dtype=f64))
    S = T.softmax_jacobian(torch.tensor([0.99, 0.01], dtype=f64))
    torch.testing.assert_close(S.abs(), torch.full((2, 2), 0.0099, dtype=f64))
    # the diagonal alpha(1-alpha) peaks at 1/2
    a = torch.linspace(0.01, 0.99, 99, dtype=f64)
    assert float(a[(a * (1 - a)).argmax()]) == pytest.approx(0.5)


def test_attention_jacobian_equals_autograd():
    K, U, mu, _ = rand_cache(n=7, d=5, d_out=4)
    J = T.attention_jacobian(K, U, mu)
    auto = torch.autograd.functional.jacobian(lambda q: T.attention(K, U, q), mu)
    torch.testing.assert_close(J, auto, rtol=1e-10, atol=1e-12)
    # batched over leading dims
    Kb, Ub, mub = K.expand(2, 7, 5), U.expand(2, 4, 7), torch.stack([mu, -mu])
    Jb = T.attention_jacobian(Kb, Ub, mub)
    torch.testing.assert_close(Jb[0], J)
    auto2 = torch.autograd.functional.jacobian(lambda q: T.attention(K, U, q), -mu)
    torch.testing.assert_close(Jb[1], auto2, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("noise_kind", ["scalar", "matrix"])
@pytest.mark.parametrize("lam_kind", ["diag", "full"])
def test_jacobian_capacity_is_half_sum_log1p_of_whitened_eigenvalues(noise_kind, lam_kind):
    K, U, mu, lam = rand_cache(n=6, d=4, d_out=3, seed=3, scale=2.0)
    if lam_kind == "full":
        M = torch.randn(4, 4, dtype=f64)
        lam = M @ M.T + 0.1 * torch.eye(4, dtype=f64)
    Lam = torch.diag(lam) if lam_kind == "diag" else lam
    if noise_kind == "scalar":
        noise, Sig = 0.3, 0.3 * np.eye(3)
    else:
        B = torch.randn(3, 3, dtype=f64)
        noise = B @ B.T + 0.5 * torch.eye(3, dtype=f64)
        Sig = noise.numpy()
    cap = float(T.jacobian_capacity(K, U, mu, lam, noise))
    # independent: numpy, explicit J, symmetric whitening by the inverse square root of Sigma
    alpha = np.exp(K.numpy() @ mu.numpy() / 2.0)
    alpha /= alpha.sum()
    S = np.diag(alpha) - np.outer(alpha, alpha)
    J = U.numpy() @ S @ K.numpy() / 2.0
    ev, V = np.linalg.eigh(Sig)
    W = V @ np.diag(ev ** -0.5) @ V.T
    G = W @ J @ Lam.numpy() @ J.T @ W
    expected = 0.5 * np.log1p(np.linalg.eigvalsh(G)).sum()
    assert cap == pytest.approx(expected, rel=1e-10)
    lam_eigs = T.whitened_eigenvalues(K, U, mu, lam, noise)
    assert float(T.capacity_from_eigenvalues(lam_eigs)) == pytest.approx(expected, rel=1e-10)


def test_eigenvalue_view_spreads_energy():
    a = T.capacity_from_eigenvalues(torch.tensor([10.0, 0.0], dtype=f64))
    b = T.capacity_from_eigenvalues(torch.tensor([5.0, 5.0], dtype=f64))
    assert 2 * float(a) == pytest.approx(math.log(11))
    assert 2 * float(b) == pytest.approx(math.log(36))
    assert a < b


def test_linear_capacity_matches_closed_form_and_ignores_mu():
    K, U, mu, lam = rand_cache(seed=5)
    M = (U @ K).numpy()
    G = M @ np.diag(lam.numpy()) @ M.T / 2.0
    expected = 0.5 * np.linalg.slogdet(np.eye(3) + G)[1]
    assert float(T.linear_capacity(K, U, lam, noise=2.0)) == pytest.approx(expected, rel=1e-12)


def test_capacity_decreases_with_noise():
    K, U, mu, lam = rand_cache(seed=6, scale=2.0)
    caps = [float(T.jacobian_capacity(K, U, mu, lam, s)) for s in (0.1, 1.0, 10.0)]
    assert caps[0] > caps[1] > caps[2] > 0


def test_determinant_lemma_gain_of_one_token():
    g = torch.Generator().manual_seed(1)
    u = torch.randn(10, 5, generator=g, dtype=f64)
    w = torch.rand(10, generator=g, dtype=f64)
    A = torch.eye(5, dtype=f64) + (u * w[:, None]).T @ u
    u_new, w_new = torch.randn(5, generator=g, dtype=f64), 0.7
    gain = torch.logdet(A + w_new * torch.outer(u_new, u_new)) - torch.logdet(A)
    lev = u_new @ torch.linalg.solve(A, u_new)
    assert float(gain) == pytest.approx(math.log1p(w_new * float(lev)), rel=1e-12)
    # and for a token already inside A: removing it costs -log(1 - w u^T A^-1 u)
    score = w * leverage(u, w)
    for i in range(10):
        A_minus = A - w[i] * torch.outer(u[i], u[i])
        drop = torch.logdet(A) - torch.logdet(A_minus)
        assert float(drop) == pytest.approx(-math.log1p(-float(score[i])), rel=1e-10)


def test_two_d_leverage_example_prefers_the_new_direction():
    u = torch.tensor([[1.0, 0.0], [0.95, 0.05], [0.0, 1.0]], dtype=f64)
    w = torch.tensor([1.0, 1.0, 0.7], dtype=f64)
    score = w * leverage(u, w)
    A = np.eye(2) + sum(wi * np.outer(ui, ui) for wi, ui in zip(w.numpy(), u.numpy()))
    expected = np.array([wi * ui @ np.linalg.inv(A) @ ui for wi, ui in zip(w.numpy(), u.numpy())])
    np.testing.assert_allclose(score.numpy(), expected, rtol=1e-12)
    assert score[2] > score[1]  # u3 covers the empty axis, u2 repeats u1
    assert w[1] > w[2]  # although the raw weight ranks u2 first


@pytest.mark.parametrize("seed", range(6))
def test_exhaustive_dominates_greedy_and_one_shot(seed):
    K, U, mu, lam = rand_cache(n=8, d=4, d_out=3, seed=seed, scale=2.0)
    ex = T.select_exhaustive(K, U, mu, lam, 3)
    gr = T.select_greedy(K, U, mu, lam, 3)
    os_ = T.select_one_shot(K, U, mu, lam, 3)
    assert ex.capacity >= gr.capacity - 1e-12
    assert ex.capacity >= os_.capacity - 1e-12
    for r in (ex, gr, os_):
        assert len(r.indices) == 3 and torch.equal(r.indices, r.indices.sort().values)
        assert r.capacity == pytest.approx(float(T.subset_capacity(K, U, mu, lam, r.indices)), rel=1e-10)
    # brute force by the definition, independent of the batched implementation
    import itertools
    best = max(float(T.subset_capacity(K, U, mu, lam, list(c))) for c in itertools.combinations(range(8), 3))
    assert ex.capacity == pytest.approx(best, rel=1e-12)


def test_algorithm1_scores_match_production_scoring():
    from jacap_lib import jacap_scores

    K, U, mu, lam = rand_cache(n=30, d=8, d_out=8, seed=2, scale=3.0)
    ref = T.algorithm1_scores(K, U, mu, lam, tau=2.0, noise=0.5)
    got = jacap_scores(K, U.T.contiguous(), mu, lam, tau=2.0, noise=0.5)
    for name in ("alpha", "rho", "kappa", "weight", "leverage", "score"):
        torch.testing.assert_close(getattr(got, name).double(), ref[name], rtol=1e-5, atol=1e-12)


def test_theory_argument_errors():
    K, U, mu, lam = rand_cache()
    with pytest.raises(ValueError, match="`U`"):
        T.attention_jacobian(K, U[:, :3], mu)
    with pytest.raises(ValueError, match="`mu`"):
        T.attention_jacobian(K, U, mu[:2])
    with pytest.raises(ValueError, match="`lam`"):
        T.jacobian_capacity(K, U, mu, -lam)
    with pytest.raises(ValueError, match="`noise`"):
        T.jacobian_capacity(K, U, mu, lam, noise=0.0)
    with pytest.raises(ValueError, match="`budget`"):
        T.select_greedy(K, U, mu, lam, 0)
    with pytest.raises(ValueError, match="max_subsets"):
        T.select_exhaustive(torch.randn(40, 4, dtype=f64), torch.randn(3, 40, dtype=f64), mu, lam, 20)
