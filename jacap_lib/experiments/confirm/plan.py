"""The confirmatory plan: written and committed once, before any confirmatory row exists.

``jacap evaluate confirm-plan`` reads the frozen candidates (``candidates.json``, :mod:`jacap_lib.experiments.candidates`),
the power analysis (``power.json``: the spread of the per-document log KL ratios on the dev documents) and the
confirmatory manifest (``data/texts/confirm/manifest.json``), and writes ``data/results/eval/confirm/plan.json``:

* the settings (every method's tune choice; the rule's Jacap-family default), with the CPU-hours they will cost;
* the cells (prompt length x ratio) and, per Jacap-family setting, the cells where its protected sinks and recent
  window fill the whole budget (there the score chooses nothing: those cells are labelled and left out of its
  comparisons);
* the comparisons: each Jacap-family setting against the cell's best tuned baseline (picked on tune by the rule,
  over kvpress's baselines and the peers), the default against KVzip and against Expected Attention;
* the adjustment over all of them (Bonferroni simultaneous intervals, Holm over the p-values), the detectable ratio
  with 80 % power in every planned cell at that adjustment (and per comparison, from the spread of its own two
  settings on the dev documents where ``power.json`` holds it), the needle design and the sentence each outcome
  prints.

The job refuses while the candidates are not frozen (a method's tune unfinished), and refuses to overwrite a plan
(a plan is written once; a changed plan needs fresh documents). It reads committed files only.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.experiments.protocol import runs

__all__ = ["CONFIDENCE", "ALPHA", "NEEDLE", "SENTENCES", "parse_cell", "planned_comparisons", "make_plan", "best_per_cell",
           "CONFIRM_PLAN"]

CONFIDENCE = 0.95
ALPHA = 0.05
#: the needle design of the confirmatory run: both modes, the settings of the planned comparisons at the needle's
#: cells, exact paired tests (make_plan adds ``settings``)
NEEDLE = {"lengths": [512, 1024, 2048], "ratios": [0.5, 0.75, 0.9], "depths": [0.1, 0.3, 0.5, 0.7, 0.9],
          "trials": 8, "modes": ["after", "inside"], "seed": 1,
          "keys": "fresh: drawn with seed 1 (the tune and dev needle rows used seed 0); every prompt also gets the "
                  "uncompressed answer",
          "pairs": "the plan's judged KL comparisons whose cell is a needle cell: the same two settings in the same "
                   "cell",
          "test": "exact McNemar per cell on the prompts both settings answered (discordant pairs), Holm over the "
                  "cells and comparisons of one mode; accuracy with a 95 % Wilson interval"}
#: what each outcome of a comparison prints (``{a}``, ``{b}``: the two settings; ``{ratio}``, ``{low}``, ``{high}``:
#: the geometric-mean KL ratio a/b and its adjusted interval; ``{cell}``)
SENTENCES = {
    "better": "In {cell}, {a} keeps a lower KL than {b}: ratio {ratio} (adjusted interval {low}-{high}).",
    "worse": "In {cell}, {a} keeps a higher KL than {b}: ratio {ratio} (adjusted interval {low}-{high}).",
    "no detectable difference": "In {cell}, the run cannot tell {a} from {b}: ratio {ratio} (adjusted interval "
                                "{low}-{high} holds 1).",
    "protection fills the budget": "In {cell}, {a} keeps only its protected tokens, so its score chooses nothing; "
                                   "the cell is not judged for it.",
}


def parse_cell(key: str) -> tuple[int, float]:
    """``(prompt length, c)`` of a cell name ``"L/c"``, as the plan writes its cells (``"1024/0.9"``)."""
    L, c = key.split("/")
    return int(L), float(c)


def planned_comparisons(candidates: dict, cells: list[tuple[int, float]], best_per_cell: dict) -> list[dict]:
    """Every comparison of the plan, one per (pair, cell): each Jacap-family setting against the cell's best tuned
    baseline (``best_per_cell``: ``{"L/c": spec}``), the default against KVzip and against Expected Attention. Where
    two purposes name the same two settings in one cell (the default against KVzip, KVzip the cell's best baseline),
    the comparison is listed once and its ``what`` names both: it is one test, counted once in the adjustment. A cell
    where the Jacap-family setting's protection fills the budget is listed with ``judged: False``."""
    from jacap_lib.experiments.protection import LABEL, protection_fills_budget

    methods = candidates["methods"]
    default = candidates["default"]["chosen"]["spec"]
    family = [e["spec"] for e in candidates["default"]["eligible"]]
    pairs = [(s, None, "against the best tuned baseline") for s in family]
    for name in ("kvzip", "expected_attention"):
        if name in methods:
            pairs.append((default, methods[name]["spec"], f"the default against {name}"))
    out: dict = {}
    for a, b, what in pairs:
        for L, c in cells:
            key = f"{L}/{c}"
            ref = b or best_per_cell[key]
            if (a, ref, key) in out:  # the same two settings in the same cell are judged once, for both purposes
                out[a, ref, key]["what"] += f"; {what}"
                continue
            fills = protection_fills_budget(a, int(L), float(c))
            out[a, ref, key] = {"a": a, "b": ref, "what": what, "cell": key, "judged": not fills,
                                **({"label": LABEL} if fills else {})}
    return list(out.values())


def make_plan(candidates: dict, power: dict, manifest: dict, *, best_per_cell: dict, manifest_sha256: str,
              lengths=(512, 1024, 2048), ratios=(0.5, 0.75, 0.9, 0.95), continuation: int = 128,
              model: dict | None = None) -> dict:
    """The plan record (see the module docstring). ``settings`` lists every frozen candidate; ``run`` the settings
    the comparisons name, ``run_cells`` the cells where each is named (the confirmatory run measures it there, on
    every document), ``needle["settings"]`` those of the judged comparisons at the needle's cells.
    Raises ``ValueError`` when ``candidates`` is not frozen."""
    from jacap_lib.verdicts.intervals import detectable_ratio, simultaneous_confidence

    if not candidates.get("frozen"):
        raise ValueError("the candidates are not frozen (pending: "
                         f"{', '.join(candidates.get('pending', [])) or '?'}); finish the tune runs and rerun "
                         "`jacap evaluate candidates` before writing the plan")
    cells = [(int(L), float(c)) for L in lengths for c in ratios]
    comps = planned_comparisons(candidates, cells, best_per_cell)
    m = sum(c["judged"] for c in comps)
    docs = [d for d in manifest["documents"]]
    n = len(docs)
    works = len({(d.get("kind"), d.get("group", d["id"])) for d in docs})
    sd = {c["cell"]: c["log_ratio_sd"] for c in power["cells"]}
    detect = {k: detectable_ratio(v, works, m) for k, v in sd.items()}
    own = {(c["a"], c["b"], c["cell"]): c["log_ratio_sd"] for c in power.get("comparisons", [])}
    per = []
    for c in comps:
        if not c["judged"]:
            continue
        spread = own.get((c["a"], c["b"], c["cell"]))
        source = "its two settings' dev rows"
        if spread is None:
            spread, source = sd[c["cell"]], "the cell's spread (no dev rows of this pair)"
        per.append({"a": c["a"], "b": c["b"], "what": c["what"], "cell": c["cell"], "log_ratio_sd": spread,
                    "sd_from": source, "detectable_ratio_80": round(detectable_ratio(spread, works, m), 4)})
    settings = list(dict.fromkeys([v["spec"] for v in candidates["methods"].values()]))
    run = [s for s in settings if any(s in (c["a"], c["b"]) for c in comps)]
    # each run setting is measured in the cells where a comparison names it (a reference that is the best baseline
    # of one cell only is not measured in the others)
    run_cells = {s: [f"{L}/{c}" for L, c in cells if any(s in (x["a"], x["b"]) and x["cell"] == f"{L}/{c}"
                                                         for x in comps)] for s in run}
    needle_cells = {f"{L}/{c}" for L in NEEDLE["lengths"] for c in NEEDLE["ratios"]}
    needle_settings = [s for s in run if any(s in (c["a"], c["b"]) and c["judged"] and c["cell"] in needle_cells
                                             for c in comps)]
    per_row = {v["spec"]: v.get("tune_cpu_seconds_per_row") or 0.0 for v in candidates["methods"].values()}
    cost = sum(per_row[s] * len(run_cells[s]) for s in run) * n
    return {
        "written": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "documents": {"manifest": "data/texts/confirm/manifest.json", "sha256": manifest_sha256, "n": n,
                      "works": works, "bootstrap": "resample works (clusters), every excerpt of a work together"},
        "candidates_fingerprints": {s: v["fingerprint"] for s, v in candidates["spaces"].items()},
        "model": model, "settings": settings, "run": run, "run_cells": run_cells,
        "default": candidates["default"]["chosen"],
        "cells": [f"{L}/{c}" for L, c in cells], "continuation": int(continuation),
        "best_baseline_per_cell": best_per_cell,
        "best_baseline_rule": "per cell, among every baseline's tune choice in every search space, the one with the "
                              "smallest mean log KL (floored at 1e-8) over the tune documents in that cell; picked "
                              "on tune only",
        "protection_rule": "a Jacap-family setting is not judged in a cell where kvpress's budget int((1 - c) L) "
                           "holds no more than its sinks and recent window (protection.protection_fills_budget)",
        "comparisons": comps, "judged": m,
        "adjustment": {"confidence": CONFIDENCE, "m": m, "per_interval": simultaneous_confidence(CONFIDENCE, m),
                       "intervals": "the geometric-mean KL ratio over the documents with a paired BCa bootstrap "
                                    "interval that resamples works, every excerpt of a drawn work together "
                                    "(verdicts.work_ratio; 9,999 resamples, seed 0), at the per-interval level",
                       "verdict": "better when the adjusted interval lies below 1, worse when above 1, no detectable "
                                  "difference when it holds 1",
                       "p_values": "Wilcoxon signed-rank test of the works' mean log KL ratios (one value per work), "
                                   "Holm over all m; reported beside the verdict, which the interval decides"},
        "power": {"from": "power.json (the dev documents' spread)", "n_effective": works, "m": m,
                  "detectable_ratio_80": {k: round(v, 4) for k, v in detect.items()},
                  "ten_percent_detectable_in": sorted(k for k, v in detect.items() if v >= 0.9),
                  "per_comparison": per,
                  "ten_percent_detectable_comparisons": sum(p["detectable_ratio_80"] >= 0.9 for p in per)},
        "needle": {**NEEDLE, "settings": needle_settings}, "sentences": SENTENCES,
        "cost_cpu_hours": round(cost / 3600, 2),
        "cost_from": "each run setting's mean CPU-seconds per tune row x documents x its cells (the KL rows; the needle "
                     "and the shared prefills come on top)",
        "rules": ["run once, resumable; nothing re-tuned afterwards",
                  "a bug found after the run: fix it, rerun the whole plan, say so"],
    }


def best_per_cell(eval_dir) -> dict:
    """``{"L/c": spec}``: per cell, the best tuned baseline over every search space's ``choices.json`` under
    ``eval_dir`` (the rule's score on the tune documents): the plan's reference for the Jacap-family candidates."""
    from jacap_lib.experiments.candidates import choice_files

    best: dict = {}
    for _, p in choice_files(Path(eval_dir)).items():
        for key, v in (files.read_json(p).get("best_baseline") or {}).get("cells", {}).items():
            if key not in best or v["score"] < best[key]["score"]:
                best[key] = {"spec": v["spec"], "score": v["score"]}
    return {k: v["spec"] for k, v in best.items()}


# --------------------------------------------------------------------------------------------- the job
def _add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None,
                        help="the evaluation folder (default data/results/eval): reads candidates.json and power.json, "
                             "writes confirm/plan.json")


