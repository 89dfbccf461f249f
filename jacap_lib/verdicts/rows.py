"""Row statistics: the one home of what the results jobs compute from the rows of the committed files.

:mod:`jacap_lib.verdicts.intervals` holds the interval machinery on two arrays (the paired geometric-mean ratio,
its BCa bootstrap interval, Holm, McNemar, the simultaneous level, the verdict sentence); this module turns the
rows of ``dev.jsonl``, ``summary.json``, ``anatomy.json``, ``needle.jsonl`` and ``ablation.jsonl`` into those
arrays and back into records. The jobs (:mod:`.anatomy`, :mod:`.needle`, :mod:`.ablation`,
:mod:`.decoding_comparison`) and the sentences (:mod:`.findings`) call it; it writes nothing and loads no model.

* Floors: :data:`KL_FLOOR` (a KL below it counts as it in a log, the protocol's rule) and :data:`ERROR_FLOOR`
  (an attention-output relative error below it counts as it in a log ratio).
* ``choices.json``: :func:`read_choices_file`, the one reader of the tune's choices (present, well-formed, its
  fingerprint its configuration's); the jobs add their own checks on top.
* ``summary.json``'s families: :data:`ALGORITHM1`, :func:`family`, :func:`is_prompt_default`.
* Paired per-document ratios from ``dev.jsonl``'s rows: :func:`paired_values`, :func:`kind_ratios` (KL per
  document kind), :func:`layer_error_ratios` (per-layer attention-output error, with intervals),
  :func:`layer_error_geomeans` (the same ratio pooled over cells, descriptive); the losing cells of a Jacap setting
  (:func:`losing_cells`, :func:`rows_part`, :func:`default_role`, :func:`library_default_part`) and one kind's
  pairs across the cells (:func:`kind_pairs`).
* ``anatomy.json``'s documents: :func:`swap_ratios`, :func:`ladder_ratios` (:data:`LADDER`), :func:`decompose_gap`,
  :func:`kept_summary`.
* ``needle.jsonl``'s 0/1 outcomes: :func:`needle_summary`, :func:`survival_statistics`, :func:`pooled_survival`,
  :func:`needle_probe_summary`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from jacap_lib.results import files
from jacap_lib.verdicts import intervals as V
from jacap_lib.verdicts.intervals import KL_FLOOR
from jacap_lib.results.provenance import fingerprint
from jacap_lib.presses.registry import method_of

__all__ = ["KL_FLOOR", "ERROR_FLOOR", "read_choices_file", "ALGORITHM1", "family", "is_prompt_default", "is_library_default",
           "paired_values", "kind_ratios", "layer_error_ratios", "layer_error_geomeans", "losing_cells",
           "default_role", "kind_pairs", "rows_part", "library_default_part", "LADDER", "LADDER_ONLY", "swap_ratios",
           "ladder_ratios", "decompose_gap", "kept_summary", "FULL", "DEFAULT_MODE", "BASELINE_LABEL", "PAPER_LABEL",
           "row_mode", "needle_summary", "survival_statistics", "SURVIVAL_BINS", "pooled_survival",
           "needle_probe_summary"]

ERROR_FLOOR = 1e-12  # an attention-output relative error below it (the layer unchanged) counts as it in a log ratio


# --------------------------------------------------------------------------------------------- choices.json
def read_choices_file(path, *, flag: str | None = None, baselines: bool = False) -> dict:
    """The content of a ``choices.json`` (the tune's choices): it must exist, hold ``config``, ``fingerprint`` and
    ``chosen``, and its fingerprint must be its configuration's; ``baselines``: it must also hold the best baseline
    per cell. Else ``ValueError`` (prefixed with the option ``flag`` that named the file) saying what to run."""
    path, at = Path(path), f"{flag}: " if flag else ""
    if not path.is_file():
        raise ValueError(f"{at}{path} does not exist; run `jacap evaluate tune` first")
    data = files.read_json(path, require=("config", "fingerprint", "chosen"))
    if not isinstance(data["config"], dict) or data["fingerprint"] != fingerprint(data["config"]):
        raise ValueError(f"{at}{path}'s fingerprint does not match its configuration; rerun `jacap evaluate tune`")
    if baselines and "best_baseline" not in data:
        raise ValueError(f"{at}{path} has no best baseline (no kvpress baseline was tuned); nothing to compare with")
    return data


# --------------------------------------------------------------------------------------------- summary.json
#: The role of the tune choice of the protocol's ``jacap_prompt`` method in ``summary.json``: Algorithm 1 with the tempered
#: centre, at the settings the tune picked (the library default until the observed centre replaced it).
ALGORITHM1 = "algorithm 1"


def family(summary: dict, role: str, picked_on: str = "tune") -> dict | None:
    """The family of ``summary.json`` (its content) with that role (:data:`ALGORITHM1`, ``"paper preset"``,
    ``"tuned <method>"``) and baseline line (``picked_on`` "tune" or "dev"); ``None`` when it has none."""
    return next((f for f in summary.get("families", []) if f["role"] == role and f["picked_on"] == picked_on), None)


def is_prompt_default(spec: str) -> bool:
    """Whether ``spec`` builds the press ``JacapPromptPress()`` builds today (same options): the prompt press, Jacap on
    the prompt's own recent queries (the library's default until the candidates were frozen)."""
    from jacap_lib.presses.registry import changed_options

    return method_of(spec).startswith("jacap") and not changed_options(spec, "jacap_prompt")


def is_library_default(spec: str) -> bool:
    """Whether ``spec`` builds the press ``JacapPress()`` builds today (registry ``jacap`` with no option
    changed): the default, Jacap on the queries of the context's reconstruction pass, the tune rule's choice."""
    from jacap_lib.presses.registry import changed_options

    return method_of(spec) == "jacap" and not changed_options(spec, "jacap")


# --------------------------------------------------------------------------------------------- dev.jsonl's rows
def paired_values(rows: list[dict], setting: str, reference: str, length: int, ratio: float, *, key: str = "kl",
                  kind: str | None = None) -> tuple[list[str], list, list]:
    """``(documents, values of setting, values of reference)`` of one (length, ratio) cell, paired per document
    (documents holding both settings, sorted; ``kind``: only documents of that kind). ``key``: a row field."""
    by: dict = {}
    for r in rows:
        if (r["method"] in (setting, reference) and int(r["length"]) == int(length)
                and math.isclose(float(r["ratio"]), float(ratio)) and (kind is None or r.get("kind") == kind)):
            by.setdefault(r["method"], {})[r["doc"]] = r[key]
    a, b = by.get(setting, {}), by.get(reference, {})
    docs = sorted(set(a) & set(b))
    if len(docs) < 3:
        raise ValueError(f"cell {length}/{ratio}{'' if kind is None else ' kind ' + kind}: {len(docs)} documents "
                         f"hold both {setting!r} and {reference!r}; a paired interval needs at least 3")
    return docs, [a[d] for d in docs], [b[d] for d in docs]


def _interval(x, y, *, verdict: bool = False, **opts) -> dict:
    """The paired geometric-mean ratio ``x / y`` (:func:`~jacap_lib.verdicts.intervals.geometric_mean_ratio`, ``opts``
    its options) as a record ``{"ratio", "low", "high", "n"}`` (``verdict``: with its sentence)."""
    iv = V.geometric_mean_ratio(x, y, **opts)
    out = {"ratio": iv.estimate, "low": iv.low, "high": iv.high, "n": iv.n}
    if verdict:
        out["verdict"] = V.verdict(iv)
    return out


def layer_error_ratios(rows: list[dict], setting: str, reference: str, length: int, ratio: float, *,
                       kind: str | None = None, **opts) -> list[dict]:
    """Per layer ``l``: the geometric mean over the documents of ``err_l(setting) / err_l(reference)`` (the
    attention-output relative error of layer ``l``, ``attn_rel_error_per_layer``) with its bootstrap interval,
    ``[{"layer", "ratio", "low", "high", "n"}]``. ``opts``: :func:`~jacap_lib.verdicts.intervals.geometric_mean_ratio`'s."""
    docs, a, b = paired_values(rows, setting, reference, length, ratio, key="attn_rel_error_per_layer", kind=kind)
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"attn_rel_error_per_layer must have one value per layer on every row, got shapes "
                         f"{a.shape} and {b.shape}")
    return [{"layer": layer, **_interval(a[:, layer], b[:, layer], **opts)} for layer in range(a.shape[1])]


