"""Bad and edge inputs against the public API, one row per case.

Each row is a call and what must come of it: either a ``ValueError`` whose message names the
argument (and, for the CLIs, argparse's exit status 2 with the flag named on stderr and no file
written), or the documented correct result, checked against an independent computation.

Rows never load a model unless they need one: ``env.tiny`` is a 2-layer random GQA Llama (no
tokenizer), ``env.model``/``env.tok`` the bundled SmolLM2-135M, each built once for the module on
first use.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from conftest import tiny_model

nan, inf = float("nan"), float("inf")
META = torch.device("meta")


# ----------------------------------------------------------------------------- row machinery
@dataclass
class Row:
    id: str
    call: Callable  # call(env) -> result
    exc: type | None = ValueError  # None: the call must succeed and `check(result, env)` holds
    names: tuple = ()  # every string must occur in the error message (case-insensitive)
    check: Callable | None = None
    needs: str | None = None  # None, "tiny" or "model"
    category: str = ""


ROWS: list[Row] = []
_CATEGORY = [""]


def category(name: str) -> None:
    _CATEGORY[0] = name


def bad(id, call, *names, exc=ValueError, needs=None):
    ROWS.append(Row(id, call, exc, names, None, needs, _CATEGORY[0]))


def ok(id, call, check, needs=None):
    ROWS.append(Row(id, call, None, (), check, needs, _CATEGORY[0]))


def close(a, b, rtol=1e-6, atol=1e-9):
    a, b = (torch.as_tensor(x, dtype=torch.float64) if not isinstance(x, torch.Tensor) else x.double() for x in (a, b))
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


class Env:
    """Lazily built models and a scratch directory, shared by the rows of this module."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self._tiny = self._model = None

    @property
    def tiny(self):
        if self._tiny is None:
            self._tiny = tiny_model("llama")
        return self._tiny

    @property
    def model(self):
        if self._model is None:
            from jacap_lib import load_model

            self._model = load_model(device="cpu")
        return self._model[0]

    @property
    def tok(self):
        self.model
        return self._model[1]

    def fresh_dir(self, name: str) -> Path:
        d = self.tmp / name
        d.mkdir(parents=True, exist_ok=False)
        return d


