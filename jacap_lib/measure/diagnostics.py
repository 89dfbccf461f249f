r"""Mechanism diagnostics: is Algorithm 1's capacity term doing anything on a real head?

Beyond the per-token weight, Algorithm 1 (note §6–§7) has two mechanisms:

* **saturation** — :math:`\rho_i = \bar\alpha_i(1-\bar\alpha_i)` falls once a token dominates, which
  can only happen to tokens with :math:`\bar\alpha_i > 1/2`;
* **leverage** — :math:`u_i^\top A^{-1} u_i` with :math:`A = I + G/\sigma^2`,
  :math:`G = \sum_j w_j u_j u_j^\top`, discounts directions the cache already covers, which needs
  :math:`A` far from :math:`I`.

:func:`mechanism_diagnostics` measures both on ``(..., N, d)`` heads: the effective dimension
:math:`d_\mathrm{eff} = \sum_i r_i = \sum_k \lambda_k/(\lambda_k+\sigma^2)` (:math:`\lambda_k` the
eigenvalues of :math:`G`), :math:`\lVert A - I\rVert_2 = \lambda_{\max}/\sigma^2`, the number of tokens with
:math:`\bar\alpha_i > 1/2`, and the overlap of the top-``budget`` set of Algorithm 1's score with the
top-``budget`` set of the plain per-token score :math:`w_i\lVert u_i\rVert^2` (1 = the leverage changes
nothing). :func:`model_mechanisms` runs it on every layer and KV head of a model, with the query
statistics :class:`~jacap_lib.presses.jacap.JacapPromptPress` would use.

:func:`query_stat_errors` measures how well statistics of the prompt's queries (flat mean, the last
``n``, an EMA with factor :math:`\beta`) predict the mean and variance of the queries that actually
come next (note §11, §13.1).
"""
from __future__ import annotations

import torch

from ..config import DEFAULTS
from ..hf import attention_modules, capture_heads, decoder_layers_of
from ..presses.jacap import JacapPromptPress
from ..scoring import deff_noise, effective_dimension, jacap_weight, leverage, weighted_gram
from ..stats import ema_weights, moment_stats

__all__ = ["mechanism_diagnostics", "layer_statistics", "model_mechanisms", "prompt_estimators",
           "query_stat_errors", "DEFAULT_ESTIMATORS"]


def mechanism_diagnostics(keys: torch.Tensor, values: torch.Tensor, mu: torch.Tensor, lam: torch.Tensor, *,
                          budget: int, tau: float = DEFAULTS.tau, noise: float | str = DEFAULTS.noise,
                          deff_target: float | None = None) -> dict:
    r"""How active saturation and leverage are, per head, for ``keys/values (..., N, d)``, ``mu/lam (..., d)``.

    ``u = v`` (the paper's proxy). ``noise`` is :math:`\sigma^2` or ``"deff"`` (then ``deff_target``).
    Returns float64 tensors of shape ``(...)``: ``sigma2``, ``deff`` (:math:`\sum_i r_i`), ``a_minus_i``
    (:math:`\lVert A-I\rVert_2`), ``n_saturated`` (tokens with :math:`\bar\alpha > 1/2`), ``alpha_max``,
    ``overlap`` (:math:`|\mathrm{top}_B(r)\cap\mathrm{top}_B(w\lVert u\rVert^2)|/B`).
    """
    n = keys.shape[-2]
    if not isinstance(budget, int) or not 0 < budget <= n:
        raise ValueError(f"`budget` must be an int in [1, N = {n}], got {budget!r}")
    k, u = keys.double(), values.double()
    alpha, _, _, w = jacap_weight(k, mu.double(), lam.double(), float(tau))
    ev = torch.linalg.eigvalsh(weighted_gram(u, w))
    if isinstance(noise, str):
        if noise != "deff" or deff_target is None:
            raise ValueError("`noise` must be a number or 'deff' with `deff_target`")
        sigma2 = deff_noise(ev, deff_target)
    else:
        sigma2 = torch.full(ev.shape[:-1], float(noise), dtype=torch.float64)
    score = w / sigma2.unsqueeze(-1) * leverage(u, w, sigma2)
    plain = w * u.square().sum(-1)
    top_r = torch.zeros_like(score, dtype=torch.bool).scatter(-1, score.topk(budget, -1).indices, True)
    top_p = torch.zeros_like(score, dtype=torch.bool).scatter(-1, plain.topk(budget, -1).indices, True)
    return {"sigma2": sigma2, "deff": effective_dimension(ev, sigma2), "a_minus_i": ev[..., -1] / sigma2,
            "n_saturated": (alpha > 0.5).sum(-1).double(), "alpha_max": alpha.amax(-1),
            "overlap": (top_r & top_p).sum(-1).double() / budget}


def layer_statistics(model, capture, press: JacapPromptPress):
    """Per decoder layer ``(keys (1, H_kv, N, d), values, mu (1, H_kv, d), lam)`` of a prefill capture.

    ``capture`` is a :class:`~jacap_lib.measure.quality.PrefillCapture`; ``mu, lam`` are the statistics
    ``press`` computes in its kvpress hook (flat / last-n / EMA, future-RoPE averaged, GQA-pooled).
    """
    inner_rope = getattr(getattr(model, "model", model), "rotary_emb", None)
    for module, rec in zip(attention_modules(model), capture.layers):
        if inner_rope is not None:
            module.rotary_emb = inner_rope
        kw = rec["kwargs"]
        hidden = kw["hidden_states"]
        with torch.no_grad():
            mu, lam = press.query_statistics(module, hidden, rec["keys"], kw)
        yield rec["keys"].float(), rec["values"].float(), mu, lam


