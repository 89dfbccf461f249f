"""The summary job: dev.jsonl + choices.json (one fingerprint) -> ``summary.json``. Per (length, ratio)
cell each Jacap setting against the best baseline picked on tune (primary) and on dev (stricter): ratio
intervals, wins/losses, Wilcoxon and Holm p, verdicts (:func:`summarize`, pure); the cells every setting has
finished (:func:`complete_cells`); per-setting cell statistics, other pairwise comparisons, the target's status
and the table rows the book shows."""
from __future__ import annotations

from pathlib import Path

from jacap_lib.results import files
from jacap_lib.verdicts import rows as RS
from jacap_lib.experiments import job as J
from jacap_lib.experiments.protocol import rules as P
from jacap_lib.experiments.protocol.choices import best_baselines, jacap_settings, dev_specs
from jacap_lib.experiments.protocol.runs import eval_dir, summary_options

__all__ = ["TUNE_LABEL", "DEV_SHORT_LABEL", "summarize", "complete_cells", "cell_statistics", "compare_settings",
           "TARGET", "target_status", "identical_documents", "summary_table", "SUMMARY"]

TUNE_LABEL = "picked on tune (the protocol)"
DEV_SHORT_LABEL = "picked on dev (stricter)"


def summarize(dev_rows: list[dict], choices: dict, *, confidence: float | None = None,
              n_resamples: int | None = None, seed: int | None = None, alpha: float = 0.05) -> dict:
    """The comparisons of the summary (pure): for each Jacap setting of :func:`jacap_settings` and each
    best-baseline line of :func:`best_baselines` (picked on tune: the protocol; picked on dev: stricter),
    one comparison family over the (length, ratio) cells, each cell a row of
    :func:`jacap_lib.verdicts.intervals.compare_cells` (paired per-document KLs: geometric-mean and mean-KL
    ratio intervals, the geometric-mean interval adjusted for the family's cells (Bonferroni), wins/losses,
    Wilcoxon p, Holm-adjusted p over the family's cells, the verdict from the adjusted interval and the
    unadjusted one's beside it) plus the cell's length, ratio and baseline.
    ``{"families": [{"setting", "role", "picked_on", "label", "rows"}]}``."""
    from jacap_lib.verdicts import intervals as V

    cfg = choices["config"]
    model = cfg.get("model", {}).get("name")
    rows = [r for r in dev_rows if r.get("split", "dev") == "dev"
            and (model is None or r.get("model") == model) and int(r["continuation"]) == int(cfg["continuation"])]
    kl = {(r["method"], int(r["length"]), float(r["ratio"]), r["doc"]): float(r["kl"]) for r in rows}
    docs = [d for d, _ in cfg["dev_docs"]]
    complete, missing = complete_cells(rows, choices)
    if not complete:
        raise ValueError("dev.jsonl has no complete (length, ratio) cell (every chosen setting on every dev "
                         "document); run or finish `jacap evaluate dev`")
    rows = [r for r in rows if (int(r["length"]), float(r["ratio"])) in complete]
    lines = best_baselines(choices, rows)
    opts = {k: v for k, v in (("confidence", confidence), ("n_resamples", n_resamples), ("seed", seed))
            if v is not None}
    families = []
    for js in jacap_settings(choices, rows):
        for picked_on, line in lines.items():
            cells, meta = {}, {}
            for L in cfg["lengths"]:
                for c in cfg["ratios"]:
                    if (int(L), float(c)) not in complete:
                        continue
                    name = f"{int(L)}/{float(c)}"
                    base = line["cells"].get(name)
                    if base is None:
                        raise ValueError(f"choices.json / dev.jsonl: no best baseline {picked_on} for cell {name}")
                    need = [(s, d) for s in (js["spec"], base["spec"]) for d in docs
                            if (s, int(L), float(c), d) not in kl]
                    if need:
                        raise ValueError(f"dev.jsonl lacks cell {name} rows of {need[:3]}; finish `jacap evaluate dev`")
                    cells[name] = ([kl[(js["spec"], int(L), float(c), d)] for d in docs],
                                   [kl[(base["spec"], int(L), float(c), d)] for d in docs])
                    meta[name] = {"length": int(L), "ratio": float(c), "baseline": base["method"],
                                  "baseline_spec": base["spec"]}
            out = []
            for row in V.compare_cells(cells, alpha=alpha, **opts):
                out.append({**meta[row["cell"]], **row, "losses": row["n"] - row["wins"] - row["ties"]})
            families.append({"setting": js["spec"], "role": js["role"], "picked_on": picked_on,
                             "label": TUNE_LABEL if picked_on == "tune" else DEV_SHORT_LABEL, "rows": out})
    return {"families": families, "cells_measured": [f"{L}/{c}" for L, c in complete],
            "cells_missing": [f"{L}/{c}" for L, c in missing]}


