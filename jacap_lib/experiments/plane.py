"""The KL–retrieval plane: for each budget cell the needle task covers, where each method's chosen setting lies
between keeping the model's predictions (KL) and keeping one fact (the needle).

:func:`kl_retrieval_points` builds one point per (cell, setting) from the committed files and nothing else:

* ``x`` — the paired geometric-mean KL ratio of the setting to a reference over the dev documents of the cell
  (``dev.jsonl``; KLs floored at the protocol's :data:`~jacap_lib.experiments.protocol.rules.KL_FLOOR`, as the rule floors
  them). The reference is the cell's best baseline by KL picked on the tune documents (``choices.json``'s
  ``best_baseline``; :data:`BEST_BASELINE`) or one named spec; every point names it (``reference``,
  ``reference_spec``). For a Jacap setting against the best baseline this is ``summary.json``'s ``gm_ratio``;
* ``y`` — the share of the needle prompts the setting answers right with the question asked after the compressed
  prompt (``needle_summary.json``: ``accuracy``, its 95 % Wilson interval, ``correct`` of ``n_prompts``), beside
  the uncompressed model's share on the same prompts (``full_accuracy``);
* ``accuracy_inside`` — the share with the question inside the compressed prompt, where the digit-survival probe
  (``needle_probe_summary.json``, mode ``"inside"``) measured that setting in that cell, else ``None``; with the
  probe's own after-compression share on the same prompts (``probe_after_accuracy``) and the verdict of the paired
  exact test between the two modes (``inside_verdict``, ``inside_p_holm``: Holm over the probe's settings and cells).

Every point carries its spec, its family (the registry name), the book's name for it
(:func:`~jacap_lib.experiments.names.spec_name`: ``name`` in plain text for a figure or a printed line,
``prose_name`` for a sentence; the same for the reference), the
number of dev documents and of needle prompts, and whether a Jacap setting's protection fills the budget there
(:func:`~jacap_lib.experiments.protection.protection_fills_budget`). The dev documents are exploratory (they helped
choose the prompt press), so the points describe; they judge nothing. :func:`jacap_lib.report.plane.answer_lines` turns
the points into the chapter's opening sentences.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["BEST_BASELINE", "SPLIT", "kl_retrieval_points", "cell_points"]

#: the default reference: each cell's best baseline by KL, picked on the tune documents
BEST_BASELINE = "best baseline"
#: the documents the KL ratios are computed on
SPLIT = "dev"


def _kl_by_doc(rows: list[dict], length: int, ratio: float) -> dict:
    """``{spec: {doc: kl}}`` of one cell of ``dev.jsonl``'s rows."""
    out: dict = {}
    for r in rows:
        if int(r["length"]) == length and math.isclose(float(r["ratio"]), ratio):
            out.setdefault(r["method"], {})[r["doc"]] = float(r["kl"])
    return out


def _gm_ratio(a: dict, b: dict) -> tuple[float, int]:
    """Geometric mean over the documents both hold of ``a[doc] / b[doc]`` (KLs floored), and that number of documents."""
    from jacap_lib.verdicts.intervals import KL_FLOOR

    docs = sorted(set(a) & set(b))
    if len(docs) < 3:
        raise ValueError(f"{len(docs)} dev documents hold both settings; a geometric-mean ratio needs at least 3")
    x = np.maximum([a[d] for d in docs], KL_FLOOR)
    y = np.maximum([b[d] for d in docs], KL_FLOOR)
    return float(np.exp(np.mean(np.log(x) - np.log(y)))), len(docs)


