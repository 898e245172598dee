#!/usr/bin/env bash
# CPU decode/prefill speed and peak RSS of `kiln generate` (one or more binaries) and, when
# given, llama.cpp's llama-bench on the same GGUF files, run back to back in each repeat
# (the machine is shared: compare numbers of the same repeat, and the medians), with the
# load average before and after. Numbers only; nothing is asserted.
#
# Usage: scripts/cpu_bench.sh [-l LLAMA_BENCH] [-r REPEATS] KILN_BIN[,KILN_BIN2...] FILE.gguf...
#   e.g. scripts/cpu_bench.sh -r 5 -l /work/lcpp/build/bin/llama-bench \
#          /tmp/kiln-before,target/release/kiln /tmp/d1b-Q8_0.gguf /tmp/d1b-Q4_K_M.gguf
# The prompt is about 140 tokens (Llama-3 vocabulary); decode is 32 tokens after it.
# llama-bench runs -t 2 -p 128 -n 32 (prefill of 128 tokens, decode of 32 at context 0).
set -euo pipefail
LLAMA_BENCH="" REPEATS=3
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
RESULTS=$(mktemp)
echo "load before: $(uptime)"
for f in "$@"; do
  for r in $(seq "$REPEATS"); do
    for bin in "${BINS[@]}"; do
      log=$(mktemp)
      /usr/bin/time -v "$bin" generate --model "$f" --prompt "$PROMPT" --max-tokens 32 \
        --ignore-eos --timing >/dev/null 2>"$log"
      speed=$(grep -E '^prefill:' "$log")
      rss=$(awk -F': ' '/Maximum resident/ {printf "%.2f", $2 / 1e6}' "$log")
      echo "$(basename "$f") | $bin | run $r | $speed | max RSS $rss GB"
      pre=$(sed -E 's/^prefill:.*\(([0-9.]+) tok\/s\); decode.*/\1/' <<<"$speed")
      dec=$(sed -E 's/.*decode:.*\(([0-9.]+) tok\/s\).*/\1/' <<<"$speed")
      echo "$(basename "$f")|$bin|$pre|$dec|$rss" >>"$RESULTS"
      rm -f "$log"
    done
    if [[ -n $LLAMA_BENCH ]]; then
      csv=$("$LLAMA_BENCH" -m "$f" -t 2 -p 128 -n 32 -r 1 -o csv 2>/dev/null | tail -n +2 | tr -d '"')
      pre=$(awk -F, '$(NF-6) > 0 {print $(NF-1)}' <<<"$csv")
      dec=$(awk -F, '$(NF-5) > 0 {print $(NF-1)}' <<<"$csv")
      echo "$(basename "$f") | llama-bench -t 2 | run $r | prefill $pre tok/s; decode $dec tok/s"
      echo "$(basename "$f")|llama-bench|$pre|$dec|-" >>"$RESULTS"
    fi
  done
done
echo "load after: $(uptime)"
echo "medians over $REPEATS runs (file | program | prefill tok/s | decode tok/s | max RSS GB):"
python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f, prog, pre, dec, rss = line.strip().split("|")
    r = rows.setdefault((f, prog), [[], [], rss])
    r[0].append(float(pre))
    r[1].append(float(dec))
for (f, prog), (pre, dec, rss) in rows.items():
    print(f"{f} | {prog} | {statistics.median(pre):.1f} | {statistics.median(dec):.1f} | {rss}")
PY
rm -f "$RESULTS"