def complete_cells(dev_rows: list[dict], choices: dict) -> tuple[list, list]:
    """The (length, ratio) cells of the protocol in which every setting the dev job runs (each method's
    choice, and the paper preset when it differs from them) has a row on every dev document, and the cells
    that lack some: ``(complete, missing)``, each a list of ``(length, ratio)`` in the configuration's order.

    The jobs measure the shortest prompts first, so an unfinished (resumable) run leaves whole lengths
    complete; the summary judges those cells and names the others (the Holm family is then the cells judged)."""
    cfg = choices["config"]
    have = {(r["method"], int(r["length"]), float(r["ratio"]), r["doc"]) for r in dev_rows}
    specs = dev_specs(choices["chosen"])
    docs = [d for d, _ in cfg["dev_docs"]]
    complete, missing = [], []
    for L in cfg["lengths"]:
        for c in cfg["ratios"]:
            ok = all((s, int(L), float(c), d) in have for s in specs for d in docs)
            (complete if ok else missing).append((int(L), float(c)))
    return complete, missing


def cell_statistics(rows: list[dict], specs=None, *, seed: int | None = None) -> list[dict]:
    """Per (setting, length, ratio): the geometric-mean KL over the documents with its 95 % bootstrap interval
    (:func:`jacap_lib.verdicts.intervals.geometric_mean`), the mean top-1 agreement and attention-output error.
    ``rows``: evaluation rows of one split; ``specs``: the settings, in order (default: every one in ``rows``).
    Only cells holding the same documents for every setting are reported."""
    from jacap_lib.verdicts import intervals as V

    specs = list(specs) if specs is not None else list(dict.fromkeys(r["method"] for r in rows))
    by: dict = {}
    for r in rows:
        if r["method"] in specs:
            by.setdefault((int(r["length"]), float(r["ratio"])), {}).setdefault(r["method"], {})[r["doc"]] = r
    out = []
    for (L, c), per in sorted(by.items()):
        docs = set(per.get(specs[0], {}))
        if not docs or any(set(per.get(s, {})) != docs for s in specs):
            continue
        for s in specs:
            rs = [per[s][d] for d in sorted(docs)]
            gm = V.geometric_mean([r["kl"] for r in rs], **({} if seed is None else {"seed": seed}))
            out.append({"method": s, "length": L, "ratio": c, "n_docs": len(rs), "kl_geomean": gm.estimate,
                        "kl_low": gm.low, "kl_high": gm.high,
                        "top1_agreement": sum(r["top1_agreement"] for r in rs) / len(rs),
                        "attn_rel_error": sum(r["attn_rel_error"] for r in rs) / len(rs)})
    return out


