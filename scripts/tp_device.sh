#!/usr/bin/env bash
# Tensor parallelism on a machine with two or more NVIDIA GPUs (nvidia-h100-x2, nvidia-h200-x2):
# the TP parity tests, the TP benches and `kiln serve --tensor-parallel 2` under `kiln bench`.
# Runs from the repository root with the gzipped parity binary (and, for TP_SERVE, the gzipped
# kiln binary and a dummy-model directory) staged in $KILN_DEV_DIR (default target/dev-tp3).
# Logs go to $OUT; device memory is sampled every second into $OUT/mem.csv.
#   TP_TESTS=0       skip the parity tests (tp::)
#   TP_8B=0          skip the Llama-3-8B-shape bench (TP 1 against TP 2; KILN_BENCH_LAYERS)
#   TP_70B=bf16,q4_k the Llama-3-70B-shape bench on two GPUs, one run per weight type
#   TP_SERVE=DIR     `kiln serve --load-format ${TP_SERVE_FORMAT:-dummy-bf16}` of the model
#                    directory DIR (under the staged dir) with TP 2, then `kiln bench` at
#                    concurrency 64 (512 in, 128 out)
set -uo pipefail
dev=${KILN_DEV_DIR:-target/dev-tp3}
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader -l 1 > "$out/mem.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
# NVLink multicast stays off (the machine sets it; never turned on here).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
source "$(dirname "$0")/cuda_env.sh"
cuda_env_nccl
export KILN_MODELS_DIR=$dev/models NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# The benches' floor: the card's memory bandwidth (H200 4.8 TB/s, H100 SXM 3.35).
if [ -z "${KILN_BENCH_BW_TBS:-}" ]; then
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
        *H200*) export KILN_BENCH_BW_TBS=4.8 ;;
        *) export KILN_BENCH_BW_TBS=3.35 ;;
    esac
fi
echo "floor bandwidth: $KILN_BENCH_BW_TBS TB/s"
gunzip -kf "$dev/parity.gz" && chmod +x "$dev/parity"
t0=$(date +%s)
since() { echo "$(( $(date +%s) - t0 )) s"; }
# The largest memory.used of each GPU since the last mark (MiB).
mark=0
peak() {
    local n; n=$(wc -l < "$out/mem.csv")
    awk -F', ' -v from="$mark" 'NR > from { v = $3 + 0; if (v > m[$2]) m[$2] = v }
        END { for (g in m) printf "gpu %s peak %d MiB; ", g, m[g]; print "" }' "$out/mem.csv"
    mark=$n
}
if [ "${TP_TESTS:-1}" = 1 ]; then
    timeout 60 "$dev/parity" --exact embed_and_gather_rows > "$out/warm.log" 2>&1
    echo "warm: exit $? after $(since)"; tail -2 "$out/warm.log"
    # The NCCL tests are ignored in the shared suite; here they have the process to themselves.
    timeout ${TP_TEST_S:-150} "$dev/parity" --include-ignored tp::tp2_ --nocapture > "$out/tp.log" 2>&1
    echo "tp tests (together): exit $? after $(since)"
    # Alone: it leaves an NCCL init blocked in its process on purpose.
    timeout 60 "$dev/parity" --ignored --exact \
        tp::a_rank_that_never_joins_does_not_hang_the_communicator_init --nocapture >> "$out/tp.log" 2>&1
    echo "tp give-up test (alone): exit $? after $(since)"
    grep -E "^test |test result|panicked|agree|worst|notice|gave up|NCCL|error" "$out/tp.log" | head -40
    peak
fi
for ty in $(echo "${TP_70B:-}" | tr ',' ' '); do
    KILN_BENCH_TYPE=$ty timeout ${TP_70B_S:-200} "$dev/parity" --ignored --exact \
        tp::bench_tp_llama3_70b_shape --nocapture > "$out/bench70b-$ty.log" 2>&1
    echo "70B $ty bench: exit $? after $(since)"
    grep -E "BENCH|loaded|holds|panicked|error" "$out/bench70b-$ty.log" | head -20
    peak
done
if [ -n "${TP_SERVE:-}" ]; then
    gunzip -kf "$dev/kiln.gz" && chmod +x "$dev/kiln"
    model=$dev/$TP_SERVE
    [ -f "$model/tokenizer.json.gz" ] && gunzip -kf "$model/tokenizer.json.gz"
    port=8125
    s0=$(date +%s)
    "$dev/kiln" serve --model "$model" --load-format "${TP_SERVE_FORMAT:-dummy-bf16}" \
        --device cuda:0 --tensor-parallel 2 --max-num-seqs 64 --kv-blocks ${TP_KV_BLOCKS:-2600} \
        --max-model-len 1024 --port $port > "$out/serve.log" 2>&1 &
    spid=$!
    for i in $(seq 1 ${TP_SERVE_WAIT_S:-240}); do
        curl -sf localhost:$port/health > /dev/null && break
        kill -0 $spid 2>/dev/null || break
        sleep 1
    done
    echo "serve: ready after $(( $(date +%s) - s0 )) s (exit status so far: $(kill -0 $spid 2>/dev/null && echo running || echo ended))"
    grep -iE "KV pool|weights on the device|joined|error|panick" "$out/serve.log" | head -8
    peak
    timeout ${TP_BENCH_S:-150} "$dev/kiln" bench --base-url http://127.0.0.1:$port --input-len 512 \
        --output-len 128 --ignore-eos --num-prompts ${TP_PROMPTS:-128} --max-concurrency 64 \
        > "$out/bench-serve.log" 2>&1
    echo "kiln bench c64: exit $? after $(since)"
    grep -vE "^\s*$" "$out/bench-serve.log" | tail -30
    peak
    kill $spid; wait $spid 2>/dev/null
fi
if [ "${TP_8B:-1}" = 1 ]; then
    KILN_BENCH_LAYERS=${KILN_BENCH_LAYERS:-32} timeout ${TP_BENCH8_S:-150} "$dev/parity" --ignored \
        --exact tp::bench_tp_llama3_8b_shape --nocapture > "$out/bench8b.log" 2>&1
    echo "8B bench: exit $? after $(since)"
    grep -E "BENCH|loaded|holds|panicked|error" "$out/bench8b.log" | head -20
    peak
fi
