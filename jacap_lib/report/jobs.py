"""The summary jobs as the command line runs them: each experiment's summary job writes its numbers, then the
report it feeds is rewritten and its sentences printed. The experiments return numbers (the path of the file
they wrote); the prose of the findings (``findings.md``), the landing page's answer (``answer.md``) and the printed
lines is this package's. :mod:`jacap_lib.cli` lists these jobs in the place of the experiments' own."""
from __future__ import annotations

from pathlib import Path

from jacap_lib.experiments import field, ladder, needle
from jacap_lib.experiments import job as J
from jacap_lib.experiments.confirm import summary as confirm_summary
from jacap_lib.experiments.protocol import summary as eval_summary
from jacap_lib.results import files
from jacap_lib.report import answer, confirm, findings

__all__ = ["SUMMARY", "NEEDLE_SUMMARY", "FIELD", "LADDER_SUMMARY", "CONFIRM_SUMMARY"]


def then(job: J.Job, after) -> J.Job:
    """``job`` followed by ``after(args, path)`` on the path its run returns (same help and options)."""
    def run(args):
        path = job.run(args)
        after(args, Path(path))
        return path

    return J.Job(job.help, job.add_arguments, run, job.description)


def _after_summary(args, path: Path) -> None:
    print(f"  and {findings.write(path.parent)} and {answer.write(path.parent)}")


def _after_needle(args, path: Path) -> None:
    summary = files.read_json(path)
    if getattr(args, "probe", False):
        for mode, s in summary["modes"].items():
            for line in findings.needle_lines(s):
                print(f"  [{mode}]" + line)
        return
    written = findings.write(path.parent)  # None until the KL summary of this folder exists
    answer.write(path.parent)  # the landing page's answer reads the same summaries
    if written:
        print(f"  and {written}")
    for line in findings.needle_lines(summary):
        print(line)


def _after_field(args, path: Path) -> None:
    answer.write(path.parent.parent)  # the landing page's answer reads the whole field


def _after_ladder(args, path: Path) -> None:
    out_dir = path.parent
    if out_dir.parent.name == "eval" and out_dir.name == "peers":  # the protocol's folder: the answer reads it
        answer.write(out_dir.parent)
    sentence = findings.ladder_sentence(files.read_json(path))
    if sentence:
        print(sentence)


def _after_confirm(args, path: Path) -> None:
    eval_dir = path.parent.parent
    confirm.write(eval_dir)  # the findings and the landing answer read it once its KL rows are complete
    answer.write(eval_dir)


SUMMARY = then(eval_summary.SUMMARY, _after_summary)
NEEDLE_SUMMARY = then(needle.NEEDLE_SUMMARY, _after_needle)
FIELD = then(field.JOB, _after_field)
LADDER_SUMMARY = then(ladder.LADDER_SUMMARY, _after_ladder)
CONFIRM_SUMMARY = then(confirm_summary.CONFIRM_SUMMARY, _after_confirm)