# ----------------------------------------------------------------------------- inputs
def head(n=12, d=8, lead=(), seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(*lead, n, d, generator=g).to(dtype)
    v = torch.randn(*lead, n, d, generator=g).to(dtype)
    mu = torch.randn(*lead, d, generator=g).to(dtype)
    lam = (torch.rand(*lead, d, generator=g) + 0.1).to(dtype)
    return k, v, mu, lam


def with_(t: torch.Tensor, index, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def theory_head(n=5, d=3, d_out=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    K = torch.randn(n, d, generator=g, dtype=torch.float64)
    U = torch.randn(d_out, n, generator=g, dtype=torch.float64)
    mu = torch.randn(d, generator=g, dtype=torch.float64)
    lam = torch.rand(d, generator=g, dtype=torch.float64) + 0.2
    return K, U, mu, lam


def scores(*a, **kw):
    from jacap_lib import jacap_scores

    return jacap_scores(*a, **kw)


def scores_with(**over):
    k, v, mu, lam = head(lead=(2, 3))
    args = dict(keys=k, values=v, mu=mu, lam=lam)
    args.update(over)
    return lambda env: scores(**args)


# ============================================================================= Algorithm 1: jacap_scores
category("jacap_scores")
_k, _v, _mu, _lam = head(lead=(2, 3))
bad("scores-keys-list", scores_with(keys=_k.tolist()), "keys")
bad("scores-keys-1d", scores_with(keys=_k[0, 0, 0]), "keys")
bad("scores-keys-int", scores_with(keys=_k.long(), values=_v.long()), "keys")
bad("scores-keys-bool", scores_with(keys=_k > 0), "keys")
bad("scores-values-shape", scores_with(values=_v[..., :5, :]), "values")
bad("scores-values-dtype", scores_with(values=_v.double()), "values")
bad("scores-mu-lam-dtype", scores_with(lam=_lam.double()), "lam")
bad("scores-mu-half-vs-fp32-keys", scores_with(mu=_mu.half(), lam=_lam.half()), "mu")
bad("scores-empty-N", scores_with(keys=_k[..., :0, :], values=_v[..., :0, :]), "keys", "N = 0")
bad("scores-d-zero", scores_with(keys=_k[..., :0], values=_v[..., :0], mu=_mu[..., :0], lam=_lam[..., :0]), "keys")
bad("scores-mu-wrong-d", scores_with(mu=_mu[..., :5]), "mu")
bad("scores-lam-wrong-d", scores_with(lam=_lam[..., :5]), "lam")
bad("scores-mu-not-broadcastable", scores_with(mu=torch.zeros(5, 8)), "mu")
bad("scores-mu-extra-leading-dims", scores_with(mu=_mu.expand(4, 2, 3, 8)), "mu")
bad("scores-lam-extra-leading-dims", scores_with(lam=_lam.expand(4, 2, 3, 8)), "lam")
bad("scores-mu-0d", scores_with(mu=torch.tensor(1.0)), "mu")
bad("scores-mu-nan", scores_with(mu=with_(_mu, (0, 0, 0), nan)), "mu", "nan")
bad("scores-lam-inf", scores_with(lam=with_(_lam, (1, 2, 3), inf)), "lam", "inf")
bad("scores-lam-negative", scores_with(lam=with_(_lam, (0, 1, 2), -0.5)), "lam")
bad("scores-keys-nan", scores_with(keys=with_(_k, (0, 0, 3, 1), nan)), "keys", "nan")
bad("scores-keys-inf", scores_with(keys=with_(_k, (1, 1, 0, 0), inf)), "keys")
bad("scores-values-nan", scores_with(values=with_(_v, (0, 2, 5, 5), nan)), "values", "nan")
for _name, _val in [("zero", 0.0), ("negative", -1.0), ("nan", nan), ("inf", inf), ("string", "10"), ("bool", True),
                    ("none", None)]:
    bad(f"scores-tau-{_name}", scores_with(tau=_val), "tau")
for _name, _val in [("zero", 0.0), ("negative", -2.0), ("nan", nan), ("inf", inf)]:
    bad(f"scores-noise-{_name}", scores_with(noise=_val), "noise")
bad("scores-out-proj-1d", scores_with(out_proj=torch.ones(8)), "out_proj")
bad("scores-out-proj-wrong-dv", scores_with(out_proj=torch.ones(4, 7)), "out_proj")
bad("scores-out-proj-nan", scores_with(out_proj=with_(torch.ones(4, 8), (1, 1), nan)), "out_proj")
bad("scores-out-proj-int", scores_with(out_proj=torch.ones(4, 8, dtype=torch.long)), "out_proj")
bad("scores-out-proj-device", scores_with(out_proj=torch.ones(4, 8, device=META)), "out_proj")
bad("scores-mu-device", scores_with(mu=_mu.to(META)), "mu")
bad("scores-backend-unknown", scores_with(backend="cuda"), "backend")
bad("scores-backend-none", scores_with(backend=None), "backend")


def _one_token(res, env):  # one token: alpha = 1, rho = 0 -> weight and score exactly 0
    close(res.alpha, torch.ones(2, 3, 1))
    close(res.score, torch.zeros(2, 3, 1), atol=0)


ok("scores-one-token", scores_with(keys=_k[..., :1, :], values=_v[..., :1, :]), _one_token)


def _zero_lam(res, env):  # lam = 0: kappa = 0, weight = 0, A = I, leverage = |v|^2, score = 0
    close(res.kappa, torch.zeros(2, 3, 12), atol=0)
    close(res.leverage, _v.double().square().sum(-1), rtol=1e-5)
    close(res.score, torch.zeros(2, 3, 12), atol=0)


ok("scores-lam-zero", scores_with(lam=torch.zeros_like(_lam)), _zero_lam)


def _bf16(res, env):  # bf16 inputs accumulate in float32; compare with float64 formulas of the rounded inputs
    from jacap_lib import theory

    k, v, mu, lam = (t.bfloat16().double() for t in (_k, _v, _mu, _lam))
    from jacap_lib.config import DEFAULTS

    ref = theory.algorithm1_scores(k[1, 2], v[1, 2].T, mu[1, 2], lam[1, 2], tau=DEFAULTS.tau)
    assert res.score.dtype == torch.float32
    close(res.score[1, 2], ref["score"], rtol=1e-4, atol=1e-9)


ok("scores-bf16", lambda env: scores(_k.bfloat16(), _v.bfloat16(), _mu.bfloat16(), _lam.bfloat16()), _bf16)


def _shared_stats(res, env):  # (d,) statistics broadcast over (2, 3): equal to the per-head call with copies
    close(res.score, scores(_k, _v, _mu[0, 0].expand(2, 3, 8), _lam[0, 0].expand(2, 3, 8)).score, rtol=1e-6, atol=1e-12)


ok("scores-stats-broadcast-down", scores_with(mu=_mu[0, 0], lam=_lam[0, 0]), _shared_stats)

# ============================================================================= selection
category("selection")


def select_keep(*a, **kw):
    from jacap_lib import select_keep as f

    return f(*a, **kw)


def protected_mask(*a, **kw):
    from jacap_lib.selection import protected_mask as f

    return f(*a, **kw)


_s = torch.tensor([[0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4]])
bad("select-scores-list", lambda env: select_keep([0.1, 0.2], 1), "scores")
bad("select-scores-0d", lambda env: select_keep(torch.tensor(1.0), 1), "scores")
bad("select-scores-int", lambda env: select_keep(torch.arange(5), 2, n_sink=0), "scores")
bad("select-scores-nan", lambda env: select_keep(with_(_s, (0, 3), nan), 4, n_sink=0), "scores", "nan")
bad("select-scores-empty", lambda env: select_keep(_s[:, :0], 1, n_sink=0), "scores")
for _name, _val in [("negative", -1), ("float", 2.5), ("bool", True), ("string", "3"), ("none", None)]:
    bad(f"select-budget-{_name}", lambda env, b=_val: select_keep(_s, b, n_sink=0), "budget")
bad("select-n-sink-negative", lambda env: select_keep(_s, 4, n_sink=-1), "sink")
bad("select-window-negative", lambda env: select_keep(_s, 4, window=-1), "window")
bad("select-window-float", lambda env: select_keep(_s, 4, window=1.5), "window")


def select_warned(*a, **kw):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keep = select_keep(*a, **kw)
    return keep, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def _kept_and_warned(expected, warning):
    def check(r, env):
        keep, said = r
        assert any(warning in w for w in said), said
        assert keep.tolist() == [expected], keep

    return check


# documented: a budget below the protected set follows the press's rule (selection.fit_protection), warned:
# the sinks first (the earliest `budget` of them if even they do not fit), then the most recent window tokens
ok("select-budget-below-protected", lambda env: select_warned(_s, 3, n_sink=2, window=2),
   _kept_and_warned([0, 1, 7], "window was shrunk to 1"))
ok("select-window-beyond-N", lambda env: select_warned(_s, 5, n_sink=0, window=20),
   _kept_and_warned([3, 4, 5, 6, 7], "window was shrunk to 5"))
ok("select-budget-zero-with-sinks", lambda env: select_warned(_s, 0, n_sink=1),
   _kept_and_warned([], "only the first 0 sinks"))
ok("select-budget-equals-protected", lambda env: select_keep(_s, 4, n_sink=2, window=2),
   lambda r, env: close(r, torch.tensor([[0, 1, 6, 7]]), atol=0))
ok("select-budget-equals-N", lambda env: select_keep(_s, 8, n_sink=0), lambda r, env: close(r, torch.arange(8)[None], atol=0))
ok("select-budget-above-N", lambda env: select_keep(_s, 99), lambda r, env: close(r, torch.arange(8)[None], atol=0))
ok("select-budget-zero-nothing-protected", lambda env: select_keep(_s, 0, n_sink=0),
   lambda r, env: (r.shape == (1, 0)) or pytest.fail(f"shape {tuple(r.shape)}"))
ok("select-plus-inf-kept", lambda env: select_keep(with_(_s, (0, 5), inf), 1, n_sink=0),
   lambda r, env: close(r, torch.tensor([[5]]), atol=0))
ok("select-minus-inf-dropped", lambda env: select_keep(with_(_s, (0, 2), -inf), 7, n_sink=0),
   lambda r, env: close(r, torch.tensor([[0, 1, 3, 4, 5, 6, 7]]), atol=0))
ok("select-batched-topk", lambda env: select_keep(torch.stack([_s[0], _s[0].flip(0)]), 3, n_sink=0),
   lambda r, env: close(r, torch.tensor([[2, 4, 6], [1, 3, 5]]), atol=0))
bad("protected-mask-n-negative", lambda env: protected_mask(-1), "n")
bad("protected-mask-n-sink-negative", lambda env: protected_mask(8, n_sink=-1), "sink")
bad("protected-mask-window-negative", lambda env: protected_mask(8, n_sink=0, window=-2), "window")
ok("protected-mask-window-beyond-n", lambda env: protected_mask(5, n_sink=1, window=9),
   lambda r, env: close(r, torch.ones(5), atol=0))

# ============================================================================= query statistics
category("stats")


def stats_mod():
    from jacap_lib import stats

    return stats


_q = torch.randn(2, 10, 8, generator=torch.Generator().manual_seed(3))
bad("flat-q-1d", lambda env: stats_mod().flat_query_stats(_q[0, 0]), "q")
bad("flat-q-empty-T", lambda env: stats_mod().flat_query_stats(_q[:, :0]), "q", "T = 0")
bad("flat-q-nan", lambda env: stats_mod().flat_query_stats(with_(_q, (1, 3, 3), nan)), "q", "nan")
bad("flat-q-int", lambda env: stats_mod().flat_query_stats(_q.long()), "q")
bad("flat-eps-zero", lambda env: stats_mod().flat_query_stats(_q, eps=0.0), "eps")
bad("flat-eps-inf", lambda env: stats_mod().flat_query_stats(_q, eps=inf), "eps")
ok("flat-one-query", lambda env: stats_mod().flat_query_stats(_q[:, :1], eps=1e-3),
   lambda r, env: (close(r[0], _q[:, 0]), close(r[1], torch.full((2, 8), 1e-3))))
for _name, _val in [("one", 1.0), ("negative", -0.1), ("nan", nan), ("string", "0.9"), ("bool", True)]:
    bad(f"ema-beta-{_name}", lambda env, b=_val: stats_mod().ema_query_stats(_q, b), "beta")
ok("ema-beta-zero-is-last-query", lambda env: stats_mod().ema_query_stats(_q, 0.0),
   lambda r, env: close(r[0], _q[:, -1]))
bad("ema-weights-T-zero", lambda env: stats_mod().ema_weights(0, 0.5), "T")
bad("ema-weights-T-float", lambda env: stats_mod().ema_weights(2.5, 0.5), "T")
bad("ema-weights-beta-above-one", lambda env: stats_mod().ema_weights(5, 1.5), "beta")
ok("ema-weights-closed-form", lambda env: stats_mod().ema_weights(4, 0.5, dtype=torch.float64),
   lambda r, env: close(r, torch.tensor([0.125, 0.125, 0.25, 0.5]), atol=0))
bad("ema-class-beta", lambda env: stats_mod().EMAQueryStats(1.0), "beta")
bad("ema-class-eps", lambda env: stats_mod().EMAQueryStats(0.9, eps=-1), "eps")
bad("ema-class-mu-before-update", lambda env: stats_mod().EMAQueryStats(0.9).mu, "update")
bad("ema-class-shape-change", lambda env: stats_mod().EMAQueryStats(0.9).update(_q[0, 0]).update(_q[0, :2, :4]), "q")
bad("ema-class-nan", lambda env: stats_mod().EMAQueryStats(0.9).update(with_(_q[0, 0], 2, nan)), "q", "nan")
bad("ema-class-chunk-1d", lambda env: stats_mod().EMAQueryStats(0.9).update(_q[0, 0], chunk=True), "q")
ok("ema-class-chunk-equals-closed-form", lambda env: stats_mod().EMAQueryStats(0.8).update(_q, chunk=True),
   lambda r, env: close(r.mu, (stats_mod().ema_weights(10, 0.8, dtype=torch.float64)[:, None] * _q.double()).sum(-2),
                        rtol=1e-5))

# ============================================================================= theory
category("theory")


def T():
    from jacap_lib import theory

    return theory


_K, _U, _tmu, _tlam = theory_head()
_full_lam = torch.diag(_tlam)
_neg_def = -torch.eye(3, dtype=torch.float64)
bad("theory-softmax-jacobian-int", lambda env: T().softmax_jacobian(torch.tensor([1, 0])), "alpha")
bad("theory-softmax-jacobian-nan", lambda env: T().softmax_jacobian(torch.tensor([0.5, nan])), "alpha", "nan")
bad("theory-attention-q-wrong-d", lambda env: T().attention(_K, _U, torch.ones(4, dtype=torch.float64)), "q")
bad("theory-attention-U-wrong-n", lambda env: T().attention(_K, _U[:, :3], _tmu), "U")
bad("theory-jacobian-K-1d", lambda env: T().attention_jacobian(_K[0], _U, _tmu), "K")
bad("theory-capacity-K-nan", lambda env: T().jacobian_capacity(with_(_K, (1, 1), nan), _U, _tmu, _tlam), "K", "nan")
bad("theory-capacity-U-inf", lambda env: T().jacobian_capacity(_K, with_(_U, (0, 0), inf), _tmu, _tlam), "U")
bad("theory-capacity-mu-nan", lambda env: T().jacobian_capacity(_K, _U, with_(_tmu, 0, nan), _tlam), "mu", "nan")
bad("theory-capacity-lam-diag-nan", lambda env: T().jacobian_capacity(_K, _U, _tmu, with_(_tlam, 1, nan)), "lam", "nan")
bad("theory-capacity-lam-diag-negative", lambda env: T().jacobian_capacity(_K, _U, _tmu, -_tlam), "lam")
bad("theory-capacity-lam-full-nonsymmetric", lambda env: T().jacobian_capacity(_K, _U, _tmu, with_(_full_lam, (0, 1), 0.3)),
    "lam", "symmetric")
bad("theory-capacity-lam-full-negative-definite", lambda env: T().jacobian_capacity(_K, _U, _tmu, _neg_def), "lam")
bad("theory-capacity-lam-full-nan", lambda env: T().jacobian_capacity(_K, _U, _tmu, with_(_full_lam, (2, 2), nan)),
    "lam", "nan")
bad("theory-capacity-lam-wrong-d", lambda env: T().jacobian_capacity(_K, _U, _tmu, _tlam[:2]), "lam")
bad("theory-capacity-noise-zero", lambda env: T().jacobian_capacity(_K, _U, _tmu, _tlam, 0.0), "noise")
bad("theory-capacity-noise-nan", lambda env: T().jacobian_capacity(_K, _U, _tmu, _tlam, nan), "noise")
bad("theory-capacity-noise-vector", lambda env: T().jacobian_capacity(_K, _U, _tmu, _tlam, torch.ones(4)), "noise")
bad("theory-capacity-noise-wrong-shape", lambda env: T().jacobian_capacity(_K, _U, _tmu, _tlam, torch.eye(3)), "noise")
bad("theory-capacity-noise-negative-definite",
    lambda env: T().jacobian_capacity(_K, _U, _tmu, _tlam, -torch.eye(4, dtype=torch.float64)), "noise")
bad("theory-capacity-noise-nonsymmetric",
    lambda env: T().jacobian_capacity(_K, _U, _tmu, _tlam, with_(torch.eye(4, dtype=torch.float64), (0, 3), 0.5)), "noise")
bad("theory-capacity-noise-nan-matrix",
    lambda env: T().jacobian_capacity(_K, _U, _tmu, _tlam, with_(torch.eye(4, dtype=torch.float64), (1, 1), nan)),
    "noise", "nan")
bad("theory-linear-capacity-lam-negative-definite", lambda env: T().linear_capacity(_K, _U, _neg_def), "lam")
bad("theory-linear-capacity-K-inf", lambda env: T().linear_capacity(with_(_K, (0, 0), inf), _U, _tlam), "K")
bad("theory-whitened-noise-negative-definite",
    lambda env: T().whitened_eigenvalues(_K, _U, _tmu, _tlam, -torch.eye(4, dtype=torch.float64)), "noise")
bad("theory-eigenvalues-below-minus-one", lambda env: T().capacity_from_eigenvalues(torch.tensor([2.0, -3.0])),
    "eigenvalues")
bad("theory-eigenvalues-nan", lambda env: T().capacity_from_eigenvalues(torch.tensor([2.0, nan])), "eigenvalues")
ok("theory-eigenvalues-closed-form", lambda env: T().capacity_from_eigenvalues(torch.tensor([10.0, 0.0], dtype=torch.float64)),
   lambda r, env: close(r, 0.5 * math.log(11)))


def _matrix_noise_equals_scalar(r, env):  # noise = s I is the scalar noise s
    close(r, T().jacobian_capacity(_K, _U, _tmu, _tlam, 2.5), rtol=1e-12)


ok("theory-capacity-isotropic-matrix-noise", lambda env: T().jacobian_capacity(
    _K, _U, _tmu, _tlam, 2.5 * torch.eye(4, dtype=torch.float64)), _matrix_noise_equals_scalar)
ok("theory-capacity-full-lam-equals-diag", lambda env: T().jacobian_capacity(_K, _U, _tmu, _full_lam),
   lambda r, env: close(r, T().jacobian_capacity(_K, _U, _tmu, _tlam), rtol=1e-12))
bad("theory-alg1-tau-zero", lambda env: T().algorithm1_scores(_K, _U, _tmu, _tlam, tau=0.0), "tau")
bad("theory-alg1-lam-nan", lambda env: T().algorithm1_scores(_K, _U, _tmu, with_(_tlam, 0, nan)), "lam", "nan")
bad("theory-alg1-noise-negative-definite",
    lambda env: T().algorithm1_scores(_K, _U, _tmu, _tlam, noise=-torch.eye(4, dtype=torch.float64)), "noise")


def _alg1_matrix_noise(r, env):
    """Independent: with whitened directions u~ = L^-1 u (noise = L L^T), -log(1 - r_i) is the log-det drop
    of I + sum_j w_j u~_j u~_j^T when token i's term is removed."""
    noise = _NOISE
    w = T().algorithm1_scores(_K, _U, _tmu, _tlam, tau=1.0)["weight"]
    Uw = torch.linalg.solve_triangular(torch.linalg.cholesky(noise), _U, upper=False)
    A = torch.eye(4, dtype=torch.float64) + (Uw * w) @ Uw.T
    for i in range(_K.shape[0]):
        drop = torch.logdet(A) - torch.logdet(A - w[i] * torch.outer(Uw[:, i], Uw[:, i]))
        assert math.isclose(-math.log1p(-float(r["score"][i])), float(drop), rel_tol=1e-9), i


_NOISE = torch.tensor([[2.0, 0.3, 0, 0], [0.3, 1.0, 0, 0], [0, 0, 0.5, 0.1], [0, 0, 0.1, 3.0]], dtype=torch.float64)
ok("theory-alg1-matrix-noise", lambda env: T().algorithm1_scores(_K, _U, _tmu, _tlam, tau=1.0, noise=_NOISE),
   _alg1_matrix_noise)


def _one_shot_tensor_noise(r, env):  # the tensor noise is used: same indices as the top-2 of the whitened scores
    s = T().algorithm1_scores(_K, _U, _tmu, _tlam, tau=10.0, noise=_NOISE)["score"]
    close(r.indices, s.topk(2).indices.sort().values, atol=0)
    close(r.capacity, T().subset_capacity(_K, _U, _tmu, _tlam, r.indices, _NOISE), rtol=1e-12)


ok("theory-one-shot-tensor-noise", lambda env: T().select_one_shot(_K, _U, _tmu, _tlam, 2, noise=_NOISE),
   _one_shot_tensor_noise)
ok("theory-one-shot-scalar-tensor-noise", lambda env: T().select_one_shot(_K, _U, _tmu, _tlam, 2, noise=torch.tensor(7.0)),
   lambda r, env: close(r.capacity, T().select_one_shot(_K, _U, _tmu, _tlam, 2, noise=7.0).capacity, rtol=1e-12))
bad("theory-select-K-batched", lambda env: T().select_greedy(_K[None], _U, _tmu, _tlam, 2), "K")
bad("theory-select-budget-zero", lambda env: T().select_greedy(_K, _U, _tmu, _tlam, 0), "budget")
bad("theory-select-budget-above-n", lambda env: T().select_one_shot(_K, _U, _tmu, _tlam, 6), "budget")
bad("theory-select-budget-float", lambda env: T().select_exhaustive(_K, _U, _tmu, _tlam, 2.0), "budget")
bad("theory-exhaustive-max-subsets", lambda env: T().select_exhaustive(_K, _U, _tmu, _tlam, 2, max_subsets=3), "max_subsets")
bad("theory-exhaustive-chunk-zero", lambda env: T().select_exhaustive(_K, _U, _tmu, _tlam, 2, chunk=0), "chunk")
bad("theory-subset-index-out-of-range", lambda env: T().subset_capacity(_K, _U, _tmu, _tlam, [0, 99]), "indices")
bad("theory-subset-index-float", lambda env: T().subset_capacity(_K, _U, _tmu, _tlam, [0.5, 1.5]), "indices")
ok("theory-subset-one-token-zero-capacity", lambda env: T().subset_capacity(_K, _U, _tmu, _tlam, [3]),
   lambda r, env: close(r, 0.0, atol=1e-15))
ok("theory-greedy-budget-one", lambda env: T().select_greedy(_K, _U, _tmu, _tlam, 1),
   lambda r, env: (r.capacity == 0.0) or pytest.fail(str(r)))


def _exhaustive_brute(r, env):
    import itertools

    best = max(float(T().subset_capacity(_K, _U, _tmu, _tlam, list(c))) for c in itertools.combinations(range(5), 3))
    assert math.isclose(r.capacity, best, rel_tol=1e-12)


ok("theory-exhaustive-chunk-one", lambda env: T().select_exhaustive(_K, _U, _tmu, _tlam, 3, chunk=1), _exhaustive_brute)

# ============================================================================= JacapPromptPress options
category("JacapPromptPress options")


def JP(*a, **kw):
    from jacap_lib import JacapPromptPress

    return JacapPromptPress(*a, **kw)


for _name, _val in [("one", 1.0), ("negative", -0.1), ("nan", nan), ("string", "0.5"), ("bool", False)]:
    bad(f"press-ratio-{_name}", lambda env, v=_val: JP(v), "compression_ratio")
for _opt in ("tau", "noise", "eps"):
    for _name, _val in [("zero", 0.0), ("inf", inf), ("nan", nan), ("bool", True)]:
        bad(f"press-{_opt}-{_name}", lambda env, o=_opt, v=_val: JP(0.5, **{o: v}), _opt)
for _opt in ("n_sink", "window"):
    for _name, _val in [("negative", -1), ("float", 2.0), ("bool", True)]:
        bad(f"press-{_opt}-{_name}", lambda env, o=_opt, v=_val: JP(0.5, **{o: v}), _opt)
bad("press-n-future-zero", lambda env: JP(0.5, n_future_positions=0), "n_future_positions")
bad("press-n-future-negative", lambda env: JP(0.5, n_future_positions=-5), "n_future_positions")
for _name, _val in [("zero", 0), ("negative", -3), ("float", 8.0)]:
    bad(f"press-n-queries-{_name}", lambda env, v=_val: JP(0.5, n_queries=v), "n_queries")
for _name, _val in [("one", 1.0), ("negative", -0.5), ("nan", nan)]:
    bad(f"press-beta-{_name}", lambda env, v=_val: JP(0.5, beta=v), "beta")
bad("press-gqa", lambda env: JP(0.5, gqa="max"), "gqa")
bad("press-backend", lambda env: JP(0.5, backend="cuda"), "backend")
bad("press-use-out-proj-string", lambda env: JP(0.5, use_out_proj="no"), "use_out_proj")


def prefill(model, press, n_tokens, seed=0):
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, n_tokens), generator=g)
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=ids, past_key_values=cache)
    return cache