def compare_settings(rows: list[dict], setting: str, reference: str, *, seed: int | None = None,
                     confidence: float | None = None, n_resamples: int | None = None) -> list[dict]:
    """``setting`` against ``reference`` in every (length, ratio) cell where both have rows on the same
    documents: :func:`jacap_lib.verdicts.intervals.compare_cells` rows (ratio intervals, the geometric-mean
    interval adjusted for these cells, wins, Wilcoxon p, Holm over these cells, the verdict from the adjusted
    interval, ``verdict_unadjusted``) with ``length``, ``ratio``, ``setting`` and ``reference``. For comparisons outside the protocol's
    primary one (e.g. Jacap against CapKV, the paper's headline). ``confidence`` / ``n_resamples``: the
    unadjusted intervals' level and bootstrap size (default ``verdicts.CONFIDENCE`` / ``N_RESAMPLES``; a family
    wider than these cells passes its own simultaneous level, :func:`~jacap_lib.verdicts.intervals.simultaneous_confidence`)."""
    from jacap_lib.verdicts import intervals as V

    by: dict = {}
    for r in rows:
        if r["method"] in (setting, reference):
            by.setdefault((int(r["length"]), float(r["ratio"])), {}).setdefault(r["method"], {})[r["doc"]] = r["kl"]
    cells, meta = {}, {}
    for (L, c), per in sorted(by.items()):
        a, b = per.get(setting, {}), per.get(reference, {})
        if a and set(a) == set(b):
            docs = sorted(a)
            cells[f"{L}/{c}"] = ([a[d] for d in docs], [b[d] for d in docs])
            meta[f"{L}/{c}"] = {"length": L, "ratio": c}
    if not cells:
        raise ValueError(f"no cell holds rows of both {setting!r} and {reference!r} on the same documents")
    return [{**meta[r["cell"]], "setting": setting, "reference": reference, **r, "losses": r["n"] - r["wins"] - r["ties"]}
            for r in V.compare_cells(cells, **{k: v for k, v in (("seed", seed), ("confidence", confidence),
                                                                 ("n_resamples", n_resamples)) if v is not None})]


#: The evaluation's target for Algorithm 1's tuned Jacap setting against the best baseline picked on tune: per
#: compression ratio, what the verdict of every prompt length must be ("better": the whole interval of the
#: geometric-mean KL ratio below 1; "not worse": its lower end at most 1), judged on the interval adjusted for
#: the cells of the comparison (simultaneous, :func:`jacap_lib.verdicts.intervals.simultaneous_confidence`).
TARGET = {0.9: "better", 0.95: "better", 0.75: "not worse"}


def target_status(summary: dict, *, target: dict | None = None) -> list[dict]:
    """Each cell the target names, judged from ``summary`` (``summary.json``'s content): the default Jacap
    setting against the best baseline picked on tune. One row per (length, ratio) of the target's ratios:
    ``requirement``, ``met``, the 95 % interval (``gm_low``/``gm_high``) and the one adjusted for the cells judged
    together (``gm_low_adjusted``/``gm_high_adjusted``), the verdict, and ``shortfall`` — how far the adjusted
    interval's end is from the requirement, as a fraction (``gm_high_adjusted - 1`` for "better",
    ``gm_low_adjusted - 1`` for "not worse"; 0 when met). ``met``, ``verdict`` and ``shortfall`` come from the
    adjusted interval; ``met_unadjusted`` and ``verdict_unadjusted`` from the 95 % one. Cells the summary has not
    measured are rows with ``met = None``."""
    target = TARGET if target is None else target
    fam = RS.family(summary, RS.ALGORITHM1, "tune")
    if fam is None:
        raise ValueError("summary has no family of Algorithm 1's tuned setting against the baseline picked on tune; "
                         "run `jacap evaluate summary`")
    if any("gm_low_adjusted" not in r for r in fam["rows"]):
        raise ValueError("summary rows have no adjusted intervals (gm_low_adjusted); it was written before they "
                         "were added: rerun `jacap evaluate summary`")
    by = {(int(r["length"]), float(r["ratio"])): r for r in fam["rows"]}
    lengths = sorted({L for L, _ in by} | {int(c.split("/")[0]) for c in summary.get("cells_missing", [])})
    out = []
    for c, need in target.items():
        if need not in ("better", "not worse"):
            raise ValueError(f"target: requirement {need!r} for c={c} must be 'better' or 'not worse'")
        for L in lengths:
            r = by.get((L, float(c)))
            if r is None:
                out.append({"length": L, "ratio": float(c), "requirement": need, "met": None, "baseline": None,
                            "gm_ratio": None, "gm_low": None, "gm_high": None, "gm_low_adjusted": None,
                            "gm_high_adjusted": None, "verdict": "not measured", "shortfall": None,
                            "met_unadjusted": None, "verdict_unadjusted": "not measured"})
                continue
            lo, hi = r["gm_low_adjusted"], r["gm_high_adjusted"]
            met = hi < 1 if need == "better" else lo <= 1
            gap = (hi - 1 if need == "better" else lo - 1) if not met else 0.0
            out.append({"length": L, "ratio": float(c), "requirement": need, "met": bool(met),
                        "setting": fam.get("setting"), "baseline": r["baseline_spec"], "gm_ratio": r["gm_ratio"], "gm_low": r["gm_low"],
                        "gm_high": r["gm_high"], "gm_low_adjusted": lo, "gm_high_adjusted": hi,
                        "verdict": r["verdict"], "shortfall": max(gap, 0.0),
                        "met_unadjusted": bool(r["gm_high"] < 1 if need == "better" else r["gm_low"] <= 1),
                        "verdict_unadjusted": r["verdict_unadjusted"]})
    return out


