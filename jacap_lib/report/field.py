"""The field on the dev documents in words: the stretch target's lines for the default press
(:func:`target_lines`), from ``field_summary.json`` (:mod:`jacap_lib.experiments.field`)."""
from __future__ import annotations

__all__ = ["target_lines"]


def target_lines(summary: dict, *, max_ratio: float = 0.75) -> list[str]:
    """The stretch target's three parts for the context press (the default ``JacapPress()``), measured on the dev
    documents (``summary``: ``field_summary.json``): in how many cells its KL is at most KVzip's (with its worst
    ratio), its lowest needle accuracy at ``c <= max_ratio`` per question mode, and its CPU time as a multiple of
    KVzip's per prompt length. Short lines: a heading, then one indented line per measurement."""
    from jacap_lib.experiments.names import spec_name

    kv = next(b for b in summary["comparisons"] if (b["setting"], b["reference"]) == ("context", "kvzip"))
    worst = max(kv["cells"], key=lambda r: r["gm_ratio"])
    tally = summary["no_higher"]["context/kvzip"]
    out = [f"{spec_name(summary['settings']['context'], legend=True)} against KVzip, dev documents:",
           f"  KL at most KVzip's: {tally['cells']} of {tally['of']} cells (worst {worst['gm_ratio']:.2f}x, "
           f"prompt {worst['length']}, c = {worst['ratio']:g})"]
    for mode, block in sorted(summary["needle"]["modes"].items()):
        acc = [c["accuracy"]["context"]["accuracy"] for c in block["cells"]
               if c["ratio"] <= max_ratio and "context" in c["accuracy"]]
        if acc:
            out.append(f"  needle, question {mode}: lowest accuracy at c <= {max_ratio:g} is {100 * min(acc):.0f} %")
    for b in summary["cost"]["lengths"]:
        for c in b["comparisons"]:
            out.append(f"  CPU time at prompt {b['length']}: {c['ratio']:.2f}x KVzip's ({c['n']} documents)")
    return out
