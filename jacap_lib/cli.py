"""``jacap`` — the one command line of the book and its library (also ``python -m jacap_lib``).

::

    jacap book build [--all] [--fresh]             build the book (executed on the bundled model)
    jacap bench kl --out data/results/quality.jsonl  quality grid: next-token KL + attention error
    jacap bench passkey --out data/results/passkey.jsonl
    jacap bench summary --inp data/results/quality.jsonl ... --out data/results/summary.json
    jacap decompose [--only taylor diagonal ...]   error decomposition -> data/decomposition/*.json
    jacap diagnose mechanisms|query-stats          mechanism diagnostics -> data/diagnostics/*.json
    jacap inspect [--method jacap --ratio 0.75]    what one eviction keeps, per token
    jacap inspect --kl-table                       the live chapter's KL table -> data/live/kl_table.json
    jacap serve-run                                Algorithm 2 run -> data/serving/serving_run.json
    jacap compare-decoding [--quick]               Algorithm 2 vs kvpress DecodingPress -> data/serving/
    jacap texts                                    rebuild the benchmark's text segments (data/texts)
    jacap texts --corpus                           rebuild the evaluation corpus (data/texts/corpus)
    jacap time scoring|e2e [options]               speed benchmarks -> data/bench/*.json

Every subcommand checks all its arguments before it loads a model or writes a file: a bad call
exits with status 2 and a message naming the argument, and writes nothing.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

__all__ = ["main", "build_parser"]


# --------------------------------------------------------------------------------------------- checks
class _Bad(Exception):
    """An invalid argument (reported through the parser: status 2, nothing written)."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise _Bad(msg)


def _ratios(values, name="--ratios"):
    for c in values:
        _check(0 <= c < 1, f"{name}: every compression ratio must be in [0, 1), got {c}")


def _positive(values, name):
    for v in values if isinstance(values, (list, tuple)) else [values]:
        _check(v >= 1, f"{name} must be >= 1, got {v}")


def _out_file(path: Path, suffix: str, name="--out"):
    _check(path.suffix == suffix, f"{name} {path} must end in {suffix}")
    _check(not path.is_dir(), f"{name} {path} is a folder; give a file name")


def _methods(specs):
    from .presses.registry import expand_methods

    try:
        return expand_methods(specs)
    except ValueError as e:
        raise _Bad(f"--methods: {e}") from None


def _check_model(name) -> None:
    from .models import check_model_name

    try:
        check_model_name(name)
    except ValueError as e:
        raise _Bad(f"--model: {e}") from None


def _load_model(args):
    _check_model(getattr(args, "model", None))
    import torch

    from .models import load_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    return load_model(args.model)


def _command(argv) -> str:
    return "jacap " + " ".join(shlex.quote(a) for a in argv)


# --------------------------------------------------------------------------------------------- book
def _book(args, argv):
    from .book import build, find_root

    try:
        root = args.root if args.root is not None else find_root()
    except ValueError as e:
        raise _Bad(str(e)) from None
    _check((root / "_config.yml").is_file(), f"--root {root} has no _config.yml")
    return build(root, all_pages=args.all, fresh=args.fresh)


