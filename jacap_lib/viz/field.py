"""The field on the tune documents: every method's tune choice by its geometric-mean KL ratio to the prompt press.

:func:`tune_ratio_figure` draws :func:`jacap_lib.experiments.candidates.score_table`: one horizontal bar per method (its
colour and marker from :data:`jacap_lib.viz.style.METHOD_STYLES`), on a log axis, best at the top, with the methods
whose tune is unfinished named under the plot.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .style import finish, setting_colours, wrap_title, wrapped

__all__ = ["not_offline_frame", "tune_ratio_figure", "STEP_NAMES", "ladder_frame", "ladder_figure", "ROLE_NAMES", "field_frame", "needle_frame",
           "field_heatmap", "field_needle_frame", "field_needle_note"]

#: the ladder's steps (``results.ladder.STEPS``) as a reader names them: the step's label (the table's column, so the
#: legend and :func:`ladder_frame` name a step alike) and what it changes from the step before
STEP_NAMES = {"L1": "L1: the reconstruction's queries", "L1b": "L1b: no recent window",
              "L2": "L2: max attention instead of Algorithm 1", "L3": "L3: global budget (= KVzip)",
              "d": "d: Algorithm 1 on KVzip's queries and budget, vs KVzip"}


def tune_ratio_figure(table: list[dict], *, pending=(), title: str | None = None) -> go.Figure:
    """Bars of ``kl_ratio`` per method of ``table`` (rows of :func:`~jacap_lib.experiments.candidates.score_table`);
    ``pending``: methods without a tune choice yet, named in a note."""
    if not table:
        raise ValueError("table must hold at least one method (rows of results.candidates.score_table)")
    from jacap_lib.experiments.names import spec_name

    rows = sorted(table, key=lambda r: r["kl_ratio"], reverse=True)  # plotly draws the first bar at the bottom
    fig = go.Figure()
    for r in rows:
        label = spec_name(r["spec"], legend=True) if "spec" in r else r["setting"]  # the book's names of the settings
        fig.add_trace(go.Bar(x=[r["kl_ratio"]], y=[label], orientation="h", name=label,
                             legendgroup=r["method"], showlegend=False,
                             hovertemplate=f"{label}<br>KL ratio to the prompt press %{{x:.3g}}<extra></extra>"))
    fig.add_vline(x=1, line={"color": "#444444", "dash": "dot"})
    import textwrap

    note = "<br>".join(textwrap.wrap(f"not tuned yet: {', '.join(pending)}", 70)) if pending else None
    lines = note.count("<br>") + 1 if note else 0
    fig.update_layout(title=title or "Each method's tune choice: geometric-mean KL ratio to the prompt press (tune documents)",
                      xaxis={"title": "KL ratio to the prompt press (log; below 1 = closer to the full cache)", "type": "log"},
                      yaxis={"title": "method (its tune choice)", "automargin": True},
                      height=160 + 26 * len(rows) + 16 * lines, bargap=0.25,
                      margin={"l": 10, "r": 10, "b": 60 + 16 * lines})
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=0, yshift=-48, showarrow=False,
                           xanchor="left", yanchor="top", align="left", font={"size": 11})
    return finish(fig)


def ladder_frame(summary: dict) -> pd.DataFrame:
    """The ladder summary (``ladder_summary.json``) as a table: one row per cell (L / c), one column per step, each
    entry the geometric-mean KL ratio to the step before and its verdict's word (adjusted interval), and the total
    ratio KVzip / prompt press with its verdict's word."""
    from jacap_lib.verdicts.words import verdict_word

    short = {"better": "better", "worse": "worse", "no detectable difference": "n.d.", "identical": "identical"}
    rows = {}
    for cell in summary["cells"]:
        key = f"{cell['length']} / {float(cell['ratio']):g}"
        row = {s["step"]: f"{s['gm_ratio']:.2f} {short[verdict_word(s['verdict'])]}" for s in cell["steps"]}
        row["KVzip / prompt press"] = f"{cell['total_L3_over_L0']:.2f} {short[verdict_word(cell['total_verdict'])]}"
        rows[key] = row
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "L / c"
    return frame


