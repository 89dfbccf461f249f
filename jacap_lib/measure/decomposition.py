r"""Error decomposition of Jacap on real attention heads (reading note §15, §13.3, §19.1).

The note splits the gap between "what eviction should preserve" and "what Algorithm 1 keeps" into

.. math::  E_{total} \le E_{Taylor} + E_{diagonal} + E_{selection},

and this module measures each term on heads of a real model:

* **E_Taylor** (:func:`taylor_error`) — for a retained set C, the true change of the retained
  attention output :math:`f_C(q)-f_C(\mu)` against its tangent :math:`J_C\,\delta q`, for the
  actual later queries of a text.
* **E_diagonal** (:func:`diagonal_capacities`) — the Jacobian capacity with the full
  :math:`S=\mathrm{Diag}(\alpha)-\alpha\alpha^\top` and full :math:`K\Lambda K^\top` against the
  diagonal approximation behind Algorithm 1's weight :math:`w_i`, and how the two rank subsets.
* **E_selection** (:func:`selection_gap`) — one-shot top-B vs greedy vs exhaustive subsets on
  small caches sampled from a real head.
* **Deletion vs sensitivity** (:func:`loo_damage`) — the counterfactual damage of deleting one
  token, :math:`\lVert f_C(q)-f_{C\setminus\{i\}}(q)\rVert`, against the local sensitivity
  :math:`\rho_i, w_i` that Algorithm 1 scores with.
* :func:`rank_one_corrected_scores` — Algorithm 1 with the *exact* softmax Jacobian
  :math:`S` (kept diagonal only in :math:`K\Lambda K^\top`), in :math:`O(N d\,d_{out})`.

Conventions follow :mod:`jacap_lib.theory`: ``K (n, d)`` keys, ``U (d_out, n)`` output directions,
``mu (d,)``. Queries and keys of a captured head are **post-RoPE**, so ``q·k`` is exactly the
model's attention logit (RoPE makes it depend only on the relative position).

``jacap decompose`` (:mod:`jacap_lib.experiments.decomposition`) regenerates ``data/decomposition/*.json``.
"""
from __future__ import annotations

import math

import torch

from .. import _checks
from .. import theory as T
from ..config import DEFAULTS
from ..hf import HeadCapture, capture_heads, head_tensors, reduce_out_proj  # noqa: F401 (re-exported)
from ..scoring import jacap_scores, rank_one_corrected_scores  # noqa: F401 (re-exported)
from ..scoring import tempered_centre

__all__ = [
    "HeadCapture",
    "capture_heads",
    "head_tensors",
    "reduce_out_proj",
    "taylor_error",
    "taylor_error_records",
    "diagonal_capacity",
    "rank_one_capacity",
    "diagonal_capacities",
    "diagonal_records",
    "selection_gap",
    "selection_records",
    "loo_damage",
    "loo_records",
    "rank_one_corrected_scores",
    "DEFAULT_TEXT",
]

# A self-written expository text (prose, then technical documentation, then code) used by the CLI.
DEFAULT_TEXT = (
    "The lighthouse on the northern cape was built in 1872 by a family of stonemasons who had never "
    "seen the sea before they arrived. They quarried granite from the hill behind the village, hauled "
    "it down on sledges in winter when the ground was frozen, and laid each course by hand. The keeper "
    "who lived there for the longest time, a woman named Ilse Brandt, kept a logbook of every ship she "
    "saw pass. Her entries are short: the date, the wind, the name of the vessel if she could read it, "
    "and sometimes a line about the weather or the birds. Over forty years the logbook grew to eleven "
    "volumes. Historians later used it to reconstruct the shipping routes of the region, because the "
    "official harbour records had been lost in a fire.\n\n"
    "Configuration reference. The cache manager reads its settings from a YAML file. The key "
    "`max_tokens` sets the number of entries kept per layer; when the cache grows past it, the "
    "eviction policy runs and removes the lowest-scoring entries. The key `protect_prefix` gives the "
    "number of leading tokens that are never evicted, which keeps the system prompt intact. The key "
    "`window` protects the most recent tokens. Scores are recomputed every `interval` decoding steps; "
    "setting it to 1 recomputes them at every step, which is accurate but slow. All sizes are counted "
    "in tokens, not bytes.\n\n"
    "```python\n"
    "def evict(cache, scores, budget, protect_prefix=4, window=16):\n"
    "    n = scores.shape[-1]\n"
    "    if budget >= n:\n"
    "        return cache\n"
    "    keep = torch.zeros(n, dtype=torch.bool)\n"
    "    keep[:protect_prefix] = True\n"
    "    keep[n - window:] = True\n"
    "    rest = budget - int(keep.sum())\n"
    "    order = scores.masked_fill(keep, float('-inf')).argsort(descending=True)\n"
    "    keep[order[:rest]] = True\n"
    "    return cache[..., keep, :]\n"
    "```\n\n"
    "After the lighthouse was automated in 1961, the logbooks were moved to the county archive. A "
    "volunteer transcribed them over three winters, and the transcription is now searchable. The most "
    "frequent entry is a single word, 'fog', which appears on more than two thousand days. The rarest "
    "is a note from March 1899 describing a ship with red sails that did not answer any signal and "
    "was never seen again."
)