# --------------------------------------------------------------------------------------------- bench
def _bench(args, argv):
    import time

    from .results import files
    from .results import quality as Q
    from .results.provenance import model_record, provenance

    if args.task == "summary":
        rows = []
        for p in args.inp:
            _check(p.is_file(), f"--inp {p} does not exist")
            try:
                rows += files.read_jsonl(p, missing_ok=False)
            except ValueError as e:
                raise _Bad(f"--inp: {e}") from None
        _check(any(r.get("task") == "kl" for r in rows), f"--inp {[str(p) for p in args.inp]} holds no KL rows")
        _out_file(args.out, ".json")
        _positive(args.n_boot, "--n-boot")
        res = Q.summarize(rows, n_boot=args.n_boot)
        res["source"] = [str(p) for p in args.inp]
        files.write_json(args.out, res)
        print(f"wrote {len(res['table'])} cells and {len(res['comparisons'])} comparisons to {args.out}")
        return 0

    _out_file(args.out, ".jsonl")
    _ratios(args.ratios)
    _positive(args.lengths, "--lengths")
    _positive(args.threads, "--threads")
    methods = _methods(args.methods)
    config = {"command": _command(argv), "task": args.task, "ratios": args.ratios, "lengths": args.lengths,
              "seed": args.seed, "threads": args.threads, "compressed": Q.COMPRESSED}
    if args.task == "kl":
        from .results.texts import load_segments

        _positive(args.continuation, "--continuation")
        try:
            segs = load_segments(args.segments)
        except (ValueError, FileNotFoundError) as e:
            raise _Bad(f"--segments: {e}") from None
        config.update(continuation=args.continuation, segments=[
            {k: s[k] for k in ("id", "kind", "split", "sha256", "source")} for s in segs])
    else:
        for d in args.depths:
            _check(0 <= d <= 1, f"--depths: every depth must be in [0, 1], got {d}")
        _positive(args.trials, "--trials")
        _check(min(args.lengths) >= 32, f"--lengths: passkey contexts need >= 32 tokens, got {min(args.lengths)}")
        from .measure.passkey import FILLER, QUESTION

        config.update(depths=args.depths, trials=args.trials, filler=FILLER, question=QUESTION)

    _check_model(args.model)
    if args.task == "kl":  # every (segment, length) must hold length + continuation tokens: refuse now, not mid-run
        from .measure.quality import prompt_and_continuation
        from .models import load_tokenizer

        tok = load_tokenizer(args.model)
        for seg in segs:
            for L in args.lengths:
                try:
                    prompt_and_continuation(tok, seg["text"], L, args.continuation, name=f"segment {seg['id']}")
                except ValueError as e:
                    raise _Bad(f"--lengths/--continuation: {e}") from None
    model, tok = _load_model(args)
    from .presses.registry import method_options, press_from_spec

    mname = model_record(args.model)["name"]
    record = provenance(model, model_name=args.model)
    config.update(model=record["model"], versions=record["versions"], git=record["git"],
                  device=record["model"]["device"], started=time.strftime("%Y-%m-%dT%H:%M:%S"),
                  methods={m: method_options(press_from_spec(m, args.ratios[0])) for m in methods})
    files.append_run(args.out, config)
    if args.task == "kl":
        n = Q.run_kl(model, tok, segments=segs, methods=methods, ratios=args.ratios, lengths=args.lengths,
                     continuation=args.continuation, out=args.out, model_name=mname, progress=not args.no_progress)
    else:
        n = Q.run_passkey(model, tok, methods=methods, ratios=args.ratios, lengths=args.lengths, depths=args.depths,
                          trials=args.trials, seed=args.seed, out=args.out, model_name=mname,
                          progress=not args.no_progress)
    print(f"wrote {n} new rows to {args.out}")
    return 0


# --------------------------------------------------------------------------------------------- decompose
def _decompose(args, argv):
    from .results.decomposition import PARTS, DecompositionConfig, run_decomposition

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
        raise _Bad(str(e).replace("`", "--").replace("_", "-")) from None
    _check(not args.out.is_file(), f"--out {args.out} is a file; give a folder")
    args.seed = cfg.seed
    model, tok = _load_model(args)
    n_layers = len(model.model.layers)
    for name in ("layers", "sel_layers", "loo_layers"):
        bad = [l for l in (getattr(cfg, name) or []) if not 0 <= l < n_layers]
        _check(not bad, f"--{name.replace('_', '-')} {bad} out of range: the model has {n_layers} layers")
    for path in run_decomposition(model, tok, args.out, cfg, progress=not args.no_progress):
        print(f"wrote {path}")
    return 0


# --------------------------------------------------------------------------------------------- inspect
def _inspect(args, argv):
    if args.kl_table:
        _ratios(args.ratios)
        out = args.out
        if out is not None:
            _out_file(out, ".json")
        model, tok = _load_model(args)
        from .results.live import write_kl_table

        path = write_kl_table(model, tok, out=out, ratios=tuple(args.ratios), model_name=args.model,
                              progress=not args.no_progress)
        print(f"wrote {path}")
        return 0
    _ratios([args.ratio], "--ratio")
    _check(args.out is None, "--out is only for --kl-table")
    from .presses.registry import parse_method, press_from_spec

    try:
        press_from_spec(args.method, args.ratio)
    except ValueError as e:
        raise _Bad(f"--method: {e}") from None
    if args.text is not None:
        _check(args.text.is_file(), f"--text {args.text} is not a file")
    _positive(args.top, "--top")
    model, tok = _load_model(args)
    from .measure.eviction import DEMO_CONTEXT, inspect_eviction

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
    return 0


# --------------------------------------------------------------------------------------------- serve-run, texts
def _serve_run(args, argv):
    if args.out is not None:
        _out_file(args.out, ".json")
    args.model, args.seed = None, 0
    model, tok = _load_model(args)
    from .results.serving import run_serving

    print(f"wrote {run_serving(model, tok, out=args.out, progress=not args.no_progress)}")
    return 0