def kind_ratios(rows: list[dict], setting: str, reference: str, length: int, ratio: float, **opts) -> list[dict]:
    """Per document kind (and ``"all"``): the geometric-mean KL ratio ``setting / reference`` with its interval,
    and the documents lost (``setting``'s KL higher) and won."""
    kinds = ["all"] + list(dict.fromkeys(r.get("kind") for r in rows if r.get("kind") is not None))
    out = []
    for k in kinds:
        _, a, b = paired_values(rows, setting, reference, length, ratio, kind=None if k == "all" else k)
        a, b = np.asarray(a, float), np.asarray(b, float)
        out.append({"kind": k, **_interval(a, b, **opts), "losses": int((a > b).sum()), "wins": int((a < b).sum())})
    return out


def layer_error_geomeans(rows: list[dict], setting: str, reference: str, docs, cells) -> dict:
    """Per layer, the geometric mean over documents (and cells) of ``attn_rel_error_per_layer`` of ``setting``
    divided by that of ``reference`` on the same (document, length, ratio): ``{"L/c": [per layer], "all": [...]}``
    (``cells``: ``[(length, ratio)]``; errors floored at :data:`ERROR_FLOOR`). Descriptive: no interval (for one
    cell with intervals: :func:`layer_error_ratios`)."""
    err = {(r["method"], int(r["length"]), float(r["ratio"]), r["doc"]): r["attn_rel_error_per_layer"] for r in rows}
    out, pooled = {}, []
    for L, c in cells:
        logs = []
        for d in docs:
            a, b = err[(setting, L, c, d)], err[(reference, L, c, d)]
            if len(a) != len(b):
                raise ValueError(f"rows of {setting!r} and {reference!r} on {d} at {L}/{c} hold different layer counts")
            logs.append([math.log(max(x, ERROR_FLOOR) / max(y, ERROR_FLOOR)) for x, y in zip(a, b)])
        pooled += logs
        out[f"{L}/{c}"] = [math.exp(sum(col) / len(col)) for col in zip(*logs)]
    out["all"] = [math.exp(sum(col) / len(col)) for col in zip(*pooled)] if pooled else []
    return out


