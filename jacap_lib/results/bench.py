"""Reading the committed benchmark results (``data/bench/*.json``) for the book."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["bench_dir", "available_benches", "load_bench", "scoring_rows", "end_to_end_rows"]


def bench_dir() -> Path:
    """``data/bench`` of the repository this package sits in, or of the nearest ancestor of the cwd."""
    candidates = [Path(__file__).resolve().parents[2], *Path.cwd().resolve().parents]
    candidates.insert(1, Path.cwd().resolve())
    for root in candidates:
        if (root / "data" / "bench").is_dir():
            return root / "data" / "bench"
    raise FileNotFoundError(
        "no data/bench folder next to jacap_lib or above the working directory; clone the book's repository "
        "(the committed results live there) or run benchmarks/scoring.py to produce them"
    )


def available_benches() -> list[str]:
    """Names of the committed result files (``scoring_cpu``, ``scoring_<gpu>``, ``end_to_end_cpu``, ...)."""
    return sorted(p.stem for p in bench_dir().glob("*.json"))


def load_bench(name: str) -> dict:
    """The JSON of ``data/bench/<name>.json`` (e.g. ``"scoring_cpu"``, ``"end_to_end_cpu"``)."""
    path = bench_dir() / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark file {path}; available: {available_benches()}")
    return json.loads(path.read_text())


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
