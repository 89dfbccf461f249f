"""Cost plan of kvpress's newer presses (the registry's PEERS): wall and CPU seconds of one measured row -- the
press on the prefill (replayed on a captured one, or for KVzip/KVgrad the real prefill with its reconstruction
passes), then the teacher-forced continuation and its KL -- at prompt lengths 512, 1024 and 2048 on one tune
document, one torch thread; KVzip and KVgrad also scored once for every ratio of the grid; and the CPU-hours of a
tune grid extrapolated from them.

    PYTHONPATH=. python3 notes/peers_cost.py            # -> data/results/eval/peers_cost.json
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import time


def main(argv=None) -> dict:
    import torch

    from jacap_lib import load_model
    from jacap_lib.measure.quality import (can_replay, capture_prefill, full_reference, next_token_kl,
                                           next_token_kl_by_ratio, prompt_and_continuation, scores_once)
    from jacap_lib.results.paths import data_path
    from jacap_lib.presses.registry import PEERS, build_press, method_options
    from jacap_lib.results import files
    from jacap_lib.experiments.protocol.documents import load_docs
    from jacap_lib.results.provenance import provenance

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--continuation", type=int, default=128)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--methods", nargs="+", default=list(PEERS))
    ap.add_argument("--doc", default=None, help="tune document id (default: the first long enough)")
    ap.add_argument("--out", default=None)
    # the grid the estimate is for
    ap.add_argument("--settings", type=int, default=5, help="tune settings per press")
    ap.add_argument("--n-docs", type=int, default=18, help="tune documents")
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75, 0.9, 0.95])
    args = ap.parse_args(argv)

    logging.getLogger("kvpress").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tok = load_model()
    need = max(args.lengths) + args.continuation
    docs = [d for d in load_docs(None, quick=False, tune_per_kind=0) if d["split"] == "tune"]
    doc = next(d for d in docs if (args.doc is None or d["id"] == args.doc)
               and tok(d["text"], return_tensors="pt", add_special_tokens=False).input_ids.shape[1] >= need)
    load_before = list(os.getloadavg())
    rows = []
    for L in args.lengths:
        prompt, cont = prompt_and_continuation(tok, doc["text"], L, args.continuation, name=doc["id"])
        w, c = time.perf_counter(), time.process_time()
        cap = capture_prefill(model, prompt)
        ref = full_reference(model, None, prompt, cont, capture=cap)
        rows.append({"length": L, "what": "capture", "seconds": time.perf_counter() - w,
                     "cpu_seconds": time.process_time() - c})
        for name in args.methods:
            press = build_press(name, args.ratio)
            w, c = time.perf_counter(), time.process_time()
            res = next_token_kl(model, None, prompt, cont, press, reference=ref, capture=cap)
            rows.append({"length": L, "what": "row", "method": name,
                         "path": "replay" if can_replay(press) else "real prefill", "kl": res.kl,
                         "kept_tokens": res.kept_tokens, "seconds": time.perf_counter() - w,
                         "cpu_seconds": time.process_time() - c})
            print(rows[-1], flush=True)
            if scores_once(press):  # the same press scored once, masked at every ratio of the grid
                w, c = time.perf_counter(), time.process_time()
                res = next_token_kl_by_ratio(model, prompt, cont, build_press(name, args.ratios[0]), args.ratios,
                                             reference=ref)
                rows.append({"length": L, "what": "rows, scored once", "method": name, "ratios": args.ratios,
                             "path": "real prefill", "kl": [r.kl for r in res], "seconds": time.perf_counter() - w,
                             "cpu_seconds": time.process_time() - c})
                print(rows[-1], flush=True)
    est = estimate(rows, settings=args.settings, n_docs=args.n_docs, n_ratios=len(args.ratios))
    config = {**provenance(model, model_name=None, command="notes/peers_cost.py"), "doc": doc["id"],
              "doc_sha256": doc["sha256"], "lengths": list(args.lengths), "continuation": args.continuation,
              "ratio": args.ratio, "threads": torch.get_num_threads(), "methods": list(args.methods),
              "settings": {n: method_options(build_press(n, args.ratio)) for n in args.methods},
              "grid": {"settings_per_press": args.settings, "tune_documents": args.n_docs, "ratios": args.ratios,
                       "lengths": list(args.lengths)},
              "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
                          "note": "2 cores shared with other jobs: seconds are noisy, cpu_seconds less so"},
              "load_average_before": load_before, "load_average_after": list(os.getloadavg()),
              "measured": "capture: one uncompressed prefill recorded + its full reference (shared by every replayed "
                          "row of a (document, length)); rows, scored once: KVzip/KVgrad scored by one real prefill "
                          "and masked at every ratio of the grid (quality.next_token_kl_by_ratio); row: the press (replayed on the capture, or the real prefill "
                          "under `with press(model)` for presses that cannot replay) + the teacher-forced "
                          "continuation + its KL"}
    out = args.out or data_path("results", "eval", "peers_cost.json", must_exist=False)
    files.write_results(out, config, [files.round_floats(r) for r in rows], estimate=files.round_floats(est))
    print(est)
    return est


def estimate(rows, *, settings: int, n_docs: int, n_ratios: int, key: str = "cpu_seconds") -> dict:
    """CPU-hours of a tune grid: per press, ``settings x n_ratios`` rows on each of ``n_docs`` documents at every
    timed length (each row at its timed cost), and the captures (one per document and length, shared by all
    presses; the rows that run the real prefill do not need them)."""
    by = {(r["length"], r.get("method")): r[key] for r in rows if r["what"] != "rows, scored once"}
    once = {(r["length"], r["method"]): r[key] for r in rows if r["what"] == "rows, scored once"}
    lengths = sorted({r["length"] for r in rows})
    per_press, per_press_once = {}, {}
    for (L, m), sec in by.items():
        if m is not None:
            per_press[m] = per_press.get(m, 0.0) + n_docs * settings * n_ratios * sec / 3600
            # scored once per (document, length, setting) for every ratio, where the press allows it
            sec_once = once.get((L, m), n_ratios * sec)
            per_press_once[m] = per_press_once.get(m, 0.0) + n_docs * settings * sec_once / 3600
    captures = sum(n_docs * by[(L, None)] for L in lengths) / 3600
    return {"key": key, "cpu_hours_per_press": per_press, "cpu_hours_captures": captures,
            "cpu_hours_total": sum(per_press.values()) + captures,
            "cpu_hours_per_press_scored_once": per_press_once,
            "cpu_hours_total_scored_once": sum(per_press_once.values()) + captures}


if __name__ == "__main__":
    main()
