#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, with target/device/ staged by
# scripts/cuda_stage.sh. Usage: scripts/cuda_device.sh [parity [ROUNDS] | bench | torchref | all |
# qbench [MIXES] | compare [MIXES] | profile CASES KERNEL_REGEX [SKIP [COUNT]]]
# Logs go to $OUT (or /tmp/kiln-out). KILN_DEV_DIR overrides the staged directory.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
dev=${KILN_DEV_DIR:-target/device}
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
# The CUDA libraries cudarc loads at run time.
source "$here/cuda_env.sh"
ldconfig -p | grep -E "libcuda\.so|libnvrtc\.so|libcublas\.so" | head -6
export KILN_MODELS_DIR=$dev/models
parity() {
    local rounds=${1:-1}
    # Warm the on-disk kernel cache once, so parallel tests do not all compile at once.
    local t0=$(date +%s%N)
    "$dev/parity" --exact embed_and_gather_rows > "$out/warm.log" 2>&1 || { tail -40 "$out/warm.log"; return 1; }
    echo "kernel compile + first test: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    for r in $(seq 1 "$rounds"); do
        "$dev/parity" --nocapture > "$out/parity-$r.log" 2>&1
        echo "round $r: exit $?"
        grep -E "^test |test result|panicked|relative error|agree|notice" "$out/parity-$r.log" | grep -v " ok$" | head -40
    done
}
bench() {
    "$dev/parity" --ignored --exact bench::bench_llama3_8b_shape --nocapture > "$out/bench.log" 2>&1
    echo "bench exit $?"
    grep -E "BENCH|BREAKDOWN|RESOURCES Attention|loaded|panicked|error" "$out/bench.log" | head -40
}
qbench() {
    # Quantized weights (Q4_K_M-like, Q8_0): decode b1/b32/b64, prefill 2048.
    KILN_BENCH_MIX=${1:-q4_k_m,q8_0} "$dev/parity" --ignored --exact bench::bench_llama3_8b_quant \
        --nocapture > "$out/qbench.log" 2>&1
    echo "qbench exit $?"
    grep -E "BENCH|BREAKDOWN|loaded|panicked|error" "$out/qbench.log" | head -60
}
bencharch() {
    # Issue 17's speed section: Qwen3-8B next to Llama-3-8B, Gemma-3-12B at context 8192, and
    # the decode attention with and without a window (one layer, split-K merge included).
    # One benchmark at a time (they would share the GPU otherwise).
    : > "$out/bencharch.log"
    for t in bench_arch::bench_arch_qwen3_8b_vs_llama3_8b bench_arch::bench_arch_gemma3_12b_ctx8192 \
        attn_window::bench_window_decode_attention; do
        "$dev/parity" --ignored --exact "$t" --nocapture >> "$out/bencharch.log" 2>&1
        echo "$t exit $?"
    done
    grep -E "^BENCH|BREAKDOWN|loaded|panicked|error" "$out/bencharch.log" | head -60
}
torchref() {
    # Kiln against PyTorch/transformers (issue 5): model and reference logits made here, on
    # this GPU, by transformers (scripts/torch_reference.py); 0.6 GB, kept out of $out.
    local ref=/tmp/kiln-torchref
    python3 scripts/torch_reference.py "$ref" --device cuda > "$out/torchref-py.log" 2>&1 \
        || { echo "torch_reference.py failed"; tail -30 "$out/torchref-py.log"; return 1; }
    grep -E "^(saved|bf16|f32|prompt|wrote)" "$out/torchref-py.log"
    cp "$ref/reference.json" "$out/"
    KILN_TORCH_REF=$ref "$dev/parity" --exact torch_ref::torch_reference_logits --nocapture \
        > "$out/torchref.log" 2>&1
    echo "torchref exit $?"
    grep -E "^(reference|backend|cpu|cuda)|panicked|relative error|picked|agrees|notice|test result" \
        "$out/torchref.log" | head -40
}
profile() {
    # Nsight Compute on launches of one kernel in chosen bench cases, e.g.
    # scripts/cuda_device.sh profile 256x512 attn_bf16_d128_dec 100 2
    local ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    [ -n "$ncu" ] || { echo "ncu not found"; return 1; }
    KILN_BENCH_CASES=$1 "$ncu" --kernel-name "regex:$2" --launch-skip "${3:-100}" --launch-count "${4:-1}" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section LaunchStats \
        "$dev/parity" --ignored --exact bench::bench_llama3_8b_shape --nocapture > "$out/ncu.log" 2>&1
    echo "ncu exit $?"
    grep -vE "^(BENCH|BREAKDOWN|RESOURCES)" "$out/ncu.log" | grep -E "^\s+[A-Z].*  |attn|gemv|Section" | head -150
}
compare() {
    # The same benchmarks with an earlier binary (KILN_DEV_BEFORE, default target/device-before:
    # stage one there first) and the staged one, in turn, on the same machine: before/after
    # numbers of a change that should not move them.
    local before=${KILN_DEV_BEFORE:-target/device-before}
    for round in 1 2; do
        for side in before after; do
            local bin=$dev/parity
            [ "$side" = before ] && bin=$before/parity
            "$bin" --ignored --exact bench::bench_llama3_8b_shape --nocapture > "$out/bench-$side-$round.log" 2>&1
            echo "$side bf16 round $round: exit $?"
            grep -E "^BENCH" "$out/bench-$side-$round.log" | head -20
            KILN_BENCH_MIX=${1:-q4_k_m} "$bin" --ignored --exact bench::bench_llama3_8b_quant --nocapture \
                > "$out/qbench-$side-$round.log" 2>&1
            echo "$side quant round $round: exit $?"
            grep -E "^BENCH" "$out/qbench-$side-$round.log" | head -20
        done
    done
}
case "${1:-parity}" in
    compare) compare "${2:-}" ;;
    parity) parity "${2:-1}" ;;
    bench) bench ;;
    qbench) qbench "${2:-}" ;;
    bencharch) bencharch ;;
    torchref) torchref ;;
    all) parity "${2:-1}"; bench; torchref ;;
    profile) shift; profile "$@" ;;
esac
