"""The KL–retrieval plane in words: the opening sentences of a chapter that shows the plane, from the points of
:func:`jacap_lib.experiments.plane.kl_retrieval_points` (:func:`answer_lines`), and the name of one point's cell
(:func:`name_cell`)."""
from __future__ import annotations

from jacap_lib.experiments.plane import cell_points

__all__ = ["answer_lines", "name_cell"]


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def answer_lines(points: list[dict]) -> list[str]:
    """The chapter's answer in a few sentences, each counted from the points: where the reference (the best
    baseline by KL) keeps the fact, how often the setting with the lowest KL of a cell also answers best, which
    setting answers most often and how far its KL lies from the reference's, and what asking the question inside
    the compressed prompt changes where the probe measured it."""
    cells = list(dict.fromkeys((p["length"], p["ratio"]) for p in points))
    n = len(cells)
    refs = {p["reference_prose_name"] for p in points}
    ref = refs.pop() if len(refs) == 1 else "the reference of each cell"
    ref_acc = sorted({p["accuracy"] for p in points if p["spec"] == p["reference_spec"]})
    full = sorted({p["full_accuracy"] for p in points})
    out = [f"Uncompressed, the model finds the key in {_range(full)} of the prompts in each of the {n} cells; "
           f"{ref}, the best baseline by KL there, finds it in "
           + (f"{_range(ref_acc)} of them." if ref_acc else "none: it was not run on the needle task.")]
    low_best, wins = 0, {}
    for cell in cells:
        ps = cell_points(points, *cell)
        top = max(p["accuracy"] for p in ps)
        low_best += min(ps, key=lambda p: p["kl_ratio"])["accuracy"] >= top
        for p in ps:
            if p["accuracy"] == top:
                wins.setdefault(p["prose_name"], []).append(p)
    out.append(f"In {low_best} of the {n} cells, the setting with the lowest KL also finds the key most often.")
    name, best = max(wins.items(), key=lambda kv: len(kv[1]))
    ratios = [p["kl_ratio"] for p in best]
    out.append(f"In {len(best)} of the {n} cells, {name} finds it most often ({_pct(min(p['accuracy'] for p in best))} "
               f"or more), with a KL {min(ratios):.1f} to {max(ratios):.1f} times the reference's.")
    inside = [p for p in points if p["accuracy_inside"] is not None and p["probe_after_accuracy"] is not None]
    if inside:
        better = [p for p in inside if p["inside_verdict"] == "better"]
        most = max(inside, key=lambda p: p["accuracy_inside"] - p["probe_after_accuracy"])
        out.append(f"Asking the question inside the compressed prompt instead of after it is better for "
                   f"{len(better)} of the {len(inside)} settings and cells the probe measured (exact paired test, "
                   f"Holm); the largest change is {name_cell(most)}, from {_pct(most['probe_after_accuracy'])} to "
                   f"{_pct(most['accuracy_inside'])}.")
    return out


def _range(values) -> str:
    values = sorted(values)
    return _pct(values[0]) if values[0] == values[-1] else f"{_pct(values[0])} to {_pct(values[-1])}"


def name_cell(p: dict) -> str:
    """A point as a sentence names it: "Algorithm 1 tuned at prompt 1024, c = 0.5"."""
    return f"{p['prose_name']} at prompt {p['length']}, c = {p['ratio']:g}"
