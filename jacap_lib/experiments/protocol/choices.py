"""The tune's choices: each method's setting and the best baseline per cell by the protocol's one rule
(``choices.json``, written after the tune job, read by the dev job with its configuration checked), the two
best-baseline lines the summary compares with, and which settings the dev job and the summary take."""
from __future__ import annotations

from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments.protocol import rules as P
from jacap_lib.verdicts.rows import ALGORITHM1

__all__ = ["DEV_LABEL", "write_choices", "read_choices", "best_baselines", "jacap_settings", "dev_specs"]

DEV_LABEL = "picked on dev (stricter secondary line: favours the baselines, as it peeks at the dev documents)"


def write_choices(path: Path, tune_rows: list[dict], config: dict, space: dict, *, provenance: dict | None = None,
                  partial: bool = False) -> dict:
    """Apply the rule to the tune rows and write ``choices.json``: each method's setting, the best
    baseline per (length, ratio) cell (picked on tune), the configuration and its fingerprint.

    ``partial``: a method of ``space`` whose settings do not all have rows on the same tune keys yet (a staged run,
    ``--methods``) is listed under ``"pending"`` instead of raising; the others are chosen as usual."""
    rows = [r for r in tune_rows if r.get("split") == "tune"]
    pending = []
    if partial:
        have = {}
        for r in rows:
            have.setdefault(r["method"], set()).add((r["doc"], int(r["length"]), float(r["ratio"])))
        keys_of = {m: [frozenset(have.get(s, ())) for s in specs] for m, specs in space.items()}
        pending = [m for m, ks in keys_of.items()
                   if not ks[0] or any(k != ks[0] for k in ks) or len(ks[0]) < _complete_keys(config)]
        space = {m: v for m, v in space.items() if m not in pending}
    choices = P.choose_settings(rows, space, split="tune") if space else {}
    chosen = {m: v["chosen"] for m, v in choices.items()}
    data = {"config": config, "fingerprint": P.fingerprint(config), "rule": P.RULE, "chosen": chosen,
            "choices": choices}
    if partial:
        data["pending"] = pending
    if any(m in _baselines() for m in chosen):
        data["best_baseline"] = {"picked_on": "tune", "cells": P.best_baseline_per_cell(rows, chosen, split="tune")}
    if provenance is not None:
        data["provenance"] = provenance
    files.write_json(path, data)
    return data


def _complete_keys(config: dict) -> int:
    """How many (document, length, ratio) rows a tune setting has when complete under ``config``."""
    return len(config["tune_docs"]) * len(config["lengths"]) * len(config["ratios"])


def _baselines():
    from jacap_lib.presses.registry import BASELINES

    return BASELINES


def read_choices(path: Path, config: dict, *, methods=None) -> dict:
    """``choices.json`` if it exists and was made under ``config`` (same fingerprint) and holds a choice for every
    method of ``methods`` (default: the whole search space of ``config``; a ``--methods`` stage names its own);
    else ``ValueError`` saying what to run."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist: the dev job needs the tune choices; run `jacap evaluate tune` "
                         "(same options) first")
    data = files.read_json(path, require=("config", "fingerprint", "chosen"))
    if data["fingerprint"] != P.fingerprint(config):
        diff = P.compare_configs(data["config"], config)
        raise ValueError(f"{path} was made with a different configuration (differs in: {', '.join(diff) or 'fingerprint'}); "
                         "rerun `jacap evaluate tune` with this run's options, or run the dev job with the tune's options")
    missing = sorted(set(config["search_space"] if methods is None else methods) - set(data["chosen"]))
    if missing:
        raise ValueError(f"{path} has no choice for {missing}; rerun `jacap evaluate tune` (its rows of them are "
                         "incomplete), or leave them out of --methods")
    return data


def best_baselines(choices: dict, dev_rows: list[dict]) -> dict:
    """The two best-baseline lines per (length, ratio) cell: ``"tune"`` (the protocol's, from
    ``choices.json``) and ``"dev"`` (the same rule applied to the dev rows; labelled :data:`DEV_LABEL`)."""
    return {"tune": {"label": "picked on tune (the protocol)", "cells": choices["best_baseline"]["cells"]},
            "dev": {"label": DEV_LABEL,
                     "cells": P.best_baseline_per_cell(dev_rows, choices["chosen"], split="dev")}}


def jacap_settings(choices: dict, dev_rows: list[dict]) -> list[dict]:
    """The Jacap settings the summary judges: Algorithm 1's tuned setting (the tune choice of ``jacap_prompt``, the tempered
    centre; role :data:`~jacap_lib.verdicts.rows.ALGORITHM1`) first, then the paper's exact settings preset when the search space has one
    (``protocol.PAPER_PRESET``, a method spec) and the dev rows hold it, else every other Jacap setting
    (``jacap*`` method) the dev rows hold; then the tune choice of every other Jacap method of the search space
    (``jacap_prompt_adakv``, ``jacap_obs``, ...; role ``"tuned <method>"``) the dev rows hold. ``[{"spec", "role"}]``."""
    have = list(dict.fromkeys(r["method"] for r in dev_rows if P.method_of(r["method"]).startswith("jacap")))
    default = choices["chosen"].get("jacap_prompt") or (have[0] if have else None)
    if default is None or default not in have:
        raise ValueError(f"dev.jsonl has no rows of the chosen Jacap setting {default!r}; run `jacap evaluate dev`")
    out = [{"spec": default, "role": ALGORITHM1}]
    paper = getattr(P, "PAPER_PRESET", None)
    if paper is not None and paper in have and not P.same_setting(paper, default):
        out.append({"spec": paper, "role": "paper preset"})
    elif paper is None or paper not in have:
        out += [{"spec": s, "role": "tuned " + P.method_of(s)} for s in have if s != default]
    for m, spec in choices["chosen"].items():
        if m != "jacap_prompt" and m.startswith("jacap") and spec in have and all(o["spec"] != spec for o in out):
            out.append({"spec": spec, "role": "tuned " + m})
    return out


def dev_specs(chosen: dict) -> list[str]:
    """The settings the dev job runs: each method's tune choice, then the paper preset
    (:data:`~jacap_lib.experiments.protocol.rules.PAPER_PRESET`) when Jacap is among the methods and its choice
    resolves to other options (so the default and the paper's settings are in every table)."""
    specs = list(dict.fromkeys(chosen.values()))
    if "jacap_prompt" in chosen and not P.same_setting(chosen["jacap_prompt"], P.PAPER_PRESET):
        specs.append(P.PAPER_PRESET)
    return specs