# --------------------------------------------------------------------------------------------- the losing cells
def losing_cells(summary: dict, role: str = ALGORITHM1) -> list[dict]:
    """The rows of ``summary`` (``summary.json``'s content) for the Jacap setting of ``role`` (default: Algorithm 1's
    tuned setting) against the best baseline picked on tune whose 95 % interval of the geometric-mean KL ratio lies
    wholly above 1."""
    fam = family(summary, role, "tune")
    if fam is None:
        raise ValueError(f"summary has no family {role!r} against the baseline picked on tune; run `jacap evaluate "
                         "summary`")
    return [r for r in fam["rows"] if r["gm_low"] > 1]


def default_role(summary: dict) -> str | None:
    """The role of the summary family whose setting is the press ``JacapPromptPress()`` builds today (picked on tune), or
    ``None`` when no family measures it."""
    return next((f["role"] for f in summary.get("families", [])
                 if f["picked_on"] == "tune" and is_prompt_default(f["setting"])), None)


def kind_pairs(dev_rows: list[dict], choices: dict, pairs: dict, *, kind: str = "dialogue") -> list[dict]:
    """Per (length, ratio) cell of the tune's best baselines (``choices``: ``choices.json``'s content), on the dev
    documents of one ``kind``: for each label of ``pairs`` (label -> ``(setting, reference)``; reference ``None``:
    the cell's best baseline picked on tune) the row of :func:`jacap_lib.verdicts.intervals.compare_cells` over the
    cells (the paired geometric-mean KL ratio with its 95 % interval, the verdict of the interval adjusted for the
    cells, the documents where ``setting`` is lower as ``wins``), with ``length``, ``ratio``, ``pair`` and
    ``reference``; cell by cell in the order of ``choices``, each cell's pairs in the order of ``pairs``."""
    cells = {f"{c['length']}/{c['ratio']:g}": c for c in choices["best_baseline"]["cells"].values()}
    out = []
    for label, (setting, reference) in pairs.items():
        refs = {name: c["spec"] if reference is None else reference for name, c in cells.items()}
        paired = {name: paired_values(dev_rows, setting, refs[name], int(c["length"]), float(c["ratio"]),
                                      kind=kind)[1:] for name, c in cells.items()}
        out += [{"length": int(cells[r["cell"]]["length"]), "ratio": float(cells[r["cell"]]["ratio"]), "pair": label,
                 "reference": refs[r["cell"]], **r} for r in V.compare_cells(paired)]
    order = list(cells)
    return sorted(out, key=lambda r: order.index(r["cell"]))  # stable: each cell's pairs keep their order


