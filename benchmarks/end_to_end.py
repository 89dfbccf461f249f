"""End-to-end cost of eviction, like the paper's runtime study: prefill (with the press scoring and
compressing every layer) + 100 greedy tokens, for no compression, Jacap and kvpress CapPress. The code
is :mod:`jacap_lib.measure.timing` (what is timed) and :data:`jacap_lib.experiments.timing.E2E` (the
job); this script is the same command as ``jacap time e2e``:

    python benchmarks/end_to_end.py                              # 2K, 4K, 8K prompts; ratios 0.6, 0.8
    python benchmarks/end_to_end.py --lengths 2048 --ratios 0.8  # a subset
    python benchmarks/end_to_end.py --quick --out /tmp/e2e.json  # 256-token smoke test
    python benchmarks/end_to_end.py --save-architecture .bench_assets/smollm2   # where the model is installed
    python benchmarks/end_to_end.py --random-init .bench_assets/smollm2          # random weights, same architecture
"""
from jacap_lib.measure.timing import (  # noqa: F401 (the script's names, for tests and sessions)
    DEFAULT_LENGTHS, DEFAULT_RATIOS, INIT_SEED, METHODS, ORIGIN_FILE, random_init_model, run_one,
)
from jacap_lib.experiments.timing import E2E, prompt_ids, save_architecture  # noqa: F401


def main(argv=None):
    return E2E.main(argv, prog="benchmarks/end_to_end.py")


if __name__ == "__main__":
    main()
