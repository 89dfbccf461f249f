"""One loader per committed results file: figures (:mod:`jacap_lib.viz`) and chapters read results
only through these (no module above this layer opens a path itself).

============================  ====================================  =================================
loader                        file(s)                               written by
============================  ====================================  =================================
:func:`load_decomposition`    ``data/decomposition/<part>.json``    ``jacap decompose``
:func:`load_failures`         ``data/decomposition/failures.json``  ``jacap decompose --only failures``
:func:`load_kl_table`         ``data/live/kl_table.json``           ``jacap inspect --kl-table``
:func:`load_serving_run`      ``data/serving/serving_run.json``     ``jacap serve-run``
:func:`load_bench`            ``data/bench/<name>.json``            ``jacap time scoring|e2e``
:func:`load_manifest`         ``data/texts/manifest.json``          ``jacap texts``
:func:`load_mechanisms`       ``data/diagnostics/mechanisms.json``  ``jacap diagnose mechanisms``
:func:`load_query_stats`      ``data/diagnostics/query_stats.json`` ``jacap diagnose query-stats``
:func:`load_eval_choices`     ``data/results/eval/choices.json``    ``jacap evaluate tune``
:func:`load_all_chosen`       ``.../eval[/<space>]/choices.json``   ``jacap evaluate tune [--space]``
:func:`load_eval_rows`        ``data/results/eval/<split>.jsonl``   ``jacap evaluate tune|dev``
:func:`load_eval_summary`     ``data/results/eval/summary.json``    ``jacap evaluate summary``
:func:`load_dev_record`       ``data/results/eval/dev_record.json`` ``jacap evaluate record``
:func:`load_needle_rows`      ``data/results/eval/needle.jsonl``    ``jacap evaluate needle``
:func:`load_needle_summary`   ``.../eval/needle_summary.json``      ``jacap evaluate needle-summary``
:func:`load_anatomy`          ``data/results/eval/anatomy.json``    ``jacap evaluate anatomy``
:func:`load_needle_probe_rows` ``.../eval/needle_probe.jsonl``      ``jacap evaluate needle --probe``
:func:`load_needle_probe_summary` ``.../needle_probe_summary.json`` ``jacap evaluate needle-summary --probe``
============================  ====================================  =================================
"""
from __future__ import annotations

from pathlib import Path

from jacap_lib.results import files
from jacap_lib.results.paths import data_dir, data_path

#: the evaluation's search spaces, each with its own folder of tune and dev files ("first": ``data/results/eval``,
#: another: ``data/results/eval/<space>``); the protocol defines each space's settings
#: (:data:`jacap_lib.experiments.protocol.rules.SPACES`, checked to name these)
SPACES = ("first", "peers", "context")

__all__ = ["load_ladder_summary", "load_field_summary", "load_confirm_summary", "load_candidates", "load_decomposition", "DECOMPOSITION_PARTS", "load_failures",
           "load_kl_table", "load_serving_run", "available_benches", "load_bench", "load_manifest",
           "load_mechanisms", "load_query_stats", "load_decoding_comparison",
           "load_eval_choices", "load_all_chosen", "load_eval_rows", "load_eval_runs", "load_eval_summary", "load_dev_record",
           "load_needle_rows", "load_needle_runs", "load_needle_summary", "load_needle_probe_rows",
           "load_needle_probe_summary", "load_anatomy",
           "load_ablation_summary", "load_ablation_summaries"]

DECOMPOSITION_PARTS = ("taylor", "diagonal", "selection", "loo")


def load_decomposition(part: str) -> tuple[dict, list]:
    """``(config, rows)`` of ``data/decomposition/<part>.json``, part in :data:`DECOMPOSITION_PARTS`
    (or a path to such a file)."""
    if part not in DECOMPOSITION_PARTS and not str(part).endswith(".json"):
        raise ValueError(f"`part` must be one of {DECOMPOSITION_PARTS} or a .json path, got {part!r}")
    path = Path(part) if str(part).endswith(".json") else data_path("decomposition", f"{part}.json", must_exist=False)
    return files.read_results(path, hint=f"jacap decompose --only {Path(str(part)).stem}")


def load_failures(path=None) -> tuple[dict, dict]:
    """``(config, {demo name: demo})`` of ``data/decomposition/failures.json``."""
    config, rows = files.read_results(path or data_path("decomposition", "failures.json", must_exist=False),
                                   hint="jacap decompose --only failures")
    return config, {d["name"]: d for d in rows}


def load_kl_table(path=None) -> tuple[dict, list]:
    """``(config, rows)`` of the live chapter's KL table (one row per method x ratio)."""
    return files.read_results(path or data_path("live", "kl_table.json", must_exist=False),
                           hint="jacap inspect --kl-table")