def rows_part(dev_rows: list[dict], summary: dict, *, role: str = ALGORITHM1,
              **opts) -> tuple[list, list]:
    """Measurement 1 of ``jacap evaluate anatomy`` (:mod:`jacap_lib.experiments.anatomy`) on the committed files for the
    Jacap setting of ``role`` (default: Algorithm 1's tuned setting): ``(layers, kinds)``, one entry per losing cell
    (and per kind): :func:`layer_error_ratios` and :func:`kind_ratios`."""
    cells = losing_cells(summary, role)  # raises when the summary has no such family
    default = family(summary, role, "tune")["setting"]
    layers, kinds = [], []
    for cell in cells:
        L, c, base = int(cell["length"]), float(cell["ratio"]), cell["baseline_spec"]
        meta = {"cell": f"{L}/{c}", "length": L, "ratio": c, "setting": default, "baseline": base,
                "kl_ratio": cell["gm_ratio"], "kl_low": cell["gm_low"], "kl_high": cell["gm_high"]}
        kr = kind_ratios(dev_rows, default, base, L, c, **opts)
        kinds.append({**meta, "kinds": kr})
        for k in [x["kind"] for x in kr]:
            layers.append({**meta, "kind": k,
                           "layers": layer_error_ratios(dev_rows, default, base, L, c,
                                                        kind=None if k == "all" else k, **opts)})
    return layers, kinds


def library_default_part(dev_rows: list[dict], summary: dict, **opts) -> dict | None:
    """Measurement 1 for the press ``JacapPromptPress()`` builds today, when the summary judges it and it is not Algorithm
    1's tuned setting: ``{"role", "setting", "layers", "kinds"}`` (:func:`rows_part`), else ``None``."""
    role = default_role(summary)
    if role is None or role == ALGORITHM1:
        return None
    layers, kinds = rows_part(dev_rows, summary, role=role, **opts)
    return {"role": role, "setting": family(summary, role, "tune")["setting"], "layers": layers,
            "kinds": kinds}


# --------------------------------------------------------------------------------------------- anatomy.json's documents
#: the rungs of the ladder that change more than one knob from the default (shown by the ladder, not among the
#: one-knob swaps); their settings are :func:`jacap_lib.experiments.anatomy.swap_settings`'
LADDER_ONLY = ("ea_alpha", "ea_alpha_kappa", "ea_alpha_kappa_identity", "ea_alpha_kappa_identity_horizon",
               "ea_alpha_kappa_identity_horizon_flat")
#: The ladder (keys of ``anatomy.json``'s settings): from Algorithm 1's score to Expected Attention's, one knob per
#: step, each step measured against the step before it (:func:`ladder_ratios`); its first step is the swap
#: ``ea_centre``, its last rung the baseline's score under Jacap's protection (``baseline_jacap_protection``).
LADDER = ("default", "ea_centre", *LADDER_ONLY, "baseline_jacap_protection")


def swap_ratios(documents: list[dict], *, kind: str | None = None, reference: str = "default", **opts) -> list[dict]:
    """Per swap setting: the geometric mean over ``documents`` (the file's ``documents``; ``kind``: only that kind)
    of its KL / the ``reference`` setting's KL (default: Algorithm 1's tuned Jacap setting), with its bootstrap interval
    (n = the documents: small, the interval wide), and the documents where it is lower than the reference's."""
    docs = [d for d in documents if kind is None or d["kind"] == kind]
    if len(docs) < 3:
        raise ValueError(f"swap_ratios: {len(docs)} documents{'' if kind is None else ' of kind ' + kind}; need >= 3")
    keys = list(docs[0]["kl"])
    if reference not in keys:
        raise ValueError(f"reference {reference!r} is not a swap setting; choose among {keys}")
    ref = np.array([d["kl"][reference]["kl"] for d in docs])
    out = []
    for k in keys:
        x = np.array([d["kl"][k]["kl"] for d in docs])
        if np.allclose(x, ref, rtol=1e-12, atol=0):
            out.append({"key": k, "ratio": 1.0, "low": 1.0, "high": 1.0, "n": len(docs), "lower": 0,
                        "verdict": "identical on every document"})
            continue
        out.append({"key": k, **_interval(x, ref, verdict=True, **opts), "lower": int((x < ref).sum())})
    return out


def ladder_ratios(documents: list[dict], *, kind: str | None = None, **opts) -> list[dict]:
    """The ladder (:data:`LADDER`) from Algorithm 1's tuned setting to the baseline's score under Jacap's protection:
    per step, the paired geometric-mean KL ratio of the step to the step before it, with its interval and the
    documents where the step lowered the KL (``[{"key", "previous", "ratio", "low", "high", "verdict", "lower",
    "n"}]``). The ratios multiply to the last rung / the default on every document. Needs every rung in the file."""
    docs = [d for d in documents if kind is None or d["kind"] == kind]
    if len(docs) < 3:
        raise ValueError(f"ladder_ratios: {len(docs)} documents{'' if kind is None else ' of kind ' + kind}; need >= 3")
    missing = [k for k in LADDER if k not in docs[0]["kl"]]
    if missing:
        raise ValueError(f"ladder_ratios: the file lacks {missing}; run `jacap evaluate anatomy --extend`")
    kl = {k: np.array([d["kl"][k]["kl"] for d in docs]) for k in LADDER}
    return [{"key": b, "previous": a, **_interval(kl[b], kl[a], verdict=True, **opts), "lower": int((kl[b] < kl[a]).sum())}
            for a, b in zip(LADDER, LADDER[1:])]


