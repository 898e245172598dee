#!/usr/bin/env bash
# Kiln against llama.cpp on the same quantized GGUF files, on the GPU machine, in one call:
#  - issue 17: the Qwen3-30B-A3B mixture-of-experts shape (scripts/make_moe_gguf.py, written
#    as a Mixtral-style `llama` file in llama.cpp's Q4_K_M types): decode at batch 1, 32 and
#    64 and prefill 2048 in `kiln serve` (driven by `kiln bench`; /metrics snapshots between
#    runs give the per-kernel time), llama-bench (pp2048, tg128) and llama-batched-bench
#    (npp 512, ntg 128, npl 1/32/64);
#  - issue 15: a Llama-3-8B-shape Q4_K_M file from the same script: cold start (process start
#    to the first answered completion) and `kiln bench` at concurrency 64 (512 in, 128 out)
#    against `kiln serve` and `llama-server`;
#  - with parity.gz (the CUDA parity test binary) in the folder: `bench_arch_moe_gguf` on the
#    MoE file, the per-kernel split of eager prefill and decode steps (/metrics only sees a
#    graph-replayed decode step as one `decode_graph`, which is its pure step time).
# Stage here (CPU machine), then carry the folder and run this script there:
#   cargo build --release --features cuda && d=/work/main/target/dev-moepeer && mkdir -p $d \
#     && objcopy --strip-all target/release/kiln $d/kiln && gzip -f $d/kiln \
#     && bash ../shared/peers/get_llama_cpp.sh $d/llama.cpp-src.tgz \
#     && cp scripts/make_moe_gguf.py scripts/moe_peer.sh $d/ \
#     && cp -r ../shared/models/tokenizers/llama3.2 $d/
#   (optional) KILN_DEV_DIR=$d bash scripts/cuda_stage.sh && gzip -f $d/parity
#   run: bash target/dev-moepeer/moe_peer.sh        (carry target/dev-moepeer)
# llama.cpp is built on the device (CUDA, sm_90, niced so Kiln's runs meanwhile keep their
# cores; about 250 s) unless the folder holds lcpp-bin.txz or lcpp-bin.tgz (the bin/ of an
# earlier build: llama-bench, llama-batched-bench, llama-server and their .so files), used as
# is; then gguf-py.tgz (llama.cpp's gguf-py folder) may stand in for the source tarball and
# tok.tgz (the llama3.2 folder) for the tokenizer, to keep the carry under 64 MiB. A fresh
# build is packed into $OUT/lcpp-bin.tgz.NN (15 MB parts) when LCPP_PACK=1.
# Everything goes to $OUT: summary.txt (the figures) and logs.tgz (every log, /metrics).
# Environment: SKIP_MOE=1, SKIP_8B=1, SKIP_LLAMA=1, SKIP_SERVE=1 (Kiln serve on the MoE file),
# SKIP_LLAMA_MOE=1 (llama.cpp on the MoE file) leave those parts out; LLAMA_8B_BENCH=1 adds
# llama-bench and llama-batched-bench on the 8B Q4_K_M file; KILN_DEV (default
# cuda:0) and LAYERS (cut both files' layers) make a quick dry run on the CPU possible.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out=${OUT:-/tmp/moe-peer-out}
work=/tmp/moepeer
logs=$work/logs
mkdir -p "$out" "$work" "$logs"
now() { date +%s%N; }
secs() { local ns=$(( $(now) - $1 )); printf '%d.%02d' $(( ns / 1000000000 )) $(( ns / 10000000 % 100 )); }
T0=$(now)
el() { secs "$T0"; }
# True once more than $1 seconds have passed since the start (the later, optional parts check
# it so the whole run stays inside the device call's limit; DEADLINE shifts every budget).
late() { [ $(( ($(now) - T0) / 1000000000 )) -gt $(( $1 + ${DEADLINE:-0} )) ]; }
summary=$logs/summary.txt
say() { echo "[$(el) s] $*" | tee -a "$summary"; }
finish() {
    cp "$summary" "$out/summary.txt"
    tar czf "$out/logs.tgz" -C "$logs" . 2> /dev/null
}
trap finish EXIT
# The CUDA libraries cudarc loads (next to this script, or the repository's when it runs
# from a carried copy in the repository root).
# shellcheck source=scripts/cuda_env.sh
source "$(dirname "$0")/cuda_env.sh" 2> /dev/null || source scripts/cuda_env.sh
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
kiln=$work/kiln
gunzip -c "$here/kiln.gz" > "$kiln" && chmod +x "$kiln"
lcpp=$work/lcpp
mkdir -p "$lcpp"
if [ -f "$here/llama.cpp-src.tgz" ]; then
    tar xzf "$here/llama.cpp-src.tgz" -C "$lcpp"