def load_serving_run(path=None) -> dict:
    """The serving chapter's Algorithm 2 run: ``config``, ``runs`` per beta and the window fallback,
    ``tradeoff``, ``query_trace``."""
    return files.read_json(path or data_path("serving", "serving_run.json", must_exist=False),
                        require=("config", "runs"), hint="jacap serve-run")


def available_benches() -> list[str]:
    """Names of the committed speed results (``scoring_cpu``, ``scoring_<gpu>``, ``end_to_end_cpu``, ...)."""
    folder = data_dir() / "bench"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def load_bench(name: str) -> dict:
    """The JSON of ``data/bench/<name>.json`` (e.g. ``"scoring_cpu"``, ``"end_to_end_cpu"``)."""
    path = data_path("bench", f"{name}.json", must_exist=False)
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark file {path}; available: {available_benches()}")
    return files.read_json(path, require=("rows",))


def load_manifest(path=None) -> dict:
    """``data/texts/manifest.json``: the text segments of the quality benchmark."""
    return files.read_json(path or data_path("texts", "manifest.json", must_exist=False), require=("segments",),
                        hint="jacap texts")


def load_mechanisms(path=None) -> tuple[dict, list]:
    """``(config, rows)`` of the mechanism diagnostics: one row per (segment, layer, KV head, tau, noise
    rule, ratio) with ``deff``, ``a_minus_i``, ``n_saturated``, ``alpha_max``, ``overlap``, ``sigma2``."""
    return files.read_results(path or data_path("diagnostics", "mechanisms.json", must_exist=False),
                           hint="jacap diagnose mechanisms")


def load_query_stats(path=None) -> tuple[dict, list]:
    """``(config, rows)`` of the query-statistics errors: one row per (segment, layer, KV head, estimator)
    with ``mu_err`` and ``lam_err`` against the continuation's queries."""
    return files.read_results(path or data_path("diagnostics", "query_stats.json", must_exist=False),
                           hint="jacap diagnose query-stats")


def load_decoding_comparison(path=None) -> tuple[dict, list]:
    """``(config, rows)`` of the serving chapter's decoding comparison (Algorithm 2 vs kvpress DecodingPress):
    one row per prompt x method, plus one ``"uncompressed"`` row per prompt."""
    return files.read_results(path or data_path("serving", "decoding_comparison.json", must_exist=False),
                           hint="jacap compare-decoding")


def load_eval_choices(path=None, *, space: str = "first") -> dict:
    """``choices.json`` of the evaluation: the protocol's configuration and fingerprint, the rule, each method's
    setting chosen on the tune documents (``chosen``, ``choices`` with every candidate's score) and the best
    baseline per (length, ratio) cell picked on tune. ``space``: the search space whose choices (as
    :func:`load_eval_rows`)."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {sorted(SPACES)}, got {space!r}")
    sub = () if space == "first" else (space,)
    return files.read_json(path or data_path("results", "eval", *sub, "choices.json", must_exist=False),
                           require=("config", "fingerprint", "chosen", "choices"),
                           hint="jacap evaluate tune" + ("" if space == "first" else f" --space {space}"))


def load_all_chosen(folder=None) -> dict[str, str]:
    """``{method: spec}``: every search space's tune choices together (the first space's ``choices.json``, then
    ``peers/`` and ``context/`` where they are committed; a method belongs to one space). ``folder``: the
    evaluation folder (default ``data/results/eval``)."""
    root = Path(folder) if folder is not None else data_path("results", "eval", must_exist=False)
    out: dict[str, str] = {}
    for space in SPACES:
        path = root / ("choices.json" if space == "first" else f"{space}/choices.json")
        if path.is_file():
            out.update(load_eval_choices(path, space=space)["chosen"])
    return out


def load_eval_rows(split: str = "dev", path=None, *, space: str = "first") -> list[dict]:
    """The evaluation's rows of ``split`` ("tune": every setting on the tune documents; "dev": each method's
    chosen setting on the dev documents): one per (document, length, ratio, setting). ``space``: the search space
    (:data:`~jacap_lib.experiments.protocol.rules.SPACES`; "first" in ``data/results/eval``, another in its own folder there)."""
    if split not in ("tune", "dev"):
        raise ValueError(f"split must be 'tune' or 'dev', got {split!r}")
    if space not in SPACES:
        raise ValueError(f"space must be one of {sorted(SPACES)}, got {space!r}")
    sub = () if space == "first" else (space,)
    path = path or data_path("results", "eval", *sub, f"{split}.jsonl", must_exist=False)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist; run `jacap evaluate {split}`")
    return files.read_jsonl(path)


def load_eval_runs(split: str = "dev", path=None) -> list[dict]:
    """Every invocation's configuration of the evaluation's ``split`` file (its ``.config.json`` sidecar)."""
    if split not in ("tune", "dev"):
        raise ValueError(f"split must be 'tune' or 'dev', got {split!r}")
    return files.read_runs(path or data_path("results", "eval", f"{split}.jsonl", must_exist=False))


def load_eval_summary(path=None) -> dict:
    """``summary.json`` of the evaluation: per (length, ratio) cell each Jacap setting against the best baseline
    picked on tune (the protocol) and on dev (stricter): ratio intervals, wins/losses, Wilcoxon and Holm p,
    verdicts; ``cells_measured`` / ``cells_missing``."""
    return files.read_json(path or data_path("results", "eval", "summary.json", must_exist=False),
                           require=("config", "families"), hint="jacap evaluate summary")


def load_dev_record(path=None) -> dict:
    """``dev_record.json``: every setting ever run on the dev documents, with its round, first run, dev rows,
    status (current choice, paper preset, superseded) and what it led to; ``rounds``: per round its settings and
    rows."""
    return files.read_json(path or data_path("results", "eval", "dev_record.json", must_exist=False),
                           require=("config", "settings", "rounds"), hint="jacap evaluate record")


def load_needle_rows(path=None) -> list[dict]:
    """The needle retrieval rows of the evaluation: one per (length, depth, trial, setting, ratio), plus one
    uncompressed (``method="full"``) per prompt; ``correct``: the key is in the answer."""
    path = path or data_path("results", "eval", "needle.jsonl", must_exist=False)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist; run `jacap evaluate needle`")
    return files.read_jsonl(path)


def load_needle_runs(path=None) -> list[dict]:
    """Every invocation's configuration of ``needle.jsonl`` (its ``.config.json`` sidecar)."""
    return files.read_runs(path or data_path("results", "eval", "needle.jsonl", must_exist=False))


