#!/usr/bin/env bash
# Cold start of `kiln serve` on the GPU machine (issue 15): process start to the first answered
# one-token completion, with an empty kernel cache and again with it warm, for one or more
# Kiln binaries on the same Llama-3-8B-shape Q4_K_M file (page cache warm), plus
# llama-server's on the same file when its binaries are in the folder. Each Kiln start's
# start-up log lines (device context, per-source kernel compile, weight upload, KV pool) go
# into the summary.
# Stage here (CPU machine), then carry the folder:
#   d=/work/main/target/dev-cold; mkdir -p $d
#   cargo build --release --features cuda && objcopy --strip-all target/release/kiln $d/kiln \
#     && gzip -f $d/kiln        (more binaries: kiln-NAME.gz, each is timed)
#   cp scripts/cold_start.sh scripts/make_moe_gguf.py ../shared/peers/make_gguf.py $d/
#   bash ../shared/peers/get_llama_cpp.sh $d/llama.cpp-src.tgz      (its gguf-py writes the file)
#   tar czf $d/tok.tgz -C ../shared/models/tokenizers llama3.2
#   cp ../main/target/dev-moepeer/lcpp-bin.txz $d/   (optional: llama-server's binaries, from
#     moe_peer.sh with LCPP_PACK=1; gguf-py.tgz, the gguf-py folder alone, may stand in for
#     llama.cpp-src.tgz)
#   run: bash target/dev-cold/cold_start.sh          (carry target/dev-cold)
# Environment: COLD_WARMUP=1 (an uncounted first start), COLD_WARM=0 (no warm starts),
# COLD_ENVS (one cold start of the first binary per VAR=VALUE setting), COLD_SPLITS (e.g. "0 off 4": one cold start of the first binary per
# KILN_NVRTC_SPLIT value), COLD_N (rounds of cold starts, the binaries in turn), WARM_ENVS adds warm starts of the first binary with those
# settings (F16=1 also on the F16 file), BENCH=1 then runs `kiln bench` at concurrency 64 (512 in, 128 out)
# against llama-server (each binary) and kiln serve.
# Everything goes to $OUT: summary.txt and logs.tgz.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out=${OUT:-/tmp/cold-out}
work=/tmp/coldstart
logs=$work/logs
rm -rf "$logs"
mkdir -p "$out" "$work" "$logs"
now() { date +%s%N; }
secs() { local ns=$(( $(now) - $1 )); printf '%d.%02d' $(( ns / 1000000000 )) $(( ns / 10000000 % 100 )); }
T0=$(now)
summary=$logs/summary.txt
say() { echo "[$(secs "$T0") s] $*" | tee -a "$summary"; }
finish() {
    cp "$summary" "$out/summary.txt"
    tar czf "$out/logs.tgz" -C "$logs" . 2> /dev/null
}
trap finish EXIT
# The CUDA libraries cudarc loads (next to this script, or the repository's when it runs
# from a carried copy in the repository root).
# shellcheck source=scripts/cuda_env.sh
source "$(dirname "$0")/cuda_env.sh" 2> /dev/null || source scripts/cuda_env.sh
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader) | $(nproc) cores"
bins=()
# kiln-NAME.gz or kiln-NAME.xz (smaller: more binaries fit one carry); python's lzma where
# the machine has no xz.
for packed in "$here"/kiln*.gz "$here"/kiln*.xz; do
    [ -f "$packed" ] || continue
    name=$(basename "${packed%.*}")
    case $packed in
        *.xz) xz -dc "$packed" 2> /dev/null || python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$packed" ;;
        *) gunzip -c "$packed" ;;
    esac > "$work/$name" && chmod +x "$work/$name" && bins+=("$name")
done
# kilns.txz: several kiln-NAME binaries in one archive (nearly alike binaries compress to
# little more than one).
if [ -f "$here/kilns.txz" ]; then
    rm -rf "$work/kilns" && mkdir -p "$work/kilns"
    tar xJf "$here/kilns.txz" -C "$work/kilns" 2> /dev/null \
        || python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$here/kilns.txz" "$work/kilns"
    for f in "$work"/kilns/kiln*; do
        name=$(basename "$f")
        mv "$f" "$work/$name" && chmod +x "$work/$name" && bins+=("$name")
    done
