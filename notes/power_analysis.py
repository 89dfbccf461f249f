"""Power analysis for the confirmatory evaluation, from the dev rows: per (length, ratio) cell, the
geometric-mean KL ratio that a paired test of "Jacap default vs the cell's best tuned baseline" detects with
80 % power at a planned number of documents n, under a Bonferroni adjustment over m planned comparisons.

The 48 dev documents of data/results/eval/dev.jsonl are called "dev" documents
here: they were used in four rounds of the evaluation, so their effects are not a confirmation; only their
spread is used to plan one. Writes data/results/eval/power.json.

Beside the cells (the first rounds' comparison), ``comparisons`` holds the spread of every comparison the
confirmatory plan makes (jacap_lib.experiments.confirm.plan.planned_comparisons: each Jacap-family candidate against
the cell's best tuned baseline over every search space, the default against KVzip and against Expected Attention),
each from the dev rows of its two settings, wherever both have rows on every dev document of the cell; ``m_planned``
is the number of judged comparisons, the plan's adjustment.

    PYTHONPATH=$PWD python3 notes/power_analysis.py
"""
from __future__ import annotations

import math

import numpy as np

from jacap_lib.experiments.confirm import plan as CP
from jacap_lib.results import files
from jacap_lib.results import loaders as R
from jacap_lib.verdicts import intervals as V
from jacap_lib.results.paths import data_path

METHOD = "jacap_obs"  # the Jacap default of the plan: the tune choice of jacap_obs (choices.json), as written there
NS = (48, 96, 144)                 # planned documents per cell
MS = (24, 48)                      # planned comparisons judged together (e.g. 12 cells x 4 comparisons = 48)
POWER, ALPHA = 0.8, 0.05


def cells(rows: list[dict], choices: dict) -> dict:
    """``{"L/c": (per-document log ratios, baseline spec)}``: the setting's KL over the best baseline's
    (picked on tune, ``choices.json``) on every dev document, paired by document."""
    cfg = choices["config"]
    docs = [d for d, _ in cfg["dev_docs"]]
    kl = {(r["method"], int(r["length"]), float(r["ratio"]), r["doc"]): float(r["kl"]) for r in rows
          if r["split"] == "dev" and r["model"] == cfg["model"]["name"]
          and int(r["continuation"]) == int(cfg["continuation"])}
    setting = choices["chosen"][METHOD]
    out = {}
    for name, base in choices["best_baseline"]["cells"].items():
        L, c = int(base["length"]), float(base["ratio"])
        method = [kl[(setting, L, c, d)] for d in docs]
        reference = [kl[(base["spec"], L, c, d)] for d in docs]
        out[name] = (V.log_ratios(method, reference), base["spec"])
    return out


def plan(rows: list[dict], choices: dict) -> dict:
    per_cell = []
    for name, (d, baseline) in cells(rows, choices).items():
        sd = float(np.std(d, ddof=1))
        length, ratio = CP.parse_cell(name)
        entry = {"cell": name, "length": length, "ratio": ratio,
                 "baseline_spec": baseline, "n_dev": int(d.size), "dev_gm_ratio": math.exp(float(np.mean(d))),
                 "dev_mean_log_ratio": float(np.mean(d)), "log_ratio_sd": sd, "detectable": {}}
        for m in MS:
            for n in NS:
                entry["detectable"][f"m={m},n={n}"] = {
                    "m": m, "n": n,
                    "ratio_t": V.detectable_ratio(sd, n, m, POWER, alpha=ALPHA),
                    "ratio_normal": V.detectable_ratio(sd, n, m, POWER, alpha=ALPHA, approximation="normal"),
                    "power_at_dev_effect_t": V.paired_power(float(np.mean(d)), sd, n, m, alpha=ALPHA)}
        per_cell.append(entry)
    return {
        "config": {
            "rows": "data/results/eval/dev.jsonl: the 48 dev documents (used in four "
                    "rounds, so here only their spread plans the confirmatory run), model and continuation of "
                    "choices.json",
            "choices_fingerprint": choices["fingerprint"],
            "comparison": f"Jacap default ({choices['chosen'][METHOD]} rows: the tune choice of {METHOD}) vs the cell's best tuned baseline "
                          "(choices.json best_baseline.cells[cell].spec, picked on tune), paired per document",
            "statistic": "d_i = log(KL_method,i / KL_baseline,i) per document; the geometric-mean ratio is "
                         "exp(mean d); log_ratio_sd = sd(d, ddof=1) over the dev documents of the cell",
            "test": f"two-sided one-sample test of mean d = 0 at level alpha/m (Bonferroni over m planned "
                    f"comparisons), alpha = {ALPHA}",
            "formula_t": "power(delta) = P(T > t_c) + P(T < -t_c), T ~ noncentral t(df = n - 1, "
                         "nc = delta sqrt(n) / sd), t_c = t_{1 - alpha/(2m), n-1} (scipy.stats.nct); the "
                         "detectable ratio is exp(-delta) with power(delta) = 0.8 (scipy.optimize.brentq); a "
                         "ratio of exp(+delta) (as much worse) is detected with the same power",
            "formula_normal": "the same with the standard normal: delta ~ (z_{1 - alpha/(2m)} + z_power) sd / "
                              "sqrt(n)",
            "functions": "jacap_lib.verdicts.intervals.detectable_ratio, paired_power",
            "power": POWER, "alpha": ALPHA, "n": list(NS), "m": list(MS),
            "caveats": ["the sd is estimated from 48 dev documents per cell; the confirmatory documents are "
                        "other works, whose spread may differ",
                        "in the confirmatory set some works give several excerpts (data/texts/confirm/"
                        "manifest.json 'clusters': 12 prose works for 24 documents, 22 plays for 24); correlated "
                        "excerpts of one work make the effective n smaller than the document count",
                        "power_at_dev_effect_t takes the dev effect as the truth; the dev documents have been "
                        "looked at in four rounds, so that effect is optimistic"],
            "script": "notes/power_analysis.py",
        },
        "cells": per_cell,
    }