def prefill_warned(model, press, n_tokens):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = prefill(model, press, n_tokens)
    return cache, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def _kept_slots(expected, warning="window was shrunk"):
    """The cache holds exactly the full cache's keys at ``expected`` positions (every layer and KV head),
    and the press warned about the truncation."""

    def check(r, env):
        cache, warned = r
        assert any(warning in w for w in warned), warned
        full = prefill(env.tiny, JP(0.0), 20)
        for layer in range(2):
            close(cache.layers[layer].keys[0], full.layers[layer].keys[0][:, expected], rtol=0, atol=0)

    return check


# documented: a budget below n_sink + window shrinks the window (warned), the sinks are never dropped
ok("press-budget-below-sink-plus-window", lambda env: prefill_warned(env.tiny, JP(0.75, n_sink=2, window=8), 20),
   _kept_slots([0, 1, 17, 18, 19]), needs="tiny")
ok("press-window-beyond-prompt", lambda env: prefill_warned(env.tiny, JP(0.5, n_sink=0, window=30), 20),
   _kept_slots(list(range(10, 20))), needs="tiny")
# documented: a budget below n_sink keeps the earliest n_kept sinks (warned), no window, no scored token
ok("press-sinks-beyond-budget", lambda env: prefill_warned(env.tiny, JP(0.75, n_sink=8, window=0), 20),
   _kept_slots([0, 1, 2, 3, 4], warning="sink tokens"), needs="tiny")
