"""Figures for the error-decomposition and failure-case chapters (08, 10b).

Every function takes the tidy records of :mod:`jacap_lib.measure.decomposition` /
:mod:`jacap_lib.measure.failures` (or the JSON files ``jacap decompose`` writes, read by
:mod:`jacap_lib.results.loaders`) and returns a
``plotly.graph_objects.Figure``.
"""
from __future__ import annotations

import math
import re

import plotly.graph_objects as go

from jacap_lib.results.loaders import load_decomposition
from .style import REFERENCE_COLOUR, clip_outliers, finish, method_style, setting_colours

__all__ = [
    "load_records",
    "taylor_error_figure",
    "diagonal_error_figure",
    "selection_figure",
    "loo_figure",
    "failure_figure",
    "lag_figure",
]

_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def load_records(part) -> tuple[dict, list]:
    """``(config, rows)`` of ``data/decomposition/<part>.json`` (e.g. ``"taylor"``; or a path)."""
    return load_decomposition(str(part))


def _by_layer(records, getter):
    xs, ys = [], []
    for r in records:
        v = getter(r)
        if v is not None and math.isfinite(v):
            xs.append(r["layer"])
            ys.append(v)
    return xs, ys


#: top margin (px) that keeps a one-line title clear of plotly's mode bar: with the 62 px that ``finish`` gives a
#: one-line title, the title sits across the bar's icons in the book's column
_TOP = 84


def _finish(fig: go.Figure) -> go.Figure:
    """:func:`~.style.finish` with the top margin at least :data:`_TOP` (``finish`` raises it for longer titles)."""
    if fig.layout.title.text and (fig.layout.margin.t is None or fig.layout.margin.t < _TOP):
        fig.update_layout(margin={"t": _TOP})
    return finish(fig)


