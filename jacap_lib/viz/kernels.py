"""Figures and tables of chapter 5 (Algorithm 1 and its GPU core); each figure function returns a ``go.Figure``,
each table function (``*_table``) a frame that fits the text column (:func:`~jacap_lib.viz.style.wrapped`).

Inputs are plain data: :func:`jacap_lib.scoring.costs.step_costs`,
:func:`~jacap_lib.scoring.costs.inverse_vs_solve` rows, and the committed benchmark JSON
(:func:`jacap_lib.experiments.bench.load_bench`).
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..scoring.costs import inverse_vs_solve_table, step_costs
from jacap_lib.experiments import bench
from jacap_lib.experiments.bench import METHOD_NAMES, end_to_end_rows
from .style import finish, wrapped

#: top margin (px) that keeps a one-line title clear of plotly's mode bar (``finish`` raises it for longer titles)
_TOP = 84

__all__ = [
    "step_cost_figure", "inverse_vs_solve_figure", "scoring_benchmark_figure", "scoring_table_figure",
    "end_to_end_figure", "inverse_vs_solve_styled", "scoring_table", "fixed_cost_table", "end_to_end_table",
    "press_ratio_table",
]

METHOD_LABELS = METHOD_NAMES  # one table of full names (results.bench), shared with the chapter's tables


def step_cost_figure(Ns=(1024, 4096, 16384, 65536), ds=(64, 128)) -> go.Figure:
    """FLOPs of each step of Algorithm 1 for one head against N; a button per head dimension d."""
    fig = go.Figure()
    steps = [s["step"] for s in step_costs(1, 1)]
    for j, d in enumerate(ds):
        for i, step in enumerate(steps):
            flops = [step_costs(N, d)[i]["flops"] for N in Ns]
            order = step_costs(1, 1)[i]["order"]
            fig.add_trace(go.Scatter(x=list(Ns), y=flops, mode="lines+markers", name=f"{step}  [{order}]",
                                     visible=(j == len(ds) - 1), legendgroup=step))
    n = len(steps)
    buttons = [
        dict(label=f"d = {d}", method="update",
             args=[{"visible": [k // n == j for k in range(n * len(ds))]}, {"title": f"FLOPs per head, d = {d}"}])
        for j, d in enumerate(ds)
    ]
    fig.update_layout(
        title=f"FLOPs per head, d = {ds[-1]}", xaxis=dict(type="log", title="cached tokens N"),
        yaxis=dict(type="log", title="floating-point operations"), height=460,
        updatemenus=[dict(type="buttons", direction="right", buttons=buttons, active=len(ds) - 1, x=0, xanchor="left",
                          y=-0.2, yanchor="top")],  # under the axis title: clear of the figure title
        margin=dict(b=110, t=_TOP),
        legend=dict(font=dict(size=11)),
    )
    return finish(fig)


def inverse_vs_solve_figure(rows: list[dict]) -> go.Figure:
    """Median and maximum relative leverage error (float32) against cond(A), three ways."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("median relative error", "maximum relative error"))
    styles = {"inverse": ("u^T inv(A) u", "#d62728"), "cholesky_solve": ("Cholesky + solve", "#1f77b4"),
              "triangular_inverse": ("L^-1 once, |L^-1 u|^2", "#2ca02c")}
    for col, stat in ((1, "median_rel_err"), (2, "max_rel_err")):
        for key, (label, color) in styles.items():
            pts = [(r["cond"], r[key][stat], r[key]["negative"]) for r in rows if key in r]
            fig.add_trace(go.Scatter(
                x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=label,
                line=dict(color=color, dash="dot" if key == "triangular_inverse" else None),
                text=[f"negative leverages: {p[2]}" for p in pts], showlegend=col == 1,
            ), row=1, col=col)
        floor = [(r["cond"], r["formation_rel_err"]) for r in rows if r.get("formation_rel_err") is not None]
        fig.add_trace(go.Scatter(x=[p[0] for p in floor], y=[p[1] for p in floor], mode="lines",
                                 name="rounding A to float32 (median)", line=dict(color="#7f7f7f", dash="dash"),
                                 showlegend=col == 1), row=1, col=col)
    fig.update_xaxes(type="log", title="cond(A)")
    fig.update_yaxes(type="log", title="relative leverage error")
    fig.update_layout(height=420, title="Leverage in float32: explicit inverse vs Cholesky + triangular solve")
    return finish(fig)