def decompose_gap(documents: list[dict], *, kind: str | None = None, **opts) -> list[dict]:
    """The default's KL gap to the baseline split into protection and score, two ways, each part a paired
    geometric-mean ratio with its interval (n = the documents, small):

    * ``total``: default / baseline;
    * ``protection (Jacap's score)``: default / Jacap's score under the baseline's protection, and
      ``score (the baseline's protection)``: that / baseline — the two multiply to ``total`` on every document;
    * ``score (Jacap's protection)``: default / the baseline's score under Jacap's protection, and
      ``protection (the baseline's score)``: that / baseline — the other order, also multiplying to ``total``.

    Needs the swap keys ``default``, ``baseline``, ``baseline_jacap_protection`` and ``jacap_baseline_protection``
    (for a baseline without sinks, ``jacap_no_protection`` stands for the latter)."""
    docs = [d for d in documents if kind is None or d["kind"] == kind]
    if len(docs) < 3:
        raise ValueError(f"decompose_gap: {len(docs)} documents{'' if kind is None else ' of kind ' + kind}; need >= 3")
    jb = "jacap_baseline_protection" if "jacap_baseline_protection" in docs[0]["kl"] else "jacap_no_protection"
    kl = {k: np.array([d["kl"][k]["kl"] for d in docs]) for k in ("default", "baseline", "baseline_jacap_protection", jb)}
    parts = [("total", "default", "baseline"),
             ("protection (Jacap's score)", "default", jb), ("score (the baseline's protection)", jb, "baseline"),
             ("score (Jacap's protection)", "default", "baseline_jacap_protection"),
             ("protection (the baseline's score)", "baseline_jacap_protection", "baseline")]
    return [{"part": name, "numerator": a, "denominator": b, **_interval(kl[a], kl[b], verdict=True, **opts)}
            for name, a, b in parts]


def kept_summary(documents: list[dict], *, kind: str | None = None) -> dict:
    """The kept-set comparison of ``anatomy.json``'s measurement 2 over ``documents`` (``kind``: only that kind): the
    mean Jaccard overlap per layer, the distance-from-end histograms of the tokens kept by one press only (summed over
    documents and layers, as a fraction of all such tokens), and their categories against the prompt's."""
    docs = [d for d in documents if kind is None or d["kind"] == kind]
    if not docs:
        raise ValueError(f"kept_summary: no documents{'' if kind is None else ' of kind ' + kind}")
    jac = np.mean([d["jaccard"] for d in docs], axis=0)
    out = {"n_docs": len(docs), "jaccard": jac.tolist(), "edges": docs[0]["histogram"]["edges"]}
    for side in ("a_only", "b_only"):
        h = np.sum([np.sum(d["histogram"][side], axis=0) for d in docs], axis=0).astype(float)
        out[side] = (h / max(h.sum(), 1)).tolist()
        out[side + "_per_head"] = float(h.sum() / sum(d["n_layers"] * d["n_heads"] for d in docs))
        cats = {c: sum(d["categories"][side][c] for d in docs) for c in docs[0]["categories"][side]}
        tot = max(sum(cats.values()), 1)
        out[side + "_categories"] = {c: v / tot for c, v in cats.items()}
    cats = {c: sum(d["categories"]["prompt"][c] for d in docs) for c in docs[0]["categories"]["prompt"]}
    out["prompt_categories"] = {c: v / max(sum(cats.values()), 1) for c, v in cats.items()}
    return out


# --------------------------------------------------------------------------------------------- needle.jsonl's outcomes
FULL = "full"  # the method of the uncompressed answer (ratio 0)
DEFAULT_MODE = "after"  # the mode of rows made before the option existed (jacap_lib.measure.passkey.MODES)
BASELINE_LABEL = "best baseline by KL on tune"
PAPER_LABEL = "paper preset"


def row_mode(row: dict) -> str:
    """The row's mode; rows made before the option existed were made ``after``."""
    return row.get("mode", DEFAULT_MODE)


