"""The live-eviction chapter's KL table job: :func:`jacap_lib.measure.eviction.kl_table` on the demo
text -> ``data/live/kl_table.json`` (``{"config", "rows"}``). Command line: ``jacap inspect --kl-table``.

:data:`INSPECT` is the job ``jacap inspect``: what one eviction keeps, per token (or, with ``--kl-table``,
this file). Its options are declared in :func:`_inspect_arguments`, all checked in :func:`_check_inspect`
before the model loads, and the report printed by :func:`_run_inspect`."""
from __future__ import annotations

from pathlib import Path

from . import files
from . import job as J
from .paths import data_path
from .provenance import provenance

__all__ = ["write_kl_table", "INSPECT"]


def write_kl_table(model, tok, *, out: Path | None = None, ratios=(0.5, 0.75, 0.9), model_name=None,
                   progress: bool = True) -> Path:
    """Run the KL table on ``DEMO_CONTEXT`` / ``DEMO_CONTINUATION`` and write it with its configuration."""
    import torch

    from ..measure.eviction import DEMO_CONTEXT, DEMO_CONTINUATION, kl_table
    from ..presses.jacap import JacapPress

    torch.manual_seed(0)
    rows = kl_table(model, tok, DEMO_CONTEXT, DEMO_CONTINUATION, ratios=ratios, progress=progress)
    config = {
        "command": "jacap inspect --kl-table",
        "prompt": "jacap_lib.measure.eviction.DEMO_CONTEXT",
        "continuation": "jacap_lib.measure.eviction.DEMO_CONTINUATION",
        "prompt_tokens": len(tok(DEMO_CONTEXT, add_special_tokens=False).input_ids),
        "continuation_tokens": len(tok(DEMO_CONTINUATION, add_special_tokens=False).input_ids),
        "ratios": [float(r) for r in ratios],
        "jacap": {k: v for k, v in vars(JacapPress()).items() if k not in ("compression_ratio", "trace")},
        "baselines": "kvpress defaults (random: seed 0)",
        "seed": 0,
        **provenance(model, model_name=model_name),
    }
    return files.write_results(out or data_path("live", "kl_table.json", must_exist=False), config, rows)


# --------------------------------------------------------------------------------------------- job: jacap inspect
def _inspect_arguments(p) -> None:
    J.shared_options(p, seed=True, out="with --kl-table (default data/live/kl_table.json)")
    p.add_argument("--method", default="jacap", help="registry name, optionally name[key=value,...]")
    p.add_argument("--ratio", type=float, default=0.75, help="compression ratio in [0, 1)")
    p.add_argument("--text", type=Path, default=None, help="a text file (default: the live chapter's demo text)")
    p.add_argument("--top", type=int, default=10, help="tokens listed at each end")
    p.add_argument("--kl-table", action="store_true",
                   help="instead: KL(full || compressed) for every method x --ratios on the demo text, written to --out")
    p.add_argument("--ratios", nargs="+", type=float, default=[0.5, 0.75, 0.9], help="with --kl-table")


def _check_inspect(args) -> None:
    """Every argument of ``jacap inspect`` (raises :class:`~jacap_lib.results.job.BadArgument`)."""
    J.check_model(args.model)
    if args.kl_table:
        J.check_ratios(args.ratios)
        if args.out is not None:
            J.check_out_file(args.out, ".json")
        return
    J.check_ratios([args.ratio], "--ratio")
    J.check(args.out is None, "--out is only for --kl-table")
    from ..presses.registry import press_from_spec

    try:
        press_from_spec(args.method, args.ratio)
    except ValueError as e:
        raise J.BadArgument(f"--method: {e}") from None
    if args.text is not None:
        J.check(args.text.is_file(), f"--text {args.text} is not a file")
    J.check_positive(args.top, "--top")


def _run_inspect(args):
    _check_inspect(args)
    model, tok = J.load_model(args)
    if args.kl_table:
        path = write_kl_table(model, tok, out=args.out, ratios=tuple(args.ratios), model_name=args.model,
                              progress=not args.no_progress)
        print(f"wrote {path}")
        return path
    from ..measure.eviction import DEMO_CONTEXT, inspect_eviction
    from ..presses.registry import parse_method

    text = DEMO_CONTEXT if args.text is None else args.text.read_text()
    name, opts = parse_method(args.method)
    insp = inspect_eviction(model, tok, text, name, args.ratio, **opts)
    frac = insp.keep_fraction()
    order = frac.argsort(descending=True).tolist()
    print(f"{args.method} at c={args.ratio}: {insp.n_tokens} prompt tokens, {insp.kept.shape[-1]} kept per head "
          f"({insp.n_layers} layers x {insp.n_heads} KV heads)")
    for title, idx in (("most kept", order[:args.top]), ("least kept", order[-args.top:][::-1])):
        print(f"\n{title} (fraction of layer x head pairs keeping the token):")
        for i in idx:
            print(f"  {i:5d} {insp.tokens[i]!r:>16} {float(frac[i]):.2f}")
    return insp


INSPECT = J.Job("what one eviction keeps; --kl-table: the live chapter's KL table", _inspect_arguments, _run_inspect)
