"""The anatomy of the cells where Algorithm 1's tuned Jacap setting loses: ``jacap evaluate anatomy`` ->
``data/results/eval/anatomy.json``.

Three measurements, each isolating one thing:

1. **Which layers** (from the committed test rows; no model run): per losing cell — the cells of ``summary.json``
   whose 95 % interval of the geometric-mean KL ratio (default / best baseline picked on tune) lies above 1 —
   and per document kind, the per-layer attention-output error of the default against the cell's best
   baseline: the geometric mean over the documents of the per-document ratio, with its BCa bootstrap interval
   (:func:`jacap_lib.results.verdicts.geometric_mean_ratio`), :func:`layer_ratios`; and the KL ratio per
   document kind, :func:`kind_ratios`. The per-layer error is cumulative: layer ``l``'s output already carries
   what earlier layers changed in the residual stream.
2. **Which tokens** (a model run, one cell): on a few test documents, the kept sets of the default and of the
   best baseline per layer and KV head, their overlap, where the tokens kept by only one of them lie and what
   they are (:func:`jacap_lib.measure.anatomy.measure_document`).
3. **The swap** (same run): KL of one-knob changes of the default and of the baseline (:func:`swap_settings`) —
   Jacap's score under the baseline's protection, the baseline's score under Jacap's protection, Jacap with no
   protection, Jacap's temperature and statistics — each as a paired ratio to the default
   (:func:`swap_ratios`).

Measurement 1 is also made for the press ``JacapPress()`` builds today when it is another tuned Jacap method
(``library_default``: ``{"role", "setting", "layers", "kinds"}``, :func:`library_default_part`).

The file: ``{"config", "layers", "kinds", "library_default", "documents", "swap"}``; ``config`` records the model, the cell, the
documents (id, kind, sha256), every setting's press options and the package versions
(:func:`jacap_lib.results.provenance.provenance`).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from ..presses.registry import parse_method, with_options
from . import files, findings
from . import job as J
from . import protocol as P

__all__ = ["layer_lines", "kind_lines", "kind_pairs", "swap_lines", "losing_cells", "default_role", "library_default_part", "paired_values", "layer_ratios", "kind_ratios", "rows_part",
           "swap_settings", "pick_documents", "swap_ratios", "ladder_ratios", "ladder_lines", "ladder_setting_lines", "LADDER", "LADDER_ONLY", "decompose_gap", "kept_summary", "add_arguments", "prepare", "execute",
           "JOB", "DEFAULT_LENGTH", "DEFAULT_RATIO", "DEFAULT_PER_KIND"]

DEFAULT_LENGTH = 2048
DEFAULT_RATIO = 0.5
DEFAULT_PER_KIND = 6  # the committed file: 24 test documents (3 per kind left each kind's interval too wide to read)
OBS_WINDOW = 32  # the prompt queries whose attention replaces Jacap's centre (= Jacap's recent window)
NO_LEVERAGE_NOISE = 1e6  # sigma^2 this large makes A = I + W / sigma^2 the identity to float32 precision


# --------------------------------------------------------------------------------------------- 1: the rows
def losing_cells(summary: dict, role: str = findings.ALGORITHM1) -> list[dict]:
    """The rows of ``summary`` (``summary.json``'s content) for the Jacap setting of ``role`` (default: Algorithm 1's
    tuned setting) against the best baseline picked on tune whose 95 % interval of the geometric-mean KL ratio lies
    wholly above 1."""
    fam = findings.family(summary, role, "tune")
    if fam is None:
        raise ValueError(f"summary has no family {role!r} against the baseline picked on tune; run `jacap evaluate "
                         "summary`")
    return [r for r in fam["rows"] if r["gm_low"] > 1]


def default_role(summary: dict) -> str | None:
    """The role of the summary family whose setting is the press ``JacapPress()`` builds today (picked on tune), or
    ``None`` when no family measures it."""
    return next((f["role"] for f in summary.get("families", [])
                 if f["picked_on"] == "tune" and findings.is_library_default(f["setting"])), None)


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
    from . import verdicts as V

    iv = V.geometric_mean_ratio(x, y, **opts)
    out = {"ratio": iv.estimate, "low": iv.low, "high": iv.high, "n": iv.n}
    if verdict:
        out["verdict"] = V.verdict(iv)
    return out


def layer_ratios(rows: list[dict], setting: str, reference: str, length: int, ratio: float, *,
                 kind: str | None = None, **opts) -> list[dict]:
    """Per layer ``l``: the geometric mean over the documents of ``err_l(setting) / err_l(reference)`` (the
    attention-output relative error of layer ``l``, ``attn_rel_error_per_layer``) with its bootstrap interval,
    ``[{"layer", "ratio", "low", "high", "n"}]``. ``opts``: :func:`~jacap_lib.results.verdicts.geometric_mean_ratio`'s."""
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


