#!/usr/bin/env bash
# One prepared GPU session: kernel tests on CUDA, the scoring benchmark (with the Triton column) and
# the end-to-end run; results land in data/bench/ (and are copied to $OUT when that is set).
#   bash benchmarks/run_gpu.sh            # about 5-8 minutes on one H100/H200-class GPU
set -euo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
export TRITON_DEFAULT_FP_FUSION=1
python -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), 'triton', triton.__version__)"
timeout 300 python -m pytest tests/test_kernels.py -q -p no:cacheprovider -x 2>&1 | tail -5
timeout 600 python benchmarks/scoring.py
timeout 900 python benchmarks/end_to_end.py --lengths 2048 4096 8192
if [ -n "${OUT:-}" ]; then cp data/bench/*.json "$OUT"/; fi