else
    tar xzf "$here/gguf-py.tgz" -C "$lcpp" && touch "$lcpp/CMakeLists.txt"
fi
src=$lcpp; [ -f "$src/CMakeLists.txt" ] || src=$(dirname "$(ls "$lcpp"/*/CMakeLists.txt | head -1)")
tok=$here/llama3.2
[ -d "$tok" ] || { tar xzf "$here/tok.tgz" -C "$work" && tok=$work/llama3.2; }
bin=$src/build/bin
dev=${KILN_DEV:-cuda:0}
layers=${LAYERS:+--layers $LAYERS}
build=
prebuilt=$(ls "$here"/lcpp-bin.txz "$here"/lcpp-bin.tgz 2> /dev/null | head -1)
if [ -n "$prebuilt" ]; then
    mkdir -p "$bin"
    tar xaf "$prebuilt" -C "$bin" 2> /dev/null \
        || python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$prebuilt" "$bin"
    say "llama.cpp: prebuilt binaries $(ls "$bin" | tr '\n' ' ')"
elif [ -z "${SKIP_LLAMA:-}" ]; then
    (cd "$src" && nice -n 19 cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release \
        > "$logs/cmake.log" 2>&1 \
        && nice -n 19 cmake --build build -j16 --target llama-bench llama-batched-bench llama-server \
        >> "$logs/cmake.log" 2>&1; echo "llama.cpp build: exit $?" >> "$logs/cmake.log") &
    build=$!
fi
export LD_LIBRARY_PATH="$bin:${LD_LIBRARY_PATH:-}"
mk() {
    LLAMA3_TOKENIZER_DIR=$tok PYTHONPATH=$src/gguf-py \
        python3 "$here/make_moe_gguf.py" "$@"
}

# Snapshot of Kiln's sampled kernel times (histogram sums and counts) into $logs/$1.prom.
metrics() { curl -sf "localhost:$1/metrics" | grep -E '^kiln_kernel_duration_seconds_(sum|count)' > "$logs/$2.prom"; }
# Waits for a server on port $1 to answer a one-token completion; prints the seconds from $2.
first_answer() {
    local port=$1 t0=$2 code
    for _ in $(seq 1 3000); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "localhost:$port/v1/completions" \
            -H 'Content-Type: application/json' -d '{"prompt":"Hello","max_tokens":1}')
        [ "$code" = 200 ] && { secs "$t0"; return 0; }
        sleep 0.05
    done
    return 1
}
# Per-kernel device time between two snapshots (sampled steps: every 64th), largest first; a
# graph-replayed decode step counts as one `decode_graph`.
kernel_split() { # label, before, after
    python3 - "$logs/$2.prom" "$logs/$3.prom" "$1" << 'PY' | tee -a "$summary"
import re, sys
def load(p):
    d = {}
    for line in open(p):
        m = re.match(r'kiln_kernel_duration_seconds_(sum|count)\{.*kernel="([^"]+)".*\} (\S+)', line)
        if m:
            d.setdefault(m.group(2), [0.0, 0.0])[m.group(1) == "count"] += float(m.group(3))
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
diff = {k: [v[0] - a.get(k, [0, 0])[0], v[1] - a.get(k, [0, 0])[1]] for k, v in b.items()}
tot = sum(v[0] for v in diff.values()) or 1.0
rows = sorted(diff.items(), key=lambda kv: -kv[1][0])
print("kernels " + sys.argv[3] + f": {tot * 1e3:.1f} ms sampled: " + ", ".join(
    f"{k} {100 * v[0] / tot:.1f}% ({v[0] / max(v[1], 1) * 1e6:.1f} us x {v[1]:.0f})" for k, v in rows if v[0] > 0))
PY
}
kb() { # port, log name, then kiln bench flags
    local port=$1 name=$2; shift 2
    timeout 150 "$kiln" bench --base-url "http://127.0.0.1:$port" --ignore-eos "$@" > "$logs/$name.log" 2>&1
    say "$name: exit $? | $(grep -E '^Output token throughput' "$logs/$name.log" | tr -s ' ') | $(grep -E '^(TTFT|TPOT) ' "$logs/$name.log" | tr -s ' ' | tr '\n' ' ')"
}

