"""Tables and figures of the one-knob ablations (``data/results/eval/ablation_summary.json``, written by
``jacap evaluate ablate-summary``, :func:`jacap_lib.experiments.ablation.summarize_ablation`).

:func:`ablation_frame`: one table per compression ratio, a row per ablation, a column per prompt length, each cell
the geometric-mean KL ratio (ablation / its base) with its simultaneous interval, compact enough for the text
column. :func:`layer_figure`: per ablation and layer, the ratio of attention-output errors (pooled over the cells).
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from jacap_lib.verdicts.precision import interval_text
from .style import finish, wrapped

__all__ = ["ablation_frame", "layer_figure"]

_MARK = {"better": "▼", "worse": "▲"}  # the interval wholly below / above 1; nothing when it holds 1


def _cell(r: dict) -> str:
    """``0.93 [0.85, 1.02]`` at the precision the interval supports (:func:`~jacap_lib.verdicts.precision.interval_text`),
    with ▼ / ▲ when the (simultaneous) interval excludes 1."""
    mark = next((m for word, m in _MARK.items() if r["verdict"].startswith(word)), "")
    return interval_text(r["gm_ratio"], r["gm_low"], r["gm_high"]) + (f" {mark}" if mark else "")


def ablation_frame(summary: dict) -> dict[float, pd.DataFrame]:
    """``{compression ratio: table}``: per ablation (rows, its short label) and prompt length (columns ``prompt …``)
    the geometric-mean KL ratio to its base with the simultaneous interval (``summary["confidence"]``);
    ▼: the ablation lowers the KL (interval below 1), ▲: raises it. Empty where a cell was not judged."""
    ratios = sorted({r["ratio"] for a in summary["ablations"] for r in a["rows"]})
    out = {}
    for c in ratios:
        table = {a["label"]: {f"prompt {r['length']}": _cell(r) for r in a["rows"] if r["ratio"] == c}
                 for a in summary["ablations"] if a["rows"]}
        frame = pd.DataFrame.from_dict(table, orient="index").fillna("")
        frame = frame[sorted(frame.columns, key=lambda k: int(k.split()[1]))]
        frame.index.name = f"c = {c:g}"  # the level, summary["confidence"], belongs in the caption
        out[c] = wrapped(frame, [frame.index.name])  # long ablation labels wrap
    return out


def layer_figure(summary: dict, *, cell: str = "all") -> go.Figure:
    """Per ablation (rows) and layer (columns), the geometric-mean ratio of the attention-output relative error
    (ablation / default) over the documents of ``cell`` (``"L/c"``, default ``"all"``: every cell judged), on a
    log colour scale centred on 1 (blue: lower error than the default, red: higher)."""
    ablations = [a for a in summary["ablations"] if a["layers"].get(cell)]
    if not ablations:
        raise ValueError(f"cell {cell!r}: no ablation has per-layer ratios there; give 'all' or one of "
                         f"{summary.get('cells_measured')}")
    z = [[math.log2(v) for v in a["layers"][cell]] for a in ablations]
    span = max(1e-3, max(abs(v) for row in z for v in row))
    ticks = []  # readable ratios, spaced at least a sixth of the half-range apart on the log scale
    for v in sorted((0.125, 0.25, 0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 4, 8), key=lambda v: abs(math.log2(v))):
        if abs(math.log2(v)) <= span and all(abs(math.log2(v / t)) >= span / 6 for t in ticks):
            ticks.append(v)
    ticks.sort()
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(len(z[0]))), y=[a["label"] for a in ablations], zmin=-span, zmax=span, colorscale="RdBu_r",
        customdata=[[2 ** v for v in row] for row in z],
        hovertemplate="%{y}<br>layer %{x}: error ratio %{customdata:.3f}<extra></extra>",
        colorbar={"title": "error ratio", "tickvals": [math.log2(v) for v in ticks], "ticktext": [f"{v:g}" for v in ticks]}))
    fig.update_layout(title="Attention-output error per layer: ablation / its base"
                            + ("" if cell == "all" else f" (prompt / c {cell})"),
                      xaxis_title="layer", yaxis={"title": "ablation", "autorange": "reversed"}, height=120 + 28 * len(ablations))
    return finish(fig)
