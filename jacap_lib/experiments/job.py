"""The one shape of a job — a command that writes results — and the table that runs jobs.

A job is a :class:`Job`: ``add_arguments(parser)`` declares its options and ``run(args)`` first checks
*every* argument (raising :class:`BadArgument` before any model is loaded or any file is written; a job's
``prepare`` whose checks raise ``ValueError`` runs under :func:`prepared`), then does the work and returns
what it made. The options every job shares are declared once, by :func:`shared_options` (``--model``,
``--threads``, ``--out``, ``--no-progress``, ``--seed``, each with one default) and a grid job's ``--lengths``
/ ``--ratios`` / ``--continuation`` by :func:`grid_options` (the evaluation folder's ``--dir`` / ``--quick``:
:func:`jacap_lib.experiments.protocol.folder_options`). :func:`run_table` turns a nested table of jobs into a
command line whose errors print the *subcommand's* usage and exit with status 2 (:mod:`jacap_lib.cli` is such
a table; scripts call :meth:`Job.main`).
"""
from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = ["BadArgument", "Job", "check", "as_option", "prepared", "check_ratios", "check_positive",
           "check_out_file", "check_methods", "check_model", "load_model", "shared_options", "grid_options",
           "build_parser", "run_table", "DEFAULT_THREADS"]

DEFAULT_THREADS = 1  # torch CPU threads: 1 is fastest and steadiest on a shared machine


class BadArgument(ValueError):
    """An invalid command-line argument: the command prints its usage and the message, exits with status 2
    and writes nothing. Raised only by a job's checks, which run before any work."""


