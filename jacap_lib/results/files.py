"""One shape for results files, read and written here only.

* **JSON results** — ``{"config": {...}, "rows": [...], ...}``: the configuration that produced the
  rows (with its :func:`~jacap_lib.results.provenance.provenance`) and one dict per measured cell;
  a file may carry further top-level keys (e.g. a summary's ``comparisons``).
* **Resumable grids** — ``<name>.jsonl`` (one row per line, appended as each cell finishes, so an
  interrupted run resumes) plus the sidecar ``<name>.config.json`` = ``{"runs": [config, ...]}``
  (one configuration per invocation that appended to it).

Malformed input raises :class:`ResultsFileError` (a ``ValueError``) naming the file and the line.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

__all__ = ["ResultsFileError", "read_json", "write_json", "write_results", "read_results", "read_jsonl",
           "append_jsonl", "config_path", "read_runs", "append_run", "round_floats"]


class ResultsFileError(ValueError):
    """A results file that exists but cannot be read as the shape it should have."""


def read_json(path, *, require=(), hint: str = "") -> dict:
    """The JSON object in ``path``; ``require``: top-level keys it must have; ``hint``: how to make it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file {path} does not exist" + (f"; create it with: {hint}" if hint else ""))
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResultsFileError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(data, dict):
        raise ResultsFileError(f"{path} must hold a JSON object, found {type(data).__name__}")
    missing = [k for k in require if k not in data]
    if missing:
        raise ResultsFileError(f"{path} has no {missing} key(s) (it has {sorted(data)}); regenerate it"
                               + (f" with: {hint}" if hint else ""))
    return data


def write_json(path, data: dict, *, indent: int | None = 1) -> Path:
    """Write ``data`` atomically (a temporary file renamed over ``path``): a failed run leaves no half file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    os.replace(tmp, path)
    return path


def write_results(path, config: dict, rows: list, **extra) -> Path:
    """The common shape: ``{"config": config, "rows": rows, **extra}``."""
    if not isinstance(config, dict):
        raise TypeError(f"`config` must be a dict, got {type(config).__name__}")
    return write_json(path, {"config": config, "rows": list(rows), **extra})


def read_results(path, *, rows_key: str = "rows", hint: str = "") -> tuple[dict, list]:
    """``(config, rows)`` of a file in the common shape."""
    data = read_json(path, require=("config", rows_key), hint=hint)
    if not isinstance(data[rows_key], list):
        raise ResultsFileError(f"{path}: '{rows_key}' must be a list, found {type(data[rows_key]).__name__}")
    return data["config"], data[rows_key]


def read_jsonl(path, *, missing_ok: bool = True) -> list[dict]:
    """Rows of a JSONL file (``[]`` for a missing file when ``missing_ok``)."""
    path = Path(path)
    if not path.exists():
        if missing_ok:
            return []
        raise FileNotFoundError(f"results file {path} does not exist")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ResultsFileError(f"{path} line {i} is not valid JSON ({e.msg}); delete that line and rerun "
                                   "to recompute it") from None
        if not isinstance(row, dict):
            raise ResultsFileError(f"{path} line {i} must be a JSON object, found {type(row).__name__}")
        rows.append(row)
    return rows


def append_jsonl(path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


def config_path(jsonl) -> Path:
    """The sidecar of a grid: ``x.jsonl`` -> ``x.config.json``."""
    return Path(jsonl).with_suffix(".config.json")


def read_runs(jsonl) -> list[dict]:
    """The configurations recorded in the sidecar of ``jsonl`` (oldest first)."""
    data = read_json(config_path(jsonl), require=("runs",))
    if not isinstance(data["runs"], list):
        raise ResultsFileError(f"{config_path(jsonl)}: 'runs' must be a list")
    return data["runs"]


def append_run(jsonl, config: dict) -> Path:
    """Add one invocation's configuration to the sidecar of ``jsonl``."""
    path = config_path(jsonl)
    runs = read_runs(jsonl) if path.exists() else []
    return write_json(path, {"runs": runs + [config]})


def round_floats(x, sig: int = 5):
    """Floats rounded to ``sig`` significant digits, recursively (smaller JSON at the precision shown)."""
    if isinstance(x, float):
        return float(f"{x:.{sig}g}") if math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: round_floats(v, sig) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [round_floats(v, sig) for v in x]
    return x
