"""Figures of the mechanism diagnostics (:mod:`jacap_lib.measure.diagnostics`): where saturation and leverage act.

Each function takes the records of :func:`jacap_lib.results.diagnostics.load_mechanisms` (or of
:func:`~jacap_lib.measure.diagnostics.model_mechanisms`) and returns a ``go.Figure``.
"""
from __future__ import annotations

import statistics

import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["mechanism_figure", "query_stats_figure"]

_PANELS = (("deff", "effective dimension Σ r_i", "log"), ("a_minus_i", "‖A − I‖₂", "log"),
           ("overlap", "kept-set overlap with top w‖u‖²", "linear"), ("n_saturated", "tokens with ᾱ > ½", "linear"))
_DASH = {1.0: "dot", 3.0: "dash", 10.0: "solid"}
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


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
    for i, (key, title, axis) in enumerate(_PANELS):
        row, col = divmod(i, 2)
        for ci, rule in enumerate(rules):
            for tau in taus:
                y = [statistics.median(r[key] for r in groups[(rule, tau, L)]) for L in layers]
                if axis == "log":
                    y = [max(v, 1e-12) for v in y]
                name = f"σ² {rule}, τ={tau:g}"
                fig.add_trace(go.Scatter(x=layers, y=y, mode="lines", name=name, legendgroup=name,
                                         showlegend=i == 0,
                                         line={"color": _COLOURS[ci % len(_COLOURS)], "dash": _DASH.get(tau, "solid")},
                                         hovertemplate=name + "<br>layer %{x}<br>%{y:.3g}<extra></extra>"),
                              row=row + 1, col=col + 1)
        fig.update_yaxes(type=axis, row=row + 1, col=col + 1)
        fig.update_xaxes(title_text="layer", row=row + 1, col=col + 1)
    fig.update_yaxes(range=[0, 1.02], row=2, col=1)
    fig.update_layout(height=640, title=f"Where Algorithm 1's mechanisms act (c = {ratio}; median over segments "
                                        "and KV heads)", legend={"font": {"size": 10}})
    return fig


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
    fig.update_layout(height=380, title="How well prompt statistics predict the next queries (median over segments, KV heads)")
    return fig