ok("press-sinks-beyond-budget-with-window", lambda env: prefill_warned(env.tiny, JP(0.85, n_sink=4, window=8), 20),
   _kept_slots([0, 1, 2], warning="sink tokens"), needs="tiny")


def _kept_protected(cache, env):  # budget = n_sink + window exactly: only the protected tokens remain
    k_full = prefill(env.tiny, JP(0.0), 20)
    for layer in range(2):
        kept, full = cache.layers[layer].keys[0], k_full.layers[layer].keys[0]
        close(kept, torch.cat([full[:, :3], full[:, -7:]], 1), rtol=0, atol=0)


ok("press-budget-equals-protected", lambda env: prefill(env.tiny, JP(0.5, n_sink=3, window=7), 20), _kept_protected,
   needs="tiny")


def _one_token_prompt(cache, env):  # compute_n_kept(1, c) = 1: the one token stays
    assert cache.layers[0].keys.shape[-2] == 1


ok("press-one-token-prompt", lambda env: prefill(env.tiny, JP(0.5, n_sink=0), 1), _one_token_prompt, needs="tiny")

# ============================================================================= registry
category("registry")


def reg():
    from jacap_lib.presses import registry

    return registry


bad("registry-unknown-name", lambda env: reg().build_press("snapvk", 0.5), "snapvk", "snapkv")
bad("registry-name-not-string", lambda env: reg().build_press(3, 0.5), "method")
bad("registry-family", lambda env: reg().list_methods("jacapp"), "family")
bad("registry-describe-unknown", lambda env: reg().describe_method("nope"), "nope")
for _name, _val in [("one", 1.0), ("negative", -0.1), ("nan", nan), ("inf", inf), ("string", "0.5"), ("none", None),
                    ("bool", True)]:
    bad(f"registry-ratio-{_name}", lambda env, v=_val: reg().build_press("jacap_prompt", v), "compression_ratio")
