"""Figures of the mechanism diagnostics (:mod:`jacap_lib.measure.diagnostics`): where saturation and leverage act.

Each function takes the records of :func:`jacap_lib.results.loaders.load_mechanisms` (or of
:func:`~jacap_lib.measure.diagnostics.model_mechanisms`) and returns a ``go.Figure``.
"""
from __future__ import annotations

import statistics

import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..config import PAPER
from jacap_lib.experiments.diagnostics import defaults_summary  # the statistic lives with its data
from .style import finish, setting_colours

__all__ = ["mechanism_figure", "query_stats_figure"]

_PANELS = (("deff", "effective dimension Σ r_i", "log", "Σ r_i"), ("a_minus_i", "‖A − I‖₂", "log", "‖A − I‖₂"),
           ("overlap", "kept-set overlap with top w‖u‖²", "linear", "overlap"),
           ("n_saturated", "tokens with ᾱ > ½", "linear", "tokens"))
_DASH = {1.0: "dot", 3.0: "dash", 10.0: "solid"}
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def _rule_tau_colours(rules, taus) -> dict:
    """``{(rule, tau): colour}``, one colour per legend entry: a colour per noise rule (``setting_colours``), lighter
    for smaller tau (mixed with white: none at the largest tau, 60 % at the smallest), so no two entries share one."""
    base = setting_colours(list(rules))
    out = {}
    for rule in rules:
        rgb = plotly.colors.hex_to_rgb(base[rule])
        for k, tau in enumerate(taus):
            mix = 0.6 * (len(taus) - 1 - k) / max(len(taus) - 1, 1)
            out[(rule, tau)] = plotly.colors.label_rgb(
                plotly.colors.find_intermediate_color(rgb, (255, 255, 255), mix, colortype="tuple"))
    return out


def mechanism_figure(records: list[dict], *, ratio: float = 0.9) -> go.Figure:
    """Four panels against the layer (median over segments and KV heads), one line per (noise rule, tau).

    Log axes for the effective dimension and ``||A - I||_2`` (they span decades). Reading: the
    leverage can only change the kept set where the effective dimension is not far below 1 and the
    overlap drops below 1; saturation can only act where some token has alpha > 1/2.
    """
    recs = [r for r in records if r["ratio"] == ratio]
    if not recs:
        raise ValueError(f"no records at ratio {ratio}; available: {sorted({r['ratio'] for r in records})}")
    rules = sorted({r["rule"] for r in recs})
    taus = sorted({r["tau"] for r in recs})
    layers = sorted({r["layer"] for r in recs})
    fig = make_subplots(rows=2, cols=2, subplot_titles=[p[1] for p in _PANELS], horizontal_spacing=0.1,
                        vertical_spacing=0.14)
    groups: dict = {}
    for r in recs:
        groups.setdefault((r["rule"], r["tau"], r["layer"]), []).append(r)
    colours = _rule_tau_colours(rules, taus)
    for i, (key, title, axis, short) in enumerate(_PANELS):
        row, col = divmod(i, 2)
        for rule in rules:
            for tau in taus:
                y = [statistics.median(r[key] for r in groups[(rule, tau, L)]) for L in layers]
                if axis == "log":
                    y = [max(v, 1e-12) for v in y]
                name = f"σ² {rule}, τ={tau:g}"
                fig.add_trace(go.Scatter(x=layers, y=y, mode="lines", name=name, legendgroup=name,
                                         showlegend=i == 0,
                                         line={"color": colours[(rule, tau)], "dash": _DASH.get(tau, "solid")},
                                         hovertemplate=name + "<br>layer %{x}<br>%{y:.3g}<extra></extra>"),
                              row=row + 1, col=col + 1)
        fig.update_yaxes(type=axis, title_text=short, row=row + 1, col=col + 1)
        fig.update_xaxes(title_text="layer", row=row + 1, col=col + 1)
    fig.update_yaxes(range=[0, 1.02], row=2, col=1)
    fig.update_layout(height=640, title=f"Where Algorithm 1's mechanisms act (c = {ratio}; median over segments "
                                        "and KV heads)", legend={"font": {"size": 10}})
    return finish(fig)


def query_stats_figure(records: list[dict]) -> go.Figure:
    """Relative error of the prompt estimators' mean and variance against the continuation's queries, per layer."""
    ests = list(dict.fromkeys(r["estimator"] for r in records))
    layers = sorted({r["layer"] for r in records})
    fig = make_subplots(rows=1, cols=2, subplot_titles=["‖μ̂ − μ_next‖ / ‖μ_next‖", "‖λ̂ − λ_next‖ / ‖λ_next‖"])
    groups: dict = {}
    for r in records:
        groups.setdefault((r["estimator"], r["layer"]), []).append(r)
    for j, key in enumerate(("mu_err", "lam_err"), start=1):
        for i, e in enumerate(ests):
            y = [statistics.median(r[key] for r in groups[(e, L)]) for L in layers]
            fig.add_trace(go.Scatter(x=layers, y=y, mode="lines", name=e, legendgroup=e, showlegend=j == 1,
                                     line={"color": _COLOURS[i % len(_COLOURS)] if i < 5 else "#7f7f7f"},
                                     hovertemplate=e + "<br>layer %{x}<br>%{y:.3f}<extra></extra>"), row=1, col=j)
        fig.update_xaxes(title_text="layer", row=1, col=j)
        fig.update_yaxes(title_text="relative error", row=1, col=j)
    fig.update_layout(height=380, title="How well prompt statistics predict the next queries (median over segments, KV heads)")
    return finish(fig)


