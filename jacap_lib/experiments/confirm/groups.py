"""The confirmatory summary's numbers, grouped for the book: the verdicts of each planned pair of settings counted
over its cells (:func:`verdict_groups`, :func:`needle_groups`), how far each needle mode has got
(:func:`needle_done`, :func:`needle_progress`), each setting's needle accuracy pooled over the prompt lengths
(:func:`needle_accuracy`) and the points of the KL–retrieval plane (:func:`plane_points`). Numbers only: the
sentences are :mod:`jacap_lib.report.confirm`'s."""
from __future__ import annotations

__all__ = ["verdict_groups", "needle_groups", "needle_done", "needle_progress", "needle_accuracy", "plane_points",
           "BEST_BASELINE", "VERDICTS", "NEEDLE_VERDICTS"]


#: the reference name of the comparisons against the best tuned baseline of each cell
BEST_BASELINE = "the best tuned baseline"


#: the verdict columns, in order; "protection fills the budget" is the plan's label of an unjudged cell
VERDICTS = ("better", "worse", "no detectable difference", "protection fills the budget")


_PLAN_WHAT = {"against the best tuned baseline": None, "the default against kvzip": "kvzip",
              "the default against expected_attention": "expected_attention"}


def _whats(entry: dict) -> list[str]:
    """The plan's purposes of one comparison (a pair named twice carries both, joined by "; ")."""
    out = [w.strip() for w in entry["what"].split(";")]
    unknown = [w for w in out if w not in _PLAN_WHAT]
    if unknown:
        raise ValueError(f"confirmatory comparison {entry['a']!r} / {entry['b']!r} in {entry['cell']}: unknown purpose "
                         f"{unknown}; known: {sorted(_PLAN_WHAT)}")
    return out


def _grouped(entries, whats_of, verdicts: tuple, *, hint: str = "") -> list[dict]:
    """``entries`` (each with ``a``, ``b``, ``cell`` and ``verdict``) counted per planned pair of settings:
    ``{"a", "reference", "references" (the ``b`` met), "what", "counts": {verdict: cells}, "cells": [...]}``, in the
    order of the plan's purposes; ``whats_of(entry)``: the entry's purposes (a pair named twice counts in both
    groups). A verdict outside ``verdicts`` is refused (``hint`` ends the message)."""
    groups: dict = {}
    for e in entries:
        whats = whats_of(e)
        if e["verdict"] not in verdicts:
            raise ValueError(f"comparison {e['a']!r} / {e['b']!r} in {e['cell']}: verdict {e['verdict']!r} is not "
                             f"one of {verdicts}{hint}")
        for what in whats:
            ref = _PLAN_WHAT[what]
            g = groups.setdefault((what, e["a"], ref), {"a": e["a"], "reference": ref or BEST_BASELINE,
                                                        "references": [], "what": what,
                                                        "counts": dict.fromkeys(verdicts, 0), "cells": []})
            g["counts"][e["verdict"]] += 1
            g["cells"].append(e)
            if e["b"] not in g["references"]:
                g["references"].append(e["b"])
    order = list(_PLAN_WHAT)
    return sorted(groups.values(), key=lambda g: order.index(g["what"]))


def verdict_groups(summary: dict) -> list[dict]:
    """Per planned pair of settings, the verdict counts over its cells: ``{"a", "reference", "references" (the
    baselines met, for the best tuned baseline), "counts": {verdict: cells}, "cells": [...]}``, the Jacap-family
    settings against the best tuned baseline first (in the plan's order), then the default against KVzip and against
    Expected Attention. A comparison the plan names for two purposes counts in both groups."""
    return _grouped(summary["kl"]["comparisons"], _whats, VERDICTS, hint="; the summary is incomplete")


#: the needle verdict columns, in order (:func:`jacap_lib.verdicts.intervals.mcnemar_verdict`'s outcomes)
NEEDLE_VERDICTS = ("better", "worse", "no detectable difference", "no difference: identical on every prompt")


def needle_groups(summary: dict, mode: str) -> list[dict]:
    """Per planned pair of settings, the exact paired needle tests' verdicts over its needle cells in ``mode`` (Holm
    over every cell and pair of the mode, as the plan says), grouped as :func:`verdict_groups` groups the KL verdicts:
    ``{"a", "reference", "references", "what", "counts": {verdict: cells}, "cells": [...]}``. ``[]`` until every
    planned prompt of ``mode`` is answered (:func:`needle_done`)."""
    if not needle_done(summary, mode):
        return []
    whats = {(e["a"], e["b"], e["cell"]): _whats(e) for e in summary["kl"]["comparisons"]}

    def whats_of(t: dict) -> list[str]:
        key = (t["a"], t["b"], t["cell"])
        if key not in whats:
            raise ValueError(f"needle pair {t['a']!r} / {t['b']!r} in {t['cell']}: no planned KL comparison names it")
        return whats[key]

    return _grouped(summary["needle"][mode]["pairs"], whats_of, NEEDLE_VERDICTS)


