#!/usr/bin/env bash
# Builds the CUDA parity test binary on this (CPU-only) machine and stages what a GPU
# machine needs under target/device/: the stripped binary and the fixture models.
# Then run scripts/cuda_device.sh there (carry target/device).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${KILN_DEV_DIR:-target/device}
mkdir -p "$dest/models"
exe=$(cargo test --release --features cuda --test parity --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="parity": print(m["executable"])')
[ -n "$exe" ] || { echo "parity test binary not found" >&2; exit 1; }
objcopy --strip-all "$exe" "$dest/parity"
cp ../shared/models/stories260K.gguf ../shared/models/stories260K-Q8_0.gguf \
    ../shared/models/stories260K-Q4_0.gguf "$dest/models/"
ls -la "$dest" "$dest/models"