def _texts(args, argv):
    from .results.texts import PROSE, build_corpus, build_texts

    if args.corpus:
        if args.out is not None:
            _check(not args.out.exists() or args.out.is_dir(), f"--out {args.out} must be a folder")
        manifest = build_corpus(args.out)
        print(f"wrote {len(manifest['documents'])} documents and manifest.json: {manifest['counts']}")
        return 0
    if args.out is not None:
        missing = [n for n in PROSE if not (args.out / "prose" / n).is_file()]
        _check(not missing, f"--out {args.out} must hold the prose segments prose/{missing}")
    manifest = build_texts(args.out)
    print(f"wrote {len(manifest['segments'])} segments and manifest.json")
    return 0


# --------------------------------------------------------------------------------------------- time
def _time(args, argv):
    from .results.timing import e2e_main, scoring_main

    # the benchmark parses its own options (argparse exits with status 2 on a bad one, before any work)
    {"scoring": scoring_main, "e2e": e2e_main}[args.which](args.args, prog=f"jacap time {args.which}")
    return 0


def _diagnose(args, argv):
    from .results.diagnostics import main as diagnostics_main

    # the job parses and checks its own options (argparse exits with status 2 on a bad one, before any work)
    return diagnostics_main([args.which, *args.args])


def _compare(args, argv):
    from .results.comparison import main as comparison_main

    # the issue-10 grid and its summary; the job parses and checks its own options
    return comparison_main([args.which, *args.args])