for _m in ["jacap_prompt", "jacap_rank1", "jacap_two_stage", "jacap_multicenter", "jacap_prompt_wo", "jacap_obs", "jacap_ea",
           "jacap_ablate", "jacap_prompt_adakv", "snapkv", "knorm", "random"]:
    bad(f"registry-unknown-option-{_m}", lambda env, m=_m: reg().build_press(m, 0.5, bogus_option=1), "bogus_option")
bad("registry-snapkv-negative-window", lambda env: reg().build_press("snapkv", 0.5, window_size=-4), "window_size")
bad("registry-snapkv-zero-window", lambda env: reg().build_press("snapkv", 0.5, window_size=0), "window_size")
bad("registry-snapkv-kernel-zero", lambda env: reg().build_press("snapkv", 0.5, kernel_size=0), "kernel_size")
bad("registry-streaming-negative-sink", lambda env: reg().build_press("streaming_llm", 0.5, n_sink=-1), "n_sink")
bad("registry-expected-attention-future-negative",
    lambda env: reg().build_press("expected_attention", 0.5, n_future_positions=-1), "n_future_positions")
bad("registry-expected-attention-vnorm-string",
    lambda env: reg().build_press("expected_attention", 0.5, use_vnorm="no"), "use_vnorm")
bad("registry-capkv-tau-zero", lambda env: reg().build_press("capkv", 0.5, tau=0.0), "tau")
bad("registry-capkv-epsilon-negative", lambda env: reg().build_press("capkv", 0.5, epsilon=-1.0), "epsilon")
bad("registry-random-seed-string", lambda env: reg().build_press("random", 0.5, seed="a"), "seed")
bad("registry-adakv-safeguard", lambda env: reg().build_press("jacap_prompt_adakv", 0.5, alpha_safeguard=1.5), "alpha_safeguard")
bad("registry-ea-beta", lambda env: reg().build_press("jacap_ea", 0.5, beta=1.0), "beta")
bad("registry-safeguard-without-adakv", lambda env: reg().build_press("snapkv", 0.5, alpha_safeguard=0.1), "adakv")
bad("registry-adakv-around-a-wrapper", lambda env: reg().build_press("jacap_obs", 0.5, adakv=True, budget="layer"),
    "adakv")
