"""Shared plumbing for the benchmark scripts: environment record, timers, peak-memory probes.

Timers: on CUDA, ``torch.cuda.Event`` pairs around each call (after a synchronize); on the CPU,
``time.perf_counter``. Peak extra memory: on CUDA ``torch.cuda.max_memory_allocated`` above what
was allocated before the call; on the CPU the resident-set high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) above the resident set before the call, with glibc's mmap threshold pinned
at 64 KiB so that freed temporaries go back to the OS and cannot hide later allocations.
"""
from __future__ import annotations

import ctypes
import datetime as _dt
import os
import platform
import re
import statistics
import time
from pathlib import Path

import torch

from jacap_lib.results.io import write_json
from jacap_lib.results.paths import data_path
from jacap_lib.results.provenance import git_revision, versions


def bench_path(name: str) -> Path:
    """``data/bench/<name>.json`` (found by :mod:`jacap_lib.results.paths`, the one locator of ``data/``)."""
    return data_path("bench", f"{name}.json", must_exist=False)


def pin_malloc() -> bool:
    """Fix glibc's mmap threshold (64 KiB) so large freed buffers leave the resident set at once."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, 65536)) and bool(libc.mallopt(-1, 65536))  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    except OSError:
        return False


def _status_bytes(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


def peak_extra_bytes(fn, device: torch.device) -> int | None:
    """Bytes allocated by one call of ``fn`` above what was live before it (None if not measurable)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    try:
        Path("/proc/self/clear_refs").write_text("5")
        base = _status_bytes("VmRSS")
        fn()
        return max(0, _status_bytes("VmHWM") - base)
    except OSError:
        return None


def time_round_robin(fns: dict, device: torch.device, repeats: int, warmup: int = 1) -> dict:
    """Median seconds per call for each function, calling them in turn (fair under a drifting load)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize(device)
                samples[name].append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
    return {
        name: {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s), "repeats": len(s)}
        for name, s in samples.items()
    }


def environment(device: torch.device) -> dict:
    cpu = platform.processor()
    try:
        cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text()).group(1).strip()
    except (OSError, AttributeError):
        pass
    env = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "packages": {p: v for p, v in versions(("torch", "triton", "kvpress", "transformers", "jacap_lib")).items()
                     if p != "python"},
        "git": git_revision(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def device_tag(env: dict) -> str:
    """Short file-name tag of the device an ``environment()`` record describes: ``"cpu"``, or the GPU's
    name lower-cased without the vendor (``"NVIDIA H200"`` -> ``"h200"``), for ``data/bench/<bench>_<tag>.json``."""
    if "gpu" not in env:
        return "cpu"
    name = re.sub(r"^(nvidia|amd)\s+", "", env["gpu"].strip(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"


def save_json(obj: dict, path: Path) -> Path:
    return write_json(path, obj)