#: the field summary's roles (``results.field_dev.ROLES``) as a table's column names
ROLE_NAMES = {"context": "default", "kvzip": "KVzip", "one_prefill": "prompt press"}


def field_frame(summary: dict) -> pd.DataFrame:
    """The field summary (``peers/field_summary.json``) as a table: one row per cell (L / c), one column per
    comparison ("default / KVzip", ...), each entry the geometric-mean KL ratio on the dev documents and its
    verdict's word (interval adjusted over every comparison and cell), marked "(p)" where a setting's protected tokens
    fill its budget (its score chose nothing there)."""
    from jacap_lib.verdicts.words import verdict_word

    short = {"better": "better", "worse": "worse", "no detectable difference": "n.d.", "identical": "identical"}
    rows: dict = {}
    for block in summary["comparisons"]:
        column = f"{ROLE_NAMES[block['setting']]} / {ROLE_NAMES[block['reference']]}"
        for r in block["cells"]:
            mark = " (p)" if r["protection_fills"] else ""
            rows.setdefault(f"{r['length']} / {float(r['ratio']):g}", {})[column] = (
                f"{r['gm_ratio']:.2f} {short[verdict_word(r['verdict'])]}{mark}")
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "L / c"
    return frame



def needle_frame(summary: dict, part: str = "accuracy") -> pd.DataFrame:
    """The needle half of the field summary (``summary["needle"]``) as a table, one row per mode and cell.

    ``part="accuracy"``: the uncompressed model's accuracy and each role's with its Wilson interval (percent of the
    prompts). ``part="comparisons"``: each comparison as prompts won-lost with its verdict's word (exact McNemar,
    Holm over every mode, comparison and cell judged). Two tables, so each fits a text column. An empty frame when
    no needle rows were summed up."""
    from jacap_lib.verdicts.words import verdict_word

    if part not in ("accuracy", "comparisons"):
        raise ValueError(f"part must be 'accuracy' or 'comparisons', got {part!r}")
    short = {"better": "better", "worse": "worse", "no detectable difference": "n.d.", "identical": "identical"}
    pct = lambda x: f"{100 * x:.0f}"
    rows: dict = {}
    for mode, block in sorted(summary.get("modes", {}).items()):
        for cell in block["cells"]:
            row = rows.setdefault((mode, f"{cell['length']} / {float(cell['ratio']):g}"), {})
            if part == "accuracy":
                full = cell.get("uncompressed")
                row["uncompressed"] = "" if full is None else pct(full)
                for role, name in ROLE_NAMES.items():
                    a = cell["accuracy"].get(role)
                    row[name] = "" if a is None else f"{pct(a['accuracy'])} [{pct(a['low'])}, {pct(a['high'])}]"
                continue
            for t in cell["comparisons"]:
                column = f"{ROLE_NAMES[t['setting']]} vs {ROLE_NAMES[t['reference']]}"
                row[column] = f"{t['wins']}-{t['losses']} {short[verdict_word(t['verdict'])]}"
    frame = pd.DataFrame.from_dict(rows, orient="index").fillna("")
    if len(frame):
        frame.index = pd.MultiIndex.from_tuples(frame.index, names=["mode", "L / c"])
    return wrapped(frame)  # headers such as "default vs prompt press" wrap at their spaces

