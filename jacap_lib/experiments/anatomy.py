"""The anatomy of the cells where Algorithm 1's tuned Jacap setting loses: ``jacap evaluate anatomy`` ->
``data/results/eval/anatomy.json``. This module is the job: its settings (:func:`swap_settings`, each built by its
own press, ``+protect[...]``, ``+window_attention[...]`` and ``+oracle`` naming the wrappers), its documents
(:func:`pick_documents`), its options and the file. The statistics are :mod:`jacap_lib.verdicts.rows`', the
model loop :mod:`jacap_lib.measure.anatomy`'s, the lines the book prints :mod:`jacap_lib.report.findings`'.

Three measurements, each isolating one thing:

1. **Which layers** (from the committed dev rows; no model run): per losing cell — the cells of ``summary.json``
   whose 95 % interval of the geometric-mean KL ratio (default / best baseline picked on tune) lies above 1 —
   and per document kind, the per-layer attention-output error of the default against the cell's best
   baseline: the geometric mean over the documents of the per-document ratio, with its BCa bootstrap interval
   (:func:`jacap_lib.verdicts.rows.layer_error_ratios`); and the KL ratio per document kind
   (:func:`~jacap_lib.verdicts.rows.kind_ratios`). The per-layer error is cumulative: layer ``l``'s output
   already carries what earlier layers changed in the residual stream.
2. **Which tokens** (a model run, one cell): on a few dev documents, the kept sets of the default and of the
   best baseline per layer and KV head, their overlap, where the tokens kept by only one of them lie and what
   they are (:func:`jacap_lib.measure.anatomy.measure_document`).
3. **The swap** (same run): KL of one-knob changes of the default and of the baseline (:func:`swap_settings`) —
   Jacap's score under the baseline's protection, the baseline's score under Jacap's protection, Jacap with no
   protection, Jacap's temperature and statistics — each as a paired ratio to the default
   (:func:`jacap_lib.verdicts.rows.swap_ratios`), and the ladder from Algorithm 1's score to the baseline's
   (:data:`jacap_lib.verdicts.rows.LADDER`).

Measurement 1 is also made for the press ``JacapPromptPress()`` builds today when it is another tuned Jacap method
(``library_default``: ``{"role", "setting", "layers", "kinds"}``,
:func:`jacap_lib.verdicts.rows.library_default_part`).

The file: ``{"config", "layers", "kinds", "library_default", "documents"}``; ``config`` records the model, the
cell, the documents (id, kind, sha256), every setting's press options and the package versions
(:func:`jacap_lib.results.provenance.provenance`); each document holds its kept-set comparison and every setting's
KL (``kl``).
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from jacap_lib.presses.registry import PRESS_NAMES, parse_method, press_from_spec, with_options, written_out
from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.verdicts import rows as RS
from jacap_lib.experiments.protection import budget_split  # noqa: F401  (the one home; re-exported for the book's readers)

__all__ = ["swap_settings", "split_wrapper", "pick_documents", "add_arguments", "prepare", "execute", "JOB", "DEFAULT_LENGTH",
           "DEFAULT_RATIO", "DEFAULT_PER_KIND", "OBS_WINDOW", "NO_LEVERAGE_NOISE", "BASELINE_HORIZON",
           "SWAP_NAMES", "BASELINE_NAMES", "swap_name", "budget_split", "loss_rows", "kind_counts",
           "swap_verdicts", "ladder_verdicts"]

DEFAULT_LENGTH = 2048
DEFAULT_RATIO = 0.5
DEFAULT_PER_KIND = 6  # the committed file: 24 dev documents (3 per kind left each kind's interval too wide to read)
OBS_WINDOW = 32  # the last prompt queries whose attention replaces Jacap's centre in the window-attention swap
# (JacapWindowAttentionPress's default obs_window; not Jacap's recent window, which is the setting's own: 16 by default)
NO_LEVERAGE_NOISE = 1e6  # sigma^2 this large makes A = I + W / sigma^2 the identity to float32 precision


# --------------------------------------------------------------------------------------------- 2-3: the swap
BASELINE_HORIZON = "the baseline's"  # an option value a ladder step takes from the baseline's press (its horizon)
#: The ladder's rungs that change more than one knob (:data:`jacap_lib.verdicts.rows.LADDER_ONLY`, in its order):
#: ``(key, the options it sets on top of the rung before, what it changes)``.
_LADDER_STEPS = tuple((key, option, text) for key, (option, text) in zip(RS.LADDER_ONLY, (
    ({"sensitivity": "alpha"},
     "ea_centre, then the sensitivity factor alpha-bar instead of rho^2 (the weight is the expected attention times "
     "k^T Lambda k / d)"),
    ({"kappa": "mean"},
     "ea_alpha, then k^T Lambda k flattened to the head's mean (the weight is the expected attention)"),
    ({"leverage": "identity"},
     "ea_alpha_kappa, then A := I: the score is the expected attention times |v|^2 (Expected Attention's score "
     "is the expected attention times |v|, from its own statistics)"),
    ({"n_future_positions": BASELINE_HORIZON},
     "ea_alpha_kappa_identity, then the baseline's RoPE horizon: the future queries averaged over its number of "
     "future positions"),
    ({"beta": None},
     "ea_alpha_kappa_identity_horizon, then flat statistics over the prompt instead of the EMA (what is left to the "
     "last rung: the baseline's full query covariance per query head instead of a diagonal one pooled per KV head, "
     "|v| instead of |v|^2, its epsilon)"),
), strict=True))


def swap_settings(default: str, baseline: str) -> list[dict]:
    """The settings of the swap, each one knob away from the default (or from the baseline):
    ``[{"key", "spec", "changes", "protect"}]``; ``protect``: ``(n_sink, window)`` for the baseline's score under
    Jacap's protection (:class:`~jacap_lib.measure.instruments.ProtectedPress`), else ``None``.

    The baseline's own protection is its ``n_sink`` (Expected Attention: the first 4 positions) and no window;
    Jacap's is ``n_sink`` sinks and a ``window`` of recent positions."""
    jacap = press_from_spec(default, 0.5)
    n_sink, window, tau, noise = jacap.n_sink, jacap.window, float(jacap.tau), jacap.noise
    base_press = press_from_spec(baseline, 0.5)
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
    out.append({"key": "window_attention_centre", "spec": f"{default}+window_attention[obs_window={OBS_WINDOW}]",
                "changes": f"the centre alpha replaced by the attention the last {OBS_WINDOW} prompt queries paid "
                           "(mean over them and the KV head's query heads); weight, leverage, protection Jacap's",
                "protect": None, "window_attention": OBS_WINDOW})
    out.append({"key": "oracle_statistics", "spec": f"{default}+oracle",
                "changes": "the query statistics (mu, Lambda) of the queries that actually follow the prompt (its "
                           "continuation) instead of the prompt's recent queries; centre rule, weight, leverage, "
                           "protection Jacap's", "protect": None, "oracle": True})
    name, opts = parse_method(default)
    if name == "jacap_prompt":  # the weight's form, one factor at a time (JacapAblationPress = JacapPromptPress at its defaults)
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
    for setting in out:  # each setting written out in full (the spec before its +wrapper), as every recorded spec is
        base, wrapper = split_wrapper(setting["spec"])
        setting["spec"] = written_out(base) + wrapper
    return out


