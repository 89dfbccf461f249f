"""The command-line jobs ``jacap evaluate tune|dev|time``: each checks its options (:func:`~.runs.prepare`),
runs (:func:`~.runs.execute`) and prints what it wrote. ``jacap evaluate summary`` is :data:`~.summary.SUMMARY`."""
from __future__ import annotations

from jacap_lib.experiments import job as J
from jacap_lib.experiments.protocol.runs import add_arguments, execute, prepare

__all__ = ["report", "TUNE", "DEV", "TIME"]


def report(res: dict) -> None:
    """Print what :func:`execute` wrote."""
    if "estimate" in res:
        e = res["estimate"]
        print(f"wrote {res['file']}; full grid: {e['cpu_seconds']['total'] / 3600:.2f} CPU-hours "
              f"(tune {e['cpu_seconds']['tune'] / 3600:.2f}, dev {e['cpu_seconds']['dev'] / 3600:.2f}); "
              f"{e['wall_seconds']['total'] / 3600:.2f} h at this run's load, one process")
    else:
        print(f"wrote {res['rows_written']} new rows to {res['file']}")
        if "choices" in res:
            print(f"wrote {res['choices']}: " + ", ".join(f"{m}: {s}" for m, s in res["chosen"].items()))
            if res.get("pending"):
                print("not chosen yet (rows incomplete; run them, a rerun resumes): " + ", ".join(res["pending"]))


def _job(job: str):
    def add(parser):
        add_arguments(parser, job)

    def run(args):
        args.job = job
        res = execute(J.prepared(prepare, args))
        report(res)
        return res

    return add, run


TUNE = J.Job("every setting of the search space on the tune documents -> data/results/eval/tune.jsonl, then "
             "each method's choice and the best baseline per cell -> choices.json", *_job("tune"))
DEV = J.Job("each method's tuned setting on the dev documents -> data/results/eval/dev.jsonl (needs the tune's "
             "choices.json, made with the same options)", *_job("dev"))
TIME = J.Job("wall and CPU time of one prefill and one replay per setting on one document, and the extrapolated "
             "time of the tune + dev grid -> data/results/eval/timing.json", *_job("time"))