fi
lcpp=$work/lcpp
mkdir -p "$lcpp/bin"
if [ -f "$here/llama.cpp-src.tgz" ]; then
    tar xzf "$here/llama.cpp-src.tgz" -C "$lcpp" llama.cpp/gguf-py
else
    tar xzf "$here/gguf-py.tgz" -C "$lcpp"
fi
tar xzf "$here/tok.tgz" -C "$work"
if [ -f "$here/lcpp-bin.txz" ]; then
    tar xaf "$here/lcpp-bin.txz" -C "$lcpp/bin" 2> /dev/null \
        || python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$here/lcpp-bin.txz" "$lcpp/bin"
fi
export LD_LIBRARY_PATH="$lcpp/bin:${LD_LIBRARY_PATH:-}"
gguf_py=$(dirname "$(find "$lcpp" -name __init__.py -path '*gguf/__init__.py' | head -1)")
model=$work/d8b-q4km.gguf
dev=${KILN_DEV:-cuda:0}
[ -s "$model" ] || LLAMA3_TOKENIZER_DIR=$work/llama3.2 PYTHONPATH=$(dirname "$gguf_py") \
    python3 "$here/make_moe_gguf.py" "$model" --shape llama3-8b > "$logs/make_8b.log" 2>&1 \
    || { say "make_moe_gguf failed"; tail -5 "$logs/make_8b.log" | tee -a "$summary"; exit 1; }
say "8B Q4_K_M file: $(stat -c %s "$model") bytes"
cat "$model" > /dev/null

# Waits for a server on port $1 to answer a one-token completion; prints the seconds from $2.
first_answer() {
    local port=$1 t0=$2 code
    for _ in $(seq 1 1500); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "localhost:$port/v1/completions" \
            -H 'Content-Type: application/json' -d '{"prompt":"Hello","max_tokens":1}')
        [ "$code" = 200 ] && { secs "$t0"; return 0; }
        sleep 0.02
    done
    echo "never"
    return 1
}
# One Kiln start: binary, home (HOME and XDG_CACHE_HOME: the kernel cache, and any cache
# NVRTC or the driver keep under HOME), log name, then env assignments.
kiln_start() {
    local bin=$1 home=$2 name=$3; shift 3
    local t0 spid
    mkdir -p "$home"
    t0=$(now)
    env "$@" KILN_LOG=info HOME="$home" XDG_CACHE_HOME="$home/.cache" "$work/$bin" serve \
        --model "$model" --device "$dev" --port 8125 > "$logs/$name.log" 2>&1 &
    spid=$!
    say "$name: first answer after $(first_answer 8125 "$t0") s"
    # Then at once a prompt of about 200 tokens (a batch step: the tiled matmuls, which a
    # start-up need not wait for; a compile still running shows here).
    local t1 code
    t1=$(now)
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 60 "localhost:8125/v1/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"prompt\":\"$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 20))\",\"max_tokens\":1}")
    say "$name: then a 200-token prompt: $code after $(secs "$t1") s"
    grep -E "start-up|kernel source compiled|kernels ready|loaded after start-up|weights on the device|KV pool|engine ready" \
        "$logs/$name.log" | sed -E 's/\x1b\[[0-9;]*m//g; s/^.*(INFO|WARN) //' | cut -c1-400 >> "$summary"
    kill "$spid"; wait "$spid" 2> /dev/null
    (cd "$home" && find . -type f | sed 's/-[0-9a-f]\{16\}\.bin$/.bin/' | sort | uniq -c | head -20) \
        > "$logs/$name.files.txt"
}
# COLD_WARMUP=1: first one uncounted cold start of the first binary (the machine's first
# start reads the CUDA libraries and NVRTC's builtins from disk; the timed ones then start
# alike).
if [ -n "${COLD_WARMUP:-}" ]; then
    rm -rf "$work/home-warmup"
    kiln_start "${bins[0]}" "$work/home-warmup" "warmup-${bins[0]}"
