"""Issue 10's comparison: note-faithful Jacap, its new options and variants against every kvpress baseline.

Two grids (rows as :func:`jacap_lib.results.quality.run_kl` writes them):

* ``data/results/tune.jsonl`` — the sweeps that chose the settings, on the three *tune* segments only
  (one per text kind), prompts 512 and 1024, c = 0.75 and 0.9: the recent window (0/8/16/32/48/64),
  the noise rule (``noise="deff"``, ``deff_frac`` 0.1/0.25/0.5), the query statistics (last n, EMA
  beta), the temperature and hybrid variants;
* ``data/results/grid.jsonl`` — all 12 segments x prompts 512/1024 x c 0.5/0.75/0.9 for
  :data:`GRID_METHODS`: every kvpress baseline (SnapKV with its default 64-token observation window and
  with 16 and 32 tokens, which fit every budget here) and the Jacap configurations.

:func:`run_summary` writes ``data/results/grid_summary.json``: means with 95% bootstrap intervals,
paired per-segment comparisons (wins/losses, Wilcoxon) to the best baseline and to CapKV, the rankings
on the tune segments that chose each setting (:data:`TUNE_CHOICES`), and the target judged on the nine
*test* segments (:func:`jacap_lib.results.quality.choose_target`).

    jacap compare grid --lengths 512 1024
    jacap compare summary
"""
from __future__ import annotations

from pathlib import Path

from . import files
from . import job as J
from .paths import data_path

__all__ = ["BASELINE_SPECS", "JACAP_SPECS", "GRID_METHODS", "TUNE_CHOICES", "TUNE_SEGMENTS", "grid_command",
           "run_grid", "run_summary", "GRID", "SUMMARY"]

TUNE_SEGMENTS = ("prose/lighthouse", "docs/execmodel", "code/textwrap")
BASELINE_SPECS = ("snapkv", "snapkv[window_size=16]", "snapkv[window_size=32]", "knorm", "keydiff",
                  "expected_attention", "capkv", "streaming_llm", "tova", "random")
JACAP_SPECS = (
    "jacap",                                            # note-faithful defaults: tau 10, sigma^2 1, u = v, window 32
    "jacap[window=0]",                                  # Algorithm 1 without step 10 (the earlier results)
    "jacap[noise=deff,deff_frac=0.25]",                 # the effective-dimension noise rule (frac chosen on tune)
    "jacap[beta=0.99]",                                 # EMA query statistics
    "jacap[tau=3]",                                     # temperature variant
    "jacap[tau=3,beta=0.9]",                            # temperature + EMA statistics (best worst-case on tune)
    "jacap_hybrid[snap_window=32,tau=1,lam_mix=0.25]",  # Jacap mixed with observed attention
)
GRID_METHODS = BASELINE_SPECS + JACAP_SPECS
TUNE_CHOICES = {
    "window": [f"jacap[window={w}]" for w in (0, 8, 16, 32, 48, 64)],
    "noise": ["jacap[window=32]"] + [f"jacap[window=32,noise=deff,deff_frac={f}]" for f in (0.1, 0.25, 0.5)],
    "statistics": ["jacap[window=32]", "jacap[window=32,n_queries=16]", "jacap[window=32,n_queries=64]",
                   "jacap[window=32,beta=0.9]", "jacap[window=32,beta=0.99]"],
    "variants": ["jacap[window=32]", "jacap[window=32,tau=1]", "jacap[window=32,tau=2]", "jacap[window=32,tau=3]",
                 "jacap[window=32,tau=3,noise=deff,deff_frac=0.1]", "jacap[window=32,tau=1,noise=deff,deff_frac=0.1]",
                 "jacap[window=32,tau=1,beta=0.99]", "jacap[window=32,tau=1,n_queries=1]",
                 "jacap[window=32,tau=1,n_queries=8]", "jacap[window=32,tau=3,n_queries=8]",
                 "jacap[window=32,tau=3,beta=0.9]", "jacap_hybrid[window=32,snap_window=32]",
                 "jacap_hybrid[window=32,snap_window=32,tau=1]", "jacap_hybrid[window=32,snap_window=32,lam_mix=0.25,tau=1]",
                 "jacap_hybrid[window=32,snap_window=32,tau=3]",
                 "jacap_hybrid[window=32,snap_window=32,tau=3,lam_mix=0.25]"],
}


def grid_command(lengths=(512, 1024)) -> list[str]:
    """The ``jacap bench kl`` arguments that (re)produce ``data/results/grid.jsonl`` (a rerun resumes)."""
    return ["bench", "kl", "--out", "data/results/grid.jsonl", "--lengths", *map(str, lengths),
            "--methods", *GRID_METHODS]


