#!/usr/bin/env bash
# `kiln bench` at concurrency 64 (512 in, 128 out, 128 prompts, --ignore-eos) against
# llama-server and against `kiln serve` with each of several flag sets, on the same
# Llama-3-8B-shape Q4_K_M file, on the GPU machine (issue 15's serving comparison).
# Stage the folder as for scripts/cold_start.sh (kiln.gz, make_moe_gguf.py, gguf-py.tgz,
# tok.tgz, lcpp-bin.txz, cuda_env.sh), then run it there:
#   KILN_VARIANTS="--max-num-batched-tokens 2048;--max-num-batched-tokens 8192" \
#     bash target/dev-x/serve_bench.sh
# Output: $OUT/summary.txt (throughput, TTFT and TPOT lines of each run) and logs.tgz.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out=${OUT:-/tmp/serve-bench-out}
work=/tmp/servebench
logs=$work/logs
rm -rf "$logs"
mkdir -p "$out" "$work" "$logs"
summary=$logs/summary.txt
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$summary"; }
trap 'cp "$summary" "$out/summary.txt"; tar czf "$out/logs.tgz" -C "$logs" . 2> /dev/null' EXIT
# shellcheck source=scripts/cuda_env.sh
source "$here/cuda_env.sh" 2> /dev/null || source scripts/cuda_env.sh
gunzip -c "$here/kiln.gz" > "$work/kiln" && chmod +x "$work/kiln"
lcpp=$work/lcpp
mkdir -p "$lcpp/bin"
tar xzf "$here/gguf-py.tgz" -C "$lcpp"
tar xzf "$here/tok.tgz" -C "$work"
tar xaf "$here/lcpp-bin.txz" -C "$lcpp/bin" 2> /dev/null
export LD_LIBRARY_PATH="$lcpp/bin:${LD_LIBRARY_PATH:-}"
gguf_py=$(dirname "$(find "$lcpp" -name __init__.py -path '*gguf/__init__.py' | head -1)")
model=${MODEL:-/tmp/coldstart/d8b-q4km.gguf}
[ -s "$model" ] || { mkdir -p "$(dirname "$model")"; LLAMA3_TOKENIZER_DIR=$work/llama3.2 \
    PYTHONPATH=$(dirname "$gguf_py") python3 "$here/make_moe_gguf.py" "$model" --shape llama3-8b \
    > "$logs/make_8b.log" 2>&1; } || { say "make_moe_gguf failed"; exit 1; }
say "$(nvidia-smi --query-gpu=name --format=csv,noheader) | 8B Q4_K_M file: $(stat -c %s "$model") bytes"
cat "$model" > /dev/null
wait_up() {
    for _ in $(seq 1 600); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "localhost:$1/v1/completions" \
            -H 'Content-Type: application/json' -d '{"prompt":"Hello","max_tokens":1}')" = 200 ] && return 0
        sleep 0.1
    done
    return 1
}
# bench NAME PORT [extra flags]
bench() {
    local name=$1 port=$2; shift 2
    timeout "${BENCH_S:-120}" "$work/kiln" bench --base-url "http://127.0.0.1:$port" --tokenizer "$model" \
        --num-prompts 128 --max-concurrency 64 --input-len 512 --output-len 128 --seed 21 \
        --ignore-eos "$@" > "$logs/bench-$name.log" 2>&1
    say "$name: bench exit $?"
    grep -E "^(Output token throughput|TTFT|TPOT|Failed|Successful|Benchmark duration)" \
        "$logs/bench-$name.log" | tee -a "$summary"
}
if [ -z "${NO_LLAMA:-}" ] && [ -x "$lcpp/bin/llama-server" ]; then
    "$lcpp/bin/llama-server" -m "$model" -ngl 99 -fa -np 64 -c 65536 -dt 0.1 --port 8081 \
        > "$logs/llama-server.log" 2>&1 &
    lpid=$!
    wait_up 8081 && bench llama-server 8081
    kill "$lpid"; wait "$lpid" 2> /dev/null
fi
IFS=';' read -ra variants <<< "${KILN_VARIANTS:-}"
[ ${#variants[@]} -eq 0 ] && variants=("")
n=0
for v in "${variants[@]}"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    KILN_LOG=info HOME=$work/home XDG_CACHE_HOME=$work/home/.cache "$work/kiln" serve \
        --model "$model" --device "${KILN_DEV:-cuda:0}" --port 8125 $v > "$logs/serve-$n.log" 2>&1 &
    spid=$!
    if wait_up 8125; then
        bench "kiln-$n ($v)" 8125
    else
        say "kiln-$n ($v): never answered"; tail -5 "$logs/serve-$n.log" | tee -a "$summary"
    fi
    kill "$spid"; wait "$spid" 2> /dev/null
done
say done