def split_wrapper(spec: str) -> tuple[str, str]:
    """``(registry spec, wrapper part)`` of a swap setting: ``"jacap_prompt[...]+window_attention[obs_window=32]"`` ->
    ``("jacap_prompt[...]", "+window_attention[obs_window=32]")``; the wrapper part is ``""`` for a plain spec (a ``+`` inside a
    value such as ``noise=1e+06`` is no wrapper)."""
    base, *rest = re.split(r"(\+(?:window_attention|protect|oracle))", spec, maxsplit=1)
    return base, "".join(rest)


def _press(setting: dict, ratio: float):
    if setting.get("oracle"):
        from jacap_lib.measure.instruments import JacapGivenStatisticsPress

        name, opts = parse_method(split_wrapper(setting["spec"])[0])
        return JacapGivenStatisticsPress(compression_ratio=ratio, **opts)
    if setting.get("window_attention"):
        from jacap_lib.measure.instruments import JacapWindowAttentionPress

        name, opts = parse_method(split_wrapper(setting["spec"])[0])
        return JacapWindowAttentionPress(compression_ratio=ratio, obs_window=int(setting["window_attention"]), **opts)
    if setting["protect"] is None:
        return press_from_spec(setting["spec"], ratio)
    from jacap_lib.measure.instruments import ProtectedPress

    base = split_wrapper(setting["spec"])[0]
    n_sink, window = setting["protect"]
    return ProtectedPress(press=press_from_spec(base, ratio), compression_ratio=ratio, n_sink=n_sink, window=window)


