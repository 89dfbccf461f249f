"""Figures and tables of the anatomy of the losing cells (``data/results/eval/anatomy.json``, read with
:func:`jacap_lib.results.loaders.load_anatomy`; the statistics are :mod:`jacap_lib.verdicts.rows`').

* :func:`layer_ratio_figure` — per losing cell, the per-layer attention-output error ratio (default / best
  baseline) with its 95 % interval, for all documents and one kind;
* :func:`position_figure` — where the tokens kept by only one of the two presses lie (distance from the end of
  the prompt), for all documents and per kind;
* :func:`swap_figure` — the paired KL ratio of each one-knob swap to the default, with its interval;
* :func:`kind_frame`, :func:`category_frame`, :func:`swap_frame` — the same numbers as tables
  (:func:`swap_setting_lines`: the key to the swap's settings).
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from jacap_lib.verdicts.rows import LADDER_ONLY
from .style import FIGURE_WIDTH as _WIDTH
from .style import finish, forest_ticks, log_tickvals, method_style, setting_colours, wrap_title, wrapped
from .style import setting_colour as _method_colour

__all__ = ["layer_ratio_figure", "position_figure", "swap_figure", "kind_frame", "kind_pair_frame", "category_frame", "swap_frame",
           "swap_setting_lines",
           "log_tickvals", "distance_labels",
           "loss_frame", "kind_figure", "swap_forest", "ladder_figure", "kept_position_figure", "named_layer_figure",
           "ablation_count_figure"]

_KIND_DASH = {"all": "solid", "dialogue": "dash", "prose": "dot", "expository": "dashdot", "code": "longdash"}



def _label(spec: str) -> str:
    """A setting's spec as a reader sees it: the part before a ``+wrapper`` by what sets it apart
    (:func:`~jacap_lib.experiments.names.short_spec`), the wrapper part as it is."""
    from jacap_lib.experiments.anatomy import split_wrapper
    from jacap_lib.experiments.names import short_spec

    base, wrapper = split_wrapper(spec)
    return short_spec(base) + wrapper

def _row_name(key: str) -> str:
    """A swap setting's row in a figure: its key as words (``window_attention_centre`` -> ``window attention centre``); the spec
    behind it is printed by :func:`swap_setting_lines`."""
    return key.replace("_", " ")


def distance_labels(edges) -> list[str]:
    """``"0–7"``, ``"8–31"``, ... for the bins ``[edges[k], edges[k+1])`` of distance from the end."""
    return [f"{a}–{b - 1}" for a, b in zip(edges[:-1], edges[1:])]


def layer_ratio_figure(data: dict, *, kinds=("all", "dialogue"), cells=None) -> go.Figure:
    """Per losing cell (one panel each), the geometric-mean ratio over the documents of the default's per-layer
    attention-output error to the best baseline's, with its 95 % interval (band), for each kind of ``kinds``
    (``"all"``: every document). Above 1: the default's error is larger in that layer."""
    entries = [e for e in data["layers"] if e["kind"] in kinds and (cells is None or e["cell"] in cells)]
    if not entries:
        raise ValueError(f"no per-layer entries for kinds {kinds} and cells {cells}")
    names = list(dict.fromkeys(e["cell"] for e in entries))
    meta = {e["cell"]: e for e in entries}
    ncol = 2 if len(names) > 1 else 1
    nrow = math.ceil(len(names) / ncol)
    one_baseline = len({e["baseline"] for e in entries}) == 1  # then named once, in the figure's title
    titles = [f"prompt {meta[n]['length']}, c = {meta[n]['ratio']:g}"
              + ("" if one_baseline else f" vs {meta[n]['baseline']}") for n in names]
    fig = make_subplots(rows=nrow, cols=ncol, subplot_titles=titles, shared_xaxes=True, shared_yaxes=True,
                        vertical_spacing=0.09 if nrow > 2 else 0.15, horizontal_spacing=0.06)
    setting = entries[0]["setting"]
    labels = {k: "all documents" if k == "all" else k for k in dict.fromkeys(e["kind"] for e in entries)}
    colours = setting_colours(list(labels.values()))  # one colour per kind of documents (the style's one mapping)
    allv = []
    for i, name in enumerate(names):
        row, col = i // ncol + 1, i % ncol + 1
        for e in (x for x in entries if x["cell"] == name):
            lay = [x["layer"] for x in e["layers"]]
            est, lo, hi = ([x[k] for x in e["layers"]] for k in ("ratio", "low", "high"))
            allv += lo + hi
            dash = _KIND_DASH.get(e["kind"], "solid")
            label = labels[e["kind"]]
            color = colours[label]
            if e["kind"] == "all":
                rgb = plotly.colors.hex_to_rgb(color)
                fig.add_trace(go.Scatter(x=lay + lay[::-1], y=hi + lo[::-1], fill="toself", mode="lines",
                                         line={"width": 0}, fillcolor=f"rgba({rgb[0]},{rgb[1]},{rgb[2]},0.15)",
                                         hoverinfo="skip", name=label, legendgroup=label, showlegend=False),
                              row=row, col=col)
            fig.add_trace(go.Scatter(x=lay, y=est, mode="lines+markers", name=label, legendgroup=label,
                                     showlegend=i == 0, line={"color": color, "dash": dash},
                                     marker={"color": color, "size": 4},
                                     customdata=list(zip(lo, hi)),
                                     hovertemplate="layer %{x}: %{y:.2f} [%{customdata[0]:.2f}, %{customdata[1]:.2f}]"),
                          row=row, col=col)
        fig.add_hline(y=1, line={"color": "black", "width": 1}, row=row, col=col)
    ticks = log_tickvals(allv + [1])
    fig.update_yaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks], matches="y")
    for i in range(len(names)):
        row, col = i // ncol + 1, i % ncol + 1
        fig.update_xaxes(title_text="layer", row=row, col=col, showticklabels=True)
        fig.update_yaxes(title_text="error ratio", row=row, col=col)
    against = entries[0]["baseline"] if one_baseline else "best baseline"
    title = wrap_title(f"Per-layer attention-output error ratio<br>{_label(setting)}<br>/ {_label(against)}", 56)
    top = 60 + 26 * (title.count("<br>") + 1)  # the title's lines (centred in the top margin), then the panel titles
    fig.update_layout(title=title,
                      height=250 * nrow + 30 + top, width=780, legend={"orientation": "h", "y": -0.06, "x": 0},
                      margin={"l": 60, "r": 20, "b": 80, "t": top})
    return finish(fig)