def _quantiles(x: torch.Tensor, qs=(0.1, 0.25, 0.5, 0.75, 0.9)) -> dict:
    x = x.double().flatten()
    x = x[torch.isfinite(x)]
    if x.numel() == 0:
        return {f"q{int(q * 100)}": float("nan") for q in qs} | {"mean": float("nan")}
    out = {f"q{int(q * 100)}": float(torch.quantile(x, q)) for q in qs}
    out["mean"] = float(x.mean())
    return out


# ----------------------------------------------------------------------------- E_Taylor
def taylor_error(K: torch.Tensor, U: torch.Tensor, mu: torch.Tensor, queries: torch.Tensor) -> dict:
    r"""First-order (tangent-plane) error of the retained attention for actual queries.

    For each query :math:`q_t` (rows of ``queries (T, d)``), with :math:`\delta q=q_t-\mu`:
    ``true_change`` :math:`=\lVert f_C(q)-f_C(\mu)\rVert`, ``linear_change``
    :math:`=\lVert J_C\delta q\rVert`, and ``rel_error``
    :math:`=\lVert f_C(q)-f_C(\mu)-J_C\delta q\rVert / \lVert f_C(q)-f_C(\mu)\rVert`.
    All ``(T,)``; ``dq_norm`` is :math:`\lVert\delta q\rVert`.
    """
    T._check_KU(K, U, mu)
    _checks.tensor("queries", queries, min_dim=2)
    if queries.shape[-1] != K.shape[-1]:
        raise ValueError(f"`queries` must be (T, d) with d = {K.shape[-1]}; got {tuple(queries.shape)}")
    f_mu = T.attention(K, U, mu)
    J = T.attention_jacobian(K, U, mu)
    dq = queries - mu
    true = T.attention(K, U, queries) - f_mu
    lin = dq @ J.T
    resid = (true - lin).norm(dim=-1)
    tn = true.norm(dim=-1)
    return dict(rel_error=resid / tn.clamp_min(1e-300), true_change=tn, linear_change=lin.norm(dim=-1),
                residual=resid, dq_norm=dq.norm(dim=-1))


def _retained(K, V, U, mu, lam, budget, tau, noise, n_sink):
    """Algorithm 1's retained set for one head (float64 scores, ``select_keep`` protections)."""
    from ..selection import select_keep

    s = jacap_scores(K.float(), (U.T).float(), mu.float(), lam.float(), tau=tau, noise=noise)
    return select_keep(s.score, budget, n_sink=n_sink)


# ----------------------------------------------------------------------------- E_diagonal
def diagonal_capacity(K, U, mu, lam, *, tau: float = 1.0, noise: float = 1.0, alpha=None) -> torch.Tensor:
    r"""Capacity implied by Algorithm 1's diagonal weights on the set (K, U):
    :math:`\tfrac12\log\det(I + \sigma^{-2}\sum_i w_i u_i u_i^\top)`, :math:`w_i=\rho_i^2\kappa_i/d`.

    ``alpha`` defaults to :math:`\mathrm{softmax}(K\mu/(\tau\sqrt d))` over this set (``tau=1`` is the
    model's own softmax, so the only approximation left is the diagonalisation); pass the
    full-pool :math:`\bar\alpha` restricted to the set to get Algorithm 1's exact weights.
    Batched over leading dims of K/U."""
    T._check_KU(K, U, mu)
    d = K.shape[-1]
    if alpha is None:
        alpha = tempered_centre(K, mu, tau)
    Lam = T._as_cov(lam, d).to(K.dtype)
    kappa = torch.einsum("...id,...de,...ie->...i", K, Lam, K)
    w = (alpha * (1 - alpha)).square() * kappa / d
    G = (U * w.unsqueeze(-2)) @ U.transpose(-1, -2)
    return T._noise_logdet_gain(G, noise)