def pick_documents(docs: list[dict], per_kind: int, ids=None) -> list[dict]:
    """The dev documents measured: ``ids`` when given (each must be a dev document), else the first
    ``per_kind`` dev documents of every kind in manifest order."""
    dev = [d for d in docs if d["split"] == "dev"]
    if ids:
        known = {d["id"]: d for d in dev}
        bad = [i for i in ids if i not in known]
        if bad:
            raise ValueError(f"--docs: {bad} are not dev documents; e.g. {list(known)[:4]}")
        return [known[i] for i in ids]
    if per_kind < 1:
        raise ValueError(f"--per-kind must be >= 1, got {per_kind}")
    out, seen = [], {}
    for d in dev:
        seen[d["kind"]] = seen.get(d["kind"], 0) + 1
        if seen[d["kind"]] <= per_kind:
            out.append(d)
    return out


# --------------------------------------------------------------------------------------------- the job
def add_arguments(parser) -> None:
    J.shared_options(parser, out="output file (default data/results/eval/anatomy.json)")
    parser.add_argument("--length", type=int, default=DEFAULT_LENGTH,
                        help=f"prompt length of the cell measured on the model (default {DEFAULT_LENGTH})")
    parser.add_argument("--ratio", type=float, default=DEFAULT_RATIO,
                        help=f"compression ratio of that cell (default {DEFAULT_RATIO})")
    parser.add_argument("--per-kind", type=int, default=DEFAULT_PER_KIND,
                        help=f"dev documents per kind, first in manifest order (default {DEFAULT_PER_KIND})")
    parser.add_argument("--docs", nargs="+", default=None, help="dev document ids instead of --per-kind")
    parser.add_argument("--dir", type=Path, default=None,
                        help="folder of dev.jsonl, choices.json and summary.json (default data/results/eval)")
    parser.add_argument("--extend", action="store_true",
                        help="measure only the settings the existing --out file lacks, on its documents and cell, "
                             "and add them (everything else in the file stays)")


def prepare(args) -> dict:
    """Check every option (``BadArgument`` or ``ValueError`` naming it; the job runs it under
    :func:`~jacap_lib.experiments.job.prepared`) and read the inputs; loads no model, writes nothing."""
    from jacap_lib.experiments.protocol import eval_dir, load_docs

    J.check(not isinstance(args.length, bool) and args.length >= 16, f"--length must be >= 16 tokens, got {args.length}")
    J.check_ratios([args.ratio], "--ratio", allow_zero=False)
    J.check(args.threads >= 1, f"--threads must be >= 1, got {args.threads}")
    folder = eval_dir(args.dir, quick=False)
    out = Path(args.out) if args.out is not None else folder / "anatomy.json"
    J.check_out_file(out, ".json")
    need = {name: folder / name for name in ("dev.jsonl", "choices.json", "summary.json")}
    for name, path in need.items():
        J.check(path.is_file(), f"--dir: {path} does not exist; run `jacap evaluate "
                                f"{ {'dev.jsonl': 'dev', 'choices.json': 'tune', 'summary.json': 'summary'}[name]}` first")
    try:
        choices = RS.read_choices_file(need["choices.json"], baselines=True)
        summary = files.read_json(need["summary.json"], require=("config", "families"))
        dev_rows = files.read_jsonl(need["dev.jsonl"])
    except (ValueError, FileNotFoundError) as e:
        raise J.BadArgument(f"--dir: {e}") from None
    cell = f"{int(args.length)}/{float(args.ratio)}"
    cells = choices["best_baseline"]["cells"]
    J.check(cell in cells, f"--length/--ratio: cell {cell} is not a cell of the evaluation; choose among {list(cells)}")
    J.check("jacap_prompt" in choices["chosen"], "--dir: choices.json has no Jacap choice")
    docs = pick_documents(load_docs(), args.per_kind, args.docs)
    J.check_model(args.model)
    default, baseline = choices["chosen"]["jacap_prompt"], cells[cell]["spec"]
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
    return {"folder": folder, "out": out, "choices": choices, "summary": summary, "dev_rows": dev_rows,
            "docs": docs, "length": int(args.length), "ratio": float(args.ratio), "cell": cell, "default": default,
            "baseline": baseline, "settings": settings, "continuation": int(choices["config"]["continuation"]),
            "existing": existing}


