"""Tables and figures of the evaluation (``data/results/eval``: the tune choices, the test rows, the summary).

Inputs come from :mod:`jacap_lib.results.loaders` (``load_eval_choices``, ``load_eval_rows``,
``load_eval_summary``, ``load_needle_summary``) and :func:`jacap_lib.results.evaluation.cell_statistics`; tables are
:class:`pandas.DataFrame` objects, figures ``go.Figure`` finished by :func:`~jacap_lib.viz.style.finish`.
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import finish

__all__ = ["split_frame", "corpus_frame", "choices_frame", "verdict_frame", "pair_frame", "target_frame", "kl_figure",
           "cells_frame",
           "needle_frame", "needle_verdict_frame"]


def _interval(est, lo, hi) -> str:
    """An estimate and its interval as table text: ``0.886 [0.834, 0.934]``."""
    return f"{est:.3f} [{lo:.3f}, {hi:.3f}]"


def _setting_by_cell(table: dict) -> pd.DataFrame:
    """``{setting: {"prompt / c": text}}`` as a table, one row per setting, one column per cell."""
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.name = "setting"
    frame.columns.name = "prompt / c"
    return frame


def split_frame(split: dict) -> pd.DataFrame:
    """``{"prompt / c": JacapPress.budget_split(prompt)}`` as a table: kept slots, sinks, window, and how many
    the score chose (and that share of the budget)."""
    rows = [{"prompt / c": k, "kept": v["kept"], "sinks": v["sinks"], "window": v["window"], "chosen by the score":
             v["scored"], "share chosen by the score": f"{v['scored'] / v['kept']:.0%}"} for k, v in split.items()]
    return pd.DataFrame(rows).set_index("prompt / c")


def corpus_frame(documents: list[dict]) -> pd.DataFrame:
    """Documents per kind and split (``documents``: a run's ``documents`` records: id, kind, split, source,
    licence), with the licences met."""
    rows: dict = {}
    for d in documents:
        row = rows.setdefault(d.get("kind") or "?", {"tune": 0, "test": 0, "licences": set()})
        row[d["split"]] += 1
        if d.get("license"):
            row["licences"].add(str(d["license"]))
    frame = pd.DataFrame([{"kind": k, "tune": v["tune"], "test": v["test"], "licences": ", ".join(sorted(v["licences"]))}
                          for k, v in rows.items()]).set_index("kind")
    return frame


def pair_frame(rows: list[dict]) -> pd.DataFrame:
    """:func:`~jacap_lib.results.evaluation.compare_settings` rows as a table: per (prompt, c) the
    geometric-mean and mean-KL ratios with 95 % intervals, wins/losses, Holm p, verdict."""
    return pd.DataFrame([{"prompt": r["length"], "c": r["ratio"],
                          "geometric-mean ratio [95% CI]": _interval(r["gm_ratio"], r["gm_low"], r["gm_high"]),
                          "mean-KL ratio [95% CI]": _interval(r["mean_ratio"], r["mean_low"], r["mean_high"]),
                          "wins/losses": f"{r['wins']}/{r['losses']}", "Holm p": f"{r['p_holm']:.2g}",
                          "verdict": r["verdict"]} for r in rows]).set_index(["prompt", "c"])


def target_frame(status: list[dict]) -> pd.DataFrame:
    """:func:`~jacap_lib.results.evaluation.target_status` rows as a table: per (prompt, c) what the target asks,
    the best baseline, the geometric-mean ratio with its 95 % interval, the verdict, whether it is met, and by
    how far the interval misses (in % of the baseline's KL)."""
    return pd.DataFrame([{"prompt": r["length"], "c": r["ratio"], "target": r["requirement"],
                          "best baseline (picked on tune)": r["baseline"] or "",
                          "geometric-mean ratio [95% CI]": "" if r["gm_ratio"] is None else
                          _interval(r["gm_ratio"], r["gm_low"], r["gm_high"]), "verdict": r["verdict"],
                          "met": {True: "yes", False: "no", None: "not measured"}[r["met"]],
                          "missed by": "" if not r["shortfall"] else f"{100 * r['shortfall']:.1f} %"}
                         for r in status]).set_index(["c", "prompt"])


def choices_frame(choices: dict) -> pd.DataFrame:
    """One row per method: its candidate settings with the rule's score as a geometric-mean KL over every tune
    (document, length, ratio) — ``exp(score)`` nats — the chosen one marked."""
    rows = []
    for method, ch in choices["choices"].items():
        for cand in ch["candidates"]:
            rows.append({"method": method, "setting": cand["spec"],
                         "tune geometric-mean KL (nats)": round(math.exp(cand["score"]), 4),
                         "chosen": "yes" if cand["spec"] == ch["chosen"] else ""})
    return pd.DataFrame(rows).set_index(["method", "setting"])


def verdict_frame(summary: dict, *, picked_on: str = "tune", role: str | None = None) -> pd.DataFrame:
    """One row per (Jacap setting, length, ratio) of the summary's families picked on ``picked_on``
    ("tune": the protocol's line; "test": the stricter one): the baseline, the geometric-mean and mean-KL
    ratios with their 95 % intervals, wins/losses over the test documents, Holm-adjusted Wilcoxon p, verdict.
    ``role``: only that Jacap setting's family ("default", "paper preset", ...)."""
    rows = []
    for fam in summary["families"]:
        if fam["picked_on"] != picked_on or (role is not None and fam["role"] != role):
            continue
        for r in fam["rows"]:
            rows.append({"Jacap setting": f"{fam['setting']} ({fam['role']})", "prompt": r["length"], "c": r["ratio"],
                         "best baseline": r["baseline_spec"],
                         "geometric-mean ratio [95% CI]": _interval(r["gm_ratio"], r["gm_low"], r["gm_high"]),
                         "mean-KL ratio [95% CI]": _interval(r["mean_ratio"], r["mean_low"], r["mean_high"]),
                         "wins/losses": f"{r['wins']}/{r['losses']}", "Holm p": f"{r['p_holm']:.2g}",
                         "verdict": r["verdict"]})
    if not rows:
        raise ValueError(f"summary has no family picked on {picked_on!r}" + (f" with role {role!r}" if role else ""))
    return pd.DataFrame(rows).set_index(["Jacap setting", "prompt", "c"])


def cells_frame(cells: list[dict], *, value: str = "kl_geomean") -> pd.DataFrame:
    """``cell_statistics`` rows as a table: one row per setting, one column per (prompt, c), ``value`` in each
    ("kl_geomean" with its interval, "top1_agreement" or "attn_rel_error")."""
    table: dict = {}
    for c in cells:
        col = f"{c['length']} / {c['ratio']}"
        txt = (_interval(c["kl_geomean"], c["kl_low"], c["kl_high"]) if value == "kl_geomean"
               else f"{c[value]:.3f}")
        table.setdefault(c["method"], {})[col] = txt
    return _setting_by_cell(table)


def kl_figure(cells: list[dict], *, title: str | None = None) -> go.Figure:
    """Geometric-mean KL (log axis) against c, one panel per prompt length, one line per setting, with
    95 % bootstrap intervals over the documents (``cells``: :func:`~jacap_lib.results.evaluation.cell_statistics`).

    The ratios are evenly spaced categories (``0.5, 0.75, 0.9, 0.95`` one step apart), so the high ratios, where
    the methods separate, are as wide as the low ones instead of bunched at the right edge of a linear axis."""
    if not cells:
        raise ValueError("cells is empty; give cell_statistics rows of a finished run")
    ratios = [f"{r:g}" for r in sorted({c["ratio"] for c in cells})]
    lengths = sorted({c["length"] for c in cells})
    methods = list(dict.fromkeys(c["method"] for c in cells))
    n_docs = sorted({c["n_docs"] for c in cells})
    fig = make_subplots(rows=1, cols=len(lengths), shared_yaxes=True,
                        subplot_titles=[f"prompt {L} tokens" for L in lengths])
    for j, L in enumerate(lengths, start=1):
        for m in methods:
            cs = sorted((c for c in cells if c["method"] == m and c["length"] == L), key=lambda c: c["ratio"])
            if not cs:
                continue
            jac = m.startswith("jacap")
            fig.add_trace(go.Scatter(
                x=[f"{c['ratio']:g}" for c in cs], y=[c["kl_geomean"] for c in cs], name=m, legendgroup=m,
                showlegend=j == 1, mode="lines+markers",
                line={"width": 3.5 if jac else 1.5, "dash": "solid" if jac else "dot"},
                error_y={"type": "data", "symmetric": False, "array": [c["kl_high"] - c["kl_geomean"] for c in cs],
                         "arrayminus": [c["kl_geomean"] - c["kl_low"] for c in cs]},
                hovertemplate="c=%{x}<br>KL %{y:.3g}<extra>" + m + "</extra>"), row=1, col=j)
        fig.update_xaxes(title_text="compression ratio c (evenly spaced)", type="category", categoryorder="array",
                         categoryarray=ratios, row=1, col=j)
    fig.update_yaxes(type="log")  # every panel: the same quantity on the same axis type
    fig.update_yaxes(title_text="geometric-mean next-token KL (nats)", row=1, col=1)
    docs = "-".join(map(str, n_docs[:: max(1, len(n_docs) - 1)]))
    fig.update_layout(height=480, title=title or f"Quality against compression on {docs} test documents "
                      "(geometric mean, 95% bootstrap interval)", legend={"font": {"size": 10}})
    return finish(fig)


def _pct(a: dict) -> str:
    return f"{100 * a['accuracy']:.0f}% [{100 * a['low']:.0f}, {100 * a['high']:.0f}]"


def needle_frame(summary: dict) -> pd.DataFrame:
    """The needle summary's accuracies as a table: one row per setting, the uncompressed answer (the ceiling)
    first, one column per (prompt, c), each cell "accuracy [95% Wilson interval]" over its prompts."""
    table: dict = {}
    for cell in summary["cells"]:
        col = f"{cell['length']} / {cell['ratio']}"
        table.setdefault("uncompressed (ceiling)", {})[col] = _pct(cell["full"])
        for a in cell["settings"]:
            table.setdefault(a["spec"], {})[col] = _pct(a)
    if not table:
        raise ValueError("summary has no complete cell; run the needle job and its summary")
    return _setting_by_cell(table)


def needle_verdict_frame(summary: dict) -> pd.DataFrame:
    """One row per (comparison, prompt, c) of the needle summary: the default Jacap setting against the best
    baseline by KL on tune and against the paper preset, paired per prompt: both accuracies, the accuracy
    difference in points with its 95 % paired bootstrap interval, wins/losses, exact McNemar p, its Holm
    adjustment over the comparison's cells, and the verdict (higher accuracy is better)."""
    rows = []
    for fam in summary["comparisons"]:
        for r in fam["rows"]:
            rows.append({"comparison": f"{fam['setting']} vs {fam['label']}", "prompt": r["length"], "c": r["ratio"],
                         "reference": r["reference_spec"], "Jacap": f"{100 * r['accuracy']:.0f}%",
                         "reference accuracy": f"{100 * r['reference_accuracy']:.0f}%",
                         "difference, points [95% CI]": f"{r['diff_points']:+.1f} [{r['diff_low']:+.1f}, {r['diff_high']:+.1f}]",
                         "wins/losses": f"{r['wins']}/{r['losses']}", "McNemar p": f"{r['p_mcnemar']:.2g}",
                         "Holm p": f"{r['p_holm']:.2g}", "verdict": r["verdict"]})
    if not rows:
        raise ValueError("summary has no comparison rows; run the needle job and its summary")
    return pd.DataFrame(rows).set_index(["comparison", "prompt", "c"])