def scoring_benchmark_figure(data: dict) -> go.Figure:
    """Median time per call against N, log-log, one line per method; a button per head dimension d."""
    rows = data["rows"]
    ds = sorted({r["d"] for r in rows})
    methods = [m for m in METHOD_LABELS if any(r["method"] == m for r in rows)]
    fig = go.Figure()
    for j, d in enumerate(ds):
        for m in methods:
            pts = sorted((r["N"], r["median_s"], r["ratio_to_floor"]) for r in rows if r["d"] == d and r["method"] == m)
            fig.add_trace(go.Scatter(
                x=[p[0] for p in pts], y=[1e3 * p[1] for p in pts], mode="lines+markers", name=METHOD_LABELS[m],
                legendgroup=m, line=dict(dash="dash" if m in ("floor", "floor_gemm") else None), visible=(j == len(ds) - 1),
                text=[f"{p[2]:.1f}x the floor" for p in pts], hovertemplate="N=%{x}: %{y:.2f} ms (%{text})",
            ))
    n = len(methods)
    env = data.get("environment", {})
    where = env.get("gpu") or f"{env.get('cpu', 'CPU')}, {env.get('torch_threads', '?')} thread(s)"
    buttons = [
        dict(label=f"d = {d}", method="update",
             args=[{"visible": [k // n == j for k in range(n * len(ds))]}, {"title": f"Scoring time, 8 KV heads, d = {d} ({where})"}])
        for j, d in enumerate(ds)
    ]
    fig.update_layout(
        title=f"Scoring time, 8 KV heads, d = {ds[-1]} ({where})", height=480,
        xaxis=dict(type="log", title="cached tokens N"), yaxis=dict(type="log", title="median ms per call"),
        updatemenus=[dict(type="buttons", direction="right", buttons=buttons, active=len(ds) - 1, x=0, xanchor="left",
                          y=-0.2, yanchor="top")],  # under the axis title: clear of the figure title
        margin=dict(b=110, t=_TOP),
    )
    return finish(fig)


def scoring_table_figure(rows: list[dict]) -> go.Figure:
    """The benchmark as a table: ms and multiple of the floor per method, and Jacap / CapKV."""
    methods = [m for m in METHOD_LABELS if f"{m}_ms" in rows[0]]
    header = ["N", "d"] + [METHOD_LABELS[m].split(" (")[0] + (" (floor)" if m == "floor" else "") for m in methods]
    header.append("Jacap torch / CapKV")
    cells = [[r["N"] for r in rows], [r["d"] for r in rows]]
    for m in methods:
        if m == "floor":
            cells.append([f"{r['floor_ms']:.2f} ms" for r in rows])
        else:
            cells.append([f"{r[m + '_ms']:.1f} ms ({r[m + '_x_floor']:.0f}x)" for r in rows])
    cells.append([f"{r['jacap_torch_over_capkv']:.2f}" for r in rows])
    fig = go.Figure(go.Table(header=dict(values=header, align="left"), cells=dict(values=cells, align="left")))
    fig.update_layout(height=60 + 28 * (len(rows) + 1), margin=dict(l=5, r=5, t=5, b=5))
    return finish(fig)


def end_to_end_figure(data: dict) -> go.Figure:
    """Stacked seconds per run: scoring, the rest of prefill, and decoding, per prompt length."""
    rows = end_to_end_rows(data)
    labels = [f"{r['prompt_tokens'] // 1024}K {r['method']}" + (f" c={r['ratio']:.1f}" if r["method"] != "none" else "")
              for r in rows]
    # parts of a run, not methods: greys, so no method's colour is borrowed
    parts = (("scoring_s", "scoring (press.score)", "#252525"), ("prefill_other_s", "prefill, rest", "#969696"),
             ("decode_s", f"decode {rows[0]['new_tokens'] if rows else ''} tokens", "#d9d9d9"))
    fig = go.Figure()
    for key, name, color in parts:
        # the scoring share is written after the whole bar (the last, decode, segment): inside the thin black
        # segment plotly would shrink and turn it until it cannot be read
        last = key == "decode_s"
        fig.add_trace(go.Bar(y=labels, x=[r[key] for r in rows], name=name, orientation="h", marker_color=color,
                             text=[f"scoring {100 * r['scoring_share_of_total']:.1f}%" if last and r["method"] != "none"
                                   else "" for r in rows],
                             textposition="outside" if last else "none", cliponaxis=False))
    env = data.get("environment", {})
    where = env.get("gpu") or f"{env.get('cpu', 'CPU')}, {env.get('torch_threads', '?')} thread(s)"
    longest = max((sum(r[key] for key, _, _ in parts) for r in rows), default=1.0)
    fig.update_layout(barmode="stack", height=120 + 28 * len(rows), margin=dict(t=_TOP),
                      xaxis=dict(title="seconds", range=[0, 1.25 * longest]),  # room for the label after a bar
                      yaxis=dict(title="prompt length, method", autorange="reversed"), legend=dict(traceorder="normal"),
                      title=f"Prefill + scoring + decode, {data['config'].get('model', '')} ({where})")
    return finish(fig)


# ------------------------------------------------------------------------------------------------------ tables
def _sig3(v) -> str:
    """A measured time or ratio with three significant digits, written in full (``11271`` not ``1.13e+04``)."""
    v = float(v)
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def inverse_vs_solve_styled(rows):
    """:func:`~jacap_lib.scoring.costs.inverse_vs_solve_table` as the chapter shows it: one column per cond(A)
    (``1e+03``), relative errors with two significant digits, ``refused`` where float32 Cholesky refused an
    indefinite A; the long row labels wrap (a ``pandas`` Styler)."""
    table = pd.DataFrame(inverse_vs_solve_table(rows)).set_index("cond(A)").T
    errs = [r for r in table.index if r.endswith(("median", "max", "(rel. error)"))]
    return (table.style.format("{:.1e}", subset=pd.IndexSlice[errs, :], na_rep="refused")
            .format_index("{:.0e}", axis=1)
            .set_table_styles([{"selector": "th.row_heading", "props": "white-space: normal; min-width: 12em;"}]))


def scoring_table(data: dict, d: int):
    """:func:`jacap_lib.experiments.bench.scoring_frame` (one row per scorer, one column per cache length N, "median
    ms (multiple of the floor)") with its scorer names and entries free to wrap, so six cache lengths fit."""
    frame = bench.scoring_frame(data, d)
    return wrapped(frame, [frame.index.name, *frame.columns])


def fixed_cost_table(data: dict):
    """:func:`jacap_lib.experiments.bench.fixed_cost_frame` without the fit's residual, three significant digits,
    the method names free to wrap. A fixed cost of exactly 0 is the fit through the origin (the free line would
    have crossed below zero, and a call cannot cost less than nothing): it reads ``0 (line through origin)``, not
    as a measured cost."""
    frame = bench.fixed_cost_frame(data).drop(columns="worst residual")
    out = frame.map(_sig3)
    col = "fixed (µs/call)"
    out.loc[frame[col] == 0, col] = "0 (line through origin)"
    return wrapped(out, ["method", col])


def end_to_end_table(data: dict):
    """:func:`jacap_lib.experiments.bench.end_to_end_frame`: seconds and ms per token with three significant digits,
    the scoring shares in percent with one decimal; the headers wrap."""
    frame = bench.end_to_end_frame(data)
    shares = ["scoring share of prefill", "scoring share of total"]
    out = frame.drop(columns=shares).map(_sig3)
    for col in shares:
        out[col] = frame[col].map(lambda v: f"{100 * v:.1f}%")
    return wrapped(out[list(frame.columns)], [])


def press_ratio_table(findings: dict, *, decode_note: str = ""):
    """Jacap's press against CapPress per (prompt tokens, c) from :func:`jacap_lib.experiments.bench.end_to_end_findings`:
    the ratio of their scoring times and of their decode times per token (two decimals); ``decode_note`` is added
    to the decode column's header (``"same kept tokens"``)."""
    decode = "decode" + (f" ({decode_note})" if decode_note else "")
    rows = [{"prompt tokens": L, "c": f"{float(c):g}", "scoring: Jacap / CapPress": f"{v:.2f}",
             f"{decode}: Jacap / CapPress": f"{findings['jacap_over_capkv_decode'][(L, c)]:.2f}"}
            for (L, c), v in findings["jacap_over_capkv_scoring"].items()]
    if not rows:
        raise ValueError("findings has no (prompt, c) with both Jacap and CapPress; give end_to_end_findings of a run with both")
    return wrapped(pd.DataFrame(rows).set_index(["prompt tokens", "c"]), [])
