"""The effective-dimension noise rule (noise="deff"): sigma^2 per head with sum_i r_i = target.

Checked against a brute-force search over a grid of sigma^2 values that sums the scores jacap_scores
itself returns (no eigenvalues involved), against the closed form on the note's 2-D example, and
through the Triton path (interpreter on the CPU) against the torch path.
"""
import os

import pytest
import torch

from jacap_lib import jacap_scores
from jacap_lib.examples import NOTE_U, NOTE_W
from jacap_lib.scoring import deff_noise, effective_dimension, weighted_gram

f64 = torch.float64


def heads(seed=0, shape=(2, 3, 120, 16), w_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    *lead, n, d = shape
    keys = torch.randn(*shape, generator=g, dtype=f64)
    values = torch.randn(*shape, generator=g, dtype=f64)
    mu = 2 * torch.randn(*lead, d, generator=g, dtype=f64)
    lam = w_scale * (0.05 + torch.rand(*lead, d, generator=g, dtype=f64))
    return keys, values, mu, lam


@pytest.mark.parametrize("target", [0.5, 3.0, 10.0])
def test_bisection_matches_brute_force_grid(target):
    keys, values, mu, lam = heads()
    s = jacap_scores(keys, values, mu, lam, tau=3.0, noise="deff", deff_target=target)
    # the rule's defining property, from the returned scores
    assert torch.allclose(s.score.double().sum(-1), torch.full((2, 3), target, dtype=f64), rtol=1e-5)
    # brute force: scan sigma^2 on a log grid, sum the scores of jacap_scores at each, take the closest
    grid = torch.logspace(-12, 4, 641, dtype=f64)  # 40 points per decade
    sums = torch.stack([jacap_scores(keys, values, mu, lam, tau=3.0, noise=float(s2)).score.double().sum(-1)
                        for s2 in grid])  # (641, 2, 3)
    best = grid[(sums - target).abs().argmin(0)]  # (2, 3)
    G = weighted_gram(values, s.weight.double())
    sigma2 = deff_noise(torch.linalg.eigvalsh(G), target)
    ratio = sigma2 / best
    assert bool((ratio > 10 ** -0.026).all() and (ratio < 10 ** 0.026).all()), ratio  # within one grid step
    # and the scores equal those of a fixed sigma^2 at the solved value
    for b in range(2):
        for h in range(3):
            fixed = jacap_scores(keys[b, h], values[b, h], mu[b, h], lam[b, h], tau=3.0, noise=float(sigma2[b, h]))
            assert torch.allclose(fixed.score, s.score[b, h], rtol=1e-5, atol=0)


def test_effective_dimension_is_the_sum_of_scores_and_monotone():
    keys, values, mu, lam = heads(seed=1)
    s = jacap_scores(keys, values, mu, lam, noise=0.01)
    ev = torch.linalg.eigvalsh(weighted_gram(values, s.weight.double()))
    assert torch.allclose(effective_dimension(ev, 0.01), s.score.double().sum(-1), rtol=1e-5)
    d = [effective_dimension(ev, x) for x in (1e-6, 1e-3, 1.0, 1e3)]
    assert all(bool((a > b).all()) for a, b in zip(d, d[1:]))
    assert torch.allclose(d[0], torch.full_like(d[0], 16.0), rtol=1e-3)  # -> rank(G) = d as sigma^2 -> 0


def test_scale_invariance_makes_tau_and_lambda_scale_irrelevant_to_the_ranking():
    keys, values, mu, lam = heads(seed=2)
    a = jacap_scores(keys, values, mu, lam, noise="deff", deff_target=4.0)
    b = jacap_scores(keys, values, mu, 1000.0 * lam, noise="deff", deff_target=4.0)  # w scales by 1000
    assert torch.allclose(a.score, b.score, rtol=1e-4)
    c = jacap_scores(keys, values, mu, 1000.0 * lam, noise=1.0)  # a fixed sigma^2 does not absorb it
    assert not torch.allclose(a.score / a.score.sum(-1, keepdim=True), c.score / c.score.sum(-1, keepdim=True),
                              rtol=1e-2)


def test_target_above_rank_is_capped_and_zero_gram_gets_unit_noise():
    ev = torch.tensor([[3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=f64)
    s2 = deff_noise(ev, 5.0)
    assert effective_dimension(ev[0], s2[0]) == pytest.approx(0.999 * 2, rel=1e-9)
    assert float(s2[1]) == 1.0


def test_two_d_example_closed_form():
    # note section 7.2: u1=(1,0), u2=(0.95,0.05), u3=(0,1), w=(1,1,0.7); keep B=2, target = B/2 = 1
    U = torch.tensor(NOTE_U, dtype=f64)
    w = torch.tensor(NOTE_W, dtype=f64)
    if U.shape[0] != 3:
        U = U.T
    ev = torch.linalg.eigvalsh((U * w[:, None]).T @ U)
    s2 = float(deff_noise(ev, 1.0))
    # closed form for two eigenvalues: l1/(l1+s)+l2/(l2+s)=1  <=>  s^2 = l1*l2
    assert s2 == pytest.approx(float(ev.prod().sqrt()), rel=1e-9)
    A = torch.eye(2, dtype=f64) + (U * (w / s2)[:, None]).T @ U
    r = w / s2 * (U * torch.linalg.solve(A, U.T).T).sum(-1)
    assert float(r.sum()) == pytest.approx(1.0, rel=1e-9)
    assert r[2] > r[1]  # leverage still ranks the orthogonal u3 above the near-copy u2
    # with a much larger sigma^2 (d_eff << 1) the ranking falls back to w |u|^2, u3 last
    A = torch.eye(2, dtype=f64) + (U * (w / 100.0)[:, None]).T @ U
    r_big = w / 100.0 * (U * torch.linalg.solve(A, U.T).T).sum(-1)
    assert r_big.argmin() == 2


@pytest.mark.parametrize("noise,target,msg", [("auto", None, "'deff'"), ("deff", None, "deff_target"),
                                                ("deff", -1.0, "deff_target"), (1.0, 3.0, "only with")])
def test_bad_noise_arguments_name_the_argument(noise, target, msg):
    keys, values, mu, lam = heads(shape=(5, 4))
    with pytest.raises(ValueError, match=msg):
        jacap_scores(keys, values, mu, lam, noise=noise, deff_target=target)


def test_per_head_target_tensor():
    keys, values, mu, lam = heads(seed=3)
    t = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    s = jacap_scores(keys, values, mu, lam, noise="deff", deff_target=t)
    assert torch.allclose(s.score.double().sum(-1), t.double(), rtol=1e-5)


def test_triton_path_matches_torch_under_the_rule():
    """The Triton path: compiled kernels on CUDA tensors where a GPU is present, else the interpreter on
    the CPU (in a fresh process, so that TRITON_INTERPRET takes effect)."""
    import subprocess
    import sys

    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from jacap_lib.scoring.triton import triton_jacap_scores\n"
        "from jacap_lib import jacap_scores\n"
        "g = torch.Generator().manual_seed(0)\n"
        "k = torch.randn(1, 2, 70, 16, generator=g); v = torch.randn(1, 2, 70, 16, generator=g)\n"
        "mu = torch.randn(1, 2, 16, generator=g); lam = 0.1 + torch.rand(1, 2, 16, generator=g)\n"
        "W = torch.randn(24, 16, generator=g)\n"
        "dev = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "k, v, mu, lam, W = (t.to(dev) for t in (k, v, mu, lam, W))\n"
        "for op in (None, W):\n"
        "    a = triton_jacap_scores(k, v, mu, lam, noise='deff', deff_target=3.0, out_proj=op, dot_precision='ieee')\n"
        "    b = jacap_scores(k, v, mu, lam, noise='deff', deff_target=3.0, out_proj=op, backend='torch')\n"
        "    assert torch.allclose(a.score, b.score, rtol=2e-3, atol=1e-7), (a.score - b.score).abs().max()\n"
        "    assert abs(float(a.score.sum(-1).max()) - 3.0) < 1e-3\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    env.pop("TRITON_INTERPRET", None)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("case", ["full", "rank3", "zero", "per-head"])
def test_on_device_rule_matches_the_eigenvalue_bisection(case):
    """deff_noise_ondevice (no eigenvalues, no host synchronisation: a batched grid search with Cholesky
    factorisations) finds the sigma^2 of deff_noise, including the capped target and the zero Gram."""
    from jacap_lib.scoring.factor import deff_noise_ondevice

    g = torch.Generator().manual_seed(21)
    U = torch.randn(4, 50, 16, generator=g, dtype=f64)
    w = torch.rand(4, 50, generator=g, dtype=f64) ** 4
    if case == "rank3":
        U = U[..., :3] @ torch.randn(3, 16, generator=g, dtype=f64)
    G = weighted_gram(U, w)
    if case == "zero":
        G[1] = 0
    target = torch.tensor([0.5, 2.0, 6.0, 12.0], dtype=f64) if case == "per-head" else torch.full((4,), 5.0, dtype=f64)
    want = deff_noise(torch.linalg.eigvalsh(G), target)
    got = deff_noise_ondevice(G, target)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