def _run(args):
    from jacap_lib.results.paths import data_path

    eval_dir = runs.eval_dir(args.dir, quick=False)
    out = eval_dir / "confirm" / "plan.json"
    J.check(not out.exists(), f"{out} exists: a plan is written once (a changed plan needs fresh documents)")
    cand = files.read_json(eval_dir / "candidates.json", require=("methods", "frozen"))
    power = files.read_json(eval_dir / "power.json", require=("cells",))
    mpath = data_path("texts", "confirm", "manifest.json")
    manifest = files.read_json(mpath, require=("documents",))
    from jacap_lib.results.provenance import model_record

    plan = J.prepared(make_plan, cand, power, manifest, best_per_cell=best_per_cell(eval_dir),
                      manifest_sha256=hashlib.sha256(Path(mpath).read_bytes()).hexdigest(),
                      model=model_record(None))
    files.write_json(out, plan)
    print(f"wrote {out}: {len(plan['settings'])} settings, {plan['judged']} judged comparisons, "
          f"~{plan['cost_cpu_hours']} CPU-hours; commit it before any confirmatory row")
    return out


CONFIRM_PLAN = J.Job("the confirmatory plan from the frozen candidates and the power analysis -> "
                     "data/results/eval/confirm/plan.json (written once, before any confirmatory row)", _add, _run)