fi
# Each binary: a cold start (fresh home) for each KILN_NVRTC_SPLIT value of COLD_SPLITS
# (the first binary only; `default` leaves it unset), COLD_N rounds (default 1) over the
# binaries in turn, then a warm one of each on its last home.
for round in $(seq 1 "${COLD_N:-1}"); do
    for bin in "${bins[@]}"; do
        splits=default
        [ "$bin" = "${bins[0]}" ] && splits=${COLD_SPLITS:-default}
        n=0
        for split in $splits; do
            n=$((n + 1))
            home=$work/home-$bin-$n
            rm -rf "$home"
            if [ "$split" = default ]; then
                kiln_start "$bin" "$home" "$bin-cold-$n-r$round"
            else
                kiln_start "$bin" "$home" "$bin-cold-$n-r$round-split-$split" KILN_NVRTC_SPLIT="$split"
            fi
        done
        # COLD_ENVS (e.g. "KILN_NVRTC_NICE=0 KILN_NVRTC_NICE=10"): one more cold start of the
        # first binary per setting.
        if [ "$bin" = "${bins[0]}" ]; then
            for v in ${COLD_ENVS:-}; do
                n=$((n + 1))
                home=$work/home-$bin-env-$n
                rm -rf "$home"
                kiln_start "$bin" "$home" "$bin-cold-$n-r$round-$v" "$v"
            done
        fi
    done
done
[ "${COLD_WARM:-1}" = 0 ] && bins_warm=() || bins_warm=("${bins[@]}")
for bin in ${bins_warm[@]+"${bins_warm[@]}"}; do
    # The first cold start's home (the default settings: a KILN_NVRTC_SPLIT start's cache
    # entries have other keys).
    home=$(ls -d "$work/home-$bin-"[0-9]* | head -1)
    kiln_start "$bin" "$home" "$bin-warm"
    # WARM_ENVS (e.g. "KILN_UPLOAD_PINNED=0"): a warm start of the first binary with each
    # setting, then the plain warm start again (run-to-run spread).
    if [ "$bin" = "${bins[0]}" ] && [ -n "${WARM_ENVS:-}" ]; then
        for v in $WARM_ENVS; do kiln_start "$bin" "$home" "$bin-warm-$v" "$v"; done
        kiln_start "$bin" "$home" "$bin-warm-again"
    fi
done
# F16=1: the same on the 16 GB F16 file of ../shared/peers/make_gguf.py (copied into the
# folder): a cold and a warm Kiln start of the first binary, then llama-server's start.
if [ -n "${F16:-}" ] && [ -f "$here/make_gguf.py" ]; then
    f16=$work/d8b-f16.gguf
    [ -s "$f16" ] || LLAMA3_TOKENIZER_DIR=$work/llama3.2 PYTHONPATH=$(dirname "$gguf_py") \
        python3 "$here/make_gguf.py" "$f16" > "$logs/make_f16.log" 2>&1 \
        || { say "make_gguf failed"; tail -5 "$logs/make_f16.log" | tee -a "$summary"; }
    if [ -s "$f16" ]; then
        say "8B F16 file: $(stat -c %s "$f16") bytes"
        cat "$f16" > /dev/null
        q4=$model
        model=$f16
        rm -rf "$work/home-f16"
        kiln_start "${bins[0]}" "$work/home-f16" "f16-${bins[0]}-cold"
        kiln_start "${bins[0]}" "$work/home-f16" "f16-${bins[0]}-warm"
        for v in ${WARM_ENVS:-}; do
            kiln_start "${bins[0]}" "$work/home-f16" "f16-${bins[0]}-warm-$v" "$v"
        done
        if [ -x "$lcpp/bin/llama-server" ]; then
            t0=$(now)
            "$lcpp/bin/llama-server" -m "$f16" -ngl 99 -fa -np 64 -c 65536 -dt 0.1 --port 8081 \
                > "$logs/llama-server-f16.log" 2>&1 &
            lpid=$!
            say "llama-server F16: first answer after $(first_answer 8081 "$t0") s"
            kill "$lpid"; wait "$lpid" 2> /dev/null
        fi
        model=$q4
    fi
