"""Mechanism and query-statistics diagnostics of Jacap on the bundled model, written to ``data/diagnostics/``.

Two jobs (each an argparse-free ``run_*`` function; :data:`MECHANISMS` and :data:`QUERY_STATS` are the
command lines ``jacap diagnose mechanisms|query-stats``):

* :func:`run_mechanisms` -> ``data/diagnostics/mechanisms.json``: per segment, layer and KV head, at
  every temperature ``tau`` and noise rule, the effective dimension, ``||A - I||_2``, the number of tokens
  with alpha > 1/2 and the overlap of the kept set with the top-``w|u|^2`` set
  (:func:`jacap_lib.measure.diagnostics.model_mechanisms`);
* :func:`run_query_stats` -> ``data/diagnostics/query_stats.json``: per segment, layer and KV head,
  the relative error of the prompt-query estimators' mean and variance against the continuation's
  queries (:func:`jacap_lib.measure.diagnostics.query_stat_errors`).

Each file has the common shape ``{"config": ..., "rows": [...]}`` (:mod:`jacap_lib.results.files`); the
config holds the provenance record (model file and sha256, package versions, git revision, command),
the segments (sha256) and every setting. Read them with
:func:`jacap_lib.results.loaders.load_mechanisms` / :func:`~jacap_lib.results.loaders.load_query_stats`.

    jacap diagnose mechanisms
    jacap diagnose query-stats
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

from jacap_lib.config import PAPER

from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.results.paths import data_path
from jacap_lib.results.provenance import provenance
from jacap_lib.results.texts import load_segments

__all__ = ["TUNE_SEGMENTS", "DEFAULT_RULES", "run_mechanisms", "run_query_stats", "MECHANISMS", "QUERY_STATS"]

TUNE_SEGMENTS = ("prose/lighthouse", "docs/execmodel", "code/textwrap")
DEFAULT_RULES = (("fixed", 1.0), ("deff", 0.1), ("deff", 0.25), ("deff", 0.5))


def _config(model, command: str, segs, **settings) -> dict:
    return {**provenance(model, command=command),
            "segments": [{k: s[k] for k in ("id", "kind", "split", "sha256")} for s in segs], **settings}


def _prepare(segments, length: int, extra: int, threads: int):
    from jacap_lib.models import load_model

    torch.set_num_threads(int(threads))
    segs = load_segments(list(segments))
    model, tok = load_model(None)
    out = []
    for s in segs:
        ids = tok(s["text"], return_tensors="pt", add_special_tokens=False).input_ids
        if ids.shape[1] < length + extra:
            raise ValueError(f"segment {s['id']} has {ids.shape[1]} tokens < length {length} + {extra}")
        out.append((s, ids[:, :length + extra]))
    return model, segs, out


def _check_args(length, taus=(1.0,), ratios=(0.5,)):
    if not isinstance(length, int) or length < 64:
        raise ValueError(f"`length` must be an int >= 64, got {length!r}")
    for t in taus:
        if not float(t) > 0:
            raise ValueError(f"`taus` must be > 0, got {t!r}")
    from jacap_lib._checks import compression_ratio

    for c in ratios:
        compression_ratio(float(c) if isinstance(c, (int, float)) and not isinstance(c, bool) else c, "`ratios`",
                          allow_zero=False)


def run_mechanisms(*, segments=TUNE_SEGMENTS, length: int = 512, taus=(1.0, 3.0, 10.0), rules=DEFAULT_RULES,
                   ratios=(0.75, 0.9), out: Path | str | None = None, threads: int = 1,
                   command: str = "jacap diagnose mechanisms") -> Path:
    """Write the mechanism diagnostics of every layer and KV head on ``segments`` (prompt ``length``)."""
    from jacap_lib.measure.diagnostics import model_mechanisms
    from jacap_lib.measure.quality import capture_prefill
    from jacap_lib.presses.jacap import JacapPromptPress

    _check_args(length, taus, ratios)
    for name, value in rules:
        if name not in ("fixed", "deff") or not float(value) > 0:
            raise ValueError(f"each rule must be ('fixed', sigma2 > 0) or ('deff', frac in (0, 1]), got {(name, value)}")
    out = Path(out) if out else data_path("diagnostics", "mechanisms.json", must_exist=False)
    model, segs, prompts = _prepare(segments, length, 0, threads)
    press = JacapPromptPress(0.5)  # statistics only: flat mean over the prompt after 4 sinks, as the paper's defaults
    records = []
    for seg, ids in prompts:
        cap = capture_prefill(model, ids)
        for r in model_mechanisms(model, cap, taus=taus, rules=rules, ratios=ratios, press=press):
            records.append({"segment": seg["id"], "kind": seg["kind"], **r})
    cfg = _config(model, command, segs, length=length, taus=list(taus), rules=[list(r) for r in rules], ratios=list(ratios),
                  statistics="JacapPromptPress defaults: flat mean/variance of the prompt's queries after 4 sinks, "
                             "future-RoPE averaged over 512 positions, GQA-pooled; u = v",
                  budget="kvpress compute_n_kept(N, ratio)",
                  deff_target="frac * min(budget, head_dim)")
    return files.write_json(out, {"config": cfg, "rows": records}, indent=None)


def run_query_stats(*, segments=TUNE_SEGMENTS, length: int = 512, continuation: int = 32, estimators=None,
                    out: Path | str | None = None, threads: int = 1,
                    command: str = "jacap diagnose query-stats") -> Path:
    """Write the prompt-estimator errors against the next ``continuation`` queries on ``segments``."""
    from jacap_lib.measure.diagnostics import DEFAULT_ESTIMATORS, query_stat_errors

    _check_args(length)
    if not isinstance(continuation, int) or continuation < 2:
        raise ValueError(f"`continuation` must be an int >= 2, got {continuation!r}")
    estimators = tuple(estimators or DEFAULT_ESTIMATORS)
    out = Path(out) if out else data_path("diagnostics", "query_stats.json", must_exist=False)
    model, segs, prompts = _prepare(segments, length, continuation, threads)
    records = []
    for seg, ids in prompts:
        for r in query_stat_errors(model, ids, length, estimators):
            records.append({"segment": seg["id"], "kind": seg["kind"], **r})
    cfg = _config(model, command, segs, length=length, continuation=continuation, estimators=list(estimators),
                  skip_sinks=4, queries="pre-RoPE, G query heads pooled per KV head (mixture moments)")
    return files.write_json(out, {"config": cfg, "rows": records}, indent=None)


# --------------------------------------------------------------------------------------------- jobs: jacap diagnose
def defaults_summary(rows: list[dict], *, tau: float = PAPER.tau, rule: str = "fixed=1", ratio: float = 0.9) -> dict:
    """Medians over every (segment, layer, KV head) row at one (tau, noise rule, ratio): what the
    paper's defaults (tau = 10, sigma^2 = 1) do on the measured model. Keys: ``n_heads`` (rows = segment x
    layer x KV head cases), ``n_segments``, ``n_layers``, ``n_kv_heads``, ``deff``, ``a_minus_i``, ``overlap``,
    ``overlap_min``, ``heads_saturated`` (rows with some alpha > 1/2), ``budget``, ``n_tokens``."""
    sel = [r for r in rows if r["tau"] == tau and r["rule"] == rule and r["ratio"] == ratio]
    if not sel:
        raise ValueError(f"no rows at tau={tau}, rule={rule!r}, ratio={ratio}")
    med = lambda k: statistics.median(r[k] for r in sel)  # noqa: E731
    return {"n_heads": len(sel), "deff": med("deff"), "a_minus_i": med("a_minus_i"), "overlap": med("overlap"),
            "overlap_min": min(r["overlap"] for r in sel), "heads_saturated": sum(r["n_saturated"] > 0 for r in sel),
            "budget": sel[0]["budget"], "n_tokens": sel[0]["n_tokens"],
            "n_segments": len({r.get("segment") for r in sel}), "n_layers": len({r["layer"] for r in sel}),
            "n_kv_heads": len({r["head"] for r in sel})}


def _arguments(name: str):
    def add_arguments(p) -> None:
        J.shared_options(p, model=False, progress=False, out=f"default data/diagnostics/{name.replace('-', '_')}.json")
        p.add_argument("--segments", nargs="+", default=list(TUNE_SEGMENTS))
        p.add_argument("--length", type=int, default=512)
        if name == "mechanisms":
            p.add_argument("--taus", nargs="+", type=float, default=[1.0, 3.0, 10.0])
            p.add_argument("--ratios", nargs="+", type=float, default=[0.75, 0.9])
        else:
            p.add_argument("--continuation", type=int, default=32)

    return add_arguments


def _check(args, name: str) -> None:
    if args.out is not None:
        J.check_out_file(args.out, ".json")
    try:
        load_segments(list(args.segments))
        if name == "mechanisms":
            _check_args(args.length, args.taus, args.ratios)
        else:
            _check_args(args.length)
            if args.continuation < 2:
                raise ValueError(f"`continuation` must be an int >= 2, got {args.continuation!r}")
    except (ValueError, FileNotFoundError) as e:
        raise J.as_option(e) from None


def _run_mechanisms(args) -> Path:
    _check(args, "mechanisms")
    path = run_mechanisms(segments=args.segments, length=args.length, taus=args.taus, ratios=args.ratios,
                          out=args.out, threads=args.threads, command=args.command)
    print(f"wrote {path}")
    return path


def _run_query_stats(args) -> Path:
    _check(args, "query-stats")
    path = run_query_stats(segments=args.segments, length=args.length, continuation=args.continuation,
                           out=args.out, threads=args.threads, command=args.command)
    print(f"wrote {path}")
    return path


MECHANISMS = J.Job("effective dimension, ||A - I||, saturation and top-w|u|^2 overlap per layer and KV head "
                   "-> data/diagnostics/mechanisms.json", _arguments("mechanisms"), _run_mechanisms)
QUERY_STATS = J.Job("errors of the prompt-query estimators against the continuation's queries "
                    "-> data/diagnostics/query_stats.json", _arguments("query-stats"), _run_query_stats)