def needle_done(summary: dict, mode: str) -> bool:
    """Whether every planned needle prompt of ``mode`` is answered (only then are its accuracies and paired tests
    the plan's)."""
    return bool(summary["needle"].get(mode, {}).get("complete"))


def needle_progress(summary: dict, mode: str) -> tuple[int, int]:
    """``(answered, planned)`` needle prompts of ``mode``, one per row of the run: every setting's answer in every cell,
    and the uncompressed answer once per prompt length (it does not depend on c; the summary repeats it in each cell
    of its length)."""
    design = summary["config"]["needle_design"]
    per_cell = len(design["depths"]) * int(design["trials"])
    lengths = len(design["lengths"])
    planned = per_cell * (len(design["settings"]) * lengths * len(design["ratios"]) + lengths)
    block = summary["needle"].get(mode)
    if block is None:
        return 0, planned
    from jacap_lib.verdicts.rows import FULL

    full: dict = {}  # prompt length -> the uncompressed answers there (the same count in each of its cells)
    answered = 0
    for e in block["accuracy"]:
        if e["setting"] == FULL:
            length = e["cell"].split("/")[0]
            full[length] = max(full.get(length, 0), int(e["n"]))
        else:
            answered += int(e["n"])
    return answered + sum(full.values()), planned


def needle_accuracy(summary: dict) -> dict:
    """``{mode: {setting: {c: accuracy}}}`` for each mode whose every planned prompt is answered
    (:func:`needle_done`): each setting's needle accuracy pooled over the prompt lengths (every cell holds the same
    prompts, so the pooled share is the mean of the cells' shares), the uncompressed answer (``"full"``) at every
    ``c``."""
    design = summary["config"]["needle_design"]
    out: dict = {}
    for mode, block in summary["needle"].items():
        if not needle_done(summary, mode):
            continue
        acc: dict = {}
        for e in block["accuracy"]:
            if not e["complete"]:
                continue
            c = float(e["cell"].split("/")[1])
            acc.setdefault(e["setting"], {}).setdefault(c, []).append(e["accuracy"])
        n = len(design["lengths"])
        out[mode] = {s: {c: sum(v) / len(v) for c, v in by.items() if len(v) == n} for s, by in acc.items()}
    return out


def plane_points(summary: dict, mode: str = "after") -> list[dict]:
    """The KL–retrieval plane of the confirmatory run, in the shape of
    :func:`jacap_lib.experiments.field.field_points` (so :func:`jacap_lib.viz.plane.kl_retrieval_figure` draws it):
    one point per needle setting and needle cell, x its geometric-mean KL ratio to KVzip over the confirmatory
    documents (``summary["kl"]["to_reference"]``; KVzip itself at 1), y its needle accuracy in ``mode`` with its
    Wilson interval beside the uncompressed answer's. ``[]`` until the KL rows and every planned prompt of ``mode``
    are there, or when the summary predates the KL ratios to KVzip."""
    from jacap_lib.experiments.names import spec_name
    from jacap_lib.presses.registry import method_of
    from jacap_lib.verdicts.rows import FULL

    kl = summary.get("kl", {})
    if not (kl.get("complete") and kl.get("to_reference") and needle_done(summary, mode)):
        return []
    n_docs = int(summary["config"]["documents"])
    reference = kl["to_reference"][0]["reference"]  # the summary's reference, KVzip
    x = {(e["setting"], e["cell"]): e["ratio"] for e in kl["to_reference"] if e["complete"]}
    acc = {(e["setting"], e["cell"]): e for e in summary["needle"][mode]["accuracy"] if e["complete"]}
    ref = {"reference": spec_name(reference, legend=True), "reference_spec": reference,
           "reference_name": spec_name(reference, legend=True), "reference_prose_name": spec_name(reference)}
    points = []
    for (s, cell), a in acc.items():
        if s == FULL or (s != reference and (s, cell) not in x) or (FULL, cell) not in acc:
            continue
        L, c = cell.split("/")
        points.append({"length": int(L), "ratio": float(c), "cell": f"{int(L)}/{float(c):g}", "spec": s,
                       "family": method_of(s), "name": spec_name(s, legend=True), "prose_name": spec_name(s), **ref,
                       "kl_ratio": 1.0 if s == reference else x[(s, cell)], "n_docs": n_docs, "split": "confirm",
                       "accuracy": a["accuracy"], "accuracy_low": a["low"], "accuracy_high": a["high"],
                       "correct": round(a["accuracy"] * a["n"]), "n_prompts": a["n"],
                       "full_accuracy": acc[(FULL, cell)]["accuracy"]})
    return points