def load_needle_summary(path=None) -> dict:
    """``needle_summary.json``: per (length, ratio) cell the uncompressed accuracy and each setting's with its
    Wilson interval (``cells``); Algorithm 1's tuned Jacap setting against the best baseline by KL on tune and the
    paper preset, paired per prompt (``comparisons``); ``cells_measured`` / ``cells_missing``."""
    return files.read_json(path or data_path("results", "eval", "needle_summary.json", must_exist=False),
                           require=("config", "cells", "comparisons"), hint="jacap evaluate needle-summary")


def load_anatomy(path=None) -> dict:
    """``anatomy.json``: why Algorithm 1's tuned Jacap setting loses — per losing cell the per-layer attention-output
    error ratios (``layers``) and the KL ratio per document kind (``kinds``), from the dev rows; on one cell's
    dev documents the kept sets of the default and the best baseline and the KL of a one-knob swap of score and
    protection (``documents``); ``config`` says what ran."""
    return files.read_json(path or data_path("results", "eval", "anatomy.json", must_exist=False),
                           require=("config", "layers", "kinds", "documents"), hint="jacap evaluate anatomy")


def load_needle_probe_rows(path=None) -> list[dict]:
    """The needle digit-survival probe's rows (``needle_probe.jsonl``): one per (mode, length, depth, trial,
    setting, ratio), plus one uncompressed per (mode, prompt); each with ``mode`` ("after"/"inside"), ``correct``
    and the digit survival (``key_kept`` per layer over KV heads, ``key_kept_frac``, ``needle_kept_frac``,
    ``key_all_kept``, ``key_copy_kept``)."""
    path = path or data_path("results", "eval", "needle_probe.jsonl", must_exist=False)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist; run `jacap evaluate needle --probe`")
    return files.read_jsonl(path)


def load_needle_probe_summary(path=None) -> dict:
    """``needle_probe_summary.json``: per mode the cells (accuracies with Wilson intervals), the default Jacap
    setting against every other setting paired per prompt (McNemar, Holm over the mode), each setting's digit
    survival per cell (``survival``); ``mode_effect``: inside against after per setting and cell."""
    return files.read_json(path or data_path("results", "eval", "needle_probe_summary.json", must_exist=False),
                           require=("config", "modes", "mode_effect"), hint="jacap evaluate needle-summary --probe")


def load_ladder_summary(path=None) -> dict:
    """``peers/ladder_summary.json``: per (length, ratio) cell of the tune documents, each step of the one-knob ladder
    from the default press to KVzip (:data:`jacap_lib.experiments.ladder.STEPS`) as its geometric-mean KL ratio to the step
    before with simultaneous intervals and verdicts, each step's share of the log gap, the pooled shares, the carrier
    steps and the gap (the sentence is :func:`jacap_lib.report.findings.ladder_sentence`'s), the check that the last step is kvpress KVzip, and the CPU cost. Table and figure:
    :func:`jacap_lib.viz.field.ladder_frame`, :func:`~jacap_lib.viz.field.ladder_figure`."""
    return files.read_json(path or data_path("results", "eval", "peers", "ladder_summary.json", must_exist=False),
                           require=("cells", "m", "carrier", "cost"), hint="jacap evaluate kvzip-ladder-summary")


