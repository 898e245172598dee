#!/usr/bin/env bash
# CPU decode/prefill speed and peak RSS of `kiln generate` (one or more binaries) and, when
# given, llama.cpp's llama-bench on the same GGUF files. Numbers only; nothing is asserted.
#
# Usage: scripts/cpu_bench.sh [-l LLAMA_BENCH] [-r REPEATS] KILN_BIN[,KILN_BIN2...] FILE.gguf...
#   e.g. scripts/cpu_bench.sh -l /tmp/lcpp/build/bin/llama-bench \
#          /tmp/kiln-before,target/release/kiln /tmp/d1b-Q8_0.gguf /tmp/d1b-Q4_K_M.gguf
# The prompt is about 140 tokens (Llama-3 vocabulary); decode is 32 tokens after it.
set -euo pipefail
LLAMA_BENCH="" REPEATS=2
while getopts "l:r:" opt; do
  case $opt in
    l) LLAMA_BENCH=$OPTARG ;;
    r) REPEATS=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
IFS=, read -r -a BINS <<<"$1"
shift
PROMPT=$(printf 'The quick brown fox jumps over the lazy dog near the river bank. %.0s' {1..10})
for f in "$@"; do
  for r in $(seq "$REPEATS"); do
    for bin in "${BINS[@]}"; do
      log=$(mktemp)
      /usr/bin/time -v "$bin" generate --model "$f" --prompt "$PROMPT" --max-tokens 32 \
        --ignore-eos --timing >/dev/null 2>"$log"
      speed=$(grep -E '^prefill:' "$log")
      rss=$(awk -F': ' '/Maximum resident/ {printf "%.2f GB", $2 / 1e6}' "$log")
      echo "$(basename "$f") | $bin | run $r | $speed | max RSS $rss"
      rm -f "$log"
    done
    if [[ -n $LLAMA_BENCH ]]; then
      "$LLAMA_BENCH" -m "$f" -t 2 -p 128 -n 32 -r 1 -o csv 2>/dev/null |
        awk -F, -v f="$(basename "$f")" -v r="$r" \
          'NR > 1 {gsub(/"/, ""); print f " | llama-bench -t 2 | run " r " | n_prompt " $(NF-6) " n_gen " $(NF-5) " | " $(NF-1) " tok/s"}'
    fi
  done
done