def ladder_figure(summary: dict, *, title: str | None = None) -> go.Figure:
    """Each ladder step's geometric-mean KL ratio to the step before, per cell, with its adjusted interval (log axis;
    below 1: the step lowers the KL). One colour per step, named by :data:`STEP_NAMES`."""
    cells = summary["cells"]
    if not cells:
        raise ValueError("summary has no cells: run `jacap evaluate kvzip-ladder-summary` on a finished ladder")
    steps = [s["step"] for s in cells[0]["steps"]]
    colours = setting_colours([STEP_NAMES.get(s, s) for s in steps])
    x = [f"{c['length']} / {float(c['ratio']):g}" for c in cells]
    fig = go.Figure()
    for step in steps:
        name = STEP_NAMES.get(step, step)
        vals = [next(s for s in c["steps"] if s["step"] == step) for c in cells]
        fig.add_trace(go.Bar(x=x, y=[v["gm_ratio"] for v in vals], name=name, marker={"color": colours[name]},
                             error_y={"type": "data", "symmetric": False,
                                      "array": [v["gm_high"] - v["gm_ratio"] for v in vals],
                                      "arrayminus": [v["gm_ratio"] - v["gm_low"] for v in vals]},
                             hovertemplate=f"{name}<br>%{{x}}: ratio %{{y:.3g}}<extra></extra>"))
    fig.add_hline(y=1, line={"color": "#444444", "dash": "dot"})
    fig.update_layout(barmode="group", height=540,
                      title=title or "From the prompt press to KVzip, one change at a time (tune documents)",
                      xaxis={"title": "prompt length L / compression ratio c"},
                      yaxis={"title": "KL ratio to the step before (log)", "type": "log"},
                      # the legend's top 125 px under the plot area: clear of the rotated tick labels and the x title
                      legend={"orientation": "v", "x": 0, "xanchor": "left", "y": -125 / (540 - 84 - 240),
                              "yanchor": "top"},
                      margin={"b": 240, "t": 84})  # t: a one-line title clear of plotly's mode bar
    return finish(fig)


def _names(specs) -> dict:
    from .evaluation import setting_names

    return setting_names(list(specs))


def _method_labels(methods) -> dict:
    """``{method: the name a reader sees}``: its tune choice's setting name (every space's choices), else the method."""
    from jacap_lib.results.loaders import load_all_chosen

    chosen = load_all_chosen()
    names = _names([chosen[m] for m in methods if m in chosen])
    return {m: names.get(chosen.get(m), m) for m in methods}


def field_heatmap(table: dict, *, title: str | None = None) -> go.Figure:
    """The whole field on the dev documents (``field_summary.json``'s ``table``,
    :func:`jacap_lib.experiments.field.field_table`): one row per method whose dev rows are complete, one column per
    cell, the colour and the printed number its geometric-mean KL ratio to the reference (KVzip) on a log scale
    centred at 1 (blue: lower KL than the reference; red: higher). Best overall at the top; methods whose rows are not
    complete are named under the plot."""
    import math
    import textwrap

    shown = [m for m in table["methods"] if m["complete"]]
    if not shown:
        raise ValueError("table has no method with complete dev rows: run `jacap evaluate dev` for the spaces first")
    names = _names([m["spec"] for m in table["methods"]])
    ref = names[table["reference_spec"]]
    cells = [(c["length"], c["ratio"]) for c in shown[0]["cells"]]
    x = [f"{L}<br>{c:g}" for L, c in cells]  # two short lines: twelve columns fit a text column unrotated
    rows = list(reversed(shown))  # plotly draws the first row at the bottom
    y = [f"{names[m['spec']]} ({m['gm_ratio']:.2f})" for m in rows]
    by = [{(c["length"], c["ratio"]): c["gm_ratio"] for c in m["cells"]} for m in rows]
    z = [[math.log2(b[cell]) if b.get(cell) else None for cell in cells] for b in by]
    text = [[f"{b[cell]:.2f}" if b.get(cell) else "" for cell in cells] for b in by]
    top = 3  # the colour scale spans ratios 1/8 to 8; larger ones take its end colour
    ticks = list(range(-top, top + 1))
    fig = go.Figure(go.Heatmap(
        x=x, y=y, z=z, text=text, texttemplate="%{text}", textfont={"size": 10}, zmin=-top, zmax=top, zmid=0,
        colorscale="RdBu_r", xgap=1, ygap=1,
        colorbar={"title": {"text": f"ratio to {ref}", "side": "right"}, "tickvals": ticks,
                  "ticktext": [f"{2.0 ** t:g}" for t in ticks], "len": 0.8},
        hovertemplate="%{y}<br>L, c = %{x}<br>KL ratio %{text}<extra></extra>"))
    left = [m["method"] for m in table["methods"] if not m["complete"]] + [m["method"] for m in table["missing"]]
    note = "<br>".join(textwrap.wrap(f"dev rows not complete yet: {', '.join(left)}", 90)) if left else None
    lines = note.count("<br>") + 1 if note else 0
    head = wrap_title(title or f"Every method's tune choice on the dev documents: KL ratio to {ref}", 48)
    title_extra = 22 * head.count("<br>")  # pixels for the title's second and later lines
    fig.update_layout(title=head,  # short lines: clear of the modebar
                      xaxis={"title": "prompt length L (upper line) and compression ratio c (lower line)",
                             "tickangle": 0, "type": "category"},
                      yaxis={"title": "method (its ratio over all cells)", "automargin": True},
                      height=190 + 26 * len(rows) + 16 * lines + title_extra,
                      margin={"l": 10, "r": 10, "b": 90 + 16 * lines, "t": 60 + title_extra})
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=0, yshift=-76, showarrow=False,
                           xanchor="left", yanchor="top", align="left", font={"size": 11})
    return finish(fig)


