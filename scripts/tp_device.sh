#!/usr/bin/env bash
# Tensor parallelism on a machine with two or more NVIDIA GPUs (nvidia-h200-x2): the TP parity
# tests and the TP decode bench. Runs from the repository root with the gzipped parity binary
# and stories260K staged in $KILN_DEV_DIR (default target/dev-tp2). Logs go to $OUT.
set -uo pipefail
dev=${KILN_DEV_DIR:-target/dev-tp2}
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
# NVLink multicast stays off (the machine sets it; never turned on here).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
source "$(dirname "$0")/cuda_env.sh"
cuda_env_nccl
export KILN_MODELS_DIR=$dev/models NCCL_DEBUG=${NCCL_DEBUG:-WARN}
gunzip -kf "$dev/parity.gz" && chmod +x "$dev/parity"
t0=$(date +%s)
if [ "${TP_WARM:-1}" = 1 ]; then
    timeout 60 "$dev/parity" --exact embed_and_gather_rows > "$out/warm.log" 2>&1
    echo "warm: exit $? after $(( $(date +%s) - t0 )) s"; tail -3 "$out/warm.log"
fi
timeout ${TP_TEST_S:-100} "$dev/parity" tp:: --nocapture > "$out/tp.log" 2>&1
echo "tp tests: exit $? after $(( $(date +%s) - t0 )) s"
grep -E "^test |test result|panicked|agree|worst|notice|NCCL|error" "$out/tp.log" | head -40
KILN_BENCH_LAYERS=${KILN_BENCH_LAYERS:-4} timeout ${TP_BENCH_S:-60} "$dev/parity" --ignored --exact \
    tp::bench_tp_llama3_8b_shape --nocapture > "$out/bench.log" 2>&1
echo "bench: exit $? after $(( $(date +%s) - t0 )) s"
grep -E "BENCH|loaded|panicked|error" "$out/bench.log" | head -20