def kind_pairs(test_rows: list[dict], choices: dict, pairs: dict, *, kind: str = "dialogue") -> list[dict]:
    """Per (length, ratio) cell of the tune's best baselines (``choices``: ``choices.json``'s content), on the test
    documents of one ``kind``: for each label of ``pairs`` (label -> ``(setting, reference)``; reference ``None``:
    the cell's best baseline picked on tune) the row of :func:`jacap_lib.results.verdicts.compare_cells` over the
    cells (the paired geometric-mean KL ratio with its 95 % interval, the verdict of the interval adjusted for the
    cells, the documents where ``setting`` is lower as ``wins``), with ``length``, ``ratio``, ``pair`` and
    ``reference``; cell by cell in the order of ``choices``, each cell's pairs in the order of ``pairs``."""
    from . import verdicts as V

    cells = {f"{c['length']}/{c['ratio']:g}": c for c in choices["best_baseline"]["cells"].values()}
    out = []
    for label, (setting, reference) in pairs.items():
        refs = {name: c["spec"] if reference is None else reference for name, c in cells.items()}
        paired = {name: paired_values(test_rows, setting, refs[name], int(c["length"]), float(c["ratio"]),
                                      kind=kind)[1:] for name, c in cells.items()}
        out += [{"length": int(cells[r["cell"]]["length"]), "ratio": float(cells[r["cell"]]["ratio"]), "pair": label,
                 "reference": refs[r["cell"]], **r} for r in V.compare_cells(paired)]
    order = list(cells)
    return sorted(out, key=lambda r: order.index(r["cell"]))  # stable: each cell's pairs keep their order


def rows_part(test_rows: list[dict], summary: dict, *, role: str = findings.ALGORITHM1,
              **opts) -> tuple[list, list]:
    """Measurement 1 on the committed files for the Jacap setting of ``role`` (default: Algorithm 1's tuned setting):
    ``(layers, kinds)``, one entry per losing cell (and per kind)."""
    cells = losing_cells(summary, role)  # raises when the summary has no such family
    default = findings.family(summary, role, "tune")["setting"]
    layers, kinds = [], []
    for cell in cells:
        L, c, base = int(cell["length"]), float(cell["ratio"]), cell["baseline_spec"]
        meta = {"cell": f"{L}/{c}", "length": L, "ratio": c, "setting": default, "baseline": base,
                "kl_ratio": cell["gm_ratio"], "kl_low": cell["gm_low"], "kl_high": cell["gm_high"]}
        kr = kind_ratios(test_rows, default, base, L, c, **opts)
        kinds.append({**meta, "kinds": kr})
        for k in [x["kind"] for x in kr]:
            layers.append({**meta, "kind": k,
                           "layers": layer_ratios(test_rows, default, base, L, c, kind=None if k == "all" else k,
                                                  **opts)})
    return layers, kinds


def library_default_part(test_rows: list[dict], summary: dict, **opts) -> dict | None:
    """Measurement 1 for the press ``JacapPress()`` builds today, when the summary judges it and it is not Algorithm
    1's tuned setting: ``{"role", "setting", "layers", "kinds"}`` (:func:`rows_part`), else ``None``."""
    role = default_role(summary)
    if role is None or role == findings.ALGORITHM1:
        return None
    layers, kinds = rows_part(test_rows, summary, role=role, **opts)
    return {"role": role, "setting": findings.family(summary, role, "tune")["setting"], "layers": layers,
            "kinds": kinds}


# --------------------------------------------------------------------------------------------- 2-3: the swap
#: The ladder: from Algorithm 1's score to Expected Attention's, one knob per step, each step measured against the
#: step before it (:func:`ladder_ratios`); its first step is the swap ``ea_centre``, its last rung is the baseline's
#: score under Jacap's protection (``baseline_jacap_protection``).
BASELINE_HORIZON = "the baseline's"  # an option value a ladder step takes from the baseline's press (its horizon)
_LADDER_STEPS = (
    ("ea_alpha", {"sensitivity": "alpha"},
     "ea_centre, then the sensitivity factor alpha-bar instead of rho^2 (the weight is the expected attention times "
     "k^T Lambda k / d)"),
    ("ea_alpha_kappa", {"kappa": "mean"},
     "ea_alpha, then k^T Lambda k flattened to the head's mean (the weight is the expected attention)"),
    ("ea_alpha_kappa_identity", {"leverage": "identity"},
     "ea_alpha_kappa, then A := I: the score is the expected attention times |v|^2 (Expected Attention's score "
     "is the expected attention times |v|, from its own statistics)"),
    ("ea_alpha_kappa_identity_horizon", {"n_future_positions": BASELINE_HORIZON},
     "ea_alpha_kappa_identity, then the baseline's RoPE horizon: the future queries averaged over its number of "
     "future positions"),
    ("ea_alpha_kappa_identity_horizon_flat", {"beta": None},
     "ea_alpha_kappa_identity_horizon, then flat statistics over the prompt instead of the EMA (what is left to the "
     "last rung: the baseline's full query covariance per query head instead of a diagonal one pooled per KV head, "
     "|v| instead of |v|^2, its epsilon)"),
)
LADDER = ("default", "ea_centre", *(k for k, _, _ in _LADDER_STEPS), "baseline_jacap_protection")
#: the rungs that change more than one knob from the default (shown by the ladder, not among the one-knob swaps)
LADDER_ONLY = tuple(k for k, _, _ in _LADDER_STEPS)