def position_figure(data: dict, *, groups=None) -> go.Figure:
    """Where the tokens kept by only one press lie: the share of them in each bin of distance from the end of
    the prompt, for Algorithm 1's tuned Jacap setting ("kept by Jacap only") and the baseline ("kept by the baseline
    only"); one panel per group of documents (default: all, dialogue, the other kinds)."""
    from jacap_lib.verdicts.rows import kept_summary

    docs = data["documents"]
    if groups is None:
        groups = {"all documents": None, "dialogue": ["dialogue"],
                  "other kinds": sorted({d["kind"] for d in docs} - {"dialogue"})}
    cfg = data["config"]
    fig = make_subplots(rows=1, cols=len(groups), subplot_titles=list(groups), shared_yaxes=True,
                        horizontal_spacing=0.04)
    labels = None
    for i, (title, kinds) in enumerate(groups.items(), 1):
        sel = [d for d in docs if kinds is None or d["kind"] in kinds]
        s = kept_summary(sel)
        labels = distance_labels(s["edges"])
        last = max(k for k in range(len(labels)) if s["a_only"][k] + s["b_only"][k] > 0) + 1
        for side, spec, what in (("b_only", cfg["baseline"], "kept by the baseline only"),
                                 ("a_only", cfg["default"], "kept by Algorithm 1 tuned only")):
            # one colour per press in every panel, the press's own (the legend names it once)
            fig.add_trace(go.Bar(x=labels[:last], y=s[side][:last], name=f"{what} ({_label(spec)})",
                                 legendgroup=side, showlegend=i == 1, marker={"color": method_style(_label(spec))["color"]},
                                 hovertemplate="%{x} from the end: %{y:.1%}"), row=1, col=i)
        fig.update_xaxes(title_text="distance from the end", tickangle=-60, row=1, col=i)
        fig.layout.annotations[i - 1].text = f"{title} ({s['n_docs']} documents)"
    fig.update_yaxes(title_text="share of the tokens kept by one only", tickformat=".0%", row=1, col=1)
    fig.update_layout(title=f"Where the two kept sets differ: prompt {cfg['length']}, c = {cfg['ratio']:g}",
                      barmode="group", height=500, width=780,
                      legend={"orientation": "h", "y": -0.42, "x": 0, "yanchor": "top"},
                      margin={"b": 170, "t": 90})
    return finish(fig)