moe=$work/moe.gguf
if [ -z "${SKIP_MOE:-}" ]; then
    mk "$moe" $layers > "$logs/make_moe.log" 2>&1 || { say "make_moe_gguf failed"; tail -5 "$logs/make_moe.log"; }
    say "MoE file: $(head -1 "$logs/make_moe.log")"
    grep BYTES "$logs/make_moe.log" | tee -a "$summary"
fi
if [ -z "${SKIP_MOE:-}" ] && [ -z "${SKIP_SERVE:-}" ]; then
    t0=$(now)
    "$kiln" serve --model "$moe" --device "$dev" --port 8124 > "$logs/serve-moe.log" 2>&1 &
    spid=$!
    say "kiln serve MoE: first answer after $(first_answer 8124 "$t0") s"
    grep -iE "weights|loaded|kv" "$logs/serve-moe.log" | head -5 >> "$summary"
    metrics 8124 m0
    kb 8124 kiln-moe-c1 --num-prompts 4 --max-concurrency 1 --input-len 512 --output-len 128 --seed 11
    metrics 8124 m1
    kb 8124 kiln-moe-c32 --num-prompts 32 --max-concurrency 32 --input-len 512 --output-len 128 --seed 12
    metrics 8124 m2
    kb 8124 kiln-moe-c64 --num-prompts 64 --max-concurrency 64 --input-len 512 --output-len 128 --seed 13
    metrics 8124 m3
    kb 8124 kiln-moe-prefill --num-prompts 4 --max-concurrency 1 --input-len 2048 --output-len 1 --seed 14
    metrics 8124 m4
    kernel_split "MoE c1" m0 m1; kernel_split "MoE c32" m1 m2; kernel_split "MoE c64" m2 m3
    kernel_split "MoE prefill 2048" m3 m4
    kill $spid; wait $spid 2> /dev/null
fi
if [ -z "${SKIP_MOE:-}" ]; then
    if [ -f "$here/parity.gz" ]; then
        gunzip -c "$here/parity.gz" > "$work/parity" && chmod +x "$work/parity"
        KILN_BENCH_GGUF=$moe timeout 240 "$work/parity" --ignored --exact \
            bench_arch::bench_arch_moe_gguf --nocapture > "$logs/parity-moe.log" 2>&1
        say "parity bench_arch_moe_gguf: exit $?"
        grep -E "^(BENCH|BREAKDOWN|loaded)" "$logs/parity-moe.log" >> "$summary"
    fi
fi