def swap_settings(default: str, baseline: str) -> list[dict]:
    """The settings of the swap, each one knob away from the default (or from the baseline):
    ``[{"key", "spec", "changes", "protect"}]``; ``protect``: ``(n_sink, window)`` for the baseline's score under
    Jacap's protection (:class:`~jacap_lib.measure.instruments.ProtectedPress`), else ``None``.

    The baseline's own protection is its ``n_sink`` (Expected Attention: the first 4 positions) and no window;
    Jacap's is ``n_sink`` sinks and a ``window`` of recent positions."""
    jacap = P.protocol_press(default, 0.5)  # as the protocol measures it (protocol.PINS)
    n_sink, window, tau, noise = jacap.n_sink, jacap.window, float(jacap.tau), jacap.noise
    base_press = P.protocol_press(baseline, 0.5)
    b_sink = int(getattr(base_press, "n_sink", 0))
    out = [
        {"key": "default", "spec": default, "changes": "nothing: Algorithm 1's tuned Jacap setting", "protect": None},
        {"key": "baseline", "spec": baseline, "changes": "the cell's best baseline (picked on tune)", "protect": None},
        {"key": "jacap_baseline_protection", "spec": with_options(default, n_sink=b_sink, window=0),
         "changes": f"Jacap's protection replaced by the baseline's: {b_sink} sinks, no window "
                    f"(from {n_sink} sinks + a {window}-token window)", "protect": None},
        {"key": "jacap_no_protection", "spec": with_options(default, n_sink=0, window=0),
         "changes": "no protection at all (n_sink=0 also lets the first queries into the statistics)", "protect": None},
        {"key": "baseline_jacap_protection", "spec": f"{baseline}+protect[n_sink={n_sink},window={window}]",
         "changes": f"the baseline's score under Jacap's protection ({n_sink} sinks + the last {window} positions "
                    "always kept)", "protect": (int(n_sink), int(window))},
    ]
    if out[2]["spec"] == out[3]["spec"]:  # a baseline without sinks: its protection is no protection
        out.pop(2)
    for t in (1.0, 10.0):
        if t != tau:
            out.append({"key": f"tau_{t:g}", "spec": with_options(default, tau=t),
                        "changes": f"temperature tau = {t:g} (from {tau:g})", "protect": None})
    if noise != NO_LEVERAGE_NOISE:
        out.append({"key": "no_leverage", "spec": with_options(default, noise=NO_LEVERAGE_NOISE),
                    "changes": f"channel noise sigma^2 = {NO_LEVERAGE_NOISE:g}: A = I + W/sigma^2 is then ~ I, so the "
                               "score ranks by w_i |v_i|^2 (no interaction between tokens through A)", "protect": None})
    if jacap.gqa != "mean":
        out.append({"key": "gqa_mean", "spec": with_options(default, gqa="mean"),
                    "changes": "statistics and scores per query head, averaged over the KV head's group (Expected "
                               "Attention's convention) instead of one pooled Gaussian per KV head", "protect": None})
    out.append({"key": "observed_centre", "spec": f"{default}+observed[obs_window={OBS_WINDOW}]",
                "changes": f"the centre alpha replaced by the attention the last {OBS_WINDOW} prompt queries paid "
                           "(mean over them and the KV head's query heads); weight, leverage, protection Jacap's",
                "protect": None, "observed": OBS_WINDOW})
    out.append({"key": "oracle_statistics", "spec": f"{default}+oracle",
                "changes": "the query statistics (mu, Lambda) of the queries that actually follow the prompt (its "
                           "continuation) instead of the prompt's recent queries; centre rule, weight, leverage, "
                           "protection Jacap's", "protect": None, "oracle": True})
    name, opts = parse_method(P.pinned(default))
    if name == "jacap":  # the weight's form, one factor at a time (JacapAblationPress = JacapPress at its defaults)
        base = {**opts, "centre": jacap.centre}
        for key, option, text in (
                ("sensitivity_alpha", {"sensitivity": "alpha"},
                 "the sensitivity factor alpha-bar instead of rho^2 = [alpha-bar (1 - alpha-bar)]^2 (Expected "
                 "Attention's weight is the attention itself)"),
                ("kappa_mean", {"kappa": "mean"},
                 "the response variance k_i^T Lambda k_i replaced by the head's weighted mean (no token-to-token "
                 "variation; total weight unchanged)"),
                ("ea_centre", {"centre": "ea"},
                 "the centre: Expected Attention's log-normal expectation softmax(K mu/sqrt d + diag(K Lambda K^T)/2d) "
                 "instead of the tempered softmax")):
            if not (jacap.centre != "tempered" and key == "ea_centre"):
                out.append({"key": key, "spec": with_options("jacap_ablate", **{**base, **option}), "changes": text,
                            "protect": None})
        horizon = getattr(base_press, "n_future_positions", None)
        if horizon is not None and horizon != jacap.n_future_positions:
            out.append({"key": "future_positions", "spec": with_options(default, n_future_positions=int(horizon)),
                        "changes": f"the RoPE average of the future queries over the next {int(horizon)} positions (the "
                                   f"baseline's) instead of {jacap.n_future_positions}", "protect": None})
        if jacap.centre == "tempered" and horizon is not None:  # the ladder towards Expected Attention's score
            step = {**base, "centre": "ea"}
            for key, option, text in _LADDER_STEPS:
                step = {**step, **{k: int(horizon) if v == BASELINE_HORIZON else v for k, v in option.items()}}
                out.append({"key": key, "spec": with_options("jacap_ablate", **step), "changes": text,
                            "protect": None})
    if jacap.beta is not None:
        out.append({"key": "flat_statistics", "spec": with_options(default, beta=None),
                    "changes": "flat query statistics over the prompt (beta = none) instead of the EMA", "protect": None})
    return out