def _paired(a: list, b: list, opts: dict) -> dict:
    """One paired comparison of 0/1 outcomes per prompt (``a`` the setting, ``b`` the reference): accuracies,
    the difference in points with its paired bootstrap interval, wins/losses, exact McNemar p, verdict."""
    diff = V.accuracy_difference(a, b, **opts)
    return {"n": len(a), "accuracy": sum(a) / len(a), "reference_accuracy": sum(b) / len(b),
            "diff_points": diff.estimate, "diff_low": diff.low, "diff_high": diff.high,
            "wins": sum(x and not y for x, y in zip(a, b)), "losses": sum(y and not x for x, y in zip(a, b)),
            "p_mcnemar": V.mcnemar_p(a, b)}


def _holm(rows: list[dict], alpha: float) -> None:
    for row, p in zip(rows, V.holm([r["p_mcnemar"] for r in rows])):
        row["verdict"] = V.mcnemar_verdict(row["wins"], row["losses"], float(p), alpha=alpha)
        row["p_holm"] = float(p)
        row["holm_significant"] = bool(p <= alpha)


def needle_summary(rows: list[dict], choices: dict, *, prompts=None, settings=None, alpha: float = 0.05,
                   confidence: float | None = None, n_resamples: int | None = None, seed: int | None = None,
                   mode: str = DEFAULT_MODE, references=None, paper_preset: str | None = None) -> dict:
    """The needle statistics (pure): per (length, ratio) cell with every setting and the uncompressed answer on
    every prompt, each one's accuracy with its 95 % Wilson interval; then Algorithm 1's tuned Jacap setting
    (``choices["chosen"]["jacap_prompt"]``) against (a) the cell's best baseline by KL on tune and (b) the paper
    preset, paired per prompt: accuracy difference (Jacap − reference, percentage points) with its paired
    bootstrap interval (descriptive), wins/losses (prompts only one gets right), exact McNemar p, Holm over the
    cells of one comparison, and the verdict of the Holm-adjusted exact test
    (:func:`~jacap_lib.verdicts.intervals.mcnemar_verdict`: "better"/"worse" only where it is at most ``alpha``).

    ``prompts``: ``[(depth, trial, key)]`` every cell must hold (default: the prompts of each length's
    uncompressed rows); ``settings``: the specs to report (default: every compressed setting of
    ``rows``, in the order of the rows; the needle-summary job passes the ones its latest run measured). Only the rows of ``mode`` are read (rows without a mode were made ``after``). ``references``:
    other specs to compare Algorithm 1's tuned Jacap setting with, one comparison each (default: the protocol's two,
    the best baseline and the paper preset); Holm runs over the cells of one comparison.
    ``paper_preset``: the paper preset's spec, compared with when ``settings`` hold it and it is another setting
    than the tune choice (the needle job passes the protocol's, unless the two build the same press).
    Returns ``{"cells": [...], "comparisons": [...], "cells_measured", "cells_missing"}``."""

    opts = {k: v for k, v in (("confidence", confidence), ("n_resamples", n_resamples), ("seed", seed)) if v is not None}
    model = (choices.get("config") or {}).get("model", {}).get("name")
    rows = [r for r in rows if (model is None or r.get("model") == model) and row_mode(r) == mode]
    got = {(r["method"], int(r["length"]), float(r["ratio"]), (float(r["depth"]), int(r["trial"]), str(r["key"]))):
           bool(r["correct"]) for r in rows}
    if settings is None:
        settings = list(dict.fromkeys(r["method"] for r in rows if r["method"] != FULL))
    settings = list(settings)
    default = choices["chosen"]["jacap_prompt"]
    lengths = sorted({int(r["length"]) for r in rows})
    ratios = sorted({float(r["ratio"]) for r in rows if r["method"] != FULL})
    cells, missing, outcome = [], [], {}
    for L in lengths:
        ps = ([(float(d), int(t), str(k)) for d, t, k in prompts] if prompts is not None else
              sorted(p for (m, l, _, p) in got if m == FULL and l == L))
        for c in ratios:
            need = [(FULL, 0.0)] + [(s, c) for s in settings]
            if not ps or any((s, L, cc, p) not in got for s, cc in need for p in ps):
                missing.append(f"{L}/{c}")
                continue
            acc = {}
            for s, cc in need:
                x = [got[(s, L, cc, p)] for p in ps]
                outcome[(s, L, c)] = x
                a, lo, hi = V.accuracy_interval(x, **({"confidence": confidence} if confidence else {}))
                acc[s] = {"spec": s, "family": FULL if s == FULL else method_of(s), "correct": int(sum(x)),
                          "accuracy": a, "low": lo, "high": hi}
            cells.append({"length": L, "ratio": c, "n_prompts": len(ps), "full": acc[FULL],
                          "settings": [acc[s] for s in settings]})
    if not cells:
        raise ValueError("needle.jsonl has no complete (length, ratio) cell (every setting and the uncompressed "
                         "answer on every prompt); run or finish `jacap evaluate needle`")
    comparisons = []
    if references is not None:
        refs = [(ref, ref, lambda cell, ref=ref: ref) for ref in references]
    else:
        refs = [("best baseline", BASELINE_LABEL,
                 lambda cell: choices["best_baseline"]["cells"][f"{cell['length']}/{cell['ratio']}"]["spec"])]
        if paper_preset is not None and paper_preset in settings:
            refs.append(("paper preset", PAPER_LABEL, lambda cell: paper_preset))
    if default not in settings:
        raise ValueError(f"needle.jsonl has no rows of Algorithm 1's tuned Jacap setting {default!r}; run `jacap evaluate needle`")
    for role, label, ref_of in refs:
        out = []
        for cell in cells:
            L, c, ref = cell["length"], cell["ratio"], ref_of(cell)
            if ref not in settings:
                raise ValueError(f"needle.jsonl has no rows of {ref!r} ({label}) in cell {L}/{c}")
            out.append({"length": L, "ratio": c, "reference_spec": ref,
                        **_paired(outcome[(default, L, c)], outcome[(ref, L, c)], opts)})
        _holm(out, alpha)
        comparisons.append({"setting": default, "reference": role, "label": label, "rows": out})
    return {"cells": cells, "comparisons": comparisons, "cells_measured": [f"{c['length']}/{c['ratio']}" for c in cells],
            "cells_missing": missing}