def _groups_of(docs):
    kinds = sorted({d["kind"] for d in docs})
    out = {"all documents": None}
    for k in kinds:
        if sum(d["kind"] == k for d in docs) >= 3:
            out[k] = [k]
    rest = [k for k in kinds if k not in out]
    if rest and sum(d["kind"] in rest for d in docs) >= 3 and rest != kinds:
        out["other kinds"] = rest
    return out


def swap_frame(data: dict, *, kinds=None) -> pd.DataFrame:
    """Each swap setting's KL / the default's KL (geometric mean over the documents, 95 % interval, documents
    where it is lower) per group of documents; ``kinds``: ``{label: [kinds] or None}``."""
    from jacap_lib.verdicts.rows import swap_ratios

    settings = {s["key"]: s for s in data["config"]["settings"]}
    groups = kinds or _groups_of(data["documents"])
    rows = []
    for label, ks in groups.items():
        sel = [d for d in data["documents"] if ks is None or d["kind"] in ks]
        for r in swap_ratios(sel):
            if r["key"] == "default" or r["key"] in LADDER_ONLY:
                continue
            rows.append({"documents": f"{label} (n={r['n']})", "setting": r["key"],
                         "KL / Algorithm 1 tuned [95% CI]": f"{r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}]",
                         "lower": f"{r['lower']}/{r['n']}"})
    return pd.DataFrame(rows).set_index(["documents", "setting"])


def swap_setting_lines(data: dict) -> list[str]:
    """The key to :func:`swap_frame`'s ``setting`` column: each setting's key, press spec and what it changes."""
    return [f"{s['key']} = {s['spec']}: {s['changes']}" for s in data["config"]["settings"]
            if s["key"] != "default" and s["key"] not in LADDER_ONLY]


def swap_figure(data: dict) -> go.Figure:
    """The paired KL ratio of each swap setting to the default (geometric mean over the documents, 95 % interval;
    below 1: the change lowers the default's KL), for all documents and per group of kinds."""
    from jacap_lib.verdicts.rows import swap_ratios

    settings = [s for s in data["config"]["settings"] if s["key"] != "default" and s["key"] not in LADDER_ONLY]
    groups = _groups_of(data["documents"])
    fig = make_subplots(rows=len(groups), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{g} ({sum(ks is None or d['kind'] in ks for d in data['documents'])} documents)"
                                        for g, ks in groups.items()])
    allv = []
    ylabels = [_row_name(s["key"]) for s in settings]
    for i, (g, ks) in enumerate(groups.items(), 1):
        sel = [d for d in data["documents"] if ks is None or d["kind"] in ks]
        by = {r["key"]: r for r in swap_ratios(sel)}
        for s in settings:
            r = by[s["key"]]
            allv += [r["low"], r["high"]]
            fig.add_trace(go.Scatter(x=[r["ratio"]], y=[_row_name(s["key"])], mode="markers", name=_label(s["spec"]),
                                     legendgroup=s["spec"], showlegend=False, marker={"size": 9},
                                     error_x={"type": "data", "symmetric": False, "array": [r["high"] - r["ratio"]],
                                              "arrayminus": [r["ratio"] - r["low"]]},
                                     hovertemplate=f"{s['changes']}: %{{x:.2f}} [{r['low']:.2f}, {r['high']:.2f}]"),
                          row=i, col=1)
        fig.add_vline(x=1, line={"color": "black", "width": 1}, row=i, col=1)
        fig.update_xaxes(title_text="KL / Algorithm 1 tuned's KL" if i == len(groups) else None, showticklabels=True,
                         row=i, col=1)
    ticks = log_tickvals(allv + [1])
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    fig.update_yaxes(categoryorder="array", categoryarray=ylabels[::-1], title_text="setting")
    for tr in fig.data:  # method colours by spec
        st = method_style(tr.name)
        tr.marker.color = st["color"]
        tr.error_x.color = st["color"]
    cfg = data["config"]
    fig.update_layout(title=f"One knob at a time: KL relative to Algorithm 1 tuned, prompt {cfg['length']}, "
                            f"c = {cfg['ratio']:g}",
                      height=150 + len(groups) * (60 + 26 * len(settings)), width=780, margin={"l": 300, "t": 90})
    return finish(fig)


