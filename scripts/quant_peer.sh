#!/usr/bin/env bash
# Kiln against llama.cpp on the same quantized GGUF files, on the GPU machine (issue 15).
# Stage here (CPU machine), then carry the folder and run this script there:
#   cargo build --release --features cuda && d=target/dev-peer && mkdir -p $d \
#     && objcopy --strip-all target/release/kiln $d/kiln && gzip -f $d/kiln \
#     && bash ../shared/peers/get_llama_cpp.sh $d/llama.cpp-src.tgz \
#     && cp ../shared/peers/make_gguf.py scripts/quant_peer.sh $d/ \
#     && cp -r ../shared/models/tokenizers/llama3.2 $d/
#   run: bash target/dev-peer/quant_peer.sh        (carry target/dev-peer)
# It builds llama.cpp (CUDA, sm_90), writes a random Llama-3-8B-shape F16 file with make_gguf.py,
# quantizes it to Q4_K_M and Q8_0 with llama-quantize, and measures on each file:
#   llama.cpp: llama-bench (prefill 2048, decode 128 at batch 1), llama-batched-bench (b 1/32/64);
#   Kiln:      `kiln bench --offline` (decode at concurrency 1/32/64, prefill 2048 as TTFT).
# Logs and a summary table go to $OUT (or /tmp/peer-out). Environment: TYPES (default
# "Q4_K_M Q8_0"), SKIP_LLAMA=1 to run Kiln alone.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out=${OUT:-/tmp/peer-out}
work=/tmp/peer
mkdir -p "$out" "$work"
# The CUDA libraries cudarc loads (next to this script, or the repository's when it runs
# from a carried copy in the repository root).
# shellcheck source=scripts/cuda_env.sh
source "$(dirname "$0")/cuda_env.sh" 2> /dev/null || source scripts/cuda_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
kiln=$work/kiln
gunzip -c "$here/kiln.gz" > "$kiln" && chmod +x "$kiln"
lcpp=$work/lcpp
mkdir -p "$lcpp" && tar xzf "$here/llama.cpp-src.tgz" -C "$lcpp"
src=$lcpp; [ -f "$src/CMakeLists.txt" ] || src=$(dirname "$(ls "$lcpp"/*/CMakeLists.txt | head -1)")
t0=$(date +%s)
(cd "$src" && cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release > "$out/cmake.log" 2>&1 \
    && cmake --build build -j16 --target llama-bench llama-batched-bench llama-quantize \
    >> "$out/cmake.log" 2>&1; echo "llama.cpp build: exit $? after $(( $(date +%s) - t0 )) s") &
build=$!
LLAMA3_TOKENIZER_DIR=$here/llama3.2 PYTHONPATH=$src/gguf-py python3 "$here/make_gguf.py" "$work/d8b.gguf" \
    > "$out/make_gguf.log" 2>&1 || { echo "make_gguf failed"; tail "$out/make_gguf.log"; }
echo "F16 file: $(( $(date +%s) - t0 )) s"
wait $build
bin=$src/build/bin
summary=$out/summary.txt
: > "$summary"
for ty in ${TYPES:-Q4_K_M Q8_0}; do
    f=$work/d8b-$ty.gguf
    "$bin/llama-quantize" "$work/d8b.gguf" "$f" "$ty" 16 > "$out/quantize-$ty.log" 2>&1 \
        || { echo "quantize $ty failed"; tail -5 "$out/quantize-$ty.log"; continue; }
    echo "== $ty: $(stat -c %s "$f") bytes" | tee -a "$summary"
    # Kiln first (the GPU is otherwise idle): load time, then decode and prefill.
    for c in 1 32 64; do
        n=$(( c < 4 ? 4 : c * 2 ))
        "$kiln" bench --offline --model "$f" --device cuda:0 --num-prompts $n --max-concurrency $c \
            --input-len 512 --output-len 128 --ignore-eos > "$out/kiln-$ty-c$c.log" 2>&1
        echo "kiln $ty c$c: exit $?" >> "$summary"
        grep -iE "output token throughput|tpot|loaded|weights" "$out/kiln-$ty-c$c.log" | head -6 >> "$summary"
    done
    "$kiln" bench --offline --model "$f" --device cuda:0 --num-prompts 4 --max-concurrency 1 \
        --input-len 2048 --output-len 1 --ignore-eos > "$out/kiln-$ty-prefill.log" 2>&1
    echo "kiln $ty prefill 2048: exit $?" >> "$summary"
    grep -iE "ttft" "$out/kiln-$ty-prefill.log" | head -4 >> "$summary"
    [ -n "${SKIP_LLAMA:-}" ] && continue
    "$bin/llama-bench" -m "$f" -ngl 99 -fa 1 -p 2048 -n 128 -r 3 > "$out/llama-bench-$ty.log" 2>&1
    grep -E "^\|" "$out/llama-bench-$ty.log" >> "$summary"
    [ "$ty" = Q4_K_M ] || continue
    "$bin/llama-batched-bench" -m "$f" -ngl 99 -fa -npp 512 -ntg 128 -npl 1,32,64 -c 41984 \
        > "$out/llama-batched-$ty.log" 2>&1
    grep -E "^\|" "$out/llama-batched-$ty.log" >> "$summary"
done
# Structured output (issue 16): free against schema-constrained requests on the Q4_K_M file, through
# `kiln serve`, at concurrency 1 and 32, and a mixed batch (16 free + 16 constrained at once).
f=$work/d8b-Q4_K_M.gguf
if [ -f "$f" ] && [ -z "${SKIP_STRUCTURED:-}" ]; then
    "$kiln" serve --model "$f" --device cuda:0 --port 8124 > "$out/serve-structured.log" 2>&1 &
    spid=$!
    for i in $(seq 1 120); do curl -sf localhost:8124/health > /dev/null && break; sleep 1; done
    schema='{"response_format":{"type":"json_schema","json_schema":{"name":"nums","schema":{"type":"object","properties":{"items":{"type":"array","items":{"type":"integer"}}},"required":["items"]}}}}'
    sb() { "$kiln" bench --base-url http://127.0.0.1:8124 --input-len 512 --output-len 128 --ignore-eos "$@"; }
    for c in 1 32; do
        n=$(( c < 4 ? 8 : c * 2 ))
        sb --num-prompts $n --max-concurrency $c > "$out/struct-free-c$c.log" 2>&1
        sb --num-prompts $n --max-concurrency $c --extra-body "$schema" > "$out/struct-schema-c$c.log" 2>&1
        for k in free schema; do
            echo "structured $k c$c: $(grep -E '^TPOT' "$out/struct-$k-c$c.log")" >> "$summary"
        done
    done
    sb --num-prompts 32 --max-concurrency 16 > "$out/struct-mixfree.log" 2>&1 &
    mp=$!
    sb --num-prompts 32 --max-concurrency 16 --extra-body "$schema" > "$out/struct-mixschema.log" 2>&1
    wait $mp
    for k in mixfree mixschema; do
        echo "structured $k c16+16: $(grep -E '^TPOT' "$out/struct-$k.log")" >> "$summary"
    done
    kill $spid
fi
cat "$summary"