bad("registry-two-stage-expand", lambda env: reg().build_press("jacap_two_stage", 0.5, expand=0.5), "expand")
bad("registry-two-stage-expand-inf", lambda env: reg().build_press("jacap_two_stage", 0.5, expand=inf), "expand")
bad("registry-multicenter-aggregate", lambda env: reg().build_press("jacap_multicenter", 0.5, aggregate="median"),
    "aggregate")
bad("registry-multicenter-centers-zero", lambda env: reg().build_press("jacap_multicenter", 0.5, n_centers=0), "n_centers")
bad("registry-multicenter-iters-zero", lambda env: reg().build_press("jacap_multicenter", 0.5, kmeans_iters=0),
    "kmeans_iters")

# ============================================================================= decode controller (Algorithm 2)
category("decode controller")


def ctrl(env, **kw):
    from jacap_lib import JacapDecodeController

    args = dict(high=64, budget=40, interval=8, window=8)
    args.update(kw)
    return JacapDecodeController(env.tiny, **args)


for _opt, _val in [("high", -1), ("budget", 0), ("interval", 0), ("beta", 1.0), ("eps", 0.0), ("n_sink", -1),
                   ("prefix", 2.5), ("window", -1), ("tau", 0.0), ("noise", nan), ("deadline_s", -1.0),
                   ("age_bins", 0), ("backend", "cuda"), ("record_layers", ("a",)), ("record_layers", (99,)),
                   ("record_layers", 3)]:
    bad(f"controller-{_opt}-{_val!r}", lambda env, o=_opt, v=_val: ctrl(env, **{o: v}), _opt, needs="tiny")
bad("controller-budget-plus-interval-above-high", lambda env: ctrl(env, high=40, budget=36, interval=8),
    "high", "interval", needs="tiny")
bad("controller-protected-above-budget", lambda env: ctrl(env, n_sink=4, prefix=30, window=16), "budget", "prefix",
    needs="tiny")
bad("controller-model-none", lambda env: controller().JacapDecodeController(None, high=64, budget=40), "model")
bad("controller-positions-unknown-layer", lambda env: ctrl(env).positions(99), "layer", needs="tiny")
bad("controller-query-stats-unknown-layer", lambda env: ctrl(env).query_stats(99), "layer", needs="tiny")
bad("controller-evict-without-request", lambda env: ctrl(env).evict(), "forward", needs="tiny")
bad("controller-attach-twice", lambda env: ctrl(env).attach().attach(), "attached", needs="tiny")


def controller():
    from jacap_lib import controller

    return controller


def replay(*a, **kw):
    from jacap_lib.measure.replay import replay as f

    return f(*a, **kw)


def kl_from_logits(*a, **kw):
    from jacap_lib.measure.quality import kl_from_logits as f

    return f(*a, **kw)


bad("replay-sequence-1d", lambda env: replay(env.tiny, torch.zeros(5, dtype=torch.long), 2), "sequence",
    needs="tiny")
bad("replay-n-prompt-zero", lambda env: replay(env.tiny, torch.zeros(1, 5, dtype=torch.long), 0), "n_prompt",
    needs="tiny")
bad("replay-n-prompt-float", lambda env: replay(env.tiny, torch.zeros(1, 5, dtype=torch.long), 2.5), "n_prompt",
    needs="tiny")
bad("replay-sequence-float", lambda env: replay(env.tiny, torch.zeros(1, 5), 2), "sequence", needs="tiny")
bad("kl-from-logits-shape", lambda env: kl_from_logits(torch.zeros(2, 5), torch.zeros(2, 4)), "logits")
bad("ema-trace-q-1d", lambda env: stats_mod().ema_trace(torch.zeros(5), 0.5), "q")
bad("ema-tradeoff-horizon-zero", lambda env: stats_mod().ema_tradeoff(torch.randn(20, 4), 0.5, horizon=0), "horizon")
bad("ema-tradeoff-horizon-too-long", lambda env: stats_mod().ema_tradeoff(torch.randn(20, 4), 0.5, horizon=19), "horizon")
bad("ema-tradeoff-q-1d", lambda env: stats_mod().ema_tradeoff(torch.randn(20), 0.5), "q")

# ============================================================================= models
category("load_model")


def load(*a, **kw):
    from jacap_lib import load_model

    return load_model(*a, **kw)


bad("load-model-name-int", lambda env: load(123), "name")
bad("load-model-name-empty", lambda env: load(""), "name")
bad("load-model-attn", lambda env: load(attn_implementation="flash"), "attn_implementation")
bad("load-model-dtype-name", lambda env: load(dtype="float33"), "dtype")
bad("load-model-dtype-int", lambda env: load(dtype=torch.int64), "dtype")
bad("load-model-device", lambda env: load(device="tpu"), "device")
bad("load-model-missing-absolute-folder", lambda env: load(str(env.tmp / "no-such-model")), "no-such-model", "not found")
bad("load-model-missing-relative-folder", lambda env: load("./no-such-model-dir"), "no-such-model-dir", "not found")
bad("load-model-folder-without-config", lambda env: load(env.fresh_dir("empty-model")), "config.json")

# ============================================================================= measure (needs the bundled model)
category("measure")


def eviction():
    from jacap_lib.measure import eviction

    return eviction


_TEXT = "The cat sat on the mat while the dog slept by the warm fire in the small house."
bad("inspect-empty-text", lambda env: eviction().inspect_eviction(env.model, env.tok, ""), "text", needs="model")
bad("inspect-unknown-method", lambda env: eviction().inspect_eviction(env.model, env.tok, _TEXT, "nope"), "nope",
    needs="model")
bad("inspect-ratio-with-press-object",
    lambda env: eviction().inspect_eviction(env.model, env.tok, _TEXT, JP(0.25), 0.75), "compression_ratio", needs="model")
bad("inspect-options-with-press-object",
    lambda env: eviction().inspect_eviction(env.model, env.tok, _TEXT, JP(0.25), tau=3.0), "options", needs="model")
bad("answer-ratio-with-press-object",
    lambda env: eviction().answer(env.model, env.tok, _TEXT, "Where?", JP(0.25), 0.75), "compression_ratio", needs="model")