def kind_frame(data: dict) -> pd.DataFrame:
    """Per losing cell and document kind: the default's KL ratio to the best baseline (geometric mean, 95 %
    interval) and the documents lost / won."""
    rows = []
    for e in data["kinds"]:
        for k in e["kinds"]:
            rows.append({"prompt": e["length"], "c": e["ratio"], "baseline": e["baseline"], "kind": k["kind"],
                         "KL ratio [95% CI]": f"{k['ratio']:.2f} [{k['low']:.2f}, {k['high']:.2f}]",
                         "lost/won": f"{k['losses']}/{k['wins']}"})
    return wrapped(pd.DataFrame(rows).set_index(["prompt", "c", "kind"]), ["baseline"])


def kind_pair_frame(rows: list[dict]) -> pd.DataFrame:
    """:func:`jacap_lib.verdicts.rows.kind_pairs` as a table: one row per cell and pair, with the geometric-mean KL
    ratio, its 95 % interval and the verdict of the interval adjusted for the cells (in short words)."""
    from .evaluation import short_verdict

    frame = pd.DataFrame([{"prompt": r["length"], "c": r["ratio"], "pair": r["pair"],
                           "KL ratio [95 % CI]": f"{r['gm_ratio']:.2f} [{r['gm_low']:.2f}, {r['gm_high']:.2f}]",
                           "verdict (adjusted)": short_verdict(r["verdict"])} for r in rows])
    return wrapped(frame.set_index(["prompt", "c", "pair"]), ["pair", "verdict (adjusted)"])


def category_frame(data: dict, *, kinds=None) -> pd.DataFrame:
    """What the tokens kept by one press only are: the share of each token category among the tokens kept by the
    baseline only, by Jacap only, and among the prompt's tokens (``kinds``: only documents of these kinds)."""
    from jacap_lib.verdicts.rows import kept_summary

    docs = [d for d in data["documents"] if kinds is None or d["kind"] in kinds]
    s = kept_summary(docs)
    rows = [{"category": c, "kept by the baseline only": f"{s['b_only_categories'][c]:.1%}",
             "kept by Jacap only": f"{s['a_only_categories'][c]:.1%}", "share of the prompt": f"{s['prompt_categories'][c]:.1%}"}
            for c in s["prompt_categories"]]
    return pd.DataFrame(rows).set_index("category")


# --------------------------------------------------------------------------------------------- the book's figures
# The figures below name every setting as the book does (results.findings.spec_name in plain text / results.anatomy
# swap_name), never by its written-out spec,
# and draw a method in its own colour (style.METHOD_STYLES): Algorithm 1 tuned, the default, Expected Attention.

def loss_frame(rows: list[dict]) -> pd.DataFrame:
    """:func:`jacap_lib.experiments.anatomy.loss_rows` as a table: per losing cell, the verdict of the interval adjusted
    for the table's cells, the verdict of the cell's own 95 % interval, the documents lost / won, and how many of the
    kept tokens the score chooses (0: protection fills the budget). The baseline's column (``against``) only when the
    cells have different baselines."""
    from jacap_lib.experiments.names import spec_name

    out = []
    for r in rows:
        chosen = (f"0 of {r['kept']}: protection fills the budget" if r["fills"]
                  else f"{r['scored']} of {r['kept']}")
        out.append({"prompt / c": f"{r['length']} / {r['ratio']:g}", "against": spec_name(r["baseline"], legend=True),
                    "adjusted": r["adjusted"], "own 95 %": r["own"], "lost/won": f"{r['losses']}/{r['wins']}",
                    "tokens the score chooses": chosen})
    frame = pd.DataFrame(out).set_index("prompt / c")
    if frame["against"].nunique() == 1:  # one baseline in every cell: the text names it once
        frame = frame.drop(columns="against")
    return wrapped(frame, ["tokens the score chooses"])


