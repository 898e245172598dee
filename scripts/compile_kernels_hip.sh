#!/usr/bin/env bash
# Ahead-of-time compile of every Kiln GPU kernel for AMD with hipcc, warnings as errors.
#
# The kernel list is derived from kernels/*.cu (tests/kernels_hip.rs checks that every source
# of the typed kernel enum is one of them). Each source is compiled whole, as the backend's
# whole-source text (`kernels::sources`: tests/kernels_hip.rs checks the bytes are the same):
# `#define KILN_ALL_PARTS 1` (every part of a split source in; the runtime's own units
# define each part tag instead), prelude.cuh, then the source's shared headers
# (attention_*.cu: attention.cuh; qgemv.cu: quant.cuh; qmma.cu: quant.cuh then qmma.cuh;
# moe.cu: quant.cuh then moe.cuh; moe_quant.cu: quant.cuh, qmma.cuh, moe.cuh)
# and the untouched kernel text, each after a #line marker, with -DKILN_WARP_SIZE set for
# the target and both storage types (f32, bf16) instantiated.
# `-include hip/hip_runtime.h` supplies what hipRTC pre-includes implicitly.
#
# Targets: gfx90a (CDNA2, MI200: wave64) and gfx1030 (RDNA2: wave32).
# Warnings: -Wall minus -Wunused-const-variable (prelude constants such as MAX_WARPS are
# unused by some kernels), all as errors; override with KILN_HIP_WARN="...".
# Usage: scripts/compile_kernels_hip.sh [--list | --units DIR] [OUT_DIR]
#   --list       print the kernel sources this script compiles, one per line, and exit.
#   --units DIR  write each source's compile unit to DIR/<name>.hip and exit (no hipcc;
#                tests/kernels_hip.rs compares them with what the backend compiles).
# Exit status: 0 when every kernel compiled for every target, 1 otherwise, 2 without hipcc.
set -uo pipefail
cd "$(dirname "$0")/.."

KERNEL_DIR=kernels
PRELUDE="$KERNEL_DIR/prelude.cuh"
TARGETS=("gfx90a:64" "gfx1030:32")

mapfile -t SOURCES < <(find "$KERNEL_DIR" -maxdepth 1 -name '*.cu' -printf '%f\n' | LC_ALL=C sort)

# The shared headers prepended to a source (mirrors `Source::headers` in
# src/backend/gpu/registry/units.rs).
headers_of() {
    case "$1" in
        attention_*.cu) echo attention.cuh ;;
        qgemv.cu) echo quant.cuh ;;
        qmma.cu) echo quant.cuh qmma.cuh ;;
        moe.cu) echo quant.cuh moe.cuh ;;
        moe_quant.cu) echo quant.cuh qmma.cuh moe.cuh ;;
    esac
}

# Writes the compile unit of every source into directory $1.
write_units() {
    local src hdr
    for src in "${SOURCES[@]}"; do
        {
            printf '#define KILN_ALL_PARTS 1\n'
            cat "$PRELUDE"
            for hdr in $(headers_of "$src"); do
                printf '\n#line 1 "%s"\n' "$hdr"
                cat "$KERNEL_DIR/$hdr"
            done
            printf '\n#line 1 "%s"\n' "$src"
            cat "$KERNEL_DIR/$src"
        } >"$1/${src%.cu}.hip"
    done
}

if [[ "${1:-}" == "--list" ]]; then
    printf '%s\n' "${SOURCES[@]}"
    exit 0
fi
if [[ "${1:-}" == "--units" ]]; then
    mkdir -p "${2:?--units needs a directory}"
    write_units "$2"
    exit 0
fi

HIPCC="${HIPCC:-hipcc}"
if ! command -v "$HIPCC" >/dev/null 2>&1; then
    echo "compile_kernels_hip: $HIPCC not found (apt-get install hipcc libamdhip64-dev)" >&2
    exit 2
fi
if [[ ${#SOURCES[@]} -eq 0 ]]; then
    echo "compile_kernels_hip: no kernel sources in $KERNEL_DIR" >&2
    exit 1
fi

OUT="${1:-$(mktemp -d)}"
mkdir -p "$OUT"
echo "hipcc: $("$HIPCC" --version 2>/dev/null | grep -m1 -i 'HIP version' || true)"

JOBS="${KILN_HIP_JOBS:-$(nproc 2>/dev/null || echo 2)}"

# Compiles one (source, target) pair; writes its log line to $OUT/<name>.<arch>.result.
compile_one() {
    local src="$1" arch="$2" warp="$3" name="${1%.cu}"
    local unit="$OUT/$name.hip" obj="$OUT/$name.$arch.hsaco" log="$OUT/$name.$arch.log"
    local start secs
    start=$(date +%s.%N)
    if "$HIPCC" --genco --offload-arch="$arch" -O3 -std=c++17 -Werror ${KILN_HIP_WARN--Wall -Wno-unused-const-variable} \
        -include hip/hip_runtime.h -DKILN_WARP_SIZE="$warp" \
        "$unit" -o "$obj" >"$log" 2>&1; then
        secs=$(echo "$(date +%s.%N) - $start" | bc)
        printf 'hip-kernel %-14s %-8s wave%-2s ok    %8d bytes %6.1fs\n' \
            "$src" "$arch" "$warp" "$(stat -c %s "$obj")" "$secs" >"$OUT/$name.$arch.result"
    else
        { printf 'hip-kernel %-14s %-8s wave%-2s FAILED\n' "$src" "$arch" "$warp"
          sed 's/^/    /' "$log"; } >"$OUT/$name.$arch.result"
    fi
}

write_units "$OUT"
# The attention sources dominate (minutes per target): start the largest units first.
mapfile -t ORDER < <(for src in "${SOURCES[@]}"; do echo "$(stat -c %s "$OUT/${src%.cu}.hip") $src"; done \
    | sort -rn | cut -d' ' -f2)
for src in "${ORDER[@]}"; do
    for t in "${TARGETS[@]}"; do
        while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n; done
        compile_one "$src" "${t%%:*}" "${t##*:}" &
    done
done
wait

failed=0
total=0
for src in "${SOURCES[@]}"; do
    for t in "${TARGETS[@]}"; do
        total=$((total + 1))
        r="$OUT/${src%.cu}.${t%%:*}.result"
        if [[ -s "$r" ]] && head -n1 "$r" | grep -q ' ok '; then
            cat "$r"
        else
            failed=$((failed + 1))
            [[ -s "$r" ]] && cat "$r" || printf 'hip-kernel %-14s %-8s FAILED (no result)\n' "$src" "${t%%:*}"
        fi
    done
done

echo "hip-kernel summary: $((total - failed))/$total compiled (${#SOURCES[@]} sources x ${#TARGETS[@]} targets, $JOBS jobs) into $OUT"
[[ $failed -eq 0 ]]