_NOTES = {
    "saturation": ("On a real model, with the paper's defaults",
                   "At τ = {tau:g} the centre softmax ᾱ over a {n_tokens}-token prompt of the bundled SmolLM2-135M "
                   "puts more than ½ on some token in {sat} of {n_heads} cases ({n_segments} segments × {n_layers} "
                   "layers × {n_kv_heads} KV heads), so the saturation side of ρ = ᾱ(1 − ᾱ) is never reached and "
                   "ρ ≈ ᾱ; at τ = 1 it is reached in {sat1} of them. (data/diagnostics/mechanisms.json)"),
    "capacity": ("On a real model, with the paper's defaults",
                 "Algorithm 1 scores at a centre ᾱ, the softmax of the keys against the mean query at a temperature τ; "
                 "each token's value direction uᵢ gets a weight wᵢ, and G = Σᵢ wᵢ uᵢuᵢᵀ is their weighted Gram, with "
                 "eigenvalues λₖ. The effective dimension Σₖ λₖ/(λₖ + σ²) counts the output directions G fills. "
                 "With σ² = 1 and τ = {tau:g}, it has on the bundled SmolLM2-135M a median {deff:.3g} over {n_heads} cases ({n_segments} segments × "
                 "{n_layers} layers × {n_kv_heads} KV heads) — far below its head dimension {head_dim} — so "
                 "log det(I + G/σ²) ≈ tr(G)/σ²: the capacity is, to first order, a sum of per-token terms. "
                 "A noise σ² chosen per head so that the effective dimension is ½·min(B, d) restores the "
                 "log-det's diminishing returns. (data/diagnostics/mechanisms.json)"),
    "leverage": ("On a real model, with the paper's defaults",
                 "With σ² = 1 and τ = {tau:g}, ‖A − I‖₂ has median {a_minus_i:.2g} on the bundled SmolLM2-135M, so "
                 "uᵢᵀA⁻¹uᵢ ≈ ‖uᵢ‖² and the leverage discounts almost nothing: at c = {ratio:g} ({budget} of "
                 "{n_tokens} tokens kept) the kept set shares a median {overlap:.0%} of its tokens with the plain "
                 "w‖u‖² ranking (lowest {overlap_min:.0%}). With σ² chosen per head so that the effective dimension "
                 "Σᵢ rᵢ (the scores' sum: how many output directions the tokens fill) is ½·min(B, d), "
                 "the median overlap falls to {overlap_deff:.0%}. (data/diagnostics/mechanisms.json)"),
}


def defaults_note(topic: str, rows: list[dict] | None = None, *, head_dim: int | None = None):
    """A note (HTML admonition) for the theory chapters: what the paper's defaults do on the bundled model,
    with the numbers read from ``data/diagnostics/mechanisms.json``. ``topic``: ``"saturation"``,
    ``"capacity"`` or ``"leverage"``; ``rows``/``head_dim`` default to that file's rows and model.
    The chapter that measures these (label ``critique``) is for the calling page to point to."""
    from IPython.display import HTML

    if topic not in _NOTES:
        raise ValueError(f"`topic` must be one of {sorted(_NOTES)}, got {topic!r}")
    if rows is None:
        from jacap_lib.results.loaders import load_mechanisms

        config, rows = load_mechanisms()
        head_dim = head_dim or config["model"]["head_dim"]
    ratio = 0.9
    d = defaults_summary(rows, ratio=ratio)
    d1 = defaults_summary(rows, tau=1.0, ratio=ratio)
    deff = defaults_summary(rows, rule="deff=0.5", ratio=ratio)
    title, text = _NOTES[topic]
    body = text.format(tau=PAPER.tau, ratio=ratio, sat=d["heads_saturated"], sat1=d1["heads_saturated"],
                       overlap_deff=deff["overlap"], head_dim=head_dim or "d", **d)
    return HTML(f'<div class="admonition note"><p class="admonition-title">{title}</p><p>{body}</p></div>')


def noise_rule_example(targets=(0.25, 1.0, 1.5)):
    """The note's 2-D example (u1 = (1, 0), u2 = (0.95, 0.05), u3 = (0, 1); w = (1, 1, 0.7)) under the
    effective-dimension rule: per target d_eff, the solved sigma^2, the three scores r_i and their sum.
    Returns a :class:`pandas.DataFrame` (one row per target, plus the paper's sigma^2 = 1)."""
    import pandas as pd
    import torch

    from ..examples import NOTE_U, NOTE_W
    from ..scoring import deff_noise, effective_dimension, leverage

    U = torch.tensor(NOTE_U, dtype=torch.float64)
    w = torch.tensor(NOTE_W, dtype=torch.float64)
    ev = torch.linalg.eigvalsh((U * w[:, None]).T @ U)
    rows = []
    for label, s2 in [("sigma^2 = 1 (paper)", 1.0)] + [(f"d_eff = {t:g}", float(deff_noise(ev, t))) for t in targets]:
        r = w / s2 * leverage(U, w, s2)
        rows.append({"rule": label, "sigma^2": round(s2, 4), "d_eff": round(float(effective_dimension(ev, s2)), 4),
                     "r1": round(float(r[0]), 4), "r2 (≈ u1)": round(float(r[1]), 4),
                     "r3 (⊥ u1)": round(float(r[2]), 4), "keeps (B = 2)": str(sorted((r.topk(2).indices + 1).tolist()))})
    return pd.DataFrame(rows).set_index("rule")