def _kind_colours(labels) -> dict[str, str]:
    """One colour per kind of documents: "all documents" and "dialogue" as :func:`layer_ratio_figure` draws them
    (the first two setting colours), the other kinds the next setting colours but Jacap's red."""
    from .style import SETTING_COLOURS

    fixed = {"all documents": SETTING_COLOURS[0], "dialogue": SETTING_COLOURS[1]}
    rest = iter(c for c in SETTING_COLOURS[2:] if c != "#d62728")
    return {k: fixed[k] if k in fixed else next(rest) for k in labels}


def kind_figure(part: dict, *, fills=None) -> go.Figure:
    """Per losing cell of ``part`` (``anatomy.json``, or its ``library_default`` part; one row each) and document
    kind (one colour each), the paired geometric-mean KL ratio of the setting to the best baseline with its 95 %
    interval (12 dev documents per kind). ``fills``: ``{(length, ratio): bool}``, cells where the setting's
    protection fills the budget, marked "(protection fills)" in the row's label."""
    from jacap_lib.experiments.names import spec_name

    entries = part["kinds"]
    kinds = [k["kind"] for k in entries[0]["kinds"]]
    labels = {k: "all documents" if k == "all" else k for k in kinds}
    colours = _kind_colours(list(labels.values()))
    fills = fills or {}
    rows = [f"{e['length']} / {e['ratio']:g}" + (" (protection fills)" if fills.get((e["length"], e["ratio"])) else "")
            for e in entries]
    fig = go.Figure()
    step = 0.8 / max(len(kinds) - 1, 1)
    allv = []
    for j, kind in enumerate(kinds):
        ys, xs, lo, hi, text = [], [], [], [], []
        for i, e in enumerate(entries):
            k = next(x for x in e["kinds"] if x["kind"] == kind)
            ys.append(i - 0.4 + j * step)
            xs.append(k["ratio"])
            lo.append(k["ratio"] - k["low"])
            hi.append(k["high"] - k["ratio"])
            allv += [k["low"], k["high"]]
            text.append(f"{rows[i]}, {labels[kind]} (n={k['n']}): %{{x:.2f}} [{k['low']:.2f}, {k['high']:.2f}]")
        colour = colours[labels[kind]]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=labels[kind], marker={"color": colour, "size": 7},
                                 error_x={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo,
                                          "color": colour, "thickness": 1.2},
                                 hovertext=text, hovertemplate="%{hovertext}<extra></extra>"))
    fig.add_vline(x=1, line={"color": "black", "width": 1})
    ticks = log_tickvals(allv + [1])
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks],
                     title_text="KL ratio (geometric mean over the documents)")
    fig.update_yaxes(tickvals=list(range(len(rows))), ticktext=rows, autorange="reversed", title_text="prompt / c")
    setting, baseline = spec_name(entries[0]["setting"], legend=True), spec_name(entries[0]["baseline"], legend=True)
    fig.update_layout(title=f"KL of {setting} / KL of {baseline}, per document kind (95 % intervals)",
                      height=140 + 46 * len(rows), width=_WIDTH, margin={"l": 190, "t": 80, "b": 110},
                      legend={"orientation": "h", "y": -0.12 - 2.0 / (len(rows) + 3), "x": 0, "yanchor": "top"})
    return finish(fig)


