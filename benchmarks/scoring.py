"""Scoring cost on identical tensors: Jacap (torch / Triton) vs kvpress CapPress, Expected Attention,
KNorm, and the memory floor (one read of K and V). The code is :mod:`jacap_lib.measure.timing` (what is
timed) and :data:`jacap_lib.experiments.timing.SCORING` (the job); this script is the same command as
``jacap time scoring``:

    python benchmarks/scoring.py                       # CPU here, CUDA (+ Triton) when a GPU is present
    python benchmarks/scoring.py --N 1024 4096 --d 64  # a subset
    python benchmarks/scoring.py --quick --out /tmp/x.json
"""
from jacap_lib.measure.timing import (  # noqa: F401 (the script's names, for tests and sessions)
    DEFAULT_D, DEFAULT_N, HEADS, NOISE, TAU, WHAT, kvpress_scorers, make_inputs, methods, repeats_for, summarise,
    time_scoring as run,
)
from jacap_lib.experiments.timing import SCORING


def main(argv=None):
    return SCORING.main(argv, prog="benchmarks/scoring.py")


if __name__ == "__main__":
    main()