def rank_one_capacity(K, U, mu, lam, *, noise: float = 1.0) -> torch.Tensor:
    r"""Capacity with the exact :math:`S` but diagonal :math:`K\Lambda K^\top`:
    :math:`\tfrac12\log\det(I+\sigma^{-2}\tfrac1d\sum_i\kappa_i\alpha_i^2(u_i-\bar u)(u_i-\bar u)^\top)`."""
    T._check_KU(K, U, mu)
    d = K.shape[-1]
    alpha = tempered_centre(K, mu, 1.0)
    kappa = torch.einsum("...id,...de,...ie->...i", K, T._as_cov(lam, d).to(K.dtype), K)
    ubar = (U @ alpha.unsqueeze(-1))
    Uc = U - ubar
    G = (Uc * (alpha.square() * kappa / d).unsqueeze(-2)) @ Uc.transpose(-1, -2)
    return T._noise_logdet_gain(G, noise)


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a.double().numpy(), b.double().numpy()).statistic)


def diagonal_capacities(K, U, mu, lam, *, budget: int, n_subsets: int = 64, tau: float = DEFAULTS.tau,
                        noise: float = 1.0, generator=None) -> dict:
    r"""E_diagonal for one head: capacities of ``n_subsets`` random subsets of size ``budget``.

    For each subset C returns ``full`` (exact :math:`S_C`, full :math:`K\Lambda K^\top`, via
    :func:`jacap_lib.theory.jacobian_capacity`), ``rank_one`` (exact S, diagonal
    :math:`K\Lambda K^\top`), ``diag`` (both diagonal, softmax re-normalised on C) and ``alg1``
    (Algorithm 1's weights: full-pool :math:`\bar\alpha` at temperature ``tau``), each ``(n_subsets,)``,
    plus Spearman rank correlations of each approximation with ``full`` across subsets.
    """
    n = K.shape[0]
    budget = _checks.nonneg_int("budget", budget)
    if not 2 <= budget <= n:
        raise ValueError(f"`budget` must be in [2, n={n}]; got {budget}")
    d = K.shape[-1]
    g = generator or torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(n, generator=g)[:budget].sort().values for _ in range(n_subsets)])
    Ks, Us = K[idx], U[:, idx].permute(1, 0, 2)
    pool_alpha = tempered_centre(K, mu, tau)
    full = T.jacobian_capacity(Ks, Us, mu, lam, noise)
    out = dict(
        full=full,
        rank_one=rank_one_capacity(Ks, Us, mu, lam, noise=noise),
        diag=diagonal_capacity(Ks, Us, mu, lam, tau=1.0, noise=noise),
        alg1=diagonal_capacity(Ks, Us, mu, lam, noise=noise, alpha=pool_alpha[idx]),
        subsets=idx,
    )
    for k in ("rank_one", "diag", "alg1"):
        out[f"spearman_{k}"] = _spearman(full, out[k])
    return out


# ----------------------------------------------------------------------------- E_selection
def selection_gap(K, U, mu, lam, *, budget: int, tau: float = DEFAULTS.tau, noise: float = DEFAULTS.noise) -> dict:
    """E_selection for one small cache: capacities of one-shot (Algorithm 1 at ``tau``), greedy and
    exhaustive subsets (:mod:`jacap_lib.theory`) and their ratios to the exhaustive optimum."""
    one = T.select_one_shot(K, U, mu, lam, budget, tau=tau, noise=noise)
    greedy = T.select_greedy(K, U, mu, lam, budget, noise=noise)
    best = T.select_exhaustive(K, U, mu, lam, budget, noise=noise)
    opt = best.capacity
    ratio = (lambda c: c / opt if opt > 0 else float("nan"))
    return dict(one_shot=one.capacity, greedy=greedy.capacity, exhaustive=opt,
                ratio_one_shot=ratio(one.capacity), ratio_greedy=ratio(greedy.capacity),
                one_shot_indices=one.indices.tolist(), greedy_indices=greedy.indices.tolist(),
                exhaustive_indices=best.indices.tolist())