fi
if [ -x "$lcpp/bin/llama-server" ]; then
    for i in 1 2; do
        t0=$(now)
        "$lcpp/bin/llama-server" -m "$model" -ngl 99 -fa -np 64 -c 65536 -dt 0.1 --port 8081 \
            > "$logs/llama-server-$i.log" 2>&1 &
        lpid=$!
        say "llama-server start $i: first answer after $(first_answer 8081 "$t0") s"
        if [ -n "${BENCH:-}" ] && [ "$i" = 2 ]; then
            for bin in "${bins[@]}"; do
                nstat -n > /dev/null 2>&1
                timeout "${BENCH_S:-100}" "$work/$bin" bench --base-url http://127.0.0.1:8081 \
                    --tokenizer "$model" --num-prompts 128 --max-concurrency 64 --input-len 512 \
                    --output-len 128 --seed 21 --ignore-eos --json "$logs/bench-llama-$bin.json" \
                    > "$logs/bench-llama-$bin.log" 2>&1 &
                bpid=$!
                # Connections to the server while the bench runs (a stuck one shows here).
                for t in 20 40 60 80; do
                    sleep 20
                    kill -0 "$bpid" 2> /dev/null || break
                    echo "== ${t} s" >> "$logs/bench-llama-$bin-conns.txt"
                    (ss -tanoi '( dport = :8081 or sport = :8081 )' 2> /dev/null \
                        || netstat -tno 2> /dev/null | grep 8081 \
                        || grep -c ':1F91 ' /proc/net/tcp) >> "$logs/bench-llama-$bin-conns.txt" 2>&1
                done
                wait "$bpid"
                say "$bin bench c64 against llama-server: exit $?"
                nstat 2> /dev/null | grep -E "ListenOverflows|ListenDrops|SynRetrans|TCPTimeouts|AbortOn" \
                    | tr -s ' ' | tr '\n' ';' | tee -a "$summary"; echo >> "$summary"
                grep -E "^(Output token throughput|TTFT|TPOT|Failed|Successful|Benchmark duration)" \
                    "$logs/bench-llama-$bin.log" | tee -a "$summary"
            done
            grep -cE "processing task" "$logs/llama-server-$i.log" | sed 's/^/llama-server tasks: /' \
                | tee -a "$summary"
        fi
        kill "$lpid"; wait "$lpid" 2> /dev/null
    done
fi
# KILN_VARIANTS: `kiln serve` flag sets for the bench, separated by ';' (e.g.
# "--max-num-batched-tokens 2048;--max-num-batched-tokens 8192"); default: one run, no flags.
if [ -n "${BENCH:-}" ]; then
    IFS=';' read -ra variants <<< "${KILN_VARIANTS:-}"
    [ ${#variants[@]} -eq 0 ] && variants=("")
    n=0
    for v in "${variants[@]}"; do
        n=$((n + 1))
        # shellcheck disable=SC2086
        KILN_LOG=info HOME="$work/home-${bins[0]}-1" XDG_CACHE_HOME="$work/home-${bins[0]}-1/.cache" \
            "$work/${bins[0]}" serve --model "$model" --device "$dev" --port 8125 $v \
            > "$logs/serve-bench-$n.log" 2>&1 &
        spid=$!
        say "kiln serve ($v) for the bench: first answer after $(first_answer 8125 "$(now)") s"
        timeout 60 "$work/${bins[0]}" bench --base-url http://127.0.0.1:8125 --num-prompts 128 \
            --max-concurrency 64 --input-len 512 --output-len 128 --seed 21 --ignore-eos \
            > "$logs/bench-kiln-$n.log" 2>&1
        say "kiln bench c64 against kiln serve ($v): exit $?"
        grep -E "^(Output token throughput|TTFT|TPOT|Failed|Successful|Benchmark duration)" \
            "$logs/bench-kiln-$n.log" | tee -a "$summary"
        kill "$spid"; wait "$spid" 2> /dev/null
    done
fi
say done