@dataclass(frozen=True)
class Job:
    """One job: ``add_arguments(parser)`` declares its options; ``run(args)`` checks them all (raising
    :class:`BadArgument`) before any work, then runs and returns what it made (a path, a dict, ...)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Any]
    description: str | None = None

    def main(self, argv=None, prog: str | None = None):
        """Run this job alone as a command line (``benchmarks/*.py``); returns ``run``'s result."""
        argv = list(sys.argv[1:] if argv is None else argv)
        parser = argparse.ArgumentParser(prog=prog, description=self.description or self.help)
        self.add_arguments(parser)
        args, _ = _parse(parser, argv)
        return _run(self, parser, args, command=_command(parser.prog, argv), options=argv)


# --------------------------------------------------------------------------------------------- checks
def check(cond: bool, msg: str) -> None:
    if not cond:
        raise BadArgument(msg)


def as_option(error: Exception) -> BadArgument:
    """A library ``ValueError`` naming a parameter as ```name``` re-worded for the command line (``--name``)."""
    import re

    return BadArgument(re.sub(r"`(\w+)`", lambda m: "--" + m.group(1).replace("_", "-"), str(error)))


def prepared(prepare: Callable, *args, **kwargs):
    """``prepare(*args, **kwargs)`` -- a job's checks -- with a library ``ValueError`` (``files.ResultsFileError``
    is one) or ``FileNotFoundError`` raised as :class:`BadArgument` with the same message: the command prints its
    usage and exits with status 2, writing nothing."""
    try:
        return prepare(*args, **kwargs)
    except BadArgument:
        raise
    except (ValueError, FileNotFoundError) as e:
        raise BadArgument(str(e)) from None


def check_ratios(values, name: str = "--ratios", *, allow_zero: bool = True) -> None:
    """Every value of option ``name`` a compression ratio (:func:`jacap_lib._checks.compression_ratio`), else
    :class:`BadArgument` naming the option."""
    from jacap_lib._checks import compression_ratio

    for c in values:
        try:
            compression_ratio(c, name, allow_zero=allow_zero)
        except ValueError as e:
            raise BadArgument(str(e)) from None


def check_positive(values, name: str) -> None:
    for v in values if isinstance(values, (list, tuple)) else [values]:
        check(v >= 1, f"{name} must be >= 1, got {v}")


def check_out_file(path: Path, suffix: str, name: str = "--out") -> None:
    check(path.suffix == suffix, f"{name} {path} must end in {suffix}")
    check(not path.is_dir(), f"{name} {path} is a folder; give a file name")


def check_methods(specs, name: str = "--methods") -> list[str]:
    """Registry method specs (``all`` expanded), each built once so a bad name or option fails now."""
    from jacap_lib.presses.registry import expand_methods

    try:
        return expand_methods(specs)
    except ValueError as e:
        raise BadArgument(f"{name}: {e}") from None


def check_model(name) -> None:
    """``--model``: a valid name, and for a Hugging Face id one that is cached or that the Hub knows
    (:func:`jacap_lib.models.check_model_available`: asked once, with a timeout, so an unusable id fails in
    seconds, before any weights load and with no traceback). Every job checks ``--model`` with it; a model
    that cannot be used here is a bad argument like any other (usage, status 2, nothing written)."""
    from jacap_lib.models import check_model_available

    try:
        check_model_available(name)  # ModelUnavailableError is a ValueError
    except ValueError as e:
        raise BadArgument(f"--model: {e}") from None


def load_model(args):
    """The model and tokenizer of ``args.model`` (default: bundled), with ``args.threads`` torch threads and
    ``args.seed`` (default 0) as torch's seed. Jobs call it as ``job.load_model`` after their checks."""
    model = getattr(args, "model", None)
    check_model(model)
    import torch

    from jacap_lib.models import load_model as _load

    torch.set_num_threads(getattr(args, "threads", DEFAULT_THREADS))
    torch.manual_seed(getattr(args, "seed", 0))
    return _load(model)


# --------------------------------------------------------------------------------------------- options
def _threads(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def shared_options(parser, *, model: bool = True, threads: bool = True, progress: bool = True, seed: bool = False,
                   out: str | None = None, out_required: bool = False) -> None:
    """Declare the options jobs share, each with its one default: ``--model`` (None: the bundled
    SmolLM2-135M, offline), ``--threads`` (:data:`DEFAULT_THREADS`), ``--no-progress``, ``--seed`` (0) and
    ``--out`` (None: the job's file under ``data/``; ``out`` is its help text, None = no ``--out``)."""
    if model:
        parser.add_argument("--model", default=None, help="Hugging Face id or local folder (default: the bundled "
                                                          "SmolLM2-135M, offline)")
    if threads:
        parser.add_argument("--threads", type=_threads, default=DEFAULT_THREADS,
                            help=f"torch CPU threads (default {DEFAULT_THREADS}: fastest on a shared machine)")
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="torch seed (default 0)")
    if out is not None:
        parser.add_argument("--out", type=Path, default=None, required=out_required, help=out)
    if progress:
        parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def grid_options(parser, *, lengths, ratios, continuation: int | None = None) -> None:
    """Declare a grid job's ``--lengths`` and ``--ratios`` (and, with ``continuation``, ``--continuation``), each
    with default None (the job's own: ``lengths`` / ``ratios`` / ``continuation``, named in the help)."""
    parser.add_argument("--lengths", nargs="+", type=int, default=None,
                        help=f"prompt tokens (default {' '.join(map(str, lengths))})")
    parser.add_argument("--ratios", nargs="+", type=float, default=None,
                        help=f"compression ratios (default {' '.join(map(str, ratios))})")
    if continuation is not None:
        parser.add_argument("--continuation", type=int, default=None,
                            help=f"continuation tokens scored (default {continuation})")


# --------------------------------------------------------------------------------------------- the table
def _resolve(entry):
    """A table entry: a :class:`Job`, ``"module:attribute"`` naming one, ``(help, "module:attribute")`` (a
    job named with its one-line help, imported only when chosen) or ``(help, {name: entry})`` (a group)."""
    if isinstance(entry, tuple) and isinstance(entry[1], str):
        entry = entry[1]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        return getattr(importlib.import_module(module), attr)
    return entry


def _add(sub, name: str, entry, path) -> None:
    """Add ``name`` to ``sub``. ``path``: the words of ``argv`` below this level (None: resolve every job);
    a job named ``(help, "module:attribute")`` is imported only when ``path`` chooses it, so ``--help`` and a
    group's help import no job module."""
    chosen = path is None or (path[:1] == [name])
    rest = None if path is None else path[1:]
    if isinstance(entry, tuple) and isinstance(entry[1], dict):
        help_, table = entry
        p = sub.add_parser(name, help=help_, description=help_)
        inner = p.add_subparsers(dest=f"_{name}_command", required=True, metavar="{" + ",".join(table) + "}")
        for k, v in table.items():
            _add(inner, k, v, rest if chosen else [])
        return
    if isinstance(entry, tuple) and not chosen:  # named, not chosen: listed by its help, never imported
        sub.add_parser(name, help=entry[0])
        return
    job = _resolve(entry)
    p = sub.add_parser(name, help=job.help, description=job.description or job.help)
    job.add_arguments(p)
    p.set_defaults(_job=job, _parser=p)


def build_parser(table: dict, prog: str, description: str = "", epilog: str | None = None,
                 argv=None) -> argparse.ArgumentParser:
    """The parser of a table ``{name: entry}`` (entries as in :func:`_resolve`); every job is a leaf.
    With ``argv``, only the jobs it chooses are imported (the others are listed by their help)."""
    ap = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="_command", required=True, metavar="{" + ",".join(table) + "}")
    for name, entry in table.items():
        _add(sub, name, entry, None if argv is None else list(argv))
    return ap


def _run(job: Job, parser, args, *, command: str, options: list[str]):
    args.command, args.argv = command, options  # what ran (recorded in results), and the job's own options
    try:
        return job.run(args)
    except BadArgument as e:
        parser.error(str(e))  # the job's own usage, status 2; its checks ran before any work


def _parse(parser, argv):
    args, extra = parser.parse_known_args(argv)
    leaf = getattr(args, "_parser", parser)
    if extra:  # argparse would report these with the top-level usage; the subcommand's is the useful one
        leaf.error("unrecognized arguments: " + " ".join(extra))
    return args, leaf


def _command(prog: str, argv) -> str:
    return " ".join([prog] + [shlex.quote(a) for a in argv])


def run_table(table: dict, argv=None, *, prog: str, description: str = "", epilog: str | None = None) -> int:
    """Parse ``argv`` against ``table`` and run the chosen job; a bad call prints *that subcommand's*
    usage and exits with status 2 (unknown options included), writing nothing. Returns 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, leaf = _parse(build_parser(table, prog, description, epilog, argv=argv), argv)
    depth = len(leaf.prog.split()) - len(prog.split())  # the subcommand's names lead argv
    _run(args._job, leaf, args, command=_command(prog, argv), options=argv[depth:])
    return 0
