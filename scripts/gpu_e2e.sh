#!/usr/bin/env bash
# GPU end-to-end check, run ON the GPU machine from a staged folder. Stage it here with:
#   cargo build --release --features cuda && mkdir -p target/e2e && cp target/release/kiln target/e2e/ \
#     && strip target/e2e/kiln && cp ../shared/models/stories260K.gguf scripts/gpu_e2e.sh scripts/cuda_env.sh target/e2e/ \
#     && sed 's/^enable_prefix_caching = true/&\ngpu_dtype = "f32"/' config/default.toml > target/e2e/f32.toml \
#     && ./target/release/kiln generate --prompt "Once upon a time" --max-tokens 64 --json --ignore-eos \
#        | python3 -c 'import json,sys; open("target/e2e/expected.txt","w").write(json.load(sys.stdin)["text"])'
# (the generate step with a non-cuda build, on the CPU), then carry target/e2e and run
# `bash target/e2e/gpu_e2e.sh`. For the OpenAI SDK suite on the GPU server, also stage
# tests/openai_sdk.py and wheels of the openai package (the GPU machine has no network):
#   cp tests/openai_sdk.py target/e2e/ && pip download --only-binary=:all: \
#     --platform manylinux2014_x86_64 --python-version 3.12 -d target/e2e/wheels openai
set -uo pipefail
cd "$(dirname "$0")"
# The CUDA library search of the other device scripts (staged next to this one).
source ./cuda_env.sh
export KILN_LOG=warn
if [ -d wheels ] && ! python3 -c 'import openai' 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links wheels --target pydeps openai && export PYTHONPATH=$PWD/pydeps
fi
# KILN_E2E_DEVICES=cuda:0,cuda:1 serves one lane per GPU (the metrics then show both devices).
devices=${KILN_E2E_DEVICES:-cuda:0}
for mode in f32 bf16; do
  cfg=""; [ $mode = f32 ] && cfg="--config f32.toml"
  ./kiln serve $cfg --model stories260K.gguf --device "$devices" --port 8123 --api-key sk-kiln-test > serve-$mode.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do curl -sf localhost:8123/health >/dev/null && break; sleep 1; done
  echo "== $mode ready after ${i}s"
  curl -s localhost:8123/v1/completions -H 'content-type: application/json' -H 'authorization: Bearer sk-kiln-test' \
    -d '{"model":"stories260K.gguf","prompt":"Once upon a time","max_tokens":64,"temperature":0,"ignore_eos":true}' > resp-$mode.json
  python3 - "$mode" <<'PY'
import json, sys
r = json.load(open(f"resp-{sys.argv[1]}.json"))
got = r["choices"][0]["text"]; want = open("expected.txt").read()
n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
print(sys.argv[1], "identical to CPU:", got == want, "| common prefix chars:", n, "of", len(want))
print(repr(got[:120]))
PY
  ./kiln bench --base-url http://127.0.0.1:8123 --model stories260K.gguf --num-prompts 64 --input-len 128 --output-len 64 --max-concurrency 16 --ignore-eos --api-key sk-kiln-test 2>&1 | tail -12
  if [ -f openai_sdk.py ] && python3 -c 'import openai' 2>/dev/null; then
    python3 openai_sdk.py http://127.0.0.1:8123 sk-kiln-test stories260K.gguf 2>&1 | tail -3
  fi
  curl -s localhost:8123/metrics -H "authorization: Bearer sk-kiln-test" > metrics-$mode.txt
  [ -n "${OUT:-}" ] && cp metrics-$mode.txt "$OUT/"
  grep -E "^kiln_(kernel_duration_seconds_count|step_duration_seconds_count)" metrics-$mode.txt | head -20
  for d in ${devices//,/ }; do
    echo "$d: $(grep -c "device=\"$d\"" metrics-$mode.txt) metric series"
  done
  kill -TERM $pid; wait $pid; echo "exit $?"
  tail -5 serve-$mode.log
done
