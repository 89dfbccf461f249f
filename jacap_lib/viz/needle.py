"""Tables and the figure of the needle digit-survival probe (``needle_probe_summary.json``, read with
:func:`jacap_lib.results.loaders.load_needle_probe_summary`): which of the hidden key's digit tokens each
setting's compressed cache still holds, layer by layer, next to whether the model answered right.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from jacap_lib.experiments.names import short_spec, spec_name
from jacap_lib.verdicts.precision import interval_text
from .evaluation import short_verdict
from .style import METHOD_STYLES, finish, style_key, wrapped

__all__ = ["style_key", "survival_figure", "survival_frame", "mode_effect_frame"]


def _mode(summary: dict, mode: str) -> dict:
    if mode not in summary.get("modes", {}):
        raise ValueError(f"mode {mode!r} is not in the probe summary (its modes: {sorted(summary.get('modes', {}))})")
    return summary["modes"][mode]


def _accuracy(block: dict) -> dict:
    """``{(spec, length, ratio): accuracy entry}`` of one mode's cells."""
    return {(a["spec"], c["length"], c["ratio"]): a for c in block["cells"] for a in c["settings"]}


def survival_figure(summary: dict, mode: str = "after", *, title: str | None = None) -> go.Figure:
    """Per setting, the mean fraction of the key's digit tokens kept in each layer (over KV heads and prompts),
    layers on x; one panel per (prompt, c) cell of ``mode``; each legend entry gives the setting's needle
    accuracy in every panel's cell."""
    block = _mode(summary, mode)
    surv = block["survival"]
    if not surv:
        raise ValueError(f"the probe summary has no complete cell in mode {mode!r}")
    cells = sorted({(s["length"], s["ratio"]) for s in surv})
    specs = list(dict.fromkeys(s["spec"] for s in surv))
    acc = _accuracy(block)
    n = sorted({s["n"] for s in surv})
    fig = make_subplots(rows=1, cols=len(cells), shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=[f"prompt {L} tokens, c = {c}" for L, c in cells])
    for spec in specs:
        accs = ", ".join(f"{100 * acc[(spec, L, c)]['accuracy']:.0f}%" for L, c in cells)
        name = f"{spec_name(spec, legend=True)}: accuracy {accs}"
        jac = spec.startswith("jacap")
        for j, (L, c) in enumerate(cells, start=1):
            s = next((x for x in surv if x["spec"] == spec and x["length"] == L and x["ratio"] == c), None)
            if s is None:
                continue
            y = s["key_kept_by_layer"]
            fig.add_trace(go.Scatter(
                x=list(range(len(y))), y=y, name=name, legendgroup=style_key(spec), showlegend=j == 1,
                mode="lines+markers", marker={"size": 5},
                line={"width": 3 if jac else 1.5, "dash": "solid" if jac else "dot"},
                hovertemplate=f"{spec}<br>layer %{{x}}: %{{y:.0%}} of key digits kept<extra></extra>"),
                row=1, col=j)
    for j in range(1, len(cells) + 1):
        fig.update_xaxes(title_text="layer", row=1, col=j)
        fig.update_yaxes(title_text="key digit tokens kept (fraction)", range=[0, 1.03], tickformat=".0%", row=1, col=j)
    where = "the question asked after compression" if mode == "after" else "the question inside the compressed prompt"
    prompts = "-".join(map(str, n[:: max(1, len(n) - 1)]))
    # the legend under the panels, one entry per row (the names carry every panel's accuracy): the figure grows
    # by one row per setting so that no entry falls past its bottom edge
    plot_h, top, rows = 300, 100, len(specs) + 1  # + 1: the legend's title
    bottom = 80 + 20 * rows
    fig.update_layout(
        height=plot_h + top + bottom, margin={"t": top, "b": bottom},
        legend={"orientation": "v", "x": 0, "y": -70 / plot_h, "yanchor": "top", "font": {"size": 11},
                "title": {"text": "setting: needle accuracy per panel (left to right)"}},
        title=title or f"Which layers keep the hidden key's digits ({where}; mean over KV heads and {prompts} prompts)")
    return finish(fig)


def survival_frame(summary: dict, mode: str = "after", *, details: bool = False) -> pd.DataFrame:
    """One row per (setting, prompt, c) of ``mode``: needle accuracy [95 % Wilson interval] and the mean fraction
    kept of the key's digit tokens and of the needle's tokens. ``details=True``: the supporting columns instead --
    the mean share of (layer, KV head) caches holding a whole copy of the key, the share of prompts where every
    key digit survived in every layer and KV head, and the accuracy on those prompts and on the others (count
    right / n)."""
    block = _mode(summary, mode)
    acc = _accuracy(block)

    def cond(a):
        return "–" if not a["n"] else f"{100 * a['accuracy']:.0f}% ({a['correct']}/{a['n']})"

    rows = []
    for s in block["survival"]:
        a = acc[(s["spec"], s["length"], s["ratio"])]
        row = {"setting": short_spec(s["spec"]), "prompt": s["length"], "c": s["ratio"]}
        if details:
            row.update({"caches with a whole copy": f"{100 * s['key_copy_kept_mean']:.0f}%",
                        "every digit everywhere": f"{100 * s['all_kept_fraction']:.0f}%",
                        "accuracy, every digit kept": cond(s["accuracy_all_kept"]),
                        "accuracy, some digit lost": cond(s["accuracy_not_all_kept"])})
        else:
            row.update({"accuracy [95 % CI]": f"{100 * a['accuracy']:.0f}% [{100 * a['low']:.0f}, {100 * a['high']:.0f}]",
                        "key digits kept": f"{100 * s['key_kept_mean']:.0f}%",
                        "needle kept": f"{100 * s['needle_kept_mean']:.0f}%"})
        rows.append(row)
    if not rows:
        raise ValueError(f"the probe summary has no complete cell in mode {mode!r}")
    return wrapped(pd.DataFrame(rows).set_index(["setting", "prompt", "c"]), ["setting"])


def mode_effect_frame(summary: dict, *, details: bool = False) -> pd.DataFrame:
    """Inside against after, per setting and cell, paired on the prompts both modes hold: both accuracies and
    the verdict in short words. ``details=True``: the supporting columns instead -- the prompts paired, the
    difference in points with its 95 % paired bootstrap interval, wins/losses, exact McNemar p, Holm p."""
    rows = []
    for e in summary.get("mode_effect", []):
        row = {"setting": short_spec(e["spec"]), "prompt": e["length"], "c": e["ratio"]}
        if details:
            row.update({"n": e["n"], "difference, pts [95 % CI]": interval_text(e["diff_points"], e["diff_low"],
                                                                                 e["diff_high"]),
                        "wins/losses": f"{e['wins']}/{e['losses']}", "McNemar p": f"{e['p_mcnemar']:.2g}",
                        "Holm p": f"{e['p_holm']:.2g}"})
        else:
            row.update({"inside": f"{100 * e['accuracy']:.0f}%", "after": f"{100 * e['reference_accuracy']:.0f}%",
                        "verdict": short_verdict(e["verdict"])})
        rows.append(row)
    if not rows:
        raise ValueError("the probe summary has no setting measured in both modes")
    return wrapped(pd.DataFrame(rows).set_index(["setting", "prompt", "c"]), ["setting"] if details else
                   ["setting", "verdict"])