d8b=$work/d8b-q4km.gguf
if [ -z "${SKIP_8B:-}" ]; then
    mk "$d8b" --shape llama3-8b $layers > "$logs/make_8b.log" 2>&1 || say "make 8b failed"
    say "8B file: $(head -1 "$logs/make_8b.log")"
    grep BYTES "$logs/make_8b.log" | tee -a "$summary"
    t0=$(now)
    "$kiln" serve --model "$d8b" --device "$dev" --port 8125 > "$logs/serve-8b.log" 2>&1 &
    spid=$!
    say "kiln serve 8B Q4_K_M cold start (page cache warm): first answer after $(first_answer 8125 "$t0") s"
    say "GPU memory used while serving (KV pool included): $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
    grep -iE "weights|loaded|kv|GB" "$logs/serve-8b.log" | head -6 >> "$summary"
    metrics 8125 m8b0
    kb 8125 kiln-8b-c64 --num-prompts 128 --max-concurrency 64 --input-len 512 --output-len 128 --seed 21
    metrics 8125 m8b
    kernel_split "8B c64" m8b0 m8b
    kill $spid; wait $spid 2> /dev/null
fi

[ -n "${SKIP_LLAMA:-}" ] && exit 0
if [ -n "$build" ]; then
    wait $build
    say "$(tail -1 "$logs/cmake.log")"
fi
if [ -z "${SKIP_MOE:-}" ] && [ -z "${SKIP_LLAMA_MOE:-}" ]; then
    timeout 150 "$bin/llama-bench" -m "$moe" -ngl 99 -fa 1 -p 2048 -n 128 -r 3 > "$logs/llama-bench-moe.log" 2>&1
    say "llama-bench MoE: exit $?"
    grep -E "^\|" "$logs/llama-bench-moe.log" >> "$summary"
    timeout 150 "$bin/llama-batched-bench" -m "$moe" -ngl 99 -fa -npp 512 -ntg 128 -npl 1,32,64 -c 41984 \
        > "$logs/llama-batched-moe.log" 2>&1
    say "llama-batched-bench MoE: exit $?"
    grep -E "^\|" "$logs/llama-batched-moe.log" >> "$summary"
fi
if [ -z "${SKIP_8B:-}" ] && [ -n "${LLAMA_8B_BENCH:-}" ]; then
    # issue 15's single-stream and batched decode of the same 8B Q4_K_M file
    timeout 120 "$bin/llama-bench" -m "$d8b" -ngl 99 -fa 1 -p 2048 -n 128 -r 3 > "$logs/llama-bench-8b.log" 2>&1
    say "llama-bench 8B Q4_K_M: exit $?"
    grep -E "^\|" "$logs/llama-bench-8b.log" >> "$summary"
    timeout 120 "$bin/llama-batched-bench" -m "$d8b" -ngl 99 -fa -npp 512 -ntg 128 -npl 1,32,64 -c 41984 \
        > "$logs/llama-batched-8b.log" 2>&1
    say "llama-batched-bench 8B Q4_K_M: exit $?"
    grep -E "^\|" "$logs/llama-batched-8b.log" >> "$summary"
fi
if [ -z "${SKIP_8B:-}" ] && late 320; then
    say "llama-server part skipped (late)"
elif [ -z "${SKIP_8B:-}" ]; then
    t0=$(now)
    "$bin/llama-server" -m "$d8b" -ngl 99 -fa -np 64 -c 65536 -dt 0.1 --port 8081 \
        > "$logs/llama-server-8b.log" 2>&1 &
    lpid=$!
    say "llama-server 8B Q4_K_M cold start (page cache warm): first answer after $(first_answer 8081 "$t0") s"
    kb 8081 llama-8b-c64 --tokenizer "$d8b" --num-prompts 128 --max-concurrency 64 --input-len 512 \
        --output-len 128 --seed 21
    kill $lpid; wait $lpid 2> /dev/null
fi
if [ -n "$build" ] && [ -n "${LCPP_PACK:-}" ] && ! late 355; then
    (cd "$bin" && tar czf "$work/lcpp-bin.tgz" llama-bench llama-batched-bench llama-server ./*.so*)
    split -b 15000000 -d "$work/lcpp-bin.tgz" "$out/lcpp-bin.tgz."
    say "packed llama.cpp: $(stat -c %s "$work/lcpp-bin.tgz") bytes"
fi
say done