def survival_statistics(rows: list[dict], confidence: float | None = None) -> dict:
    """Digit survival of one setting's rows (one cell, one mode; rows of :func:`jacap_lib.measure.passkey.measure_needle`):
    the mean fractions kept of the key's digit tokens, of the needle's tokens and of (layer, KV head) caches
    holding a whole copy of the key; the per-layer mean fraction of key digits kept (over KV heads and
    prompts); the fraction of prompts where every key digit survived in every layer and KV head; and the
    accuracy on those prompts and on the others, each with its Wilson interval (``None`` when there are none)."""
    if not rows or any("key_kept" not in r for r in rows):
        raise ValueError("survival_statistics needs rows with digit survival (measured by `jacap evaluate needle` "
                         "since the --mode option)")
    n = len(rows)
    kw = {"confidence": confidence} if confidence else {}

    def acc(sub):
        if not sub:
            return {"n": 0, "correct": 0, "accuracy": None, "low": None, "high": None}
        a, lo, hi = V.accuracy_interval([bool(r["correct"]) for r in sub], **kw)
        return {"n": len(sub), "correct": sum(bool(r["correct"]) for r in sub), "accuracy": a, "low": lo, "high": hi}

    n_layers = len(rows[0]["key_kept"])
    by_layer = [sum(sum(r["key_kept"][i]) / len(r["key_kept"][i]) for r in rows) / n for i in range(n_layers)]
    every = [r for r in rows if r["key_all_kept"]]
    return {"n": n, "key_kept_mean": sum(r["key_kept_frac"] for r in rows) / n,
            "needle_kept_mean": sum(r["needle_kept_frac"] for r in rows) / n,
            "key_copy_kept_mean": sum(r["key_copy_kept"] for r in rows) / n,
            "all_kept_fraction": len(every) / n, "key_kept_by_layer": by_layer,
            "accuracy_all_kept": acc(every), "accuracy_not_all_kept": acc([r for r in rows if not r["key_all_kept"]])}


SURVIVAL_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)


def pooled_survival(rows: list[dict], bins=SURVIVAL_BINS) -> dict:
    """Digit survival against the answer over compressed rows of every setting and cell (pooled; an
    association across settings, not an effect of survival): the accuracy per bin of ``key_kept_frac``
    (``[lo, hi)``, the last bin closed) with its Wilson interval, and per layer the mean fraction of key digits
    kept (over KV heads) in the rows answered right and in those answered wrong."""
    out = []
    for i, (lo, hi) in enumerate(zip(bins[:-1], bins[1:])):
        last = i == len(bins) - 2
        sub = [r for r in rows if lo <= r["key_kept_frac"] < hi or (last and r["key_kept_frac"] == hi)]
        entry = {"low_edge": lo, "high_edge": hi, "n": len(sub)}
        if sub:
            a, l, h = V.accuracy_interval([bool(r["correct"]) for r in sub])
            entry.update(correct=sum(bool(r["correct"]) for r in sub), accuracy=a, low=l, high=h)
        out.append(entry)

    def by_layer(sub):
        if not sub:
            return None
        n_layers = len(sub[0]["key_kept"])
        return [sum(sum(r["key_kept"][i]) / len(r["key_kept"][i]) for r in sub) / len(sub) for i in range(n_layers)]

    right = [r for r in rows if r["correct"]]
    wrong = [r for r in rows if not r["correct"]]
    return {"n": len(rows), "bins": out, "key_kept_by_layer_right": by_layer(right),
            "key_kept_by_layer_wrong": by_layer(wrong), "n_right": len(right), "n_wrong": len(wrong)}