def _setting_record(setting: dict, press) -> dict:
    """A swap setting as the file's config records it: its fields, ``protect`` as a list, the press's options."""
    from jacap_lib.presses.registry import method_options

    return {**{k: v for k, v in setting.items() if k != "protect"},
            "protect": list(setting["protect"]) if setting["protect"] else None, "options": method_options(press)}


def _with_missing(model, tokenizer, plan: dict, doc: dict, kl: dict, presses: dict) -> dict:
    """``kl`` (one document's ``{key: record}``) with the settings of ``presses`` it lacks measured on ``doc``: the
    plan's settings, in its order (a key the plan no longer lists is dropped)."""
    from jacap_lib.measure.anatomy import document_kl

    todo = {k: p for k, p in presses.items() if k not in kl}
    new = document_kl(model, tokenizer, doc["text"], length=plan["length"], continuation=plan["continuation"],
                      presses=todo, name=f"document {doc['id']}") if todo else {}
    merged = {**kl, **files.round_floats(new)}
    return {s["key"]: merged[s["key"]] for s in plan["settings"] if s["key"] in merged}


def _extend(plan: dict, args, model, tokenizer) -> Path:
    """``--extend``: the settings the file lacks, measured on its documents and merged in."""
    from tqdm.auto import tqdm

    from jacap_lib.results.provenance import provenance

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

    from jacap_lib.measure.anatomy import measure_document
    from jacap_lib.results.provenance import provenance

    t0 = time.perf_counter()
    layers, kinds = RS.rows_part(plan["dev_rows"], plan["summary"])
    library_default = RS.library_default_part(plan["dev_rows"], plan["summary"])
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
              "rows_from": ["dev.jsonl", "choices.json", "summary.json"], "fingerprint": plan["choices"].get("fingerprint"),
              "threads": args.threads, "seconds": round(time.perf_counter() - t0, 1),
              "measured": "1: per-layer attention-output error ratios and KL ratios per kind from the committed dev "
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
            "cells (from the dev rows), and on one cell's dev documents the kept sets of that setting and the best "
            "baseline and a one-knob swap of score and protection -> data/results/eval/anatomy.json",
            add_arguments, _run)




# --------------------------------------------------------------------------------------------- the book's reading
#: How the book names each swap setting of :func:`swap_settings` (and the ladder's rungs) in a figure or a table:
#: what the one change is, in words (the spec behind each key is :func:`jacap_lib.viz.anatomy.swap_setting_lines`').
SWAP_NAMES = {
    "default": "Algorithm 1 tuned",
    "baseline": "Expected Attention (the baseline)",
    "jacap_baseline_protection": "no recent window (the baseline's protection)",
    "jacap_no_protection": "no protection at all",
    "baseline_jacap_protection": "Expected Attention's score, Jacap's protection",
    "tau_1": "temperature τ = 1",
    "tau_10": "temperature τ = 10",
    "no_leverage": "no leverage (A = I)",
    "gqa_mean": "scores per query head, averaged",
    "window_attention_centre": "centre: SnapKV's window attention",
    "oracle_statistics": "statistics of the queries that follow",
    "sensitivity_alpha": "sensitivity ᾱ instead of ρ²",
    "kappa_mean": "κ flattened to its mean",
    "ea_centre": "centre: Expected Attention's",
    "future_positions": "the baseline's RoPE horizon",
    "flat_statistics": "flat statistics instead of the EMA",
    "ea_alpha": "+ sensitivity ᾱ instead of ρ²",
    "ea_alpha_kappa": "+ κ flattened to its mean",
    "ea_alpha_kappa_identity": "+ no leverage (A = I)",
    "ea_alpha_kappa_identity_horizon": "+ the baseline's RoPE horizon",
    "ea_alpha_kappa_identity_horizon_flat": "+ flat statistics",
}

#: The book's names of the kvpress baselines (registry name -> name in prose and figures): the registry's one table.
BASELINE_NAMES = PRESS_NAMES


def swap_name(key: str) -> str:
    """The book's name of a swap setting or ladder rung (:data:`SWAP_NAMES`); an unknown key as words."""
    return SWAP_NAMES.get(key, key.replace("_", " "))


