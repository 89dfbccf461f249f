r"""Query statistics :math:`\mu_Q` and :math:`\mathrm{diag}(\Lambda_Q)` for Jacap.

Two estimators over a sequence of queries ``q (..., T, d)`` (leading dims = batch rows / heads,
never mixed):

* flat: the sample mean and (biased) variance over T;
* EMA (note §11): :math:`\mu_t = \beta\mu_{t-1} + (1-\beta)q_t`,
  :math:`m_t = \beta m_{t-1} + (1-\beta) q_t\odot q_t`, :math:`\lambda = \max(m - \mu\odot\mu, \epsilon)`,
  started at the first query (:math:`\mu_1 = q_1`, :math:`m_1 = q_1\odot q_1`) so it carries no zero bias.

Large :math:`\beta` averages over a long past (stable, slow to follow a phase change); small
:math:`\beta` follows the latest queries (responsive, noisy).

:func:`moment_stats` turns first and second moments into ``(mu, lam)`` (the variance floor :math:`\epsilon`;
with ``group`` > 1 one Gaussian pooled over the query heads that share a KV head, GQA);
:class:`EMAQueryStats` streams the EMA during decoding; :func:`ema_trace` and :func:`ema_tradeoff` are the
:math:`\beta` analysis of a query stream (the statistics after every step; how well they predict the next queries).
"""
from __future__ import annotations

import torch

from . import _checks
from .config import DEFAULTS

__all__ = ["flat_query_stats", "ema_query_stats", "ema_weights", "EMAQueryStats", "moment_stats", "ema_trace", "ema_tradeoff"]