def _press_ratio_used(r, env):  # the press object's own ratio is what runs (compute_n_kept(N, 0.25) kept)
    from kvpress.utils import compute_n_kept

    assert r.compression_ratio == 0.25 and r.kept.shape[-1] == compute_n_kept(len(r.token_ids), 0.25)


ok("inspect-press-object", lambda env: eviction().inspect_eviction(env.model, env.tok, _TEXT, JP(0.25)), _press_ratio_used,
   needs="model")


def quality():
    from jacap_lib.measure import quality

    return quality


bad("kl-prompt-empty", lambda env: quality().next_token_kl(env.model, None, [], [1, 2], None), "prompt_ids", needs="model")
bad("kl-continuation-float", lambda env: quality().next_token_kl(env.model, None, [1, 2], torch.ones(2), None),
    "continuation_ids", needs="model")
bad("kl-string-without-tokenizer", lambda env: quality().next_token_kl(env.model, None, "abc", [1], None), "prompt_ids",
    needs="model")
bad("kl-batch-two", lambda env: quality().next_token_kl(env.model, None, torch.ones(2, 3, dtype=torch.long), [1], None),
    "prompt_ids", needs="model")

# ============================================================================= results (functions)
category("results")


def V():
    from jacap_lib.verdicts import intervals as verdicts

    return verdicts


def parse_method(spec):
    from jacap_lib.presses.registry import parse_method as f

    return f(spec)


bad("parse-method-bad-spec", lambda env: parse_method("ja cap"), "spec")
bad("parse-method-option-no-value", lambda env: parse_method("jacap_prompt[tau]"), "tau")
bad("parse-method-not-string", lambda env: parse_method(3), "spec")
bad("load-segments-unknown", lambda env: __import__("jacap_lib.results.texts", fromlist=["x"]).load_segments(
    ["no-such-segment"]), "no-such-segment")
bad("bootstrap-empty", lambda env: V().geometric_mean_ratio([], []), "at least 3")
bad("bootstrap-n-resamples-zero", lambda env: V().geometric_mean_ratio([1.0, 2.0, 3.0], [1.0, 1.0, 2.0], n_resamples=0),
    "n_resamples")
bad("bootstrap-confidence", lambda env: V().geometric_mean_ratio([1.0, 2.0, 3.0], [1.0, 1.0, 2.0], confidence=1.5),
    "confidence")
bad("bootstrap-nan", lambda env: V().geometric_mean_ratio([1.0, nan, 2.0], [1.0, 1.0, 1.0]), "non-finite")


def _bootstrap_closed(r, env):  # the same ratio on every document: the interval collapses to it
    assert (r.estimate, r.low, r.high) == pytest.approx((2.0, 2.0, 2.0), rel=1e-12), r


ok("bootstrap-constant", lambda env: V().geometric_mean_ratio([2.0, 5.0, 3.0], [1.0, 2.5, 1.5]), _bootstrap_closed)
bad("simultaneous-confidence-m-zero", lambda env: V().simultaneous_confidence(0.95, 0), "m must")
bad("simultaneous-confidence-level", lambda env: V().simultaneous_confidence(95, 3), "confidence")
bad("mcnemar-verdict-negative-wins", lambda env: V().mcnemar_verdict(-1, 3, 0.5), "wins")
bad("mcnemar-verdict-p-above-one", lambda env: V().mcnemar_verdict(1, 3, 2.0), "p_adjusted")


def passkey_prompt(*a):
    from jacap_lib.measure.passkey import passkey_prompt as f

    return f(*a)


bad("passkey-depth", lambda env: passkey_prompt(env.tok, 128, 1.5, "12345"), "depth", needs="model")
bad("passkey-length-short", lambda env: passkey_prompt(env.tok, 10, 0.5, "12345"), "length", needs="model")


def _passkey_depth_zero(r, env):  # depth 0: the needle opens the context, which is exactly `length` tokens
    ctx, question = r
    assert ctx.shape == (1, 128)
    needle = env.tok(" The pass key is 12345. Remember it. 12345 is the pass key. ", add_special_tokens=False).input_ids
    assert ctx[0, :len(needle)].tolist() == needle


ok("passkey-depth-zero", lambda env: passkey_prompt(env.tok, 128, 0.0, "12345"), _passkey_depth_zero, needs="model")


def _malformed(env):
    from jacap_lib.results import files

    p = env.fresh_dir("malformed") / "rows.jsonl"
    p.write_text('{"task": "kl"}\n{"task": \n')
    return files.read_jsonl(p)


bad("read-jsonl-malformed-names-file-and-line", _malformed, "rows.jsonl", "line 2")
bad("read-jsonl-missing-file", lambda env: __import__("jacap_lib.results.files", fromlist=["x"]).read_jsonl(
    env.tmp / "missing.jsonl", missing_ok=False), "missing.jsonl", exc=FileNotFoundError)

# ============================================================================= CLI: jacap <subcommand>
category("CLI")


@dataclass
class CliResult:
    code: int
    stderr: str
    stdout: str


def run_cli(env, argv, *, fresh: str):
    """Run ``jacap <argv>`` in a fresh directory (cwd); return exit status + output and the files it wrote."""
    from jacap_lib.cli import main

    work = env.tmp / fresh
    work.mkdir(parents=True, exist_ok=True)
    before = {p for p in work.rglob("*") if p.is_file()}
    argv = [a.replace("{d}", str(work)) for a in argv]
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(work)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(cwd)
    written = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file() and p not in before)
    return CliResult(code, err.getvalue(), out.getvalue()), written


def cli_bad(id, argv, *names, setup=None, needs=None):
    """``jacap <argv>`` must exit with status 2 naming every string of ``names`` on stderr, and write no file."""

    def call(env):
        fresh = "cli-" + id
        if setup is not None:
            setup(env.tmp / fresh)
        res, written = run_cli(env, argv, fresh=fresh)
        if written:
            raise AssertionError(f"a rejected run wrote {written}; stderr: {res.stderr[-300:]}")
        if res.code != 2:
            raise AssertionError(f"exit status {res.code} (expected 2); stderr: {res.stderr[-500:]}")
        raise ValueError(res.stderr)

    bad(id, call, *names, needs=needs)


def _inputs(files: dict):
    def setup(work: Path):
        work.mkdir(parents=True)
        for name, text in files.items():
            (work / name).write_text(text)

    return setup


_EV = ["evaluate", "tune", "--dir", "{d}/new/sub", "--lengths", "512", "--methods", "knorm", "--ratios", "0.5",
       "--continuation", "4", "--no-progress"]


def ev_with(**over):
    argv = list(_EV)
    for flag, value in over.items():
        i = argv.index("--" + flag.replace("_", "-"))
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        argv[i + 1:j] = value if isinstance(value, list) else [value]
    return argv


