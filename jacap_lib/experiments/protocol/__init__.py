"""The evaluation protocol and its jobs: every method tuned the same way on the tune documents, judged on the dev ones.

``jacap evaluate tune``  every setting of :data:`~jacap_lib.experiments.protocol.rules.SEARCH_SPACE` on the *tune*
                         documents -> ``data/results/eval/tune.jsonl``; when complete, each method's choice
                         and the best baseline per cell by the protocol's one rule -> ``choices.json``
``jacap evaluate dev``  each method's chosen setting on the *dev* documents -> ``dev.jsonl``; refuses to
                         run without ``choices.json`` or with one made under a different configuration
``jacap evaluate summary`` dev.jsonl + choices.json (same fingerprint) -> ``summary.json``: per cell, each
                         Jacap setting against the best baseline picked on tune (primary) and on dev
                         (stricter, secondary): ratio intervals, wins/losses, Wilcoxon and Holm p, verdict
``jacap evaluate time``  wall and CPU time of one prefill and one replay per setting on one document, and
                         the extrapolated time of the whole tune + dev grid -> ``timing.json``

The measurement (:mod:`jacap_lib.measure.quality`): per (document, prompt length) ONE uncompressed
prefill is captured (what every attention layer's kvpress hook sees) with its full-cache reference on the
continuation; every (setting, ratio) then replays the press's own hook on the captured prefill and runs
only the continuation, teacher-forced at its true positions. Per row: next-token KL(full || compressed)
averaged over the continuation (primary), top-1 agreement and the attention-output relative error
(secondary). ``tests/test_evaluation.py`` checks the replay against kvpress's own path for every method.

Rows are appended as each prefill's replays finish, keyed by (model, document + sha256, length,
continuation, ratio, method spec); a rerun skips the keys already there (resumable). ``--workers N``
runs N processes (one torch thread each), one prefill at a time each. The sidecar ``<file>.config.json``
records every invocation's full configuration (provenance, model file sha256, lengths, ratios,
continuation, documents, every setting's press options, seeds, package versions).
``--quick`` is the smoke run: 2 tune + 2 dev documents, prompt 512, c 0.75/0.9, a 32-token continuation,
three methods with at most two settings each (:func:`~jacap_lib.experiments.protocol.rules.quick_space`).

One file per job of the package: :mod:`.rules` (the protocol: search spaces, the one selection rule, the
fingerprint), :mod:`.documents` (the documents and the grid's defaults), :mod:`.runs` (the
tune and dev runs: options, plan, prefill groups, the worker pool, resumable rows), :mod:`.choices` (the
tune's choices and the best baselines), :mod:`.summary` (the summary job and its statistics), :mod:`.timing`
(the time job), :mod:`.jobs` (the command-line jobs). Every public name is importable from this package.
"""
from __future__ import annotations

# the names outside __all__ (labels, Group, check_lengths, the worker's _WORKER/_init_worker, which
# decoding_comparison shares) stay importable from here as from the one module this package was
from jacap_lib.experiments.protocol.choices import DEV_LABEL, best_baselines, jacap_settings, read_choices, dev_specs, write_choices  # noqa: F401
from jacap_lib.experiments.protocol.documents import (DEFAULT_CONTINUATION, DEFAULT_LENGTHS, DEFAULT_RATIOS, QUICK, TUNE_DOCS_PER_KIND, check_lengths,
                     load_docs)  # noqa: F401
from jacap_lib.experiments.protocol.jobs import DEV, TIME, TUNE, report
from jacap_lib.experiments.protocol.runs import (_WORKER, _init_worker, Group, Plan, add_arguments, check_processes, check_ratios, grid_from_args,
                   check_settings_unchanged, eval_dir, execute, folder_options, map_in_workers, measure_group,
                   prepare, row_key, run_groups, summary_options, dev_groups, tune_groups)  # noqa: F401
from jacap_lib.experiments.protocol.summary import (SUMMARY, TARGET, DEV_SHORT_LABEL, TUNE_LABEL, cell_statistics, compare_settings, complete_cells,
                      identical_documents, summarize, summary_table, target_status)  # noqa: F401
from jacap_lib.experiments.protocol.timing import estimate, time_methods

__all__ = ["DEFAULT_LENGTHS", "DEFAULT_RATIOS", "DEFAULT_CONTINUATION", "QUICK", "Plan", "row_key", "load_docs",
           "tune_groups", "dev_groups", "run_groups", "measure_group", "write_choices", "read_choices",
           "best_baselines", "jacap_settings", "complete_cells", "dev_specs", "cell_statistics", "compare_settings", "check_settings_unchanged", "summarize", "summary_table",
           "TARGET", "target_status", "identical_documents", "check_ratios", "check_processes",
           "eval_dir", "map_in_workers", "time_methods", "estimate", "add_arguments", "prepare", "execute", "report", "TUNE", "DEV",
           "TIME", "SUMMARY", "folder_options", "summary_options"]