def moment_stats(mu: torch.Tensor, m: torch.Tensor, eps: float, *, group: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``(mu, lam)`` of a diagonal Gaussian from first and second moments ``mu, m (..., H, d)``:
    :math:`\lambda = \max(m - \mu\odot\mu, \epsilon)`.

    ``group = G > 1`` first pools every G consecutive heads (the G query heads that share one KV head,
    transformers' ``repeat_kv`` layout) into one Gaussian, the equal mixture of theirs: both moments
    averaged over the group, so the result is ``(..., H / G, d)``. ``eps`` is validated where it entered."""
    if group > 1:
        *lead, h, d = mu.shape
        if h % group:
            raise ValueError(f"{h} heads do not split into groups of `group` = {group}; give the GQA group size")
        mu, m = mu.view(*lead, h // group, group, d).mean(-2), m.view(*lead, h // group, group, d).mean(-2)
    return mu, (m - mu.square()).clamp_min(eps)


def _check_q(q):
    _checks.tensor("q", q, min_dim=2)
    if q.shape[-2] == 0:
        raise ValueError("`q` has T = 0 queries: statistics need at least one query")
    _checks.finite("q", q)


def flat_query_stats(q: torch.Tensor, eps: float = DEFAULTS.eps) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance (floored at ``eps``) over the T axis of ``q (..., T, d)``, in float32."""
    _check_q(q)
    eps = _checks.positive("eps", eps)
    qf = q.float()
    return moment_stats(qf.mean(-2), qf.square().mean(-2), eps)


def ema_weights(T: int, beta: float, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """The weight the EMA puts on each of T queries (they sum to 1; the last gets ``1 - beta``)."""
    T = _checks.int_at_least("T", T, 1)
    beta = _checks.unit_interval("beta", beta)
    t = torch.arange(T, dtype=torch.float64, device=device)
    w = (1.0 - beta) * beta ** (T - 1 - t)
    w[0] = beta ** (T - 1)
    return w.to(dtype)


def ema_query_stats(q: torch.Tensor, beta: float, eps: float = DEFAULTS.eps) -> tuple[torch.Tensor, torch.Tensor]:
    """EMA mean and floored variance over the T axis of ``q (..., T, d)`` (closed form of the recursion)."""
    _check_q(q)
    beta = _checks.unit_interval("beta", beta)
    eps = _checks.positive("eps", eps)
    qf = q.float()
    w = ema_weights(q.shape[-2], beta, device=q.device).unsqueeze(-1)
    return moment_stats((w * qf).sum(-2), (w * qf.square()).sum(-2), eps)


class EMAQueryStats:
    """Streaming EMA statistics for decoding: ``update(q)`` with ``q (..., d)`` (one step) or
    ``(..., T, d)`` (a chunk, folded in order). Leading dims (e.g. batch row, head) stay separate.

    ``beta=None``: flat (cumulative) statistics instead of the EMA -- the running mean and second moment
    of every query seen, each weighing ``1 / count`` (what :func:`flat_query_stats` gives on the whole
    stream)."""

    def __init__(self, beta: float | None, eps: float = DEFAULTS.eps):
        self.beta = None if beta is None else _checks.unit_interval("beta", beta)
        self.eps = _checks.positive("eps", eps)
        self.reset()

    def reset(self) -> None:
        self._mu = None
        self._m = None
        self.count = 0

    def update(self, q: torch.Tensor, *, chunk: bool = False) -> "EMAQueryStats":
        """Fold in one query step ``(..., d)``, or a chunk ``(..., T, d)`` when ``chunk=True``."""
        q = _checks.tensor("q", q, min_dim=2 if chunk else 1)
        _checks.finite("q", q)
        steps = q.float().unbind(-2) if chunk else (q.float(),)
        for qt in steps:
            if self._mu is None:
                self._mu, self._m = qt.clone(), qt.square()
            else:
                if qt.shape != self._mu.shape:
                    raise ValueError(f"`q` step shape {tuple(qt.shape)} differs from earlier steps {tuple(self._mu.shape)}")
                b = self.count / (self.count + 1) if self.beta is None else self.beta
                self._mu = b * self._mu + (1 - b) * qt
                self._m = b * self._m + (1 - b) * qt.square()
            self.count += 1
        return self

    def _ready(self):
        if self._mu is None:
            raise ValueError("EMAQueryStats has seen no query yet: call update(q) first")

    @property
    def mu(self) -> torch.Tensor:
        self._ready()
        return self._mu

    @property
    def lam(self) -> torch.Tensor:
        self._ready()
        return moment_stats(self._mu, self._m, self.eps)[1]


# ------------------------------------------------------------------ the beta analysis of a query stream
def ema_trace(q: torch.Tensor, beta: float, eps: float = DEFAULTS.eps) -> tuple[torch.Tensor, torch.Tensor]:
    """The EMA statistics after every step of a query stream ``q (T, d)``: ``(mu, lam)``, each ``(T, d)``.

    Same recursion as :class:`jacap_lib.stats.EMAQueryStats` (started at the first query)."""
    _checks.tensor("q", q, min_dim=2)
    stats = EMAQueryStats(beta, eps)
    mus, lams = [], []
    for qt in q.float().unbind(-2):
        stats.update(qt)
        mus.append(stats.mu.clone())
        lams.append(stats.lam.clone())
    return torch.stack(mus, -2), torch.stack(lams, -2)


def ema_tradeoff(q: torch.Tensor, beta: float, horizon: int = 16, eps: float = DEFAULTS.eps) -> dict:
    r"""How well the EMA mean after step t predicts the next ``horizon`` queries of a stream ``q (T, d)``.

    Returns ``jitter`` (mean step-to-step change :math:`\lVert\mu_t-\mu_{t-1}\rVert`, the noise) and
    ``lag_error`` (mean :math:`\lVert\mu_t-\bar q_{t+1..t+h}\rVert`, the tracking error against the
    mean of the queries that are yet to come), both relative to the mean query norm.
    """
    horizon = _checks.nonneg_int("horizon", horizon)
    _checks.tensor("q", q, min_dim=2)
    T = q.shape[-2]
    if horizon < 1 or T <= horizon + 1:
        raise ValueError(f"`horizon` must be >= 1 and < T - 1 = {T - 1}, got {horizon}")
    q = q.float()
    mu, _ = ema_trace(q, beta, eps)
    scale = q.norm(dim=-1).mean()
    future = torch.stack([q[t + 1: t + 1 + horizon].mean(0) for t in range(T - horizon)])
    lag = (mu[: T - horizon] - future).norm(dim=-1).mean() / scale
    jitter = (mu[1:] - mu[:-1]).norm(dim=-1).mean() / scale
    return {"beta": float(beta), "jitter": float(jitter), "lag_error": float(lag)}
