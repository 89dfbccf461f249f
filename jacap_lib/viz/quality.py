"""Figures of the quality benchmark (chapters 09 and 10): one function per figure, each returns a go.Figure.

All of them read the committed results through :mod:`jacap_lib.results.loaders` (re-exported here for
the chapters): ``data/results/summary.json`` (``jacap bench summary``) and the grids' rows
(``data/results/*.jsonl``, ``jacap bench kl|passkey``) with their configurations.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from .style import finish, method_style

from ..results.loaders import load_grid_rows, load_passkey_rows, load_runs, load_summary  # noqa: F401

__all__ = ["load_summary", "load_rows", "load_runs", "load_passkey_rows", "kl_vs_ratio", "kl_by_kind", "segment_ranks",
           "passkey_heatmap", "ablation_rows", "ablation_table", "target_rows"]

KINDS = ("prose", "docs", "code")


def load_rows(*names: str) -> list[dict]:
    """Rows of the grids ``names`` (``"quality"``, ``"ablation"``, ...; default the quality grid)."""
    return load_grid_rows(*(names or ("quality",)))


def _cells(summary, **match):
    return [c for c in summary["table"] if all(c.get(k) == v for k, v in match.items())]


def _base_methods(summary, length):
    """The kvpress baselines and plain Jacap (the summary lists the baselines, so kvpress is not imported)."""
    base = set(summary["baselines"]) | {"jacap"}
    return sorted({c["method"] for c in _cells(summary, length=length, kind="all") if c["method"] in base})


def kl_vs_ratio(summary: dict, *, kind: str = "all", methods=None, log_y: bool = True) -> go.Figure:
    """Mean next-token KL vs compression ratio, one line per method, 95% bootstrap intervals; one panel per length."""
    lengths = sorted({c["length"] for c in summary["table"]})
    fig = make_subplots(rows=1, cols=len(lengths), subplot_titles=[f"prompt {L} tokens" for L in lengths],
                        shared_yaxes=True)
    for j, L in enumerate(lengths, start=1):
        for m in methods or _base_methods(summary, L):
            cs = sorted(_cells(summary, method=m, length=L, kind=kind), key=lambda c: c["ratio"])
            if len(cs) < 2:
                continue
            fig.add_trace(go.Scatter(
                x=[c["ratio"] for c in cs], y=[c["kl_mean"] for c in cs], name=m, legendgroup=m, showlegend=j == 1,
                mode="lines+markers", line={"width": 4 if m.startswith("jacap") else 1.5},
                error_y={"type": "data", "symmetric": False, "array": [c["kl_hi"] - c["kl_mean"] for c in cs],
                         "arrayminus": [c["kl_mean"] - c["kl_lo"] for c in cs]},
                hovertemplate=m + "<br>c=%{x}<br>KL=%{y:.3f}<extra></extra>"), row=1, col=j)
        fig.update_xaxes(title_text="compression ratio c", row=1, col=j)
    fig.update_yaxes(type="log" if log_y else "linear")  # every panel: the same axis type
    fig.update_yaxes(title_text=f"next-token KL (nats), {kind}", row=1, col=1)
    fig.update_layout(title="Quality vs compression (mean over segments, 95% bootstrap interval)", height=450)
    return finish(fig)


def kl_by_kind(summary: dict, *, length: int, ratio: float, methods=None) -> go.Figure:
    """Per kind of text: mean KL with interval per method at one (length, ratio) — rankings differ by kind."""
    kinds = [k for k in KINDS if _cells(summary, kind=k, length=length)]
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=kinds, shared_yaxes=True)
    for j, kind in enumerate(kinds, start=1):
        cs = [c for c in _cells(summary, kind=kind, length=length, ratio=ratio)
              if c["method"] in (methods or _base_methods(summary, length))]
        cs.sort(key=lambda c: c["kl_mean"])
        fig.add_trace(go.Bar(
            y=[c["method"] for c in cs], x=[c["kl_mean"] for c in cs], orientation="h", showlegend=False,
            marker_color=[method_style(c["method"])["color"] for c in cs],
            error_x={"type": "data", "symmetric": False, "array": [c["kl_hi"] - c["kl_mean"] for c in cs],
                     "arrayminus": [c["kl_mean"] - c["kl_lo"] for c in cs]}), row=1, col=j)
        fig.update_xaxes(title_text="KL (nats)", row=1, col=j)
    fig.update_layout(title=f"Ranking by kind of text (prompt {length}, c={ratio})", height=420)
    return finish(fig)


def segment_ranks(rows: list[dict], *, length: int, ratio: float, methods=None) -> go.Figure:
    """Rank of every method on every segment (1 = lowest KL): the ranking flips between segments."""
    sub = [r for r in rows if r.get("task") == "kl" and r["length"] == length and r["ratio"] == ratio]
    segs = sorted({r["segment"] for r in sub}, key=lambda s: (s.split("/")[0], s))
    ms = methods or sorted({r["method"] for r in sub})
    kl = {(r["method"], r["segment"]): r["kl"] for r in sub}
    z = []
    for m in ms:
        row = []
        for s in segs:
            if (m, s) not in kl:
                row.append(None)
                continue
            vals = sorted(kl[(mm, s)] for mm in ms if (mm, s) in kl)
            row.append(vals.index(kl[(m, s)]) + 1)
        z.append(row)
    fig = go.Figure(go.Heatmap(z=z, x=segs, y=ms, colorscale="RdYlGn_r", text=z, texttemplate="%{text}",
                               colorbar={"title": "rank"}))
    fig.update_layout(title=f"Rank per segment (prompt {length}, c={ratio}; 1 = best)", height=60 + 32 * len(ms))
    return finish(fig)


def passkey_heatmap(rows: list[dict], *, methods=None, ratio: float | None = None) -> go.Figure:
    """Passkey accuracy over (context length x needle depth); one frame per method (slider)."""
    pk = [r for r in rows if r.get("task") == "passkey"]
    if not pk:
        raise ValueError("no passkey rows; run: jacap bench passkey --out data/results/passkey.jsonl")
    lengths = sorted({r["length"] for r in pk})
    depths = sorted({r["depth"] for r in pk})
    specs = [("full", 0.0)] + sorted({(r["method"], r["ratio"]) for r in pk if r["method"] != "full"
                                      and (ratio is None or r["ratio"] == ratio)
                                      and (methods is None or r["method"] in methods)})

    def grid(m, c):
        z = []
        for d in depths:
            row = []
            for L in lengths:
                cell = [r["correct"] for r in pk if r["method"] == m and r["ratio"] == c and r["length"] == L
                        and r["depth"] == d]
                row.append(sum(cell) / len(cell) if cell else None)
            z.append(row)
        return z

    names = [m if m == "full" else f"{m} c={c}" for m, c in specs]
    frames = [go.Frame(data=[go.Heatmap(z=grid(m, c), x=[str(L) for L in lengths], y=depths, zmin=0, zmax=1,
                                        colorscale="Viridis")], name=n) for (m, c), n in zip(specs, names)]
    fig = go.Figure(data=frames[0].data, frames=frames)
    fig.update_layout(
        title="Passkey accuracy: context length x needle depth (slider: method)", height=420,
        xaxis_title="context length (tokens)", yaxis_title="needle depth (0 = start)",
        sliders=[{"steps": [{"method": "animate", "label": n,
                             "args": [[n], {"mode": "immediate", "frame": {"duration": 0, "redraw": True}}]}
                            for n in names], "currentvalue": {"prefix": "method: "}}])
    return finish(fig)


def ablation_rows(summary: dict, *, length: int = 512, ratios=(0.75, 0.9), split: str = "all") -> list[dict]:
    """One row per Jacap method: mean KL and ratio to the best kvpress baseline at each ratio."""
    comps = [c for c in summary["comparisons"] if c["split"] == split and c["length"] == length
             and c["ratio"] in ratios]
    out: dict = {}
    for c in comps:
        row = out.setdefault(c["method"], {"method": c["method"]})
        row[f"KL c={c['ratio']}"] = round(c["kl"], 4)
        row[f"mean ratio c={c['ratio']}"] = round(c["mean_ratio"], 3)
        row[f"geo ratio c={c['ratio']}"] = round(c["geo_mean_ratio"], 3)
        row[f"best baseline c={c['ratio']}"] = f"{c['best_baseline']} ({c['baseline_kl']:.4f})"
    key = f"mean ratio c={ratios[-1]}"
    return sorted(out.values(), key=lambda r: r.get(key, float("inf")))


def ablation_table(summary: dict, **kw) -> go.Figure:
    rows = ablation_rows(summary, **kw)
    if not rows:
        raise ValueError("no Jacap comparisons in the summary for this length/split")
    cols = list(rows[0].keys())
    fig = go.Figure(go.Table(header={"values": cols}, cells={"values": [[r.get(c, "") for r in rows] for c in cols]}))
    fig.update_layout(title="Ablation: Jacap variants vs the best kvpress baseline (ratio < 1: Jacap better)",
                      height=120 + 30 * len(rows))
    return finish(fig)


def target_rows(summary: dict) -> list[dict]:
    """The target check (issue 6 item 5) as table rows: chosen method's tune and test ratios."""
    t = summary.get("target") or {}
    if not t.get("chosen"):
        return []
    return [{"split": split, "ratio": r, **v} for split in ("tune", "test") for r, v in t[split].items()]
