"""Tables of the committed speed results (``data/bench/*.json``) for the book; read them with
:func:`jacap_lib.results.loaders.load_bench`."""
from __future__ import annotations

from .loaders import available_benches, load_bench  # noqa: F401 (re-exported: the chapters' names)

__all__ = ["available_benches", "load_bench", "scoring_rows", "end_to_end_rows"]


def scoring_rows(data: dict) -> list[dict]:
    """One row per (N, d): median milliseconds per method, ratios to the floor, and Jacap/CapKV."""
    table: dict[tuple, dict] = {}
    for r in data["rows"]:
        row = table.setdefault((r["N"], r["d"]), {"N": r["N"], "d": r["d"]})
        row[f"{r['method']}_ms"] = 1e3 * r["median_s"]
        row[f"{r['method']}_x_floor"] = r["ratio_to_floor"]
        row[f"{r['method']}_peak_MiB"] = None if r["peak_extra_bytes"] is None else r["peak_extra_bytes"] / 2**20
    for row in table.values():
        row["jacap_torch_over_capkv"] = row["jacap_torch_ms"] / row["capkv_ms"]
    return [table[k] for k in sorted(table, key=lambda k: (k[1], k[0]))]


def end_to_end_rows(data: dict) -> list[dict]:
    """The end-to-end rows with the prefill split into scoring and the rest."""
    out = []
    for r in data["rows"]:
        out.append({**r, "prefill_other_s": r["prefill_s"] - r["scoring_s"]})
    return out