def _forest(rows: list[dict], groups: list[str], colour_of, legend_of, *, title: str, xtitle: str,
            ytitle: str) -> go.Figure:
    """One panel per group: each row a point at its ratio with its (adjusted) interval; filled where the interval
    excludes 1, open where it holds 1; the colour and legend entry of a row from ``colour_of`` / ``legend_of``."""
    names = list(dict.fromkeys(r["name"] for r in rows))
    n_of = {g: next(r["n"] for r in rows if r["group"] == g) for g in groups}
    fig = make_subplots(rows=1, cols=len(groups), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"{g} ({n_of[g]})" for g in groups])
    shown, allv = set(), []
    for col, g in enumerate(groups, 1):
        for r in (x for x in rows if x["group"] == g):
            allv += [r["low"], r["high"]]
            excl = r["low"] > 1 or r["high"] < 1
            colour, legend = colour_of(r), legend_of(r)
            if legend not in shown:  # the legend's entry: a filled marker and a line in the row's colour
                fig.add_trace(go.Scatter(x=[None], y=[r["name"]], mode="lines+markers", name=legend,
                                         legendgroup=legend, marker={"color": colour, "size": 9, "symbol": "circle"},
                                         line={"color": colour}, hoverinfo="skip"), row=1, col=col)
            fig.add_trace(go.Scatter(
                x=[r["ratio"]], y=[r["name"]], mode="markers", name=legend, legendgroup=legend,
                showlegend=False,
                marker={"color": colour, "size": 9, "symbol": "circle" if excl else "circle-open",
                        "line": {"color": colour, "width": 1.5}},
                error_x={"type": "data", "symmetric": False, "array": [r["high"] - r["ratio"]],
                         "arrayminus": [r["ratio"] - r["low"]], "color": colour, "thickness": 1.5},
                hovertemplate=f"{r['name']}, {g}: %{{x:.2f}} [{r['low']:.2f}, {r['high']:.2f}]; {r['verdict']}; lower on "
                              f"{r['lower']} of {r['n']}<extra></extra>"), row=1, col=col)
            shown.add(legend)
        fig.add_vline(x=1, line={"color": "black", "width": 1}, row=1, col=col)
    lo, hi = min(allv + [1]), max(allv + [1])
    ticks = forest_ticks(lo, hi)
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks], tickangle=0,
                     range=[math.log10(lo) - 0.05, math.log10(hi) + 0.05])
    fig.update_xaxes(title_text=xtitle)  # every panel: its own axis title
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1])
    fig.update_yaxes(title_text=ytitle, row=1, col=1)
    height = 200 + 30 * len(names)
    fig.update_layout(title=title, height=height, width=_WIDTH, margin={"l": 260, "r": 20, "t": 90, "b": 120},
                      legend={"orientation": "h", "y": -70 / (height - 210), "x": 0, "yanchor": "top"})
    return finish(fig)


def swap_forest(data: dict) -> go.Figure:
    """The one-knob swaps of ``anatomy.json`` as a forest plot: per group of documents (all, dialogue, the other
    kinds), each setting's paired KL ratio to Algorithm 1 tuned with its interval adjusted for the settings judged
    together (:func:`jacap_lib.experiments.anatomy.swap_verdicts`); a change of Jacap's score in Algorithm 1 tuned's
    colour, Expected Attention's score in its own; filled: the interval excludes 1."""
    from jacap_lib.experiments.anatomy import swap_verdicts
    from jacap_lib.experiments.names import spec_name

    cfg = data["config"]
    rows = swap_verdicts(data["documents"])
    a_col, b_col = _method_colour(cfg["default"]), _method_colour(cfg["baseline"])
    a_name, b_name = spec_name(cfg["default"], legend=True), spec_name(cfg["baseline"], legend=True)
    ea = {"baseline", "baseline_jacap_protection"}
    conf = rows[0]["confidence"]
    return _forest(rows, list(dict.fromkeys(r["group"] for r in rows)),
                   lambda r: b_col if r["key"] in ea else a_col,
                   lambda r: f"{b_name}'s score" if r["key"] in ea else f"{a_name}, one change",
                   title=f"One change at a time: KL / KL of {a_name}, prompt {cfg['length']}, c = {cfg['ratio']:g} "
                         f"({100 * conf:.1f} % intervals, adjusted)",
                   xtitle="KL ratio", ytitle="one change")