def kl_retrieval_points(*, reference: str = BEST_BASELINE, dev_rows=None, choices=None, needle=None,
                        probe=None) -> list[dict]:
    """One point per (needle cell, needle setting) with dev rows in that cell, in the needle summary's order (see
    the module docstring for the fields). ``reference``: :data:`BEST_BASELINE` (each cell's best baseline by KL on
    tune) or a spec with dev rows in every cell. The inputs default to the committed files (``dev_rows``:
    ``load_eval_rows("dev")``, ``choices``: ``load_eval_choices()``, ``needle``: ``load_needle_summary()``,
    ``probe``: ``load_needle_probe_summary()``; pass ``probe={}`` to leave the question-inside mode out)."""
    from jacap_lib.results import loaders as R
    from jacap_lib.experiments.names import spec_name
    from jacap_lib.experiments.protection import protection_fills_budget
    from jacap_lib.experiments.protocol.rules import method_of

    dev_rows = R.load_eval_rows(SPLIT) if dev_rows is None else dev_rows
    choices = R.load_eval_choices() if choices is None else choices
    needle = R.load_needle_summary() if needle is None else needle
    probe = R.load_needle_probe_summary() if probe is None else probe
    if not isinstance(reference, str) or not reference:
        raise ValueError(f"reference must be {BEST_BASELINE!r} or a method spec, got {reference!r}")
    inside, probe_after = {}, {}
    effect = {(int(e["length"]), float(e["ratio"]), e["spec"]): e for e in probe.get("mode_effect") or []}
    for mode, store in (("inside", inside), ("after", probe_after)):
        for cell in ((probe.get("modes") or {}).get(mode) or {}).get("cells", []):
            key = (int(cell["length"]), float(cell["ratio"]))
            store[key + ("full",)] = (cell["full"], cell["n_prompts"])
            for a in cell["settings"]:
                store[key + (a["spec"],)] = (a, cell["n_prompts"])
    points = []
    for cell in needle["cells"]:
        L, c = int(cell["length"]), float(cell["ratio"])
        if reference == BEST_BASELINE:
            ref_spec = choices["best_baseline"]["cells"][f"{L}/{c:g}"]["spec"]
            ref_label = "the best baseline by KL (picked on tune)"
        else:
            ref_spec, ref_label = reference, None
        kl = _kl_by_doc(dev_rows, L, c)
        if ref_spec not in kl:
            raise ValueError(f"the reference {ref_spec!r} has no dev rows in cell {L}/{c:g}; name a measured setting")
        ref_name, ref_prose = spec_name(ref_spec, legend=True, choices=choices), spec_name(ref_spec, choices=choices)
        ref_label = ref_label or ref_name  # a named spec by its name
        full_in = inside.get((L, c, "full"))
        for a in cell["settings"]:
            spec = a["spec"]
            if spec not in kl:
                continue
            ratio, n_docs = _gm_ratio(kl[spec], kl[ref_spec])
            ins, aft = inside.get((L, c, spec)), probe_after.get((L, c, spec))
            points.append({
                "length": L, "ratio": c, "cell": f"{L}/{c:g}", "spec": spec, "family": method_of(spec),
                "name": spec_name(spec, legend=True, choices=choices), "prose_name": spec_name(spec, choices=choices),
                "reference": ref_label, "reference_spec": ref_spec,
                "reference_name": ref_name, "reference_prose_name": ref_prose,
                "kl_ratio": ratio, "n_docs": n_docs, "split": SPLIT,
                "accuracy": float(a["accuracy"]), "accuracy_low": float(a["low"]), "accuracy_high": float(a["high"]),
                "correct": int(a["correct"]), "n_prompts": int(cell["n_prompts"]),
                "full_accuracy": float(cell["full"]["accuracy"]),
                "accuracy_inside": None if ins is None else float(ins[0]["accuracy"]),
                "n_prompts_inside": None if ins is None else int(ins[1]),
                "full_accuracy_inside": None if ins is None or full_in is None else float(full_in[0]["accuracy"]),
                "probe_after_accuracy": None if aft is None else float(aft[0]["accuracy"]),
                "inside_verdict": (effect.get((L, c, spec)) or {}).get("verdict"),
                "inside_p_holm": (effect.get((L, c, spec)) or {}).get("p_holm"),
                "protection_fills_budget": protection_fills_budget(spec, L, c),
            })
    if not points:
        raise ValueError("no needle setting has dev rows in a needle cell; nothing to place in the plane")
    return points


def cell_points(points: list[dict], length: int, ratio: float) -> list[dict]:
    """The points of one cell (``ValueError`` when the plane has none there)."""
    out = [p for p in points if p["length"] == int(length) and math.isclose(p["ratio"], float(ratio))]
    if not out:
        have = sorted({p["cell"] for p in points})
        raise ValueError(f"the plane has no point at prompt {length}, c = {ratio}; its cells are {have}")
    return out