# ----------------------------------------------------------------------------- deletion damage vs sensitivity
def loo_damage(K: torch.Tensor, U: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    r"""Leave-one-out damage :math:`\lVert f_C(q)-f_{C\setminus\{i\}}(q)\rVert` for every token i and query.

    Closed form (no re-computation): deleting i re-normalises the others by :math:`1/(1-\alpha_i)`, so
    :math:`f_C - f_{C\setminus i} = \tfrac{\alpha_i}{1-\alpha_i}(u_i - f_C)`. Returns ``(T, n)``.
    """
    T._check_KU(K, U)
    _checks.tensor("queries", queries, min_dim=1)
    if K.shape[-2] < 2:
        raise ValueError("`K` must hold at least 2 tokens: deleting the only token leaves no attention")
    q = queries if queries.dim() == 2 else queries.unsqueeze(0)
    alpha = torch.softmax(q @ K.T / math.sqrt(K.shape[-1]), dim=-1)  # (T, n)
    f = alpha @ U.T  # (T, d_out)
    dist = (U.T.unsqueeze(0) - f.unsqueeze(1)).norm(dim=-1)  # (T, n)
    return alpha / (1 - alpha).clamp_min(torch.finfo(alpha.dtype).tiny) * dist


# ----------------------------------------------------------------------------- tidy per-head records
def _iter_heads(caps: dict, heads=None):
    for layer, cap in sorted(caps.items()):
        for h in (range(cap.n_heads) if heads is None else heads):
            yield layer, h, cap


def taylor_error_records(caps: dict, *, prefix: int, ratio: float = 0.75, tau: float = DEFAULTS.tau,
                         noise: float = DEFAULTS.noise, n_sink: int = DEFAULTS.n_sink, heads=None) -> list[dict]:
    r"""E_Taylor per (layer, head): Algorithm 1 keeps :math:`B=(1-c)N` of the first ``prefix`` tokens
    (statistics = flat mean/variance of the later queries, i.e. an oracle for the future), then
    the tangent-plane error is measured on those later queries. One record per head with quantiles
    of ``rel_error`` over the queries."""
    from ..stats import flat_query_stats

    recs = []
    for layer, h, cap in _iter_heads(caps, heads):
        t = head_tensors(cap, h, prefix=prefix)
        mu, lam = (x.to(t["K"].dtype) for x in flat_query_stats(t["Q_future"]))
        budget = max(2, round((1 - ratio) * prefix))
        keep = _retained(t["K"], t["V"], t["U"], mu, lam, budget, tau, noise, n_sink)
        e = taylor_error(t["K"][keep], t["U"][:, keep], mu, t["Q_future"])
        recs.append(dict(layer=layer, head=h, budget=budget, n_queries=int(e["rel_error"].numel()),
                         rel_error=_quantiles(e["rel_error"]),
                         dq_over_mu=float((e["dq_norm"] / mu.norm()).mean()),
                         true_change=float(e["true_change"].mean())))
    return recs


def diagonal_records(caps: dict, *, prefix: int, pool: int = 64, budget: int = 16, n_subsets: int = 64,
                     tau: float = DEFAULTS.tau, noise: float = DEFAULTS.noise, seed: int = 0, heads=None) -> list[dict]:
    """E_diagonal per (layer, head) on a random pool of ``pool`` cached tokens: relative capacity
    errors of each approximation, ``(approx - full) / full``, and rank correlations across subsets."""
    from ..stats import flat_query_stats

    recs = []
    g = torch.Generator().manual_seed(seed)
    for layer, h, cap in _iter_heads(caps, heads):
        t = head_tensors(cap, h, prefix=prefix)
        mu, lam = (x.to(t["K"].dtype) for x in flat_query_stats(t["Q_future"]))
        sel = torch.randperm(prefix, generator=g)[:pool].sort().values
        r = diagonal_capacities(t["K"][sel], t["U"][:, sel], mu, lam, budget=budget, n_subsets=n_subsets,
                                tau=tau, noise=noise, generator=g)
        full = r["full"]
        rec = dict(layer=layer, head=h, full_capacity=_quantiles(full))
        for k in ("rank_one", "diag", "alg1"):
            rec[f"rel_error_{k}"] = _quantiles((r[k] - full) / full)
            rec[f"spearman_{k}"] = r[f"spearman_{k}"]
        recs.append(rec)
    return recs


def selection_records(caps: dict, *, prefix: int, n: int = 16, budget: int = 4, n_caches: int = 2,
                      tau: float = DEFAULTS.tau, noise: float = DEFAULTS.noise, seed: int = 0, heads=None) -> list[dict]:
    """E_selection per (layer, head, cache): ``n_caches`` small caches of ``n`` tokens sampled from
    the head's prefix; one-shot/greedy/exhaustive capacities and ratios."""
    from ..stats import flat_query_stats

    if n > 20:
        raise ValueError(f"`n` must be <= 20 for exhaustive search; got {n}")
    recs = []
    g = torch.Generator().manual_seed(seed)
    for layer, h, cap in _iter_heads(caps, heads):
        t = head_tensors(cap, h, prefix=prefix)
        mu, lam = (x.to(t["K"].dtype) for x in flat_query_stats(t["Q_future"]))
        for c in range(n_caches):
            sel = torch.randperm(prefix, generator=g)[:n].sort().values
            r = selection_gap(t["K"][sel], t["U"][:, sel], mu, lam, budget=budget, tau=tau, noise=noise)
            recs.append(dict(layer=layer, head=h, cache=c, n=n, budget=budget,
                             positions=sel.tolist(), **r))
    return recs


def loo_records(caps: dict, *, prefix: int, heads=None, tau_values=(1.0, 10.0), keep_top: int | None = 16,
                n_random: int = 24, saturated: float = 0.5, seed: int = 0) -> list[dict]:
    """Deletion damage vs Jacobian sensitivity per (layer, head, token) over the prefix.

    To keep the records small, each head contributes its saturated tokens (ᾱ ≥ ``saturated`` at
    the first temperature), its ``keep_top`` most damaging deletions and ``n_random`` other tokens
    drawn with ``seed`` (``keep_top=None`` = every token).

    ``damage`` is the mean over the later queries of the leave-one-out damage (:func:`loo_damage`)
    divided by the mean full-attention output norm (so heads are comparable); ``alpha_bar``,
    ``rho`` and ``weight`` come from Algorithm 1 (flat statistics of the later queries) at each
    temperature in ``tau_values`` (suffix ``_tau{τ:g}``). ``*_pct`` fields are the token's percentile
    (0..1) among *all* tokens of its head, computed before any subsampling."""
    from ..stats import flat_query_stats

    recs = []
    for layer, h, cap in _iter_heads(caps, heads):
        t = head_tensors(cap, h, prefix=prefix)
        mu, lam = (x.to(t["K"].dtype) for x in flat_query_stats(t["Q_future"]))
        dmg = loo_damage(t["K"], t["U"], t["Q_future"])  # (T, n)
        alpha_q = torch.softmax(t["Q_future"] @ t["K"].T / math.sqrt(t["K"].shape[-1]), dim=-1)
        scale = (alpha_q @ t["U"].T).norm(dim=-1).mean()
        dmg = (dmg.mean(0) / scale)
        per_tau = {}
        for tau in tau_values:
            s = jacap_scores(t["K"], t["U"].T, mu, lam, tau=tau)
            per_tau[tau] = s
        n = t["K"].shape[0]
        if keep_top is None:
            chosen = range(n)
        else:
            a0 = per_tau[tau_values[0]].alpha
            base = set((a0 >= saturated).nonzero().flatten().tolist()) | set(dmg.topk(min(keep_top, n)).indices.tolist())
            g = torch.Generator().manual_seed(seed + 1000 * layer + h)
            others = [i for i in torch.randperm(n, generator=g).tolist() if i not in base][:n_random]
            chosen = sorted(base | set(others))
        pct = lambda x: (x.argsort().argsort().double() + 0.5) / n  # percentile among all n tokens
        dmg_pct = pct(dmg)
        pcts = {tau: (pct(s.rho.double()), pct(s.score.double())) for tau, s in per_tau.items()}
        for i in chosen:
            rec = dict(layer=layer, head=h, position=i, damage=float(dmg[i]), damage_pct=float(dmg_pct[i]),
                       attention=float(alpha_q[:, i].mean()))
            for tau, s in per_tau.items():
                rec[f"rho_pct_tau{tau:g}"] = float(pcts[tau][0][i])
                rec[f"score_pct_tau{tau:g}"] = float(pcts[tau][1][i])
                rec[f"alpha_bar_tau{tau:g}"] = float(s.alpha[i])
                rec[f"rho_tau{tau:g}"] = float(s.rho[i])
                rec[f"weight_tau{tau:g}"] = float(s.weight[i])
                rec[f"score_tau{tau:g}"] = float(s.score[i])
            recs.append(rec)
    return recs
