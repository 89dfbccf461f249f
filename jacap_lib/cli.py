"""``jacap`` — the one command line of the book and its library (also ``python -m jacap_lib``).

::

    jacap book build [--all] [--fresh]             build the book (executed on the bundled model)
    jacap compare-decoding [--quick] [--workers N] Algorithm 2 vs kvpress DecodingPress -> data/serving/
    jacap decompose [--only taylor diagonal ...]   error decomposition -> data/decomposition/*.json
    jacap diagnose mechanisms|query-stats          mechanism diagnostics -> data/diagnostics/*.json
    jacap evaluate tune|dev|time|summary [--quick] the evaluation protocol -> data/results/eval/
    jacap evaluate needle|needle-summary [--quick] needle retrieval with the tuned methods -> data/results/eval/
    jacap evaluate ablate|ablate-summary [--quick] one-knob ablations of Jacap on the tune documents -> data/results/eval/
    jacap evaluate anatomy [--length 2048 --ratio 0.5] why Algorithm 1 tuned loses a cell -> data/results/eval/anatomy.json
    jacap evaluate record                          every setting run on the dev documents -> dev_record.json
    jacap evaluate kvzip-ladder|kvzip-ladder-summary  prompt press -> KVzip one knob at a time -> data/results/eval/peers/
    jacap evaluate field-summary  the whole field beside KVzip on the dev documents -> data/results/eval/peers/
    jacap evaluate needle [--mode inside] --probe  digit survival per layer and KV head -> needle_probe.jsonl
    jacap inspect [--method jacap --ratio 0.5]     what one eviction keeps, per token (default: JacapPress)
    jacap inspect --layer 3 --head 1 [--text ...]  one head's text, kept/protected/evicted marked
    jacap inspect --html eviction.html             the whole model as a self-contained HTML page
    jacap inspect --kl-table                       the live chapter's KL table -> data/live/kl_table.json
    jacap serve-run                                Algorithm 2 run -> data/serving/serving_run.json
    jacap texts                                    rebuild the benchmark's text segments (data/texts)
    jacap texts --corpus                           rebuild the evaluation corpus (data/texts/corpus)
    jacap texts --confirm                          rebuild the confirmatory set (data/texts/confirm)
    jacap time scoring|e2e [options]               speed benchmarks -> data/bench/*.json

The command line is the table :data:`COMMANDS`: every leaf is a job
(:class:`jacap_lib.experiments.job.Job`: ``add_arguments(parser)`` + ``run(args)``) in the module that
owns it. Every job checks all its arguments before it loads a model or writes a file: a bad call prints
that subcommand's usage and a message naming the argument, exits with status 2, and writes nothing.
A job is named here as ``"module:attribute"`` with its one-line help, so ``jacap --help`` imports no job module
(nor torch) and a call imports only its own job's. The options jobs share have one default each
(:mod:`jacap_lib.experiments.job`): ``--model`` (the bundled SmolLM2-135M), ``--threads 1``, ``--out`` (the job's file
under ``data/``), ``--no-progress``.
"""
from __future__ import annotations

import sys

from jacap_lib.experiments.job import build_parser as _build, run_table

__all__ = ["COMMANDS", "main", "build_parser"]