# --------------------------------------------------------------------------------------------- parser
def _model_args(p, *, seed=True):
    p.add_argument("--model", default=None, help="Hugging Face id (default: the bundled SmolLM2-135M, offline)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared 2-core machine)")
    if seed:
        p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    from .results.quality import DEFAULT_LENGTHS, DEFAULT_RATIOS, PASSKEY_DEPTHS, PASSKEY_LENGTHS

    ap = argparse.ArgumentParser(prog="jacap", description="The one command line of the Jacap book and its library "
                                 "(also `python -m jacap_lib`).",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Run `jacap <subcommand> --help` for each subcommand's options.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{book,bench,compare-decoding,decompose,diagnose,inspect,serve-run,texts,time}")

    book = sub.add_parser("book", help="build the Jupyter Book").add_subparsers(dest="book_cmd", required=True)
    b = book.add_parser("build", help="sync the notebooks and build _build/html (warnings are errors)")
    b.add_argument("--root", type=Path, default=None, help="repository root (default: found from the cwd)")
    b.add_argument("--all", action="store_true", help="re-render every page (execution stays cached)")
    b.add_argument("--fresh", action="store_true", help="drop the execution cache and the site first")
    b.set_defaults(func=_book)

    bench = sub.add_parser("bench", help="quality under compression: KL grid, passkey, summary").add_subparsers(
        dest="task", required=True)
    for task, help_ in (("kl", "next-token KL and attention-output error per segment x length x method x ratio"),
                        ("passkey", "needle retrieval over context length x needle depth")):
        p = bench.add_parser(task, help=help_, description=help_ + ". Rows are appended to --out (JSONL); a "
                             "rerun resumes. The configuration goes to <out>.config.json.")
        _model_args(p)
        p.add_argument("--methods", nargs="+", default=["all"],
                       help="registry names, optionally name[key=value,...]; 'all' = every registry method")
        p.add_argument("--ratios", nargs="+", type=float, default=list(DEFAULT_RATIOS))
        p.add_argument("--out", type=Path, required=True, help="the JSONL grid file")
        if task == "kl":
            p.add_argument("--lengths", nargs="+", type=int, default=list(DEFAULT_LENGTHS), help="prompt tokens")
            p.add_argument("--continuation", type=int, default=32, help="continuation tokens scored")
            p.add_argument("--segments", nargs="+", default=None, help="segment ids (default: all in the manifest)")
        else:
            p.add_argument("--lengths", nargs="+", type=int, default=list(PASSKEY_LENGTHS), help="context tokens")
            p.add_argument("--depths", nargs="+", type=float, default=list(PASSKEY_DEPTHS))
            p.add_argument("--trials", type=int, default=2)
        p.set_defaults(func=_bench)
    s = bench.add_parser("summary", help="mean and 95%% bootstrap interval per method x ratio x length x kind")
    s.add_argument("--inp", type=Path, nargs="+", required=True, help="one or more JSONL grid files")
    s.add_argument("--out", type=Path, required=True, help="the summary JSON file")
    s.add_argument("--n-boot", type=int, default=2000)
    s.set_defaults(func=_bench)

    d = sub.add_parser("decompose", help="error decomposition on real heads -> data/decomposition/*.json")
    _model_args(d)
    d.add_argument("--out", type=Path, default=Path("data/decomposition"), help="output folder")
    d.add_argument("--text", type=Path, default=None, help="a text file (default: the built-in DEFAULT_TEXT)")
    d.add_argument("--prefix", type=int, default=384, help="cached tokens N; later tokens are the future queries")
    d.add_argument("--layers", type=int, nargs="*", default=None, help="layers (default: all)")
    d.add_argument("--ratio", type=float, default=0.75)
    d.add_argument("--tau", type=float, default=10.0)
    d.add_argument("--noise", type=float, default=1.0)
    d.add_argument("--n-sink", type=int, default=4)
    d.add_argument("--pool", type=int, default=64)
    d.add_argument("--diag-budget", type=int, default=16)
    d.add_argument("--n-subsets", type=int, default=64)
    d.add_argument("--sel-n", type=int, default=16)
    d.add_argument("--sel-budget", type=int, default=4)
    d.add_argument("--sel-caches", type=int, default=1)
    d.add_argument("--sel-layers", type=int, nargs="*", default=None, help="layers for E_selection (default: every 3rd)")
    d.add_argument("--loo-layers", type=int, nargs="*", default=None, help="layers for deletion records (default: every 3rd)")
    d.add_argument("--quick", action="store_true", help="two layers, small pools (a smoke run)")
    d.add_argument("--only", nargs="*", default=None, choices=["taylor", "diagonal", "selection", "loo", "failures"],
                   help="compute only these parts (default: all)")
    d.set_defaults(func=_decompose)

    i = sub.add_parser("inspect", help="what one eviction keeps; --kl-table: the live chapter's KL table")
    _model_args(i)
    i.add_argument("--method", default="jacap", help="registry name, optionally name[key=value,...]")
    i.add_argument("--ratio", type=float, default=0.75, help="compression ratio in [0, 1)")
    i.add_argument("--text", type=Path, default=None, help="a text file (default: the live chapter's demo text)")
    i.add_argument("--top", type=int, default=10, help="tokens listed at each end")
    i.add_argument("--kl-table", action="store_true",
                   help="instead: KL(full || compressed) for every method x --ratios on the demo text, written to --out")
    i.add_argument("--ratios", nargs="+", type=float, default=[0.5, 0.75, 0.9], help="with --kl-table")
    i.add_argument("--out", type=Path, default=None, help="with --kl-table (default data/live/kl_table.json)")
    i.set_defaults(func=_inspect)

    r = sub.add_parser("serve-run", help="Algorithm 2 on the bundled model -> data/serving/serving_run.json (~6 min)")
    r.add_argument("--out", type=Path, default=None, help="default data/serving/serving_run.json")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=_serve_run)

    t = sub.add_parser("texts", help="rebuild the quality benchmark's text segments and manifest (data/texts), "
                                     "or with --corpus the evaluation corpus (data/texts/corpus)")
    t.add_argument("--corpus", action="store_true",
                   help="build the evaluation corpus from its pinned packages (pip, apt-get download; needs rdata)")
    t.add_argument("--out", type=Path, default=None,
                   help="default data/texts (must hold prose/), with --corpus data/texts/corpus")
    t.set_defaults(func=_texts)

    dg = sub.add_parser("diagnose", help="mechanism and query-statistics diagnostics -> data/diagnostics/*.json",
                        description="Run a diagnostics job of jacap_lib.results.diagnostics; options after the name go "
                                    "to it (`jacap diagnose mechanisms --help` lists them).")
    dg.add_argument("which", choices=["mechanisms", "query-stats"])
    dg.add_argument("args", nargs=argparse.REMAINDER, help="options of the job")
    dg.set_defaults(func=_diagnose)

    cg = sub.add_parser("compare", help="the note-faithful comparison: grid -> data/results/grid.jsonl, summary -> "
                                        "grid_summary.json", description="Run a job of jacap_lib.results.comparison; "
                                        "options after the name go to it (`jacap compare summary --help`).")
    cg.add_argument("which", choices=["grid", "summary"])
    cg.add_argument("args", nargs=argparse.REMAINDER, help="options of the job")
    cg.set_defaults(func=_compare)

    # a job that parses its own options: `main` hands it everything after the subcommand's name
    sub.add_parser("compare-decoding", add_help=False,
                   help="Algorithm 2 vs kvpress DecodingPress, teacher-forced -> data/serving/decoding_comparison.json")

    tm = sub.add_parser("time", help="speed benchmarks (jacap_lib.results.timing) -> data/bench/*.json",
                        description="Run a speed benchmark; options after the name go to it "
                                    "(`jacap time scoring --help` lists them).")
    tm.add_argument("which", choices=["scoring", "e2e"], help="scoring: Algorithm 1 vs CapKV; e2e: prefill + decode")
    tm.add_argument("args", nargs=argparse.REMAINDER, help="options of the benchmark")
    tm.set_defaults(func=_time)
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["compare-decoding"]:
        from .results.decoding_comparison import main as compare_main

        return compare_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args, argv)
    except _Bad as e:
        parser.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