def model_mechanisms(model, capture, *, taus=(1.0, 3.0, 10.0), rules=(("fixed", 1.0),),
                     ratios=(0.75, 0.9), press: JacapPromptPress | None = None) -> list[dict]:
    """:func:`mechanism_diagnostics` on every layer and KV head: one record per (layer, head, tau, rule, ratio).

    ``rules`` is a sequence of ``(name, value)``: ``("fixed", sigma2)`` or ``("deff", frac)`` (target
    ``frac * min(budget, d)``, as :class:`~jacap_lib.presses.jacap.JacapPromptPress` with ``noise="deff"``).
    The budget at ratio ``c`` is kvpress's ``compute_n_kept(N, c)``.
    """
    from kvpress.utils import compute_n_kept

    press = press or JacapPromptPress(0.5)
    out = []
    for layer, (k, v, mu, lam) in enumerate(layer_statistics(model, capture, press)):
        n, d = k.shape[-2], k.shape[-1]
        for c in ratios:
            budget = compute_n_kept(n, c)
            for tau in taus:
                for name, value in rules:
                    if name == "fixed":
                        res = mechanism_diagnostics(k[0], v[0], mu[0], lam[0], budget=budget, tau=tau, noise=value)
                    elif name == "deff":
                        res = mechanism_diagnostics(k[0], v[0], mu[0], lam[0], budget=budget, tau=tau, noise="deff",
                                                    deff_target=value * min(budget, d))
                    else:
                        raise ValueError(f"rule name must be 'fixed' or 'deff', got {name!r}")
                    for h in range(k.shape[1]):
                        out.append({"layer": layer, "head": h, "tau": float(tau), "rule": f"{name}={value:g}",
                                    "ratio": float(c), "budget": int(budget), "n_tokens": int(n),
                                    **{key: float(t[h]) for key, t in res.items()}})
    return out


# ------------------------------------------------------------------------------- query statistics
DEFAULT_ESTIMATORS = ("flat", "last16", "last64", "last128", "ema0.9", "ema0.99")


def prompt_estimators(q: torch.Tensor, names=DEFAULT_ESTIMATORS, *, skip: int = 4, eps: float = DEFAULTS.eps) -> dict:
    """First and second moments of prompt queries ``q (..., T, d)`` under each named estimator.

    ``flat``: all queries after the first ``skip`` (sinks); ``lastN``: the last N; ``emaB``: exponential
    moving average with factor B over the queries after the sinks (:func:`jacap_lib.stats.ema_weights`).
    Returns ``{name: (mu (..., d), lam (..., d))}`` with ``lam = max(m - mu^2, eps)``.
    """
    q = q[..., skip:, :].double()
    out = {}
    for name in names:
        if name == "flat":
            w = torch.full((q.shape[-2],), 1.0 / q.shape[-2], dtype=torch.float64)
        elif name.startswith("last"):
            n = int(name[4:])
            w = torch.zeros(q.shape[-2], dtype=torch.float64)
            w[-n:] = 1.0 / min(n, q.shape[-2])
        elif name.startswith("ema"):
            w = ema_weights(q.shape[-2], float(name[3:]), dtype=torch.float64)
        else:
            raise ValueError(f"unknown estimator {name!r}: use 'flat', 'lastN' or 'emaB'")
        out[name] = moment_stats((w[:, None] * q).sum(-2), (w[:, None] * q.square()).sum(-2), eps)
    return out


@torch.no_grad()
def query_stat_errors(model, input_ids: torch.Tensor, prompt_len: int, names=DEFAULT_ESTIMATORS, *,
                      skip: int = 4) -> list[dict]:
    r"""How well each estimator on the prompt predicts the continuation's queries, per layer and KV head.

    One forward over ``input_ids (1, P + M)`` captures every layer's pre-RoPE queries
    (:func:`jacap_lib.hf.capture_heads`); the G query heads of a KV head are pooled, as
    ``JacapPromptPress(gqa="pool")`` does. Per estimator: ``mu_err`` :math:`=\lVert\hat\mu-\mu_c\rVert/\lVert\mu_c\rVert`
    and ``lam_err`` :math:`=\lVert\hat\lambda-\lambda_c\rVert/\lVert\lambda_c\rVert`, with
    :math:`\mu_c, \lambda_c` the mean and variance of the ``M`` continuation queries (pre-RoPE; the
    averaged future rotation the press applies is one fixed linear map for both sides).
    """
    P = int(prompt_len)
    T = input_ids.shape[-1]
    if not 0 < P < T:
        raise ValueError(f"`prompt_len` must be in (0, {T}) so that both a prompt and a continuation exist, got {P}")
    caps = capture_heads(model, input_ids)
    out = []
    for layer in range(len(decoder_layers_of(model))):
        cap = caps[layer]
        q = cap.queries_prerope  # (H, T, d)
        H, _, d = q.shape
        g = cap.group
        qc = q[:, P:].double().reshape(H // g, g, T - P, d).reshape(H // g, g * (T - P), d)
        mu_c, lam_c = moment_stats(qc.mean(-2), qc.square().mean(-2), DEFAULTS.eps)
        est = prompt_estimators(q[:, :P], names, skip=skip)  # (H, d) each
        for name, (mu, lam) in est.items():
            mu, lam = moment_stats(mu, lam + mu.square(), DEFAULTS.eps, group=g)  # pool the G heads (mixture moments)
            mu_err = (mu - mu_c).norm(dim=-1) / mu_c.norm(dim=-1)
            lam_err = (lam - lam_c).norm(dim=-1) / lam_c.norm(dim=-1)
            for h in range(H // g):
                out.append({"layer": layer, "head": h, "estimator": name, "mu_err": float(mu_err[h]),
                            "lam_err": float(lam_err[h])})
    return out