def needle_probe_summary(rows: list[dict], choices: dict, *, prompts=None, settings=None, alpha: float = 0.05,
                         seed: int | None = None) -> dict:
    """The probe's statistics (pure), per mode present in ``rows``: the cells of :func:`needle_summary`
    (each setting's accuracy with its Wilson interval, the uncompressed ceiling); Algorithm 1's tuned Jacap setting
    against every other setting, paired per prompt (exact McNemar p, Holm over ALL the comparisons of the mode:
    every other setting x every cell); each setting's :func:`survival_statistics` per cell. Then, per setting
    and cell complete in both modes, ``inside`` against ``after`` paired on the prompts both modes hold (Holm
    over those). ``prompts``: ``[(depth, trial, key)]``, or ``{mode: [...]}`` when the modes were run on
    different prompt sets (a mode's run may cover a subset of the depths).
    Returns ``{"modes": {mode: {"cells", "comparisons", "survival", "cells_measured", "cells_missing"}},
    "mode_effect": [...]}``."""
    from jacap_lib.measure.passkey import MODES

    opts = {"seed": seed} if seed is not None else {}
    default = choices["chosen"]["jacap_prompt"]
    present = [m for m in MODES if any(row_mode(r) == m for r in rows)]
    if not present:
        raise ValueError("needle_probe.jsonl has no rows; run `jacap evaluate needle --probe`")
    out, outcome = {}, {}
    for mode in present:
        mine = [r for r in rows if row_mode(r) == mode]
        mode_prompts = prompts.get(mode) if isinstance(prompts, dict) else prompts
        specs = list(settings) if settings is not None else list(dict.fromkeys(r["method"] for r in mine if r["method"] != FULL))
        s = needle_summary(mine, choices, prompts=mode_prompts, settings=specs, mode=mode, alpha=alpha, seed=seed,
                           references=[x for x in specs if x != default])
        _holm([r for f in s["comparisons"] for r in f["rows"]], alpha)
        for f in s["comparisons"]:
            f["holm_family"] = "every other setting x every cell of this mode"
        ps = {(float(d), int(t), str(k)) for d, t, k in mode_prompts} if mode_prompts is not None else None
        surv = []
        for cell in s["cells"]:
            L, c = cell["length"], cell["ratio"]
            for spec in specs:
                sub = [r for r in mine if r["method"] == spec and int(r["length"]) == L and float(r["ratio"]) == c
                       and (ps is None or (float(r["depth"]), int(r["trial"]), str(r["key"])) in ps)]
                sub.sort(key=lambda r: (float(r["depth"]), int(r["trial"])))
                outcome[(mode, spec, L, c)] = {(float(r["depth"]), int(r["trial"]), str(r["key"])): bool(r["correct"])
                                               for r in sub}
                surv.append({"spec": spec, "family": method_of(spec), "length": L, "ratio": c,
                             **survival_statistics(sub)})
        judged = {(c["length"], c["ratio"]) for c in s["cells"]}
        kept_rows = [r for r in mine if r["method"] in specs and (int(r["length"]), float(r["ratio"])) in judged
                     and (ps is None or (float(r["depth"]), int(r["trial"]), str(r["key"])) in ps)]
        out[mode] = {**s, "survival": surv, "pooled": pooled_survival(kept_rows)}
    effect = []
    if len(present) == 2:
        for (mode, spec, L, c), ins in outcome.items():
            aft = outcome.get(("after", spec, L, c))
            both = sorted(set(ins) & set(aft or {}))
            if mode != "inside" or not both:
                continue
            effect.append({"spec": spec, "length": L, "ratio": c, "setting_mode": "inside", "reference_mode": "after",
                           **_paired([ins[p] for p in both], [aft[p] for p in both], opts)})
        _holm(effect, alpha)
    return {"modes": out, "mode_effect": effect}
