#!/usr/bin/env bash
# The standard serving sweep: concurrency 1, 8, 32, 128 on random prompts of 512 tokens in and
# 128 out (ignore_eos, so every server generates the same tokens), one JSON per point.
# Compare two servers by running it twice back to back into two directories.
#
# Usage: scripts/sweep.sh BASE_URL MODEL OUT_DIR [extra kiln bench flags...]
#   e.g. scripts/sweep.sh http://127.0.0.1:8000 stories260K.gguf out/kiln --label kiln-cpu
# Environment:
#   KILN_BIN      the kiln binary (default: target/release/kiln, else kiln on PATH)
#   CONCURRENCY   points to run (default: "1 8 32 128")
#   PROMPTS_PER   prompts per unit of concurrency (default 4; at least 32 per point)
#   INPUT_LEN, OUTPUT_LEN  (default 512 and 128)
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
base_url=$1
model=$2
out=$3
shift 3
root="$(cd "$(dirname "$0")/.." && pwd)"
bin=${KILN_BIN:-}
if [ -z "$bin" ]; then
    if [ -x "$root/target/release/kiln" ]; then bin="$root/target/release/kiln"; else bin=kiln; fi
fi
mkdir -p "$out"
for c in ${CONCURRENCY:-1 8 32 128}; do
    n=$(( c * ${PROMPTS_PER:-4} ))
    [ "$n" -lt 32 ] && n=32
    echo "== concurrency $c, $n prompts -> $out/c$c.json" >&2
    "$bin" bench --base-url "$base_url" --model "$model" \
        --dataset random --input-len "${INPUT_LEN:-512}" --output-len "${OUTPUT_LEN:-128}" \
        --ignore-eos --num-prompts "$n" --max-concurrency "$c" --request-rate inf --seed 0 \
        --json "$out/c$c.json" "$@"
done
