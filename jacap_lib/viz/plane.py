"""The KL–retrieval plane: per budget cell, each method's chosen setting by how far it moves the model's predictions
(KL ratio to a reference, log x) and how often it still finds a fact hidden in the prompt (needle accuracy, y).

:func:`kl_retrieval_figure` draws the points of :func:`jacap_lib.experiments.plane.kl_retrieval_points`: one panel per
(prompt length, c), one colour and marker per method (:data:`jacap_lib.viz.style.METHOD_STYLES`), the settings named
as the glossary names them ("the default", "Algorithm 1 tuned", "Algorithm 1 as published", the other methods by
their registry names), a dotted line at x = 1 (the reference's KL) and a dashed line at the uncompressed model's
accuracy. A note under the legend says what the data are (the exploratory dev documents, the needle prompts).
"""
from __future__ import annotations

import math
import textwrap
from typing import NamedTuple

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from jacap_lib.experiments.names import short_spec
from .style import METHOD_STYLES, REFERENCE_COLOUR, finish, style_key

__all__ = ["style_key", "kl_retrieval_figure", "LINE_COLOUR"]

#: the colour of the x = 1 line (the reference's KL): a grey no method uses
LINE_COLOUR = "#444444"


class _Source(NamedTuple):
    """How the figure names the run its points come from."""
    note: str  # the documents, in the note under the legend
    hover: str  # the documents, in each point's hover text
    keys: str  # what the note adds about the needle keys
    points: str  # what one point is


#: the runs a plane can show, by the points' ``split``
_SOURCES = {
    "dev": _Source("dev documents (exploratory: used in four rounds, they helped choose the prompt press)",
                   "dev documents", "", "One point per method's chosen setting."),
    "confirm": _Source("fresh confirmatory documents (judged once, by a plan committed before the run)",
                       "confirmatory documents", "; fresh keys", "One point per setting the plan runs."),
}


def _split(points: list[dict]) -> str:
    """The one ``split`` of ``points`` (``"dev"`` when unnamed); a mix is refused."""
    splits = {p.get("split", "dev") for p in points}
    if len(splits) != 1 or not splits <= set(_SOURCES):
        raise ValueError(f"points: they mix or misname their documents ({sorted(splits)}); give the points of one "
                         f"run, with split one of {sorted(_SOURCES)}")
    return splits.pop()


def _order(points: list[dict]) -> list[str]:
    """The settings' legend order: Jacap's settings first (the named ones, then the other Jacap methods), then the
    baselines, each in the order of the points."""
    specs = list(dict.fromkeys(p["spec"] for p in points))
    from jacap_lib.experiments.names import DEFAULT_NAME, PROMPT_NAME

    rank = {DEFAULT_NAME["legend"]: 0, PROMPT_NAME["legend"]: 1, "Algorithm 1 tuned": 2, "Algorithm 1 as published": 3}
    name = {p["spec"]: p["name"] for p in points}
    return sorted(specs, key=lambda s: (rank.get(name[s], 4 if s.startswith("jacap") else 5), specs.index(s)))