def identical_documents(rows: list[dict], setting: str, other: str, *, rtol: float = 1e-9) -> dict:
    """Per (length, ratio) cell where both settings have rows on the same documents: how many documents give
    the two settings the same KL (to ``rtol`` relative) and how many documents there are, ``{(L, c): (same, n)}``.
    Where every document is the same, the two settings kept the same tokens: nothing their scores differ in
    decided that cell (e.g. a budget the sinks and the recent window fill). Two presses that keep the same tokens
    along different code paths differ by the replay's numerical noise (up to about 1e-5 relative on the committed
    rows), so such a check needs ``rtol`` above it; the default 1e-9 asks for the same arithmetic."""
    if not (isinstance(rtol, (int, float)) and 0 <= rtol < 1):
        raise ValueError(f"rtol must be a relative tolerance in [0, 1), got {rtol!r}")
    by: dict = {}
    for r in rows:
        if r["method"] in (setting, other):
            by.setdefault((int(r["length"]), float(r["ratio"])), {}).setdefault(r["method"], {})[r["doc"]] = float(r["kl"])
    out = {}
    for cell, per in sorted(by.items()):
        a, b = per.get(setting, {}), per.get(other, {})
        if a and set(a) == set(b):
            same = sum(abs(a[d] - b[d]) <= rtol * max(abs(a[d]), abs(b[d]), 1e-30) for d in a)
            out[cell] = (same, len(a))
    return out


def summary_table(summary: dict) -> list[dict]:
    """The summary as table rows (pure; ``summary``: what :func:`summarize` returns or ``summary.json``
    holds): one row per (Jacap setting, baseline line, cell), primary line (picked on tune) first; the verdict
    from the simultaneous interval, the 95 % one's beside it."""
    def iv(est, lo, hi):
        return f"{est:.3f} [{lo:.3f}, {hi:.3f}]"

    fams = sorted(summary["families"], key=lambda f: f["picked_on"] != "tune")
    return [{"Jacap setting": f"{f['setting']} ({f['role']})", "best baseline": f["label"],
             "length": r["length"], "c": r["ratio"], "baseline": r["baseline_spec"],
             "geometric-mean ratio [95% CI]": iv(r["gm_ratio"], r["gm_low"], r["gm_high"]),
             "geometric-mean ratio [simultaneous CI]": iv(r["gm_ratio"], r["gm_low_adjusted"], r["gm_high_adjusted"]),
             "mean-KL ratio [95% CI]": iv(r["mean_ratio"], r["mean_low"], r["mean_high"]),
             "wins/losses": f"{r['wins']}/{r['losses']}", "Wilcoxon p": r["p_wilcoxon"], "Holm p": r["p_holm"],
             "verdict": r["verdict"], "verdict (95% CI)": r["verdict_unadjusted"]}
            for f in fams for r in f["rows"]]