def field_needle_frame(needle: dict) -> pd.DataFrame:
    """Every method's needle accuracy (``field_summary.json``'s ``needle_table``,
    :func:`jacap_lib.experiments.field.field_needle`) as a table: one row per method (the uncompressed model first),
    one column per mode and c, each entry the percent of the prompts answered, pooled over the prompt lengths. A
    method without rows in a mode has an empty entry there."""
    modes = sorted(needle.get("modes", {}))
    if not modes:
        return pd.DataFrame()
    methods = sorted({m for mode in modes for m in needle["modes"][mode]["methods"]})
    label = _method_labels(methods)
    ratios = sorted({r["ratio"] for mode in modes for v in needle["modes"][mode]["methods"].values() for r in v})
    columns = [(mode, c) for mode in modes for c in ratios]
    rows = {"uncompressed": {}}
    for mode in modes:
        full = needle["modes"][mode]["uncompressed"]
        k = sum(u["accuracy"] * u["n"] for u in full)
        n = sum(u["n"] for u in full)
        for c in ratios:
            rows["uncompressed"][(mode, c)] = f"{100 * k / n:.0f}" if n else ""
        for m, values in needle["modes"][mode]["methods"].items():
            for v in values:
                rows.setdefault(label[m], {})[(mode, v["ratio"])] = f"{100 * v['accuracy']:.0f}"
    order = ["uncompressed"] + sorted((k for k in rows if k != "uncompressed"),
                                      key=lambda k: -sum(float(v or 0) for v in rows[k].values()))
    frame = pd.DataFrame([[rows[k].get(col, "") for col in columns] for k in order], index=order,
                         columns=pd.MultiIndex.from_tuples([(f"question {m}", f"c = {c:g}") for m, c in columns]))
    frame.index.name = "method"
    return wrapped(frame)


def field_needle_note(needle: dict) -> str:
    """The line under :func:`field_needle_frame`: which methods a mode leaves out because they have not answered all
    their prompts there yet (``partial``, with how many rows they have so far), or that none is left out."""
    modes = needle.get("modes", {})
    missing: dict = {}  # method -> {mode: its rows there so far}
    for mode in sorted(modes):
        for m, n in modes[mode].get("partial", {}).items():
            missing.setdefault(m, {})[mode] = n
    if not missing:
        return "No method is left out: each one shown has answered all its prompts in every mode it has rows in."
    label = _method_labels(missing)
    parts = []
    for m, per_mode in sorted(missing.items()):
        counts = " and ".join(f"{n} answers so far with the question {mode}" for mode, n in per_mode.items())
        parts.append(f"{label[m]} ({counts})")
    return ("Left out where its prompts are not all answered yet: " + "; ".join(parts) + ".")


def not_offline_frame() -> pd.DataFrame:
    """kvpress's presses that cannot run offline on the bundled model, one row each with the reason
    (:data:`jacap_lib.presses.registry.NOT_OFFLINE`), the reason wrapped to the column."""
    from ..presses.registry import NOT_OFFLINE

    frame = pd.DataFrame([{"press": k, "why it cannot run here": v} for k, v in NOT_OFFLINE.items()])
    return wrapped(frame.set_index("press"), ["why it cannot run here"])
