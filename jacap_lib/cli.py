"""``jacap`` — the one command line of the book and its library (also ``python -m jacap_lib``).

::

    jacap book build [--all] [--fresh]             build the book (executed on the bundled model)
    jacap bench kl --out data/results/quality.jsonl  quality grid: next-token KL + attention error
    jacap bench passkey --out data/results/passkey.jsonl
    jacap bench summary --inp data/results/quality.jsonl ... --out data/results/summary.json
    jacap compare grid|summary                     the note-faithful comparison -> data/results/grid*.json*
    jacap compare-decoding [--quick]               Algorithm 2 vs kvpress DecodingPress -> data/serving/
    jacap decompose [--only taylor diagonal ...]   error decomposition -> data/decomposition/*.json
    jacap diagnose mechanisms|query-stats          mechanism diagnostics -> data/diagnostics/*.json
    jacap evaluate tune|test|time [--quick]        the evaluation protocol -> data/results/eval/
    jacap inspect [--method jacap --ratio 0.5]     what one eviction keeps, per token
    jacap inspect --layer 3 --head 1 [--text ...]  one head's text, kept/protected/evicted marked
    jacap inspect --html eviction.html             the whole model as a self-contained HTML page
    jacap inspect --kl-table                       the live chapter's KL table -> data/live/kl_table.json
    jacap serve-run                                Algorithm 2 run -> data/serving/serving_run.json
    jacap texts                                    rebuild the benchmark's text segments (data/texts)
    jacap texts --corpus                           rebuild the evaluation corpus (data/texts/corpus)
    jacap time scoring|e2e [options]               speed benchmarks -> data/bench/*.json

The command line is the table :data:`COMMANDS`: every leaf is a job
(:class:`jacap_lib.results.job.Job`: ``add_arguments(parser)`` + ``run(args)``) in the module that
owns it. Every job checks all its arguments before it loads a model or writes a file: a bad call prints
that subcommand's usage and a message naming the argument, exits with status 2, and writes nothing.
"""
from __future__ import annotations

import sys

from .results.job import build_parser as _build, run_table

__all__ = ["COMMANDS", "main", "build_parser"]

# subcommand -> job ("module:attribute") or (help, {subcommand: ...}); one line per job
COMMANDS = {
    "book": ("build the Jupyter Book", {
        "build": "jacap_lib.book:BUILD",
    }),
    "bench": ("quality under compression: KL grid, passkey, summary", {
        "kl": "jacap_lib.results.quality:KL",
        "passkey": "jacap_lib.results.quality:PASSKEY",
        "summary": "jacap_lib.results.quality:SUMMARY",
    }),
    "compare": ("the note-faithful comparison: grid -> data/results/grid.jsonl, summary -> grid_summary.json", {
        "grid": "jacap_lib.results.comparison:GRID",
        "summary": "jacap_lib.results.comparison:SUMMARY",
    }),
    "compare-decoding": "jacap_lib.results.decoding_comparison:JOB",
    "decompose": "jacap_lib.results.decomposition:JOB",
    "diagnose": ("mechanism and query-statistics diagnostics -> data/diagnostics/*.json", {
        "mechanisms": "jacap_lib.results.diagnostics:MECHANISMS",
        "query-stats": "jacap_lib.results.diagnostics:QUERY_STATS",
    }),
    "evaluate": ("the evaluation protocol: every method tuned alike on the tune documents, judged on the test "
                 "documents -> data/results/eval/", {
        "tune": "jacap_lib.results.evaluation:TUNE",
        "test": "jacap_lib.results.evaluation:TEST",
        "time": "jacap_lib.results.evaluation:TIME",
    }),
    "inspect": "jacap_lib.viz.eviction:INSPECT",
    "serve-run": "jacap_lib.results.serving:JOB",
    "texts": "jacap_lib.results.texts:JOB",
    "time": ("speed benchmarks (jacap_lib.measure.timing) -> data/bench/*.json", {
        "scoring": "jacap_lib.results.timing:SCORING",
        "e2e": "jacap_lib.results.timing:E2E",
    }),
}

_PROG = "jacap"
_DESCRIPTION = "The one command line of the Jacap book and its library (also `python -m jacap_lib`)."
_EPILOG = "Run `jacap <subcommand> --help` for each subcommand's options."


def build_parser():
    """The ``jacap`` parser (every subcommand of :data:`COMMANDS`)."""
    return _build(COMMANDS, _PROG, _DESCRIPTION, _EPILOG)


def main(argv=None) -> int:
    return run_table(COMMANDS, argv, prog=_PROG, description=_DESCRIPTION, epilog=_EPILOG)


if __name__ == "__main__":
    sys.exit(main())