def _summary_inputs(out_dir: Path) -> tuple[list[dict], dict, list[dict]]:
    """dev rows, choices and the dev runs' configurations of ``out_dir``; ``ValueError`` when a file is
    missing or dev.jsonl was made under another configuration than choices.json."""
    dev, ch = out_dir / "dev.jsonl", out_dir / "choices.json"
    choices = RS.read_choices_file(ch, flag="--dir", baselines=True)
    if not dev.is_file():
        raise ValueError(f"--dir: {dev} does not exist; run `jacap evaluate dev` (same options) first")
    if not files.config_path(dev).is_file():
        raise ValueError(f"--dir: {files.config_path(dev)} (dev.jsonl's configuration) does not exist; rerun "
                         "`jacap evaluate dev`")
    runs = files.read_runs(dev)
    bad = [r.get("fingerprint") for r in runs if r.get("fingerprint") != choices["fingerprint"]
           and not P.same_measurements(r.get("protocol"), choices["config"])]  # another search space: same rows
    if not runs or bad:
        diff = sorted({k for r in runs if isinstance(r.get("protocol"), dict)
                       for k in P.compare_configs(r["protocol"], choices["config"])})
        raise ValueError(f"--dir: dev.jsonl and choices.json were made with different configurations (differs in: "
                         f"{', '.join(diff) or 'fingerprint'}); rerun `jacap evaluate dev` with the tune's options")
    return files.read_jsonl(dev), choices, runs


def _summary_add(parser):
    summary_options(parser, "folder of dev.jsonl and choices.json, where summary.json is written (default "
                              "data/results/eval; with --quick data/results/eval/quick)")


def _summarize(args) -> tuple[Path, dict, list[dict], dict]:
    """The ``--dir`` folder, its choices, dev runs and summary; ``ValueError`` as :func:`_summary_inputs`."""
    out_dir = eval_dir(args.dir, quick=args.quick)
    dev_rows, choices, runs = _summary_inputs(out_dir)
    return out_dir, choices, runs, summarize(dev_rows, choices, seed=args.seed)


def _summary_run(args):
    from jacap_lib.verdicts import intervals as V

    out_dir, choices, runs, summary = J.prepared(_summarize, args)
    seed = V.SEED if args.seed is None else args.seed
    config = {"protocol": choices["config"], "fingerprint": choices["fingerprint"], "chosen": choices["chosen"],
              "rule": choices.get("rule"), "inputs": ["dev.jsonl", "choices.json"],
              "dev_runs": [r.get("command") for r in runs], "command": getattr(args, "command", None),
              "statistics": {"confidence": V.CONFIDENCE, "n_resamples": V.N_RESAMPLES, "method": V.METHOD,
                             "seed": seed, "alpha": 0.05, "primary": "geometric-mean KL ratio (Jacap / baseline)",
                             "holm_family": "all (length, ratio) cells of one Jacap setting against one "
                                            "best-baseline line",
                             "adjusted_interval": "simultaneous Bonferroni interval of the geometric-mean ratio over "
                                                  "the Holm family's m cells: level 1 - (1 - confidence) / m, the same "
                                                  "resamples (gm_low_adjusted, gm_high_adjusted, confidence_adjusted)",
                             "verdict": "from the adjusted interval; verdict_unadjusted from the 95 % interval"}}
    path = out_dir / "summary.json"
    files.write_json(path, {"config": config, **files.round_floats(summary)})
    print(f"wrote {path}")
    if summary["cells_missing"]:
        print(f"  judged {len(summary['cells_measured'])} complete cells; not yet measured on every dev document "
              f"(finish `jacap evaluate dev`, it resumes): {', '.join(summary['cells_missing'])}")
    for r in summary_table(summary):
        print(f"  {r['Jacap setting']} vs {r['baseline']} ({r['best baseline']}), L={r['length']} c={r['c']}: "
              f"{r['verdict']}")
    return path


SUMMARY = J.Job("per cell, Algorithm 1's tuned Jacap setting (and the paper preset or the other Jacap settings) against the best "
                "baseline picked on tune and, stricter, on dev: ratio intervals, wins, Wilcoxon and Holm p, verdicts "
                "-> data/results/eval/summary.json (needs dev.jsonl and choices.json of one configuration)",
                _summary_add, _summary_run)