def kl_retrieval_figure(points: list[dict], *, lengths=None, ratios=None, intervals: bool = False,
                        title: str | None = None) -> go.Figure:
    """The KL–retrieval plane of ``points`` (:func:`~jacap_lib.experiments.plane.kl_retrieval_points`): one panel per
    (prompt length, c) — rows = prompt lengths, columns = c; ``lengths`` / ``ratios`` keep only those — with
    x = the geometric-mean KL ratio to the points' reference (log axis shared by every panel) and y = the needle
    accuracy with the question asked after the compressed prompt (%). ``intervals``: draw each accuracy's 95 %
    Wilson interval (always in the hover text)."""
    if not points:
        raise ValueError("points is empty; give the points of results.plane.kl_retrieval_points()")
    keep = [p for p in points if (lengths is None or p["length"] in set(lengths))
            and (ratios is None or any(math.isclose(p["ratio"], float(r)) for r in ratios))]
    if not keep:
        raise ValueError(f"no point has a prompt length in {lengths} and c in {ratios}; the points' cells are "
                         f"{sorted({p['cell'] for p in points})}")
    Ls = sorted({p["length"] for p in keep})
    cs = sorted({p["ratio"] for p in keep})
    refs = sorted({p["reference_name"] for p in keep})
    ref_text = refs[0] if len(refs) == 1 else "the reference of each cell"
    fig = make_subplots(rows=len(Ls), cols=len(cs), shared_xaxes="all", shared_yaxes="all",
                        subplot_titles=[f"prompt {L}, c = {c:g}" for L in Ls for c in cs],
                        horizontal_spacing=0.04, vertical_spacing=0.1 if len(Ls) > 1 else 0.0,
                        x_title=f"KL ratio to {ref_text} (log; left of 1: closer to the full cache)",
                        y_title="needle prompts answered right (%)")
    xs = [p["kl_ratio"] for p in keep]
    lo, hi = min(xs + [1.0]) / 1.25, max(xs + [1.0]) * 1.25
    first = {"full": True, "ref": True}
    for i, L in enumerate(Ls, start=1):
        for j, c in enumerate(cs, start=1):
            cell = [p for p in keep if p["length"] == L and math.isclose(p["ratio"], c)]
            if not cell:
                continue
            full = 100 * cell[0]["full_accuracy"]
            fig.add_trace(go.Scatter(x=[lo, hi], y=[full, full], mode="lines", name="uncompressed model",
                                     legendgroup="full", showlegend=first["full"], line={"dash": "dash", "width": 1},
                                     hovertemplate=f"uncompressed: {full:.0f} %<extra></extra>"), row=i, col=j)
            fig.add_trace(go.Scatter(x=[1, 1], y=[-5, 105], mode="lines", name=f"x = 1: {ref_text}'s KL",
                                     legendgroup="reference line", showlegend=first["ref"],
                                     line={"dash": "dot", "width": 1, "color": LINE_COLOUR}, hoverinfo="skip"),
                          row=i, col=j)
            first = {"full": False, "ref": False}
    split = _split(keep)
    shown = set()
    for spec in _order(keep):
        for i, L in enumerate(Ls, start=1):
            for j, c in enumerate(cs, start=1):
                p = next((q for q in keep if q["spec"] == spec and q["length"] == L and math.isclose(q["ratio"], c)),
                         None)
                if p is None:
                    continue
                acc = 100 * p["accuracy"]
                err = {"type": "data", "symmetric": False, "array": [100 * p["accuracy_high"] - acc],
                       "arrayminus": [acc - 100 * p["accuracy_low"]], "thickness": 1, "width": 3} if intervals else None
                hover = (f"<b>{p['name']}</b> ({p['spec']})<br>KL ratio to {p['reference_name']}: "
                         f"{p['kl_ratio']:.3g} over {p['n_docs']} {_SOURCES[split].hover}<br>needle: {p['correct']} of "
                         f"{p['n_prompts']} prompts ({acc:.0f} %, 95 % interval {100 * p['accuracy_low']:.0f} to "
                         f"{100 * p['accuracy_high']:.0f} %)<extra></extra>")
                fig.add_trace(go.Scatter(
                    x=[p["kl_ratio"]], y=[acc], mode="markers", name=p["name"], legendgroup=style_key(spec),
                    showlegend=spec not in shown, error_y=err,
                    marker={"size": 11 if spec.startswith("jacap") else 9, "line": {"width": 0.5, "color": "white"}},
                    hovertemplate=hover), row=i, col=j)
                shown.add(spec)
    fig.update_xaxes(type="log", range=[math.log10(lo), math.log10(hi)], showticklabels=True)
    fig.update_yaxes(range=[-5, 105], tickvals=[0, 25, 50, 75, 100], showticklabels=True)
    docs = sorted({p["n_docs"] for p in keep})
    prompts = sorted({p["n_prompts"] for p in keep})
    span = lambda v: "-".join(map(str, v[:: max(1, len(v) - 1)]))  # noqa: E731
    note = (f"KL over the {span(docs)} {_SOURCES[split].note}; {span(prompts)} needle prompts per panel (a 5-digit key "
            f"hidden in filler, the question asked after the compressed prompt{_SOURCES[split].keys}). {_SOURCES[split].points}")
    # the default title names the points' documents and reference: two planes of different references never share one
    head = title or (f"Predictions kept (KL ratio to {ref_text}) against a fact kept (needle accuracy), per budget, "
                     f"{_SOURCES[split].hover}")
    lines, note_lines = textwrap.wrap(head, 48), textwrap.wrap(note, 96)  # short lines: clear of the modebar
    # pixels: the title's lines, the note under it and the panels' titles above the plots; under the plots the tick
    # labels, the x title, then the legend (three entries a row) — fixed sizes, so nothing overlaps at any height
    title_h, note_h = 22 * len(lines) + 14, 16 * len(note_lines)
    top, plot_h, legend_rows = title_h + note_h + 40, 240 * len(Ls), -(-(len(shown) + 2) // 3)
    below = 62
    height = top + plot_h + below + 22 * legend_rows + 20
    fig.update_layout(
        height=height,
        title={"text": "<br>".join(lines), "x": 0.01, "xanchor": "left", "y": 1 - 14 / height, "yref": "container",
               "yanchor": "top"},
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -below / plot_h, "yanchor": "top",
                "font": {"size": 11}, "entrywidth": 190, "entrywidthmode": "pixels"},
        margin={"l": 70, "r": 20, "t": top, "b": below + 22 * legend_rows + 20})
    fig.add_annotation(text="<br>".join(note_lines), xref="paper", yref="paper", x=0, xanchor="left", y=1,
                       yanchor="bottom", yshift=32, showarrow=False, align="left",
                       font={"size": 11, "color": "#444444"})
    # the uncompressed line is drawn in the reference colour of the book ("full")
    for tr in fig.data:
        if tr.legendgroup == "full":
            tr.line.color = REFERENCE_COLOUR
    return finish(fig)