def run_grid(*, lengths=(512, 1024), ratios=(0.5, 0.75, 0.9), continuation: int = 32, methods=GRID_METHODS,
             segments=None, out: Path | str | None = None, threads: int = 1, progress: bool = False,
             command: str | None = None) -> int:
    """Run (or resume) the grid: every segment x ``lengths`` x ``ratios`` x ``methods``; returns rows written.

    The same job as ``jacap bench kl`` with :func:`grid_command`'s arguments; the invocation's
    configuration (provenance, segments, methods with every option) is appended to the sidecar."""
    import time

    import torch

    from ..models import load_model
    from ..presses.registry import method_options, press_from_spec
    from .provenance import model_record, provenance
    from .quality import COMPRESSED, run_kl
    from .texts import load_segments

    for c in ratios:
        if not 0 <= c < 1:
            raise ValueError(f"`ratios` must lie in [0, 1), got {c}")
    for m in methods:
        press_from_spec(m, 0.5)  # bad names/options fail before any model work
    out = Path(out) if out else data_path("results", "grid.jsonl", must_exist=False)
    segs = load_segments(segments)
    torch.set_num_threads(int(threads))
    model, tok = load_model(None)
    record = provenance(model)
    command = command or "jacap compare grid --lengths " + " ".join(map(str, lengths))
    files.append_run(out, {"command": command,
                        "task": "kl", "ratios": list(ratios), "lengths": list(lengths), "continuation": continuation,
                        "threads": threads, "compressed": COMPRESSED, "model": record["model"],
                        "versions": record["versions"], "git": record["git"], "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                        "segments": [{k: s[k] for k in ("id", "kind", "split", "sha256", "source")} for s in segs],
                        "methods": {m: method_options(press_from_spec(m, ratios[0])) for m in methods}})
    return run_kl(model, tok, segments=segs, methods=list(methods), ratios=ratios, lengths=lengths,
                  continuation=continuation, out=out, model_name=model_record(None)["name"], progress=progress)


def run_summary(*, grid: Path | str | None = None, tune: Path | str | None = None, out: Path | str | None = None,
                n_boot: int = 2000, seed: int = 0) -> Path:
    """Summarise the grid (+ the tune sweeps) into ``data/results/grid_summary.json``."""
    from .quality import choose_target, rank_on_tune, summarize

    grid = Path(grid) if grid else data_path("results", "grid.jsonl")
    tune = Path(tune) if tune else data_path("results", "tune.jsonl")
    out = Path(out) if out else data_path("results", "grid_summary.json", must_exist=False)
    grid_rows = files.read_jsonl(grid, missing_ok=False)
    tune_rows = files.read_jsonl(tune, missing_ok=False)
    if not grid_rows:
        raise ValueError(f"{grid} holds no rows; run: jacap compare grid")
    res = summarize(grid_rows + tune_rows, n_boot=n_boot, seed=seed)
    res["choices"] = {k: rank_on_tune(res["comparisons"], v) for k, v in TUNE_CHOICES.items()}
    # the target: chosen among the grid's Jacap configurations on the tune segments, judged on the test ones
    grid_jacap = [c for c in res["comparisons"] if c["method"] in JACAP_SPECS]
    res["target"] = choose_target(grid_jacap)
    # inputs named relative to the repository when they lie in it, so a rerun elsewhere writes the same file
    root = data_path("results", "grid.jsonl", must_exist=False).parents[2]
    res["source"] = [str(p.resolve().relative_to(root)) if p.resolve().is_relative_to(root) else str(p)
                     for p in (grid, tune)]
    res["grid_methods"] = list(GRID_METHODS)
    res["tune_segments"] = list(TUNE_SEGMENTS)
    return files.write_json(out, res)


# --------------------------------------------------------------------------------------------- jobs: jacap compare
def _grid_arguments(p) -> None:
    J.shared_options(p, model=False, out="default data/results/grid.jsonl")
    p.add_argument("--lengths", nargs="+", type=int, default=[512, 1024])


def _run_grid(args) -> int:
    J.check_positive(args.lengths, "--lengths")
    if args.out is not None:
        J.check_out_file(args.out, ".jsonl")
    n = run_grid(lengths=tuple(args.lengths), out=args.out, threads=args.threads, progress=not args.no_progress,
                 command=args.command)
    print(f"wrote {n} new rows")
    return n


def _summary_arguments(p) -> None:
    J.shared_options(p, model=False, threads=False, progress=False, out="default data/results/grid_summary.json")
    p.add_argument("--n-boot", type=int, default=2000)


def _run_summary(args) -> Path:
    J.check_positive(args.n_boot, "--n-boot")
    if args.out is not None:
        J.check_out_file(args.out, ".json")
    path = run_summary(n_boot=args.n_boot, out=args.out)
    print(f"wrote {path}")
    return path


GRID = J.Job("run (or resume) data/results/grid.jsonl (the jobs of `jacap bench kl` on GRID_METHODS)",
             _grid_arguments, _run_grid)
SUMMARY = J.Job("write data/results/grid_summary.json (intervals, paired comparisons, tune rankings, target)",
                _summary_arguments, _run_summary)
