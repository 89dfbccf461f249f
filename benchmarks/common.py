"""Shared plumbing of the speed benchmarks, kept as an import path for scripts (``benchmarks/run_gpu.sh``):
the timers and memory probes live in :mod:`jacap_lib.measure.timing`, the environment record and the
result-file naming in :mod:`jacap_lib.experiments.timing`."""
from jacap_lib.measure.timing import peak_extra_bytes, pin_malloc, time_round_robin  # noqa: F401
from jacap_lib.experiments.timing import bench_path, device_tag, environment  # noqa: F401