def load_field_summary(path=None) -> dict:
    """``peers/field_summary.json``: on the dev documents, per (length, ratio) cell, the context press's tune choice
    against KVzip's and against the setting ``JacapPromptPress()`` builds, and that setting against KVzip, with intervals
    simultaneous over all of them (:mod:`jacap_lib.experiments.field`). Table: :func:`jacap_lib.viz.field.field_frame`."""
    return files.read_json(path or data_path("results", "eval", "peers", "field_summary.json", must_exist=False),
                           require=("config", "comparisons", "m", "no_higher"), hint="jacap evaluate field-summary")


def load_confirm_summary(eval_dir=None, *, part: str | None = "all") -> dict | None:
    """``confirm/summary.json`` of ``eval_dir`` (default ``data/results/eval``): the committed confirmatory plan's
    verdicts (:mod:`jacap_lib.experiments.confirm.summary`). ``None`` when there is none yet, or while rows of ``part``
    are missing: ``"all"`` (every planned row), ``"kl"`` (the KL rows; the needle part may still run) or ``None``
    (whatever is there). The answer and the findings read the KL verdicts from ``"kl"`` on, and stay on the dev
    documents before."""
    if part not in ("all", "kl", None):
        raise ValueError(f"part must be 'all', 'kl' or None, got {part!r}")
    d = Path(eval_dir) if eval_dir is not None else data_path("results", "eval", must_exist=False)
    path = d / "confirm" / "summary.json"
    if not path.is_file():
        return None
    data = files.read_json(path, require=("config", "complete", "kl", "needle"), hint="jacap evaluate confirm-summary")
    done = {"all": data["complete"], "kl": data["kl"].get("complete", False), None: True}[part]
    return data if done else None


def load_candidates(path=None) -> dict:
    """``candidates.json``: every method's tune choice from every search space with its rule score, the Jacap-family
    default the rule picks, what is still pending (:mod:`jacap_lib.experiments.candidates`)."""
    return files.read_json(path or data_path("results", "eval", "candidates.json", must_exist=False),
                           require=("methods", "pending", "frozen"), hint="jacap evaluate candidates")


def load_confirm_plan(path=None) -> dict:
    """``confirm/plan.json``: the confirmatory plan, written once and committed before any confirmatory row
    (:mod:`jacap_lib.experiments.confirm.plan`). Table: :func:`jacap_lib.viz.evaluation.plan_frame`."""
    return files.read_json(path or data_path("results", "eval", "confirm", "plan.json", must_exist=False),
                           require=("run", "cells", "comparisons", "adjustment", "power"),
                           hint="jacap evaluate confirm-plan")


def load_ablation_summary(path=None) -> dict:
    """``ablation_summary.json``: per one-knob ablation of Jacap and (length, ratio) cell, the paired geometric-mean
    KL ratio to its base on the tune documents with its simultaneous (Bonferroni) and 95 % intervals, wins/losses,
    Wilcoxon and Holm p, verdicts, and per layer the attention-output error ratio (``ablations``); ``m``,
    ``confidence``, ``cells_measured`` / ``cells_missing``. Tables: :func:`jacap_lib.viz.ablation.ablation_frame`."""
    return files.read_json(path or data_path("results", "eval", "ablation_summary.json", must_exist=False),
                           require=("config", "ablations", "m"), hint="jacap evaluate ablate-summary")


def load_ablation_summaries() -> list[dict]:
    """Every committed ablation summary, one per measured compression ratio, in ratio order: ``ablation_summary.json``
    and those of the folders ``ablation-c<ratio>/`` beside it (each folder one run of ``jacap evaluate ablate
    --ratios <ratio> --dir ...`` and its ``ablate-summary``; each summary judges its own cells, its ``m`` and
    simultaneous level its own)."""
    root = data_path("results", "eval", must_exist=False)
    paths = [root / "ablation_summary.json"] + sorted(root.glob("ablation-c*/ablation_summary.json"))
    found = [load_ablation_summary(p) for p in paths if p.is_file()]
    if not found:
        raise FileNotFoundError(f"no ablation summary under {root}; run `jacap evaluate ablate` and `ablate-summary`")
    return sorted(found, key=lambda s: min(r["ratio"] for a in s["ablations"] for r in a["rows"]))