def _press(setting: dict, ratio: float):
    if setting.get("oracle"):
        from ..measure.instruments import JacapGivenStatisticsPress

        name, opts = parse_method(P.pinned(setting["spec"].split("+oracle", 1)[0]))
        return JacapGivenStatisticsPress(compression_ratio=ratio, **opts)
    if setting.get("observed"):
        from ..measure.instruments import JacapObservedPress

        name, opts = P.parse_method(setting["spec"].split("+observed[", 1)[0])
        return JacapObservedPress(compression_ratio=ratio, obs_window=int(setting["observed"]), **opts)
    if setting["protect"] is None:
        return P.protocol_press(setting["spec"], ratio)
    from ..measure.instruments import ProtectedPress

    base = setting["spec"].split("+protect[", 1)[0]
    n_sink, window = setting["protect"]
    return ProtectedPress(press=P.protocol_press(base, ratio), compression_ratio=ratio, n_sink=n_sink, window=window)


def pick_documents(docs: list[dict], per_kind: int, ids=None) -> list[dict]:
    """The test documents measured: ``ids`` when given (each must be a test document), else the first
    ``per_kind`` test documents of every kind in manifest order."""
    test = [d for d in docs if d["split"] == "test"]
    if ids:
        known = {d["id"]: d for d in test}
        bad = [i for i in ids if i not in known]
        if bad:
            raise ValueError(f"--docs: {bad} are not test documents; e.g. {list(known)[:4]}")
        return [known[i] for i in ids]
    if per_kind < 1:
        raise ValueError(f"--per-kind must be >= 1, got {per_kind}")
    out, seen = [], {}
    for d in test:
        seen[d["kind"]] = seen.get(d["kind"], 0) + 1
        if seen[d["kind"]] <= per_kind:
            out.append(d)
    return out


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
    """The kept-set comparison of measurement 2 over ``documents`` (``kind``: only that kind): the mean Jaccard
    overlap per layer, the distance-from-end histograms of the tokens kept by one press only (summed over
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


# --------------------------------------------------------------------------------------------- the job
def add_arguments(parser) -> None:
    J.shared_options(parser, out="output file (default data/results/eval/anatomy.json)")
    parser.add_argument("--length", type=int, default=DEFAULT_LENGTH,
                        help=f"prompt length of the cell measured on the model (default {DEFAULT_LENGTH})")
    parser.add_argument("--ratio", type=float, default=DEFAULT_RATIO,
                        help=f"compression ratio of that cell (default {DEFAULT_RATIO})")
    parser.add_argument("--per-kind", type=int, default=DEFAULT_PER_KIND,
                        help=f"test documents per kind, first in manifest order (default {DEFAULT_PER_KIND})")
    parser.add_argument("--docs", nargs="+", default=None, help="test document ids instead of --per-kind")
    parser.add_argument("--dir", type=Path, default=None,
                        help="folder of test.jsonl, choices.json and summary.json (default data/results/eval)")
    parser.add_argument("--extend", action="store_true",
                        help="measure only the settings the existing --out file lacks, on its documents and cell, "
                             "and add them (everything else in the file stays)")


def prepare(args) -> dict:
    """Check every option (``BadArgument`` or ``ValueError`` naming it; the job runs it under
    :func:`~jacap_lib.results.job.prepared`) and read the inputs; loads no model, writes nothing."""
    from .evaluation import eval_dir, load_docs

    J.check(not isinstance(args.length, bool) and args.length >= 16, f"--length must be >= 16 tokens, got {args.length}")
    J.check(0 < args.ratio < 1, f"--ratio must lie in (0, 1), got {args.ratio}")
    J.check(args.threads >= 1, f"--threads must be >= 1, got {args.threads}")
    folder = eval_dir(args.dir, quick=False)
    out = Path(args.out) if args.out is not None else folder / "anatomy.json"
    J.check_out_file(out, ".json")
    need = {name: folder / name for name in ("test.jsonl", "choices.json", "summary.json")}
    for name, path in need.items():
        J.check(path.is_file(), f"--dir: {path} does not exist; run `jacap evaluate "
                                f"{ {'test.jsonl': 'test', 'choices.json': 'tune', 'summary.json': 'summary'}[name]}` first")
    try:
        choices = files.read_json(need["choices.json"], require=("config", "chosen", "best_baseline"))
        summary = files.read_json(need["summary.json"], require=("config", "families"))
        test_rows = files.read_jsonl(need["test.jsonl"])
    except (ValueError, FileNotFoundError) as e:
        raise J.BadArgument(f"--dir: {e}") from None
    cell = f"{int(args.length)}/{float(args.ratio)}"
    cells = choices["best_baseline"]["cells"]
    J.check(cell in cells, f"--length/--ratio: cell {cell} is not a cell of the evaluation; choose among {list(cells)}")
    J.check("jacap" in choices["chosen"], "--dir: choices.json has no Jacap choice")
    docs = pick_documents(load_docs(), args.per_kind, args.docs)
    J.check_model(args.model)
    default, baseline = choices["chosen"]["jacap"], cells[cell]["spec"]
    settings = swap_settings(default, baseline)
    for s in settings:
        _press(s, float(args.ratio))  # a setting that cannot be built fails now
    existing = None
    if getattr(args, "extend", False):
        J.check(out.is_file(), f"--extend: {out} does not exist; run without --extend first")
        try:
            existing = files.read_json(out, require=("config", "layers", "kinds", "documents"))
        except ValueError as e:
            raise J.BadArgument(f"--extend: {e}") from None
        c = existing["config"]
        same = (c.get("cell") == cell and c.get("default") == default and c.get("baseline") == baseline
                and (not args.docs or [d["id"] for d in c["documents"]] == list(args.docs)))
        J.check(same, f"--extend: {out} was made for cell {c.get('cell')}, {c.get('default')} vs {c.get('baseline')} "
                      f"on other documents; extend it with its own cell and documents")
        known = {d["id"]: d for d in load_docs()}
        docs = [known[d["id"]] for d in c["documents"]]
    return {"folder": folder, "out": out, "choices": choices, "summary": summary, "test_rows": test_rows,
            "docs": docs, "length": int(args.length), "ratio": float(args.ratio), "cell": cell, "default": default,
            "baseline": baseline, "settings": settings, "continuation": int(choices["config"]["continuation"]),
            "existing": existing}


def _setting_record(setting: dict, press) -> dict:
    """A swap setting as the file's config records it: its fields, ``protect`` as a list, the press's options."""
    from ..presses.registry import method_options

    return {**{k: v for k, v in setting.items() if k != "protect"},
            "protect": list(setting["protect"]) if setting["protect"] else None, "options": method_options(press)}


def _with_missing(model, tokenizer, plan: dict, doc: dict, kl: dict, presses: dict) -> dict:
    """``kl`` (one document's ``{key: record}``) with the settings of ``presses`` it lacks measured on ``doc``: the
    plan's settings, in its order (a key the plan no longer lists is dropped)."""
    from ..measure.anatomy import document_kl

    todo = {k: p for k, p in presses.items() if k not in kl}
    new = document_kl(model, tokenizer, doc["text"], length=plan["length"], continuation=plan["continuation"],
                      presses=todo, name=f"document {doc['id']}") if todo else {}
    merged = {**kl, **files.round_floats(new)}
    return {s["key"]: merged[s["key"]] for s in plan["settings"] if s["key"] in merged}


def _extend(plan: dict, args, model, tokenizer) -> Path:
    """``--extend``: the settings the file lacks, measured on its documents and merged in."""
    from tqdm.auto import tqdm

    from .provenance import provenance

    data = plan["existing"]
    have = set(data["documents"][0]["kl"]) if data["documents"] else set()
    todo = [s for s in plan["settings"] if s["key"] not in have]
    if not todo:
        print(f"{plan['out']} already holds every setting; nothing to add")
        return plan["out"]
    t0 = time.perf_counter()
    if model is None:
        model, tokenizer = J.load_model(args)
    presses = {s["key"]: _press(s, plan["ratio"]) for s in todo}
    by_id = {d["id"]: d for d in plan["docs"]}
    order = [s["key"] for s in plan["settings"]]
    for rec in tqdm(data["documents"], desc="anatomy documents", disable=args.no_progress):
        rec["kl"] = _with_missing(model, tokenizer, plan, by_id[rec["doc"]], rec["kl"], presses)
    cfg = data["config"]
    done = {s["key"] for s in cfg["settings"]}
    cfg["settings"] += [_setting_record(s, presses[s["key"]]) for s in todo if s["key"] not in done]
    cfg["settings"].sort(key=lambda s: order.index(s["key"]) if s["key"] in order else len(order))
    rec = provenance(model, model_name=args.model, command=getattr(args, "command", None))
    cfg.setdefault("extended", []).append({"settings": [s["key"] for s in todo], "git": rec["git"], "time": rec["time"],
                                           "command": rec.get("command"), "versions": rec["versions"],
                                           "seconds": round(time.perf_counter() - t0, 1)})
    return files.write_json(plan["out"], data)


def _resumable(partial: Path, docs: list[dict]) -> dict[str, dict]:
    """``{doc id: record}`` of the documents a stopped run left in ``partial`` that are still to be measured, with
    the same text (sha256); ``{}`` when there is no such file. A resumed document keeps its kept-set comparison and
    KLs and is measured only for the settings it lacks."""
    if not partial.is_file():
        return {}
    try:
        recs = files.read_json(partial, require=("documents",))["documents"]
    except ValueError:
        return {}
    want = {d["id"]: d["sha256"] for d in docs}
    return {r["doc"]: r for r in recs if want.get(r.get("doc")) == r.get("sha256") and isinstance(r.get("kl"), dict)}


def execute(plan: dict, args, *, model=None, tokenizer=None) -> Path:
    """Measurement 1 from the rows, then 2-3 on the model; writes the file (atomically) at the end
    (``--extend``: only the settings the file lacks, merged into it)."""
    if plan.get("existing") is not None:
        return _extend(plan, args, model, tokenizer)
    from tqdm.auto import tqdm

    from ..measure.anatomy import measure_document
    from .provenance import provenance

    t0 = time.perf_counter()
    layers, kinds = rows_part(plan["test_rows"], plan["summary"])
    library_default = library_default_part(plan["test_rows"], plan["summary"])
    if model is None:
        model, tokenizer = J.load_model(args)
    presses = {s["key"]: _press(s, plan["ratio"]) for s in plan["settings"]}
    order = [s["key"] for s in plan["settings"]]
    partial = plan["out"].with_name(plan["out"].name + ".partial")  # what is done so far, if the run stops
    done = _resumable(partial, plan["docs"])
    documents = []
    for d in tqdm(plan["docs"], desc="anatomy documents", disable=args.no_progress):
        old = done.pop(d["id"], None)
        if old is None:
            res = measure_document(model, tokenizer, d["text"], length=plan["length"],
                                   continuation=plan["continuation"], presses=presses, pair=("default", "baseline"),
                                   name=f"document {d['id']}")
        else:  # measured by a run that stopped: only the settings it lacks
            res = {**{k: v for k, v in old.items() if k not in ("doc", "kind", "sha256")},
                   "kl": _with_missing(model, tokenizer, plan, d, old["kl"], presses)}
        res["kl"] = {k: res["kl"][k] for k in order}
        documents.append({"doc": d["id"], "kind": d["kind"], "sha256": d["sha256"], **res})
        # the documents not reached yet stay in the partial file, kept if this run stops too
        files.write_json(partial, {"documents": files.round_floats(documents + list(done.values()))})
    config = {**provenance(model, model_name=args.model, command=getattr(args, "command", None)),
              "cell": plan["cell"], "length": plan["length"], "ratio": plan["ratio"],
              "continuation": plan["continuation"], "default": plan["default"], "baseline": plan["baseline"],
              "pair": {"a": "default", "b": "baseline"},
              "settings": [_setting_record(s, presses[s["key"]]) for s in plan["settings"]],
              "documents": [{k: d.get(k) for k in ("id", "kind", "split", "sha256")} for d in plan["docs"]],
              "rows_from": ["test.jsonl", "choices.json", "summary.json"], "fingerprint": plan["choices"].get("fingerprint"),
              "threads": args.threads, "seconds": round(time.perf_counter() - t0, 1),
              "measured": "1: per-layer attention-output error ratios and KL ratios per kind from the committed test "
                          "rows (losing cells of summary.json); 2-3: one captured prefill per document, every setting "
                          "replayed with its own kvpress hook, KL(full || compressed) over the continuation; kept sets "
                          "read back from the replayed caches",
              "statistics": "geometric mean of paired per-document ratios, 95 % BCa bootstrap interval "
                            "(verdicts.geometric_mean_ratio, 9999 resamples, seed 0)"}
    path = files.write_json(plan["out"], {"config": config, "layers": files.round_floats(layers),
                                          "kinds": files.round_floats(kinds),
                                          **({"library_default": files.round_floats(library_default)}
                                             if library_default else {}),
                                          "documents": files.round_floats(documents)})
    plan["out"].with_name(plan["out"].name + ".partial").unlink(missing_ok=True)
    return path


def _run(args):
    plan = J.prepared(prepare, args)
    path = execute(plan, args)
    print(f"wrote {path}")
    return path


JOB = J.Job("why Algorithm 1's tuned Jacap setting loses: per-layer error ratios and KL by document kind in the losing "
            "cells (from the test rows), and on one cell's test documents the kept sets of the default and the best "
            "baseline and a one-knob swap of score and protection -> data/results/eval/anatomy.json",
            add_arguments, _run)


def layer_lines(anatomy: dict) -> list[str]:
    """Per losing cell (all documents), how many layers' error-ratio intervals lie above and below 1, layer 0's,
    the largest and the last layer's ratio; then how often layer 0 lies above 1 and has the largest ratio."""
    out, n_cells, layer0_largest, layer0_above = [], 0, 0, 0
    for e in anatomy["layers"]:
        if e["kind"] != "all":
            continue
        lay = e["layers"]
        top = max(lay, key=lambda x: x["ratio"])
        n_cells += 1
        layer0_largest += top["layer"] == 0
        layer0_above += lay[0]["low"] > 1
        out.append(f"prompt {e['length']}, c={e['ratio']} vs {e['baseline']}: error ratio's interval above 1 in "
                   f"{sum(x['low'] > 1 for x in lay)} of {len(lay)} layers, below 1 in {sum(x['high'] < 1 for x in lay)}; "
                   f"layer 0: {lay[0]['ratio']:.2f}, largest: layer {top['layer']} ({top['ratio']:.2f}), last layer: "
                   f"{lay[-1]['ratio']:.2f}")
    out.append(f"layer 0: its interval lies above 1 in {layer0_above} of {n_cells} losing cells; it has the largest "
               f"ratio of any layer in {layer0_largest}")
    return out


def kind_lines(anatomy: dict, kind: str = "dialogue") -> list[str]:
    """Per losing cell of ``anatomy`` (the file, or its ``library_default`` part): the document kind with the largest
    KL ratio and the kinds whose interval lies above 1; then in how many cells ``kind`` has the largest ratio and
    lies above 1."""
    out, largest, above_n = [], 0, 0
    for e in anatomy["kinds"]:
        worst = max((k for k in e["kinds"] if k["kind"] != "all"), key=lambda k: k["ratio"])
        above = [k["kind"] for k in e["kinds"] if k["kind"] != "all" and k["low"] > 1]
        largest += worst["kind"] == kind
        above_n += kind in above
        out.append(f"prompt {e['length']}, c={e['ratio']}: largest ratio on {worst['kind']} ({worst['ratio']:.2f}, "
                   f"{worst['losses']}/{worst['losses'] + worst['wins']} lost); kinds whose interval lies above 1: "
                   f"{', '.join(above) or 'none'}")
    out.append(f"{kind} has the largest ratio in {largest} of {len(anatomy['kinds'])} losing cells; its interval lies "
               f"above 1 in {above_n}")
    return out


_OPTIONAL_SWAPS = (  # key -> what it names in swap_lines (settings a file measured before them lacks)
    ("oracle_statistics", "statistics of the queries that follow the prompt (oracle)"),
    ("sensitivity_alpha", "sensitivity factor alpha-bar instead of rho^2"),
    ("kappa_mean", "response variance k^T Lambda k flattened to its mean"),
    ("ea_centre", "centre = Expected Attention's log-normal expectation"),
    ("future_positions", "RoPE horizon of the future queries = the baseline's"),
)


def _optional_entries(docs, dialogue, others, one) -> list[tuple[str, dict]]:
    """swap_lines' entries for the settings of :data:`_OPTIONAL_SWAPS` the file holds: each against the default, on
    all documents, on dialogue and on the other kinds, and against the baseline on dialogue and the other kinds."""
    have = set(docs[0]["kl"])
    out = []
    for key, text in _OPTIONAL_SWAPS:
        if key in have:
            out += [(f"{text} (/ default)", one(key)),
                    ("  on dialogue (/ default)", one(key, dialogue)),
                    ("  on dialogue, against the baseline", one(key, dialogue, "baseline")),
                    ("  on the other kinds (/ default)", one(key, others)),
                    ("  on the other kinds, against the baseline", one(key, others, "baseline"))]
    return out


def swap_lines(docs: list[dict]) -> list[str]:
    """The swap's findings as short lines: the protection and score parts of the gap, then each one-knob setting
    against the default (and, for the statistics and the centre, on dialogue and the other kinds, also against the
    baseline). Each comparison is a line naming it, then an indented line with its KL ratio, 95 % interval and the
    verdict of the interval adjusted for the one-knob settings of the file (Bonferroni)."""
    m = sum(k != "default" and k not in LADDER_ONLY for k in docs[0]["kl"])  # the one-knob settings judged together
    conf = 1 - 0.05 / m
    tables: dict = {}  # (selection, reference, confidence; None: the default) -> {key: row}: one pass each

    def table(sel, reference, confidence):
        at = (tuple(d["doc"] for d in sel), reference, confidence)
        if at not in tables:
            kw = {k: v for k, v in (("reference", reference), ("confidence", confidence)) if v is not None}
            tables[at] = {r["key"]: r for r in swap_ratios(sel, **kw)}
        return tables[at]

    def one(key, sel=None, reference=None):
        sel = docs if sel is None else sel
        return {**table(sel, reference, None)[key], "adjusted": table(sel, reference, conf)[key]["verdict"]}

    adjusted = {p["part"]: p["verdict"] for p in decompose_gap(docs, confidence=conf)}
    parts = {p["part"]: {**p, "adjusted": adjusted[p["part"]]} for p in decompose_gap(docs)}
    dialogue = [d for d in docs if d["kind"] == "dialogue"]
    others = [d for d in docs if d["kind"] != "dialogue"]
    entries = [
        ("protection, on Jacap's score (Jacap with the baseline's protection / default)",
         one("jacap_baseline_protection")),
        ("protection, on the baseline's score (baseline with Jacap's protection / baseline)",
         parts["protection (the baseline's score)"]),
        ("score, under Jacap's protection (default / baseline with Jacap's protection)",
         parts["score (Jacap's protection)"]),
        ("statistics: flat instead of EMA (/ default)", one("flat_statistics")),
        ("  on dialogue (/ default)", one("flat_statistics", dialogue)),
        ("  on dialogue, against the baseline", one("flat_statistics", dialogue, "baseline")),
        ("  on the other kinds (/ default)", one("flat_statistics", others)),
        ("centre = observed attention of the last prompt queries (/ default)", one("observed_centre")),
        ("  on dialogue (/ default)", one("observed_centre", dialogue)),
        ("  on dialogue, against the baseline", one("observed_centre", dialogue, "baseline")),
        ("  on the other kinds (/ default)", one("observed_centre", others)),
        ("  on the other kinds, against the baseline", one("observed_centre", others, "baseline")),
        *_optional_entries(docs, dialogue, others, one),
        ("leverage interaction removed (/ default)", one("no_leverage")),
        ("temperature 1 (/ default)", one("tau_1")),
        ("temperature 10 (/ default)", one("tau_10")),
        ("per-query-head scoring (/ default)", one("gqa_mean")),
    ]
    out = ["each comparison: its KL ratio and 95 % interval; the verdict adjusted for",
           f"the {m} one-knob settings judged together (Bonferroni, {100 * conf:.1f} % interval)"]
    for label, r in entries:
        pad = " " * (len(label) - len(label.lstrip()) + 4)
        out += [f"{label}:", f"{pad}{r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}]; adjusted: {r['adjusted']}"]
    return out


def ladder_setting_lines(config: dict, width: int = 96) -> list[str]:
    """The ladder's rungs as short lines, from the file's ``config``: each rung's key, the option(s) it sets on top
    of the rung before it (``+ option=value``), and what it changes, wrapped at ``width`` characters."""
    import textwrap

    settings = {s["key"]: s for s in config["settings"]}
    missing = [k for k in LADDER if k not in settings]
    if missing:
        raise ValueError(f"ladder_setting_lines: the file lacks {missing}; run `jacap evaluate anatomy --extend`")
    out = []
    for a, b in zip(LADDER, LADDER[1:]):
        pa, pb = (parse_method(settings[k]["spec"].split("+", 1)[0])[1] for k in (a, b))
        added = ", ".join(f"{k}={'none' if v is None else v}" for k, v in pb.items() if pa.get(k, object()) != v)
        out.append(f"{b}" + (f" (+ {added})" if added and b in LADDER_ONLY + ("ea_centre",) else ""))
        out += textwrap.wrap(settings[b]["changes"], width, initial_indent="    ", subsequent_indent="    ")
    return out


def ladder_lines(docs: list[dict]) -> list[str]:
    """The ladder (:func:`ladder_ratios`) as lines: per group of documents (all, dialogue, the other kinds), each
    step's KL / the step before it, and the whole ladder (the last rung / the default)."""
    groups = (("all documents", docs), ("dialogue", [d for d in docs if d["kind"] == "dialogue"]),
              ("the other kinds", [d for d in docs if d["kind"] != "dialogue"]))
    m = len(LADDER) - 1
    out = ["each step: its KL / the KL of the step before (95 % interval),",
           f"verdict adjusted for the {m} steps of a group (Bonferroni, {100 * (1 - 0.05 / m):.0f} % interval)"]
    for label, sel in groups:
        out.append(f"{label} ({len(sel)}):")
        for r, a in zip(ladder_ratios(sel), ladder_ratios(sel, confidence=1 - 0.05 / m)):
            out.append(f"  {r['key']}: {r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}], lower on {r['lower']} of "
                       f"{r['n']}")
            out.append(f"      adjusted: {a['verdict']}")
    return out

