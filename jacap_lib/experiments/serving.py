"""The serving chapter's job: Algorithm 2 (:class:`jacap_lib.controller.JacapDecodeController`) on the
bundled model -> ``data/serving/serving_run.json``. Command line: ``jacap serve-run`` (~6 min on two
busy CPU cores).

One greedy continuation of a story prompt is generated once without eviction; then the same tokens
are replayed (teacher forcing) through the controller for several beta values and through the
sliding-window fallback, so every configuration is judged on identical tokens by the next-token KL
against the uncompressed model.
"""
from __future__ import annotations

import time
from pathlib import Path

from jacap_lib.config import DEFAULTS
from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.results.paths import data_path
from jacap_lib.results.provenance import provenance

__all__ = ["CONFIG", "run_serving", "JOB"]

CONFIG = {
    "prompt": "Write a long story about a lighthouse keeper who finds an old map in a bottle.",
    "chat_template": True,
    "n_new": 160,
    "decoding": "greedy (do_sample=False)",
    "high": 80,
    "budget": 56,
    "interval": 8,
    "window": 16,
    "n_sink": DEFAULTS.n_sink,
    "prefix": 0,
    "tau": DEFAULTS.tau,
    "noise": DEFAULTS.noise,
    "eps": DEFAULTS.eps,
    "betas": [0.5, 0.8, 0.9, 0.95, 0.99],
    "main_beta": 0.9,
    "study_layer": 15,
    "tradeoff_betas": [0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99],
    "horizon": 16,
    "torch_threads": 1,
}


def run_serving(model, tok, *, out: Path | None = None, config: dict | None = None, progress: bool = True) -> Path:
    """Run :func:`jacap_lib.measure.serving.serving_study` with ``config`` (default :data:`CONFIG`) and
    write it with its configuration and provenance."""
    import torch

    from jacap_lib.measure.serving import serving_study
    from jacap_lib.models import BUNDLED_DIST, BUNDLED_FILE, BUNDLED_NAME, BUNDLED_VERSION

    cfg = dict(CONFIG if config is None else config)
    torch.set_num_threads(cfg["torch_threads"])
    t_start = time.time()
    study = serving_study(model, tok, cfg, progress=progress)
    record = provenance(model)
    result = {
        "config": {"model": BUNDLED_NAME, "model_file": BUNDLED_FILE,
                   "model_package": f"{BUNDLED_DIST}=={BUNDLED_VERSION}", "dtype": "float32", **cfg,
                   "command": "jacap serve-run", "provenance": record},
        "versions": record["versions"], **study, "wall_seconds": time.time() - t_start,
    }
    return files.write_json(out or data_path("serving", "serving_run.json", must_exist=False), result)


# --------------------------------------------------------------------------------------------- job: jacap serve-run
def _add_arguments(p) -> None:
    J.shared_options(p, model=False, out="default data/serving/serving_run.json")


def _run(args) -> Path:
    if args.out is not None:
        J.check_out_file(args.out, ".json")
    model, tok = J.load_model(args)  # the bundled model, seed 0
    path = run_serving(model, tok, out=args.out, progress=not args.no_progress)
    print(f"wrote {path}")
    return path


JOB = J.Job("Algorithm 2 on the bundled model -> data/serving/serving_run.json (~6 min)", _add_arguments, _run)
