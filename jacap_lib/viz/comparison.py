"""Tables and figures of issue 10's comparison (``data/results/grid_summary.json`` and ``grid.jsonl``).

Tables are :class:`pandas.DataFrame` objects (a notebook shows them as HTML tables, every row and full
method names); figures are ``go.Figure``. Inputs come from :func:`jacap_lib.results.loaders.load_grid_summary`
and :func:`~jacap_lib.results.loaders.load_grid_rows`.
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from .style import finish

__all__ = ["baseline_frame", "comparison_frame", "capkv_frame", "choice_frame", "target_frame", "ratio_strip_figure",
           "kl_vs_ratio_figure"]

SETTINGS = ((512, 0.75), (512, 0.9), (1024, 0.75), (1024, 0.9))


def _cells(summary, **match):
    return [c for c in summary["table"] if all(c.get(k) == v for k, v in match.items())]


def baseline_frame(summary: dict, *, length: int, methods=None, kind: str = "all") -> pd.DataFrame:
    """Mean KL (nats) [95% bootstrap interval] over the segments, one row per method, one column per ratio."""
    methods = methods or summary.get("grid_methods") or sorted({c["method"] for c in summary["table"]})
    ratios = sorted({c["ratio"] for c in _cells(summary, length=length, kind=kind)})
    rows = []
    for m in methods:
        row = {"method": m}
        for c in ratios:
            cell = _cells(summary, method=m, length=length, ratio=c, kind=kind)
            row[f"c = {c}"] = f"{cell[0]['kl_mean']:.3f} [{cell[0]['kl_lo']:.3f}, {cell[0]['kl_hi']:.3f}]" if cell else ""
        rows.append(row)
    return pd.DataFrame(rows).set_index("method")


def comparison_frame(summary: dict, *, split: str = "test", methods=None, settings=SETTINGS) -> pd.DataFrame:
    """Per Jacap method and (prompt, c): KL, the best baseline, mean and geometric-mean ratios, wins/losses
    over the segments, Wilcoxon p (paired, on per-segment log ratios)."""
    rows = []
    for c in summary["comparisons"]:
        if c["split"] != split or (c["length"], c["ratio"]) not in settings:
            continue
        if methods is not None and c["method"] not in methods:
            continue
        rows.append({"method": c["method"], "prompt": c["length"], "c": c["ratio"], "KL": round(c["kl"], 4),
                     "best baseline": c["best_baseline"], "baseline KL": round(c["baseline_kl"], 4),
                     "mean ratio": round(c["mean_ratio"], 3), "geo-mean ratio": round(c["geo_mean_ratio"], 3),
                     "wins/losses": f"{c['wins']}/{c['losses']}",
                     "Wilcoxon p": None if c["wilcoxon_p"] is None else round(c["wilcoxon_p"], 3)})
    return pd.DataFrame(rows).sort_values(["prompt", "c", "mean ratio"]).reset_index(drop=True)


def capkv_frame(summary: dict, *, split: str = "test", methods=None) -> pd.DataFrame:
    """Jacap methods against CapKV (the paper's headline comparison), per (prompt, c)."""
    rows = []
    for c in summary["comparisons"]:
        if c["split"] != split or "vs_capkv" not in c or (methods is not None and c["method"] not in methods):
            continue
        v = c["vs_capkv"]
        rows.append({"method": c["method"], "prompt": c["length"], "c": c["ratio"], "KL": round(c["kl"], 4),
                     "CapKV KL": round(v["capkv_kl"], 4), "mean ratio": round(v["mean_ratio"], 3),
                     "geo-mean ratio": round(v["geo_mean_ratio"], 3), "wins/losses": f"{v['wins']}/{v['losses']}",
                     "Wilcoxon p": None if v["wilcoxon_p"] is None else round(v["wilcoxon_p"], 4)})
    return pd.DataFrame(rows).sort_values(["prompt", "c", "method"]).reset_index(drop=True)


def choice_frame(summary: dict, name: str) -> pd.DataFrame:
    """How one setting was chosen on the tune segments: ``summary["choices"][name]``, best first.
    Columns: the score (sum of log mean ratio + log geo-mean ratio over the four settings) and, per
    setting, ``mean / geo`` ratios to the best baseline."""
    ranked = summary["choices"][name]
    rows = []
    for r in ranked:
        row = {"method": r["method"], "score": round(r["score"], 3)}
        for L, c in SETTINGS:
            v = r.get(f"{L}/{c}")
            row[f"{L}, c={c}"] = f"{v[0]:.2f} / {v[1]:.2f}" if v else ""
        rows.append(row)
    return pd.DataFrame(rows).set_index("method")


def target_frame(summary: dict) -> pd.DataFrame:
    """The target: the chosen method's ratios to the best baseline on the tune and the test segments."""
    t = summary["target"]
    rows = []
    for split in ("tune", "test"):
        for key, v in t[split].items():
            L, c = key.split("/")
            rows.append({"split": split, "prompt": int(L), "c": float(c), "best baseline": v["best_baseline"],
                         "baseline KL": round(v["baseline_kl"], 4), "KL": round(v["kl"], 4),
                         "mean ratio": round(v["mean_ratio"], 3), "geo-mean ratio": round(v["geo_mean_ratio"], 3),
                         "wins/losses": f"{v['wins']}/{v['losses']}", "segments": v["n_segments"],
                         "met": v["mean_ratio"] <= 1 and v["geo_mean_ratio"] <= 1})
    return pd.DataFrame(rows)


def ratio_strip_figure(rows: list[dict], methods, *, baseline: str | dict, split: str | None = "test") -> go.Figure:
    """Per-segment KL ratio of each method to a baseline (log axis), one panel per (prompt, c).

    ``baseline`` is a method name, or a dict ``{(length, ratio): name}`` (e.g. the best baseline per setting).
    Points below 1 are segments where the method beats the baseline."""
    kl = {(r["method"], r["length"], r["ratio"], r["segment"]): r["kl"] for r in rows if r.get("task") == "kl"
          and (split is None or r.get("split") == split)}
    fig = make_subplots(rows=1, cols=len(SETTINGS), shared_yaxes=True,
                        subplot_titles=[f"{L}, c={c}" for L, c in SETTINGS])
    for j, (L, c) in enumerate(SETTINGS, start=1):
        base = baseline if isinstance(baseline, str) else baseline[(L, c)]
        for i, m in enumerate(methods):
            pts = [(s, v / kl[(base, L, c, s)]) for (mm, LL, cc, s), v in kl.items()
                   if mm == m and LL == L and cc == c and (base, L, c, s) in kl]
            fig.add_trace(go.Scatter(x=[i] * len(pts), y=[p[1] for p in pts], mode="markers", name=m,
                                     legendgroup=m, showlegend=j == 1, text=[p[0] for p in pts],
                                     hovertemplate="%{text}<br>ratio %{y:.2f}<extra>" + m + "</extra>"), row=1, col=j)
        fig.add_hline(y=1.0, line_dash="dot", row=1, col=j)
        fig.update_xaxes(showticklabels=False, row=1, col=j)
    fig.update_yaxes(type="log")  # every panel: the same quantity on the same axis type
    fig.update_yaxes(title_text="KL ratio to the baseline (per segment)", row=1, col=1)
    fig.update_layout(height=420, title="Per-segment KL ratios (below 1: the Jacap configuration wins)",
                      legend={"orientation": "h", "y": -0.1})
    return finish(fig)


def kl_vs_ratio_figure(summary: dict, methods, *, kind: str = "all") -> go.Figure:
    """Mean KL against c (log axis; KL spans more than a decade), one panel per prompt length."""
    lengths = sorted({c["length"] for c in summary["table"]})
    fig = make_subplots(rows=1, cols=len(lengths), shared_yaxes=True,
                        subplot_titles=[f"prompt {L} tokens" for L in lengths])
    for j, L in enumerate(lengths, start=1):
        for m in methods:
            cs = sorted(_cells(summary, method=m, length=L, kind=kind), key=lambda c: c["ratio"])
            if not cs:
                continue
            fig.add_trace(go.Scatter(
                x=[c["ratio"] for c in cs], y=[c["kl_mean"] for c in cs], name=m, legendgroup=m, showlegend=j == 1,
                mode="lines+markers", line={"width": 3.5 if m.startswith("jacap") else 1.5,
                                            "dash": "solid" if m.startswith("jacap") else "dot"},
                error_y={"type": "data", "symmetric": False, "array": [c["kl_hi"] - c["kl_mean"] for c in cs],
                         "arrayminus": [c["kl_mean"] - c["kl_lo"] for c in cs]}), row=1, col=j)
        fig.update_xaxes(title_text="compression ratio c", row=1, col=j)
    fig.update_yaxes(type="log")  # every panel: the same quantity on the same axis type
    fig.update_yaxes(title_text="next-token KL (nats)", row=1, col=1)
    fig.update_layout(height=460, title="Quality vs compression, 12 segments (mean, 95% bootstrap interval)",
                      legend={"font": {"size": 10}})
    return finish(fig)