def taylor_error_figure(records: list, *, stat: str = "q50") -> go.Figure:
    """E_Taylor: per layer, the distribution over heads of each head's ``stat`` (median by
    default) relative tangent-plane error ‖f(q)-f(μ)-Jδq‖/‖f(q)-f(μ)‖ for the later queries."""
    xs, ys = _by_layer(records, lambda r: r["rel_error"][stat])
    fig = go.Figure(go.Box(x=xs, y=ys, name=f"per-head {stat}", boxpoints="all", jitter=0.4, pointpos=0,
                           marker=dict(size=4), hovertemplate="layer %{x}<br>rel. error %{y:.3f}<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="error = size of the change itself")
    fig.update_layout(title="E<sub>Taylor</sub>: tangent-plane error of the retained attention, per layer",
                      xaxis_title="layer", yaxis_title="relative error (per-head median over later queries)",
                      yaxis_type="log", showlegend=False, template="plotly_white")
    return _finish(fig)


def diagonal_error_figure(records: list, *, metric: str = "rel_error") -> go.Figure:
    """E_diagonal: per layer, boxes over heads for each approximation of the full capacity.

    ``metric="rel_error"``: median over subsets of (approx - full)/full; ``metric="spearman"``:
    rank correlation with the full capacity across subsets (1 = the same ranking of subsets)."""
    names = {"rank_one": "exact S, diagonal KΛKᵀ", "diag": "diagonal S and KΛKᵀ (same α)",
             "alg1": "Algorithm 1 weights (pool ᾱ, τ)"}
    fig = go.Figure()
    for i, (k, label) in enumerate(names.items()):
        get = (lambda r, k=k: r[f"rel_error_{k}"]["q50"]) if metric == "rel_error" else (lambda r, k=k: r[f"spearman_{k}"])
        xs, ys = _by_layer(records, get)
        fig.add_trace(go.Box(x=xs, y=ys, name=label, marker_color=_COLORS[i]))
    ytitle = "median relative capacity error" if metric == "rel_error" else "Spearman ρ with full capacity (subsets)"
    what = ("how far each approximation's capacity lies from the full one" if metric == "rel_error"
            else "whether each approximation ranks the subsets as the full capacity does")
    fig.update_layout(boxmode="group", title=f"E<sub>diagonal</sub>: {what}",
                      xaxis_title="layer", yaxis_title=ytitle, template="plotly_white", legend=dict(orientation="h", y=-0.2))
    if metric == "rel_error":  # a few subsets' errors run to thousands: show the bulk, name the extreme
        clip_outliers(fig, "yaxis")
    return _finish(fig)


def selection_figure(records: list) -> go.Figure:
    """E_selection: capacity of the one-shot and greedy subsets as a fraction of the exhaustive optimum."""
    fig = go.Figure()
    for i, (k, label) in enumerate((("ratio_one_shot", "one-shot top-B (Algorithm 1)"), ("ratio_greedy", "greedy"))):
        xs, ys = _by_layer(records, lambda r, k=k: r[k])
        fig.add_trace(go.Box(x=xs, y=ys, name=label, marker_color=_COLORS[i], boxpoints="all", jitter=0.3))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="exhaustive optimum")
    n, b = (records[0]["n"], records[0]["budget"]) if records else ("?", "?")
    fig.update_layout(boxmode="group", template="plotly_white", xaxis_title="layer",
                      yaxis_title="capacity / exhaustive capacity",
                      title=f"E<sub>selection</sub>: small caches (n = {n}, B = {b}) sampled from real heads",
                      legend=dict(orientation="h", y=-0.2))
    return _finish(fig)


#: what each sensitivity of :func:`loo_figure` is, for its title (two figures of one chapter plot different ones)
_SENSITIVITY = {"rho": "Jacobian sensitivity ρ = ᾱ(1 − ᾱ)", "weight": "Algorithm 1's weight w",
                "score": "Jacap score r"}


def loo_figure(records: list, *, tau: float = 1.0, saturated: float = 0.5, sensitivity: str = "rho",
               saturated_tau: float = 1.0) -> go.Figure:
    """Deletion damage vs Jacobian sensitivity, one point per (layer, head, token).

    x = ``sensitivity`` (``"rho"`` = ᾱ(1-ᾱ), ``"weight"`` = w or ``"score"`` = Algorithm 1's r) at temperature
    ``tau``, named in the title (two figures that plot different sensitivities never share a title); y = the
    leave-one-out damage (relative to the head's output norm). Tokens with ᾱ ≥ ``saturated`` under the
    model's own softmax (``saturated_tau``, default 1 — at τ = 10 nothing saturates) are drawn in red:
    tiny ρ, large damage is the note's §13.3 / §19.1 warning."""
    key = f"{sensitivity}_tau{tau:g}"
    akey = f"alpha_bar_tau{saturated_tau:g}"
    if records and key not in records[0]:
        raise ValueError(f"records have no {key!r}; available temperatures: "
                         f"{sorted(k for k in records[0] if k.startswith('rho_tau'))}")
    fig = go.Figure()
    for name, sel, color, size in (("other tokens", lambda r: r[akey] < saturated, "rgba(31,119,180,0.35)", 4),
                                   (f"saturated (ᾱ ≥ {saturated})", lambda r: r[akey] >= saturated, "#d62728", 9)):
        pts = [r for r in records if sel(r) and r[key] > 0 and r["damage"] > 0]
        fig.add_trace(go.Scattergl(
            x=[r[key] for r in pts], y=[r["damage"] for r in pts], mode="markers", name=name,
            marker=dict(color=color, size=size),
            text=[f"layer {r['layer']} head {r['head']} pos {r['position']}<br>ᾱ={r[akey]:.3f}" for r in pts],
            hovertemplate="%{text}<br>x=%{x:.2e}<br>damage=%{y:.2e}<extra></extra>"))
    fig.update_layout(template="plotly_white", xaxis_type="log", yaxis_type="log",
                      xaxis_title=f"{_SENSITIVITY.get(sensitivity, sensitivity)} (τ = {tau:g}); red: ᾱ ≥ {saturated} at "
                                  f"τ = {saturated_tau:g}",
                      yaxis_title="leave-one-out damage / ‖f_C‖",
                      title=f"Deletion damage vs {_SENSITIVITY.get(sensitivity, sensitivity)} (τ = {tau:g})",
                      legend=dict(orientation="h", y=-0.2))
    return _finish(fig)


_PARAMETER = re.compile(r"^(?P<stem>.*?)\s*\((?P<param>[^()]*=[^()]*)\)$")  # "stem (name=value)"


def _setting_names(cases: list) -> dict:
    """``{label: legend name}``: cases whose labels differ only in a trailing ``(name=value)`` and never share a
    ratio are one setting whose value depends on the ratio (the protected prefix is capped at the budget), drawn
    as one trace named ``stem (value; other value at c = ...)``; every other label names itself."""
    stems: dict = {}
    for c in cases:
        m = _PARAMETER.match(c["label"])
        stems.setdefault(m["stem"] if m else c["label"], {}).setdefault(c["label"], []).append(c["compression_ratio"])
    out = {}
    for stem, labels in stems.items():
        ratios = [r for rs in labels.values() for r in rs]
        if len(labels) == 1 or len(set(ratios)) < len(ratios) or not all(_PARAMETER.match(lab) for lab in labels):
            out.update({lab: lab for lab in labels})
            continue
        ordered = sorted(labels.items(), key=lambda kv: -len(kv[1]))  # the value at most ratios first
        others = "; ".join(f"{_PARAMETER.match(lab)['param']} at c = {', '.join(f'{r:g}' for r in rs)}"
                           for lab, rs in ordered[1:])
        name = f"{stem} ({_PARAMETER.match(ordered[0][0])['param']}; {others})"
        out.update({lab: name for lab in labels})
    return out


def failure_figure(demo: dict, *, metric: str = "answer_logprob") -> go.Figure:
    """One failure demo (``FailureDemo.to_dict()``): ``metric`` per case, grouped by compression ratio (or one
    bar per case when the demo has one ratio), each setting in its own colour (:func:`~.style.setting_colours`),
    the full-cache reference as a dotted black line named in the legend, and a ✓ (greedy answer correct) or ✗
    above the plot over each bar, clear of the bars and of the reference line."""
    cases = demo["cases"]
    names = _setting_names(cases)
    colours = setting_colours(names.values())
    several = len({c["compression_ratio"] for c in cases}) > 1
    xcat = (lambda c: f"c = {c['compression_ratio']:g}") if several else (lambda c: names[c["label"]])
    categories = list(dict.fromkeys(xcat(c) for c in cases))
    # explicit bar positions (0.8 of each category, shared by its bars) so the ✓/✗ marks sit over their bars
    slots: dict = {}
    for c in cases:
        slots.setdefault(xcat(c), []).append(names[c["label"]])
    fig = go.Figure()
    marks = []
    for name in colours:
        cs = [c for c in cases if names[c["label"]] == name]
        width = [0.8 / len(slots[xcat(c)]) for c in cs]
        offset = [-0.4 + slots[xcat(c)].index(name) * w for c, w in zip(cs, width)]
        fig.add_trace(go.Bar(x=[xcat(c) for c in cs], y=[c[metric] for c in cs], name=name, width=width,
                             offset=offset, marker_color=colours[name],
                             customdata=[[c["label"], "correct" if c["answer_correct"] else "wrong"] for c in cs],
                             hovertemplate="%{customdata[0]}<br>%{x}: %{y:.3g}<br>greedy answer %{customdata[1]}"
                                           "<extra></extra>"))
        marks += [(categories.index(xcat(c)) + o + w / 2, "✓" if c["answer_correct"] else "✗", colours[name])
                  for c, o, w in zip(cs, offset, width)]
    for x, text, colour in marks:
        fig.add_annotation(x=x, xref="x", y=1.0, yref="paper", yanchor="bottom", yshift=4, text=text, showarrow=False,
                           font={"size": 15, "color": colour})
    ref = demo["reference"][metric]
    if ref is not None and math.isfinite(ref):
        fig.add_hline(y=ref, line_dash="dot", line_color=REFERENCE_COLOUR)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"full cache ({ref:.3g})",
                                 line={"color": REFERENCE_COLOUR, "dash": "dot"}, hoverinfo="skip"))
    titles = {"answer_logprob": "log-probability of the answer", "kl": "next-token KL(full ‖ compressed)",
              "critical_kept": "fraction of (layer, KV head) keeping the critical tokens",
              "margin": "log p(answer) − log p(rival)"}
    # the axis titles short enough to stay beside the plot (a long one runs up into the figure's title)
    axis_titles = {"answer_logprob": "log p(answer)", "kl": "KL(full ‖ compressed)",
                   "critical_kept": "critical tokens kept (share)", "margin": "log p(answer) − log p(rival)"}
    if not several:  # the x labels name the settings: the legend keeps the reference only, beside the plot, where
        # it cannot run into the (rotated) x labels
        for tr in fig.data:
            if tr.type == "bar":
                tr.showlegend = False
    fig.update_layout(template="plotly_white", yaxis_title=axis_titles.get(metric, metric),
                      xaxis={"title": "compression ratio" if several else "setting", "type": "category",
                             "categoryorder": "array", "categoryarray": categories},
                      title=f"{demo['name'].replace('_', ' ')}: {titles.get(metric, metric)} "
                            "(above each bar: ✓ greedy answer correct, ✗ wrong)",
                      legend=dict(orientation="h", y=-0.2) if several else
                      dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top"))
    return _finish(fig)


def lag_figure(lag: dict) -> go.Figure:
    """Phase change: distance of the EMA centre from the new phase's queries vs β, one colour per layer
    (:func:`~.style.setting_colours`), the EMA as a solid line and the flat mean as a dotted one, both named in
    the legend (``setup["lag"]`` of :func:`jacap_lib.measure.failures.phase_change`). The β values are evenly
    spaced categories, so the values near 1 (0.95, 0.99, 0.999), where the distance rises, do not bunch."""
    layers = sorted(lag, key=int)
    colours = setting_colours([f"layer {layer}" for layer in layers])
    fig = go.Figure()
    for layer in layers:
        rec, colour = lag[layer], colours[f"layer {layer}"]
        betas = [b for b in rec["distance"] if b != "flat"]
        fig.add_trace(go.Scatter(x=[f"{float(b):g}" for b in betas], y=[rec["distance"][b] for b in betas],
                                 mode="lines+markers", name=f"layer {layer}: EMA", legendgroup=f"layer {layer}",
                                 line={"color": colour}, marker={"color": colour}))
        fig.add_trace(go.Scatter(x=[f"{float(b):g}" for b in betas], y=[rec["distance"]["flat"]] * len(betas),
                                 mode="lines", name=f"layer {layer}: flat mean", legendgroup=f"layer {layer}",
                                 line={"color": colour, "dash": "dot"},
                                 hovertemplate=f"layer {layer}: flat mean %{{y:.3f}}<extra></extra>"))
    fig.update_layout(template="plotly_white", xaxis={"title": "β (EMA decay; values evenly spaced)", "type": "category"},
                      yaxis_title="‖μ_β − mean future query‖ / ‖mean future query‖",
                      title="How far the query statistics lag behind a phase change")
    return _finish(fig)


def failure_frame(demo: dict):
    """One failure demo (``load_failures()[1][name]``) as a table: the reference and every case, with the
    answer's log-probability, whether it is still the argmax, the continuation's KL, the fraction of the
    critical tokens kept and (where defined) the answer-vs-rival margin."""
    import pandas as pd

    rows = []
    for r in [demo["reference"]] + demo["cases"]:
        rows.append({"c": r["compression_ratio"], "case": r["label"], "logp(answer)": round(r["answer_logprob"], 2),
                     "correct": bool(r["answer_correct"]), "KL": round(r["kl"], 3),
                     "critical kept": round(r["critical_kept"], 2),
                     "margin": None if r["margin"] != r["margin"] else round(r["margin"], 2)})
    return pd.DataFrame(rows).set_index("c")