def loss_rows(family: dict) -> list[dict]:
    """The cells of a ``summary.json`` family (``RS.family(...)``) where its setting is worse than the best baseline
    picked on tune, by the interval adjusted for the table's cells (``adjusted``) or by the cell's own 95 % interval
    alone: ``[{"length", "ratio", "baseline", "adjusted", "own", "verdict", "verdict_unadjusted", "wins", "losses",
    "kept", "scored", "fills"}]`` — ``scored``: the tokens the score chooses (``kept`` minus the sinks and the window),
    ``fills``: whether protection fills the budget there (:func:`~jacap_lib.experiments.protection.protection_fills_budget`),
    so that the score chooses no token."""
    from jacap_lib.verdicts.words import verdict_word
    from jacap_lib.experiments.protection import protection_fills_budget

    out = []
    for r in family["rows"]:
        adjusted, own = verdict_word(r["verdict"]), verdict_word(r["verdict_unadjusted"])
        if "worse" not in (adjusted, own):
            continue
        split = budget_split(family["setting"], int(r["length"]), float(r["ratio"]))
        fills = protection_fills_budget(family["setting"], int(r["length"]), float(r["ratio"]))
        out.append({"length": int(r["length"]), "ratio": float(r["ratio"]), "baseline": r["baseline_spec"],
                    "adjusted": adjusted, "own": own, "verdict": r["verdict"],
                    "verdict_unadjusted": r["verdict_unadjusted"], "wins": int(r["wins"]), "losses": int(r["losses"]),
                    "kept": split["kept"] if split else None, "scored": split["scored"] if split else None,
                    "fills": fills})
    return out


def kind_counts(part: dict) -> dict[str, dict]:
    """Per document kind, over the losing cells of ``part`` (``anatomy.json``, or its ``library_default`` part):
    ``{"largest": cells where that kind has the largest KL ratio of the kinds, "above": cells where its 95 % interval
    lies wholly above 1, "cells": the losing cells}``."""
    kinds = [k["kind"] for k in part["kinds"][0]["kinds"] if k["kind"] != "all"]
    out = {k: {"largest": 0, "above": 0, "cells": len(part["kinds"])} for k in kinds}
    for e in part["kinds"]:
        rows = [k for k in e["kinds"] if k["kind"] != "all"]
        out[max(rows, key=lambda k: k["ratio"])["kind"]]["largest"] += 1
        for k in rows:
            out[k["kind"]]["above"] += k["low"] > 1
    return out


def _groups(docs: list[dict]) -> dict[str, list[dict]]:
    return {"all documents": docs, "dialogue": [d for d in docs if d["kind"] == "dialogue"],
            "other kinds": [d for d in docs if d["kind"] != "dialogue"]}


def swap_verdicts(docs: list[dict]) -> list[dict]:
    """Each one-knob swap setting against Algorithm 1 tuned (the key ``default``), per group of documents (all,
    dialogue, the other kinds): the paired geometric-mean KL ratio with its interval adjusted for the one-knob
    settings judged together (Bonferroni, as :func:`jacap_lib.report.findings.swap_lines`), its verdict and the
    documents where it is lower: ``[{"group", "key", "name", "ratio", "low", "high", "verdict", "lower", "n"}]``."""
    from jacap_lib.verdicts import intervals as V

    keys = [k for k in docs[0]["kl"] if k != "default" and k not in RS.LADDER_ONLY]
    conf = V.simultaneous_confidence(V.CONFIDENCE, len(keys))
    out = []
    for group, sel in _groups(docs).items():
        for r in RS.swap_ratios(sel, confidence=conf):
            if r["key"] in keys:
                out.append({"group": group, "name": swap_name(r["key"]), "confidence": conf, **r})
    return out


def ladder_verdicts(docs: list[dict]) -> list[dict]:
    """The ladder (:data:`jacap_lib.verdicts.rows.LADDER`) per group of documents: each step's KL / the step
    before it, with its interval adjusted for the steps of a group (Bonferroni, as
    :func:`jacap_lib.report.findings.ladder_lines`): ``[{"group", "key", "name", "ratio", "low", "high", "verdict",
    "lower", "n"}]``."""
    from jacap_lib.verdicts import intervals as V

    conf = V.simultaneous_confidence(V.CONFIDENCE, len(RS.LADDER) - 1)
    return [{"group": group, "name": swap_name(r["key"]), "confidence": conf, **r}
            for group, sel in _groups(docs).items() for r in RS.ladder_ratios(sel, confidence=conf)]