def ladder_figure(data: dict) -> go.Figure:
    """The ladder of ``anatomy.json`` from Algorithm 1 tuned's score to Expected Attention's (under Jacap's
    protection), one knob per rung: per group of documents, each rung's KL / the KL of the rung before it, with its
    interval adjusted for the rungs of a group (:func:`jacap_lib.experiments.anatomy.ladder_verdicts`)."""
    from jacap_lib.experiments.anatomy import ladder_verdicts
    from jacap_lib.experiments.names import spec_name

    cfg = data["config"]
    rows = ladder_verdicts(data["documents"])
    a_col, b_col = _method_colour(cfg["default"]), _method_colour(cfg["baseline"])
    a_name, b_name = spec_name(cfg["default"], legend=True), spec_name(cfg["baseline"], legend=True)
    last = rows[-1]["key"]
    conf = rows[0]["confidence"]
    return _forest(rows, list(dict.fromkeys(r["group"] for r in rows)),
                   lambda r: b_col if r["key"] == last else a_col,
                   lambda r: f"the last rung: {b_name}'s score" if r["key"] == last else "a rung of the ladder",
                   title=f"From {a_name}'s score to {b_name}'s: each rung / the rung before "
                         f"({100 * conf:.0f} % intervals, adjusted)",
                   xtitle="KL ratio", ytitle="rung")


def kept_position_figure(data: dict) -> go.Figure:
    """:func:`position_figure` with the book's names and each press in its own colour (Algorithm 1 tuned's,
    Expected Attention's)."""
    from jacap_lib.experiments.names import spec_name

    cfg = data["config"]
    fig = position_figure(data)
    for tr in fig.data:
        spec = cfg["baseline"] if tr.legendgroup == "b_only" else cfg["default"]
        tr.name = f"kept by {spec_name(spec, legend=True)} only"
        tr.marker.color = _method_colour(spec)
    fig.update_layout(width=_WIDTH, margin={"l": 70, "r": 20})
    return fig


def named_layer_figure(data: dict, **kw) -> go.Figure:
    """:func:`layer_ratio_figure` titled with the book's names of the two settings."""
    from jacap_lib.experiments.names import spec_name

    fig = layer_ratio_figure(data, **kw)
    e = data["layers"][0]
    fig.layout.title.text = wrap_title(f"Attention-output error per layer: {spec_name(e['setting'], legend=True)} / "
                                       f"{spec_name(e['baseline'], legend=True)}", 56)
    fig.update_layout(width=_WIDTH, margin={"l": 60, "r": 20})
    return fig


_VERDICT_COLOURS = {"better": "#2166ac", "no detectable difference": "#bdbdbd", "identical": "#f4a582",
                    "worse": "#b2182b"}


def ablation_count_figure(summaries: list[dict]) -> go.Figure:
    """Per one-knob ablation of the tune documents (:func:`jacap_lib.experiments.record.ablation_counts`), the cells
    where it lowers the KL against its base, makes no detectable difference, is identical, or raises it (verdicts
    of the intervals adjusted for each compression ratio's comparisons)."""
    from jacap_lib.experiments.record import ablation_counts

    counts = ablation_counts(summaries)
    labels = list(counts)[::-1]
    fig = go.Figure()
    for word, colour in _VERDICT_COLOURS.items():
        fig.add_trace(go.Bar(y=labels, x=[counts[a].get(word, 0) for a in labels], orientation="h", name=word,
                             marker={"color": colour}, hovertemplate=f"%{{y}}: {word} in %{{x}} cells<extra></extra>"))
    n = max(sum(c.values()) for c in counts.values())
    fig.update_layout(barmode="stack", title="Each component replaced alone: verdicts over the cells (tune documents)",
                      xaxis={"title": "cells", "dtick": 1, "range": [0, n]}, yaxis={"title": "ablation"},
                      height=160 + 24 * len(labels), width=_WIDTH, margin={"l": 160, "r": 20, "t": 80, "b": 120},
                      legend={"orientation": "h", "y": -0.55 * 100 / (100 + 24 * len(labels)) - 0.1, "x": 0,
                              "yanchor": "top"})
    return finish(fig)