# subcommand -> (help, "module:attribute"): a job, imported only when chosen (so `jacap --help` and a group's
# help import no job module; the help is the job's own, tests/test_cli.py checks they agree), or
# (help, {subcommand: ...}): a group
COMMANDS = {
    "book": ("build the Jupyter Book", {
        "build": ("sync the notebooks and build _build/html (warnings are errors)",
                  "jacap_lib.book:BUILD"),
    }),
    "compare-decoding": ("Algorithm 2 vs kvpress DecodingPress, teacher-forced -> "
                         "data/serving/decoding_comparison.json",
                         "jacap_lib.experiments.decoding_comparison:JOB"),
    "decompose": ("error decomposition on real heads -> data/decomposition/*.json",
                  "jacap_lib.experiments.decomposition:JOB"),
    "diagnose": ("mechanism and query-statistics diagnostics -> data/diagnostics/*.json", {
        "mechanisms": ("effective dimension, ||A - I||, saturation and top-w|u|^2 overlap per layer and KV head -> "
                       "data/diagnostics/mechanisms.json",
                       "jacap_lib.experiments.diagnostics:MECHANISMS"),
        "query-stats": ("errors of the prompt-query estimators against the continuation's queries -> "
                        "data/diagnostics/query_stats.json",
                        "jacap_lib.experiments.diagnostics:QUERY_STATS"),
    }),
    "evaluate": ("the evaluation protocol: every method tuned alike on the tune documents, judged on the dev "
                 "documents -> data/results/eval/", {
        "tune": ("every setting of the search space on the tune documents -> data/results/eval/tune.jsonl, then each "
                 "method's choice and the best baseline per cell -> choices.json",
                 "jacap_lib.experiments.protocol:TUNE"),
        "dev": ("each method's tuned setting on the dev documents -> data/results/eval/dev.jsonl (needs the tune's "
                 "choices.json, made with the same options)",
                 "jacap_lib.experiments.protocol:DEV"),
        "time": ("wall and CPU time of one prefill and one replay per setting on one document, and the extrapolated "
                 "time of the tune + dev grid -> data/results/eval/timing.json",
                 "jacap_lib.experiments.protocol:TIME"),
        "summary": ("per cell, Algorithm 1's tuned Jacap setting (and the paper preset or the other Jacap settings) against the "
                    "best baseline picked on tune and, stricter, on dev: ratio intervals, wins, Wilcoxon and Holm p, "
                    "verdicts -> data/results/eval/summary.json (needs dev.jsonl and choices.json of one configuration)",
                    "jacap_lib.report.jobs:SUMMARY"),
        "candidates": ("every method's tune choice from every search space, the Jacap-family default the rule "
                       "picks, and what is still pending -> data/results/eval/candidates.json",
                       "jacap_lib.experiments.candidates:CANDIDATES"),
        "confirm-plan": ("the confirmatory plan from the frozen candidates and the power analysis -> "
                         "data/results/eval/confirm/plan.json (written once, before any confirmatory row)",
                         "jacap_lib.experiments.confirm.plan:CONFIRM_PLAN"),
        "confirm": ("the committed confirmatory plan, once, on the fresh documents: --part kl (every run setting at "
                    "every planned cell) or --part needle --mode after|inside -> data/results/eval/confirm/ "
                    "(resumable)",
                    "jacap_lib.experiments.confirm.run:CONFIRM"),
        "confirm-summary": ("the committed confirmatory plan's verdicts from its rows -> "
                            "data/results/eval/confirm/summary.json",
                            "jacap_lib.report.jobs:CONFIRM_SUMMARY"),
        "ablate": ("Algorithm 1's tuned Jacap press and each one-knob ablation of it on every tune document -> "
                   "data/results/eval/ablation.jsonl (resumable)",
                   "jacap_lib.experiments.ablation:ABLATE"),
        "ablate-summary": ("per ablation and cell, the paired geometric-mean KL ratio to the ablations' base setting with simultaneous "
                           "(Bonferroni) and unadjusted intervals, wins, Wilcoxon and Holm p, verdicts, and per-layer "
                           "attention-error ratios -> data/results/eval/ablation_summary.json",
                           "jacap_lib.experiments.ablation:ABLATE_SUMMARY"),
        "needle": ("needle retrieval with each method's tuned setting and the paper preset at prompts 512/1024/2048, "
                   "c 0.5/0.75/0.9, 5 depths x 4 keys, plus the uncompressed answer -> data/results/eval/needle.jsonl "
                   "(needs the tune's choices.json)",
                   "jacap_lib.experiments.needle:NEEDLE"),
        "needle-summary": ("per cell, each setting's needle accuracy (and the uncompressed ceiling) and Algorithm 1 "
                           "tuned against the best baseline by KL on tune and the paper preset, paired per "
                           "prompt: accuracy difference intervals, McNemar and Holm p, verdicts -> "
                           "data/results/eval/needle_summary.json",
                           "jacap_lib.report.jobs:NEEDLE_SUMMARY"),
        "record": ("every setting ever run on the dev documents, with its round, first run, rows and what it led "
                   "to -> data/results/eval/dev_record.json (reads the committed dev rows and runs)",
                   "jacap_lib.experiments.record:RECORD"),
        "kvzip-ladder": ("the one-knob ladder from the prompt press JacapPromptPress() to kvpress KVzip (which queries, the "
                         "protection, how they are summarised, the budget; and Jacap's score on KVzip's queries and "
                         "budget) on every tune document -> data/results/eval/peers/ladder.jsonl (resumable)",
                         "jacap_lib.experiments.ladder:LADDER_JOB"),
        "kvzip-ladder-summary": ("per cell, each ladder step's geometric-mean KL ratio to the step before with "
                                 "simultaneous (Bonferroni) intervals and verdicts, and each step's share of the log "
                                 "gap prompt press -> KVzip -> data/results/eval/peers/ladder_summary.json",
                                 "jacap_lib.report.jobs:LADDER_SUMMARY"),
        "field-summary": ("on the dev documents, per cell, the context press's tune choice against KVzip's and "
                          "against the setting JacapPromptPress() builds, and that setting against KVzip: simultaneous "
                          "intervals and verdicts; beside them every method's tune choice by its KL ratio to KVzip "
                          "and its needle accuracy -> data/results/eval/peers/field_summary.json",
                          "jacap_lib.report.jobs:FIELD"),
        "anatomy": ("why Algorithm 1's tuned Jacap setting loses: per-layer error ratios and KL by document kind in the "
                    "losing cells (from the dev rows), and on one cell's dev documents the kept sets of that setting "
                    "and the best baseline and a one-knob swap of score and protection -> "
                    "data/results/eval/anatomy.json",
                    "jacap_lib.experiments.anatomy:JOB"),
    }),
    "inspect": ("what one eviction keeps, per layer and KV head (--layer/--head: marked text, --html: the whole "
                "model); --kl-table: the live chapter's KL table",
                "jacap_lib.viz.eviction:INSPECT"),
    "serve-run": ("Algorithm 2 on the bundled model -> data/serving/serving_run.json (~6 min)",
                  "jacap_lib.experiments.serving:JOB"),
    "texts": ("rebuild the quality benchmark's text segments and manifest (data/texts), with --corpus the "
              "evaluation corpus (data/texts/corpus), with --confirm the confirmatory set (data/texts/confirm)",
              "jacap_lib.experiments.corpus:JOB"),
    "time": ("speed benchmarks (jacap_lib.measure.timing) -> data/bench/*.json", {
        "scoring": ("Algorithm 1's scoring cost vs CapKV and kvpress scorers -> data/bench/scoring_<device>.json",
                    "jacap_lib.experiments.timing:SCORING"),
        "e2e": ("prefill + greedy decoding: no compression, Jacap, CapKV -> data/bench/end_to_end_<device>.json",
                "jacap_lib.experiments.timing:E2E"),
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
