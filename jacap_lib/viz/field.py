"""The field on the tune documents: every method's tune choice by its geometric-mean KL ratio to the default.

:func:`tune_ratio_figure` draws :func:`jacap_lib.results.candidates.score_table`: one horizontal bar per method (its
colour and marker from :data:`jacap_lib.viz.style.METHOD_STYLES`), on a log axis, best at the top, with the methods
whose tune is unfinished named under the plot.
"""
from __future__ import annotations

import plotly.graph_objects as go

from .style import finish

__all__ = ["tune_ratio_figure"]


def tune_ratio_figure(table: list[dict], *, pending=(), title: str | None = None) -> go.Figure:
    """Bars of ``kl_ratio`` per method of ``table`` (rows of :func:`~jacap_lib.results.candidates.score_table`);
    ``pending``: methods without a tune choice yet, named in a note."""
    if not table:
        raise ValueError("table must hold at least one method (rows of results.candidates.score_table)")
    rows = sorted(table, key=lambda r: r["kl_ratio"], reverse=True)  # plotly draws the first bar at the bottom
    fig = go.Figure()
    for r in rows:
        fig.add_trace(go.Bar(x=[r["kl_ratio"]], y=[r["setting"]], orientation="h", name=r["setting"],
                             legendgroup=r["method"], showlegend=False,
                             hovertemplate=f"{r['setting']}<br>KL ratio to the default %{{x:.3g}}<extra></extra>"))
    fig.add_vline(x=1, line={"color": "#444444", "dash": "dot"})
    note = f"not tuned yet: {', '.join(pending)}" if pending else None
    fig.update_layout(title=title or "Each method's tune choice: geometric-mean KL ratio to the default (tune documents)",
                      xaxis={"title": "KL ratio to the default (log; below 1 = closer to the full cache)", "type": "log"},
                      yaxis={"automargin": True}, height=120 + 26 * len(rows), bargap=0.25,
                      margin={"l": 10, "r": 10, "b": 70 if note else 50})
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=-0.12 - 2.0 / (len(rows) + 4),
                           showarrow=False, xanchor="left", yanchor="top", font={"size": 11})
    return finish(fig)