def comparisons(rows: list[dict], candidates: dict, best_per_cell: dict, docs: list[str]) -> dict:
    """``{"m_planned", "comparisons": [...]}``: per planned (setting, reference, cell) with dev rows of both on every
    document of ``docs``, the sd of the per-document log KL ratios (KL floored at the rule's floor), the dev ratio,
    and the detectable ratio at each planned n under the plan's own m (and the MS); ``missing`` lists the planned
    comparisons without complete dev rows."""
    from jacap_lib.experiments.protocol.rules import KL_FLOOR

    cells = [CP.parse_cell(k) for k in best_per_cell]
    planned = CP.planned_comparisons(candidates, cells, best_per_cell)
    m_planned = sum(c["judged"] for c in planned)
    kl = {(r["method"], int(r["length"]), float(r["ratio"]), r["doc"]): max(float(r["kl"]), KL_FLOOR) for r in rows
          if r.get("split", "dev") == "dev"}
    out, missing = [], []
    for c in planned:
        L, ratio = CP.parse_cell(c["cell"])
        keys = [((c["a"], L, ratio, d), (c["b"], L, ratio, d)) for d in docs]
        if not all(a in kl and b in kl for a, b in keys):
            missing.append({k: c[k] for k in ("a", "b", "what", "cell")})
            continue
        d = np.log([kl[a] for a, _ in keys]) - np.log([kl[b] for _, b in keys])
        sd = float(np.std(d, ddof=1))
        entry = {k: c[k] for k in ("a", "b", "what", "cell", "judged")}
        entry.update({"n_dev": int(d.size), "dev_gm_ratio": math.exp(float(np.mean(d))), "log_ratio_sd": sd,
                      "detectable": {f"m={m},n={n}": V.detectable_ratio(sd, n, m, POWER, alpha=ALPHA)
                                     for m in sorted({m_planned, *MS}) for n in NS}})
        out.append(entry)
    return {"m_planned": m_planned, "comparisons": out, "missing": missing}


if __name__ == "__main__":
    out = plan(R.load_eval_rows("dev"), R.load_eval_choices())
    every = [r for space in ("first", "peers", "context") for r in R.load_eval_rows("dev", space=space)]
    docs = [d for d, _ in R.load_eval_choices()["config"]["dev_docs"]]
    from jacap_lib.experiments.confirm.plan import best_per_cell

    extra = comparisons(every, R.load_candidates(), best_per_cell(data_path("results", "eval")), docs)
    out["m_planned"], out["comparisons"], out["comparisons_missing"] = (extra["m_planned"], extra["comparisons"],
                                                                        extra["missing"])
    out["config"]["comparisons"] = ("every comparison of confirm_plan.planned_comparisons with dev rows of both "
                                    "settings on every dev document of its cell (rows of data/results/eval, peers/ "
                                    "and context/), its sd as the cells'; detectable ratios at m_planned (the plan's "
                                    "judged comparisons) and at each m of MS")
    path = files.write_json(data_path("results", "eval", "power.json", must_exist=False), out)
    for c in out["cells"]:
        row = " ".join(f"{k}: {v['ratio_t']:.3f}" for k, v in c["detectable"].items())
        print(f"{c['cell']:>9} sd {c['log_ratio_sd']:.3f} dev gm {c['dev_gm_ratio']:.3f}  {row}")
    m = out["m_planned"]
    for c in out["comparisons"]:
        print(f"{c['what'][:40]:>40} {c['cell']:>9} sd {c['log_ratio_sd']:.3f} detectable at n=96, m={m}: "
              f"{c['detectable'][f'm={m},n=96']:.3f}")
    print(f"{len(out['comparisons_missing'])} planned comparisons without complete dev rows")
    print("wrote", path)
