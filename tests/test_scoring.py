"""jacap_scores (Algorithm 1) against a float64 re-computation of the formulas, and its error handling."""
import math
import warnings

import pytest
import torch

from jacap_lib import jacap_scores
from jacap_lib.config import DEFAULTS
from jacap_lib import scoring
from jacap_lib.scoring import CholeskyFailure, JacapScores

f64 = torch.float64


def inputs(shape=(2, 3, 257, 64), seed=0, dtype=torch.float32, key_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    *lead, n, d = shape
    keys = (key_scale * torch.randn(*shape, generator=g)).to(dtype)
    values = torch.randn(*shape, generator=g).to(dtype)
    mu = (3 * torch.randn(*lead, d, generator=g)).to(dtype)
    lam = (torch.rand(*lead, d, generator=g) + 0.05).to(dtype)
    return keys, values, mu, lam


def reference(keys, values, mu, lam, tau=DEFAULTS.tau, noise=DEFAULTS.noise, out_proj=None):
    """The formulas written out in float64, with an explicit inverse (independent of the library path)."""
    k, v, m, l = (t.to(f64) for t in (keys, values, mu, lam))
    d = k.shape[-1]
    logits = torch.einsum("...nd,...d->...n", k, m) / (tau * math.sqrt(d))
    alpha = torch.exp(logits - logits.amax(-1, keepdim=True))
    alpha = alpha / alpha.sum(-1, keepdim=True)
    rho = alpha * (1 - alpha)
    kappa = torch.einsum("...nd,...d->...n", k * k, l)
    w = rho**2 * kappa / d
    u = v if out_proj is None else torch.einsum("od,...nd->...no", out_proj.to(f64), v)
    A = torch.eye(u.shape[-1], dtype=f64) + torch.einsum("...n,...ni,...nj->...ij", w / noise, u, u)
    Ainv = torch.linalg.inv(A)
    lev = torch.einsum("...ni,...ij,...nj->...n", u, Ainv, u)
    return dict(alpha=alpha, rho=rho, kappa=kappa, weight=w, leverage=lev, score=w / noise * lev, A=A)


FIELDS = ("alpha", "rho", "kappa", "weight", "leverage", "score")


def test_matches_float64_recomputation_fp32_to_1e5_relative():
    keys, values, mu, lam = inputs()
    got = jacap_scores(keys, values, mu, lam)
    ref = reference(keys, values, mu, lam)
    assert isinstance(got, JacapScores)
    for name in FIELDS:
        t = getattr(got, name)
        assert t.dtype == torch.float32 and t.shape == (2, 3, 257)
        rel = ((t.double() - ref[name]).abs() / ref[name].abs().clamp_min(1e-30)).max()
        assert rel < 1e-5, (name, float(rel))


@pytest.mark.parametrize("tau,noise", [(1.0, 1.0), (10.0, 0.01), (3.0, 5.0)])
def test_tau_noise_and_out_proj(tau, noise):
    keys, values, mu, lam = inputs((2, 40, 16), seed=1)
    W = torch.randn(24, 16, generator=torch.Generator().manual_seed(9))
    got = jacap_scores(keys, values, mu, lam, tau=tau, noise=noise, out_proj=W)
    ref = reference(keys, values, mu, lam, tau=tau, noise=noise, out_proj=W)
    for name in FIELDS:
        torch.testing.assert_close(getattr(got, name).double(), ref[name], rtol=2e-5, atol=1e-12)


def test_shared_statistics_broadcast():
    keys, values, mu, lam = inputs((2, 3, 50, 8), seed=2)
    got = jacap_scores(keys, values, mu[0, 0], lam[0, 0])
    ref = reference(keys, values, mu[0, 0].expand(2, 3, 8), lam[0, 0].expand(2, 3, 8))
    torch.testing.assert_close(got.score.double(), ref["score"], rtol=1e-5, atol=1e-12)


def test_checklist_A_spd_weights_nonneg_scores_below_one():
    keys, values, mu, lam = inputs((4, 120, 32), seed=3, key_scale=4.0)
    ref = reference(keys, values, mu, lam, tau=1.0)
    assert torch.linalg.eigvalsh(ref["A"]).min() >= 1.0 - 1e-9  # A = I + PSD
    got = jacap_scores(keys, values, mu, lam, tau=1.0)
    assert (got.weight >= 0).all() and (got.leverage >= 0).all()
    # w u^T A^{-1} u < 1 for every token of the pool (A contains that token's own rank-one term)
    assert (got.score < 1).all() and (got.score >= 0).all()
    torch.testing.assert_close(got.alpha.sum(-1), torch.ones(4))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("key_scale", [1.0, 300.0])
def test_half_precision_inputs_give_finite_fp32_scores(dtype, key_scale):
    keys, values, mu, lam = inputs((2, 2, 300, 64), seed=4, dtype=dtype, key_scale=key_scale)
    got = jacap_scores(keys, values, mu, lam)
    for name in FIELDS:
        t = getattr(got, name)
        assert t.dtype == torch.float32 and torch.isfinite(t).all(), name
    # against the float64 formulas evaluated on the same (rounded) inputs: the bounded quantities (alpha,
    # rho, score in [0, 1]) to 5e-6 absolute -- float32's 1 - alpha near saturation limits rho to ~1e-7 --
    # and kappa / leverage to 1e-5 of their row's largest value
    ref = reference(keys, values, mu, lam)
    for name in ("alpha", "rho", "score"):
        assert float((getattr(got, name).double() - ref[name]).abs().max()) <= 5e-6, name
    for name in ("kappa", "leverage"):
        err = (getattr(got, name).double() - ref[name]).abs() / ref[name].abs().amax(-1, keepdim=True)
        assert float(err.max()) <= 1e-5, name


def test_constant_rho_reduces_to_capkv_leverage_structure():
    """mu = 0 makes alpha uniform, so rho is constant and w_i = c * kappa_i: the score is then the
    leverage of a linear (CapKV-style) channel with diagonal response covariance kappa."""
    keys, values, _, lam = inputs((60, 8), seed=5)
    n, d = keys.shape
    got = jacap_scores(keys, values, torch.zeros(d), lam, tau=1.0)
    rho = (1 / n) * (1 - 1 / n)
    torch.testing.assert_close(got.rho, torch.full((n,), rho))
    c = rho**2 / d
    kappa = (keys.double() ** 2 * lam.double()).sum(-1)
    u = values.double()
    A = torch.eye(d, dtype=f64) + c * (u * kappa[:, None]).T @ u
    capkv = c * kappa * torch.einsum("ni,ij,nj->n", u, torch.linalg.inv(A), u)
    torch.testing.assert_close(got.score.double(), capkv, rtol=1e-5, atol=1e-14)
    # ... and equals the marginal loss of the linear log-det capacity with that diagonal covariance
    full = torch.logdet(A)
    for i in (0, 17, 59):
        Ai = A - c * kappa[i] * torch.outer(u[i], u[i])
        assert float(full - torch.logdet(Ai)) == pytest.approx(-math.log1p(-float(capkv[i])), rel=1e-8)


def test_noise_rescales_weights():
    keys, values, mu, lam = inputs((30, 8), seed=6)
    a = jacap_scores(keys, values, mu, lam, noise=4.0)
    b = reference(keys, values, mu, lam / 4.0)  # kappa/4 == w/4 everywhere
    torch.testing.assert_close(a.score.double(), b["score"], rtol=1e-5, atol=1e-14)


def test_cholesky_retries_with_jitter_then_raises(monkeypatch):
    keys, values, mu, lam = inputs((10, 4), seed=7)
    real = torch.linalg.cholesky_ex
    calls = []

    def failing_once(A, *a, **k):
        calls.append(1)
        L, info = real(A, *a, **k)
        return (L, torch.ones_like(info)) if len(calls) == 1 else (L, info)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", failing_once)
    with pytest.warns(RuntimeWarning, match="jitter"):
        out = jacap_scores(keys, values, mu, lam)
    assert torch.isfinite(out.score).all() and len(calls) == 2

    monkeypatch.setattr(torch.linalg, "cholesky_ex", lambda A, *a, **k: (A, torch.ones(A.shape[:-2], dtype=torch.int32)))
    with pytest.raises(CholeskyFailure, match="jitter"):
        jacap_scores(keys, values, mu, lam)


def test_never_forms_an_inverse(monkeypatch):
    keys, values, mu, lam = inputs((10, 4), seed=8)

    def boom(*a, **k):
        raise AssertionError("explicit inverse used")

    monkeypatch.setattr(torch.linalg, "inv", boom)
    monkeypatch.setattr(torch, "inverse", boom)
    jacap_scores(keys, values, mu, lam)


@pytest.mark.parametrize(
    "mutate,arg",
    [
        (lambda k, v, m, l: (k.masked_fill(k > 2, float("nan")), v, m, l), "keys"),
        (lambda k, v, m, l: (k, v.masked_fill(v > 2, float("inf")), m, l), "values"),
        (lambda k, v, m, l: (k, v[..., :-1, :], m, l), "values"),
        (lambda k, v, m, l: (k, v.double(), m, l), "values"),
        (lambda k, v, m, l: (k, v, m[..., :-1], l), "mu"),
        (lambda k, v, m, l: (k, v, m, l.double()), "lam"),
        (lambda k, v, m, l: (k, v, m, -l), "lam"),
        (lambda k, v, m, l: (k, v, m.half(), l.half()), "mu"),
        (lambda k, v, m, l: (k[..., :0, :], v[..., :0, :], m, l), "N = 0"),
        (lambda k, v, m, l: (k, v, torch.zeros(5, 8), l), "mu"),
        (lambda k, v, m, l: (k.long(), v, m, l), "keys"),
    ],
)
def test_bad_input_names_the_argument(mutate, arg):
    k, v, m, l = mutate(*inputs((2, 12, 8), seed=9))
    with pytest.raises(ValueError, match=arg):
        jacap_scores(k, v, m, l)


@pytest.mark.parametrize("kw,arg", [({"tau": 0}, "tau"), ({"tau": -1}, "tau"), ({"noise": 0.0}, "noise"),
                                    ({"noise": float("nan")}, "noise"), ({"backend": "cuda"}, "backend"),
                                    ({"out_proj": torch.randn(4, 5)}, "out_proj")])
def test_bad_options_name_the_argument(kw, arg):
    with pytest.raises(ValueError, match=arg):
        jacap_scores(*inputs((2, 12, 8), seed=10), **kw)


def test_on_device_jitter_choice_per_head():
    """cholesky_jitter_ondevice tries every jitter at once and picks, per head, the first that factorises:
    0 for an SPD head, a positive level for a head with a slightly negative eigenvalue, len(jitters) when
    nothing works (the caller raises then)."""
    from jacap_lib.scoring.contract import _JITTERS
    from jacap_lib.scoring.factor import cholesky_jitter_ondevice

    g = torch.Generator().manual_seed(3)
    Q = torch.linalg.qr(torch.randn(3, 6, 6, generator=g)).Q
    ev = torch.tensor([[1.0, 2, 3, 4, 5, 6], [-3e-6, 1, 1, 1, 1, 1], [-1.0, 1, 1, 1, 1, 1]])
    A = Q @ torch.diag_embed(ev) @ Q.transpose(-1, -2)
    A = 0.5 * (A + A.transpose(-1, -2))
    L, level = cholesky_jitter_ondevice(A)
    assert level[0] == 0 and 0 < level[1] < len(_JITTERS) and level[2] == len(_JITTERS)
    torch.testing.assert_close(L[0] @ L[0].T, A[0], rtol=1e-5, atol=1e-5)
    scale = A[1].diagonal().mean().clamp_min(1.0)
    torch.testing.assert_close(L[1] @ L[1].T, A[1] + _JITTERS[int(level[1])] * scale * torch.eye(6), rtol=1e-5, atol=1e-5)


def test_inputs_that_require_grad_are_scored_without_autograd():
    """A model run outside torch.no_grad() hands the press tensors that require grad: the torch path scores
    them (its blocked kernels write into buffers, which autograd refuses) and equals the float64 formulas."""
    keys, values, mu, lam = inputs(shape=(1, 2, 129, 32), seed=3)
    for t in (keys, values, mu, lam):
        t.requires_grad_(True)
    s = jacap_scores(keys, values, mu, lam, backend="torch")
    ref = reference(*(t.detach() for t in (keys, values, mu, lam)))
    assert not s.score.requires_grad
    for f in FIELDS:
        torch.testing.assert_close(getattr(s, f).to(f64), ref[f], rtol=1e-5, atol=1e-9)


def _lev_weight(k, m, l):
    return scoring.jacap_weight(k.double(), m.double(), l.double(), 3.0)[3]


# every public entry of jacap_lib.scoring that takes cache tensors (examples, diagnostics and the presses call
# them): name -> (call on (keys, values, mu, lam, W), whether its result is a selection score without gradient)
GRAD_ENTRIES = {
    "jacap_scores": (lambda k, v, m, l, W: jacap_scores(k, v, m, l, backend="torch"), True),
    "jacap_scores-deff-out_proj": (lambda k, v, m, l, W: jacap_scores(k, v, m, l, noise="deff", deff_target=3.0,
                                                                      out_proj=W, backend="torch"), True),
    "validated_scores": (lambda k, v, m, l, W: scoring.validated_scores(k, v, m, l, tau=2.0, noise=0.5), True),
    "leverage": (lambda k, v, m, l, W: scoring.leverage(v.double(), _lev_weight(k, m, l), 0.5), True),
    "leverage-per-head-noise": (lambda k, v, m, l, W: scoring.leverage(v, _lev_weight(k, m, l).float(), l[..., :1].squeeze(-1)), True),
    "rank_one_corrected_scores": (lambda k, v, m, l, W: scoring.rank_one_corrected_scores(k, v, m, l), True),
    "rank_one_corrected_scores-out_proj": (lambda k, v, m, l, W: scoring.rank_one_corrected_scores(
        k, v, m, l, tau=10.0, noise=2.0, out_proj=W), True),
    "jacap_weight": (lambda k, v, m, l, W: scoring.jacap_weight(k, m, l, 3.0), False),
    "weighted_gram": (lambda k, v, m, l, W: scoring.weighted_gram(v, _lev_weight(k, m, l).float()), False),
    # eigenvalues: lam stands in (>= 0, (1, 2, d)); eigvalsh itself differs in the last bit with grad on
    "effective_dimension": (lambda k, v, m, l, W: scoring.effective_dimension(l.double() * 10, m[..., 0].abs()), False),
    "deff_noise": (lambda k, v, m, l, W: scoring.deff_noise(l.double() * 10, 3.0), False),
    "cholesky_with_jitter": (lambda k, v, m, l, W: scoring.cholesky_with_jitter(
        torch.eye(32) + scoring.weighted_gram(v, _lev_weight(k, m, l).float())), False),
}


def _tensors(out):
    if isinstance(out, JacapScores):
        return list(out.to_dict().values())
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("entry", list(GRAD_ENTRIES))
def test_every_entry_takes_inputs_that_require_grad(entry):
    """Outside torch.no_grad() a model hands the scorers tensors that require grad (kvpress's own tests do):
    every public entry computes on them without raising (the blocked passes write into out= buffers, which
    autograd refuses) and returns exactly what it returns for the same values without grad; the selection
    scores carry no gradient."""
    fn, detached = GRAD_ENTRIES[entry]
    keys, values, mu, lam = inputs(shape=(1, 2, 129, 32), seed=4)
    W = torch.randn(48, 32, generator=torch.Generator().manual_seed(5)) / 6
    plain = _tensors(fn(keys, values, mu, lam, W))
    assert torch.is_grad_enabled()
    graded = [t.clone().requires_grad_(True) for t in (keys, values, mu, lam, W)]
    got = _tensors(fn(*graded))
    assert len(got) == len(plain)
    for a, b in zip(plain, got):
        assert not a.requires_grad and torch.isfinite(a).all()
        assert torch.equal(a, b.detach()), entry
        if detached:
            assert not b.requires_grad, entry


def test_a_given_centre_replaces_the_tempered_softmax():
    """``alpha=`` (the observed centre): the blocked torch path equals a dense float64 Algorithm 1 from that centre
    (explicit solve) and a hand computation of the weight; ``tau`` is then unused; the Triton backend (which computes
    the tempered centre in its kernels) and a wrong shape are refused."""
    from jacap_lib.scoring.core import validated_scores

    g = torch.Generator().manual_seed(11)
    k, v = torch.randn(2, 3, 40, 16, generator=g), torch.randn(2, 3, 40, 16, generator=g)
    mu, lam = torch.randn(2, 3, 16, generator=g), torch.rand(2, 3, 16, generator=g) + 0.1
    alpha = torch.softmax(torch.randn(2, 3, 40, generator=g), -1)
    got = validated_scores(k, v, mu, lam, tau=3.0, noise=0.5, alpha=alpha)
    other_tau = validated_scores(k, v, mu, lam, tau=50.0, noise=0.5, alpha=alpha)
    a64, k64, v64 = alpha.double(), k.double(), v.double()
    w64 = (a64 * (1 - a64)).square() * (k64.square() * lam.double().unsqueeze(-2)).sum(-1) / 16
    A = torch.eye(16, dtype=torch.float64) + (v64.transpose(-1, -2) * (w64 / 0.5).unsqueeze(-2)) @ v64
    ref = w64 / 0.5 * (v64 * torch.linalg.solve(A, v64.transpose(-1, -2)).transpose(-1, -2)).sum(-1)
    torch.testing.assert_close(got.alpha, alpha)
    torch.testing.assert_close(got.score.double(), ref, rtol=1e-4, atol=1e-10)
    assert torch.equal(got.score, other_tau.score)
    rho = alpha * (1 - alpha)
    kappa = (k.square() * lam.unsqueeze(-2)).sum(-1)
    torch.testing.assert_close(got.weight, rho.square() * kappa / 16, rtol=1e-5, atol=1e-12)
    with pytest.raises(ValueError, match="triton"):
        validated_scores(k, v, mu, lam, tau=3.0, noise=0.5, alpha=alpha, backend="triton")
    with pytest.raises(ValueError, match="alpha"):
        validated_scores(k, v, mu, lam, tau=3.0, noise=0.5, alpha=alpha[..., :-1])


def test_the_press_refuses_triton_with_the_observed_centre():
    from jacap_lib.presses.jacap import JacapPromptPress

    with pytest.raises(ValueError, match="backend='triton'"):
        JacapPromptPress(0.5, backend="triton")
    assert JacapPromptPress(0.5, backend="triton", centre="tempered").backend == "triton"
    with pytest.raises(ValueError, match="backend='triton'"):
        JacapPromptPress(0.5, backend="triton", centre="ea")  # Expected Attention's centre: the torch path too
    with pytest.raises(ValueError, match="centre"):
        JacapPromptPress(0.5, centre="median")