cli_bad("cli-no-subcommand", [], "required")
cli_bad("cli-unknown-subcommand", ["bogus"], "bogus")
cli_bad("cli-evaluate-no-task", ["evaluate"], "required")
cli_bad("cli-evaluate-dir-is-file", ev_with(dir="{d}/f.txt"), "--dir", setup=_inputs({"f.txt": "x"}))
cli_bad("cli-evaluate-ratio-not-number", ev_with(ratios="half"), "--ratios")
cli_bad("cli-evaluate-ratio-one", ev_with(ratios=["0.5", "1.0"]), "--ratios")
cli_bad("cli-evaluate-ratio-negative", ev_with(ratios="-0.5"), "--ratios")
cli_bad("cli-evaluate-ratio-nan", ev_with(ratios="nan"), "--ratios")
cli_bad("cli-evaluate-length-zero", ev_with(lengths="0"), "--lengths")
cli_bad("cli-evaluate-length-not-int", ev_with(lengths="64.5"), "--lengths")
cli_bad("cli-evaluate-threads-zero", ev_with() + ["--threads", "0"], "--threads")
cli_bad("cli-evaluate-continuation-zero", ev_with(continuation="0"), "--continuation")
cli_bad("cli-evaluate-unknown-method", ev_with(methods=["knorm", "snapvk"]), "--methods", "snapvk")
cli_bad("cli-evaluate-method-spec-not-a-name", ev_with(methods=["jacap_prompt[tau=-1]"]), "--methods", "search space")
cli_bad("cli-evaluate-unknown-manifest", ev_with() + ["--manifest", "{d}/none.json"], "--manifest", "none.json")
cli_bad("cli-evaluate-model-missing-folder", ev_with() + ["--model", "./no-such-model"], "--model", "no-such-model")
cli_bad("cli-evaluate-length-beyond-documents", ev_with(lengths=["512", "1000000"]), "--lengths", needs="model")
cli_bad("cli-evaluate-dev-without-choices", ["evaluate", "dev", "--dir", "{d}/e", "--no-progress"], "choices.json")
cli_bad("cli-evaluate-summary-missing", ["evaluate", "summary", "--dir", "{d}/e"], "--dir", "does not exist")
_AB = ["evaluate", "ablate", "--dir", "{d}/new/sub", "--lengths", "512", "--ratios", "0.5", "--continuation", "4",
       "--no-progress"]
cli_bad("cli-ablate-ratio-one", _AB[:6] + ["1.0"] + _AB[7:], "--ratios")
cli_bad("cli-ablate-length-small", _AB[:4] + ["8"] + _AB[5:], "--lengths")
cli_bad("cli-ablate-unknown-ablation", _AB + ["--ablations", "no-such-knob"], "--ablations", "no-such-knob")
cli_bad("cli-ablate-workers-zero", _AB + ["--workers", "0"], "--workers")
cli_bad("cli-ablate-continuation-zero", _AB[:8] + ["0"] + _AB[9:], "--continuation")
cli_bad("cli-ablate-dir-is-file", _AB[:2] + ["--dir", "{d}/f.txt"] + _AB[4:], "--dir", setup=_inputs({"f.txt": "x"}))
cli_bad("cli-ablate-summary-missing", ["evaluate", "ablate-summary", "--dir", "{d}/e"], "--dir", "does not exist")
cli_bad("cli-needle-trials-zero", ["evaluate", "needle", "--dir", "{d}/e", "--trials", "0"], "--trials")
cli_bad("cli-needle-mode-unknown", ["evaluate", "needle", "--dir", "{d}/e", "--mode", "before"], "--mode", "inside")
cli_bad("cli-inspect-ratio", ["inspect", "--ratio", "1.5"], "--ratio")
cli_bad("cli-inspect-method", ["inspect", "--method", "nope"], "--method", "nope")
cli_bad("cli-inspect-out-without-kl-table", ["inspect", "--out", "{d}/x.json"], "--out")
cli_bad("cli-inspect-missing-file", ["inspect", "--file", "{d}/absent.txt"], "--file")
cli_bad("cli-inspect-empty-text", ["inspect", "--text", "  "], "--text")
cli_bad("cli-inspect-negative-layer", ["inspect", "--layer", "-1"], "--layer")
cli_bad("cli-inspect-head-without-layer", ["inspect", "--head", "1"], "--head", "--layer")
cli_bad("cli-inspect-html-suffix", ["inspect", "--html", "{d}/e.png"], "--html", ".html")
cli_bad("cli-inspect-top-zero", ["inspect", "--top", "0"], "--top")
cli_bad("cli-decompose-prefix-zero", ["decompose", "--out", "{d}/dec", "--prefix", "0"], "--prefix")
cli_bad("cli-decompose-only-unknown", ["decompose", "--out", "{d}/dec", "--only", "nope"], "--only")
cli_bad("cli-time-unknown", ["time", "nope"], "nope")

# ============================================================================= the test
def _param(row: Row):
    marks = [pytest.mark.model] if row.needs == "model" else []
    return pytest.param(row, id=row.id, marks=marks)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return Env(tmp_path_factory.mktemp("bad_inputs"))


def test_ids_unique_and_enough_rows():
    ids = [r.id for r in ROWS]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert not dup, f"duplicate row ids: {dup}"
    assert len(ROWS) >= 150, len(ROWS)


@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_bad_input(row: Row, env):
    if row.exc is None:
        result = row.call(env)
        row.check(result, env)
        return
    with pytest.raises(Exception) as info:
        row.call(env)
    err = info.value
    assert type(err) is row.exc or isinstance(err, row.exc) and not isinstance(err, (KeyError, IndexError)), (
        f"{type(err).__name__}: {err}")
    msg = str(err).lower()
    missing = [n for n in row.names if n.lower() not in msg]
    assert not missing, f"message does not name {missing}: {err}"


@pytest.mark.parametrize("bad", [1, 1.0, -0.1, float("nan"), True, "0.5", None])
def test_one_compression_ratio_check_for_every_press(bad):
    """The presses, the instrument and the registry share one check (``_checks.compression_ratio``): each refuses
    the same values with the same message, and takes a ratio in [0, 1) as a float."""
    from jacap_lib import _checks, build_press
    from jacap_lib.presses.jacap import JacapPromptPress

    assert _checks.compression_ratio(0) == 0.0 and _checks.compression_ratio(0.5) == 0.5
    for make in (lambda: _checks.compression_ratio(bad), lambda: JacapPromptPress(bad),
                 lambda: build_press("snapkv", bad), lambda: build_press("jacap", bad)):
        with pytest.raises(ValueError, match=r"compression_ratio must be a number in \[0, 1\)"):
            make()
