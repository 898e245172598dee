#!/usr/bin/env python3
"""Writes golden data for Kiln's dequantizers, computed independently with gguf-py (numpy).

Outputs in tests/data/quant/:
  <type>.raw       random raw blocks (finite f16 scale fields), 8 blocks per type
  <type>.f32       gguf-py's dequantization of <type>.raw, little-endian f32
  mxfp4.raw        MXFP4 blocks: every E8M0 exponent byte 0..=255 once (the extremes 0, 1,
                   254, 255 included; 253..255 overflow f32 for the larger codes, as in
                   ggml) with random nibbles (all 16 E2M1 codes, -0 included)
  mxfp4.f32        gguf-py's dequantization of mxfp4.raw (infinities where ggml has them)
  mxfp4_dot_w.raw  an [8, 512] MXFP4 weight quantized by gguf-py from random values
                   (scales 2^-20..2^20 across rows), plus the exponent bytes 0 and 255
                   in two blocks of row 7
  mxfp4_dot_x.f32  [3, 512] random f32 activations
  mxfp4_dot_y.f32  [3, 8] their dot products with gguf-py's dequantized weight (float64 sums)
  fixtures.json    for every non-F32 tensor of the quantized/F16 fixture models: type,
                   element count, FNV-1a 64 of the dequantized f32 bytes, first values, sum

Usage: python3 scripts/gen_quant_golden.py [--models ../shared/models]
Requires: pip install gguf numpy (tested with gguf 0.19.0, whose gguf.quants has MXFP4; or
PYTHONPATH=llama.cpp/gguf-py with the tree ../shared/peers/get_llama_cpp.sh fetches).
"""

import argparse
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize, quantize

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "quant"
N_BLOCKS = 8
SEED = 20240601

FIXTURES = [
    "stories260K-F16.gguf",
    "stories260K-Q8_0.gguf",
    "stories260K-Q4_0.gguf",
    "llama-2-tiny-random.gguf",
]


def f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def random_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """Small finite f16 scales of both signs, one of them subnormal, as (n, 2) bytes."""
    s = rng.uniform(-0.05, 0.05, n)
    s[0] = 3.0e-7  # f16 subnormal
    s[1] = 0.0
    return f16_bytes(s)


def random_plain_bits(rng: np.random.Generator, n: int, exp_mask: int) -> np.ndarray:
    """Random 16-bit patterns whose exponent is not all ones (no inf/NaN)."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    bad = (bits & exp_mask) == exp_mask
    bits[bad] ^= np.uint16(0x4000)  # clear the top exponent bit
    return bits.view(np.uint8).reshape(-1, 2)


def random_blocks(qtype: T, rng: np.random.Generator) -> np.ndarray:
    """N_BLOCKS raw blocks of `qtype` as a uint8 array of shape (N_BLOCKS, block_bytes)."""
    if qtype == T.F16:
        return random_plain_bits(rng, 32 * N_BLOCKS, 0x7C00).reshape(N_BLOCKS, -1)
    if qtype == T.BF16:
        return random_plain_bits(rng, 32 * N_BLOCKS, 0x7F80).reshape(N_BLOCKS, -1)
    layout = {  # (offset of each f16 scale field, block bytes)
        T.Q8_0: ([0], 34),
        T.Q4_0: ([0], 18),
        T.Q4_K: ([0, 2], 144),
        T.Q5_K: ([0, 2], 176),
        T.Q6_K: ([208], 210),
    }
    fields, size = layout[qtype]
    blocks = rng.integers(0, 256, (N_BLOCKS, size), dtype=np.uint16).astype(np.uint8)
    for at in fields:
        blocks[:, at : at + 2] = random_scales(rng, N_BLOCKS)
    return blocks


def write_blocks(rng: np.random.Generator) -> None:
    # New types go last: the random draws of the earlier ones stay the same.
    for qtype in [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_K, T.Q6_K, T.Q5_K]:
        blocks = random_blocks(qtype, rng)
        values = dequantize(blocks, qtype).astype("<f4").reshape(-1)
        assert np.all(np.isfinite(values)), qtype
        stem = qtype.name.lower()
        (OUT / f"{stem}.raw").write_bytes(blocks.tobytes())
        (OUT / f"{stem}.f32").write_bytes(values.tobytes())
        print(f"{stem}: {blocks.size} bytes -> {values.size} values")


def write_mxfp4(rng: np.random.Generator) -> None:
    qs = rng.integers(0, 256, (256, 16), dtype=np.uint16).astype(np.uint8)
    e = rng.permutation(256).astype(np.uint8).reshape(256, 1)
    blocks = np.concatenate([e, qs], axis=1)
    with np.errstate(over="ignore"):
        values = dequantize(blocks, T.MXFP4).astype("<f4").reshape(-1)
    assert np.all(np.isfinite(values[np.repeat(e[:, 0] < 253, 32)])), "finite below 253"
    (OUT / "mxfp4.raw").write_bytes(blocks.tobytes())
    (OUT / "mxfp4.f32").write_bytes(values.tobytes())
    print(f"mxfp4: {blocks.size} bytes -> {values.size} values")

    rows, k, n = 8, 512, 3
    scale = 2.0 ** np.linspace(-20, 20, rows).reshape(rows, 1)
    w = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
    wq = quantize(w, T.MXFP4).reshape(rows, -1, 17)
    # Extreme exponents in the last row, with tiny codes so that the values stay finite:
    # block 0 at e = 0 (subnormal 2^-128 unit), block 1 at e = 255 (2^127) holding only 0/±1.
    wq[7, 0, 0] = 0
    wq[7, 1, 0] = 255
    wq[7, 1, 1:] &= np.uint8(0x99)  # codes 0, 1, 8, 9: 0, 1, -0, -1
    wq = wq.reshape(rows, -1)
    wd = dequantize(wq, T.MXFP4).astype(np.float32).reshape(rows, k)
    assert np.all(np.isfinite(wd))
    x = rng.uniform(-1.0, 1.0, (n, k)).astype(np.float32)
    # Row 7's 2^127 block swamps everything: give its activations there a tiny size.
    x[:, 32:64] *= np.float32(2.0**-120)
    y = (x.astype(np.float64) @ wd.astype(np.float64).T).astype("<f4")
    assert np.all(np.isfinite(y))
    (OUT / "mxfp4_dot_w.raw").write_bytes(wq.tobytes())
    (OUT / "mxfp4_dot_x.f32").write_bytes(x.astype("<f4").tobytes())
    (OUT / "mxfp4_dot_y.f32").write_bytes(y.tobytes())
    print(f"mxfp4 dots: [{n}, {k}] x [{rows}, {k}]^T")


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def fixture_summaries(models: pathlib.Path) -> dict:
    out = {}
    for fname in FIXTURES:
        reader = GGUFReader(models / fname)
        tensors = {}
        for t in reader.tensors:
            if t.tensor_type == T.F32:
                continue
            values = dequantize(t.data, t.tensor_type).astype("<f4").reshape(-1)
            tensors[t.name] = {
                "type": t.tensor_type.name,
                "n_elements": int(values.size),
                "fnv1a64": f"{fnv1a64(values.tobytes()):016x}",
                "first": [float(v) for v in values[:8]],
                "sum": float(values.astype(np.float64).sum()),
            }
        out[fname] = tensors
        print(f"{fname}: {len(tensors)} tensors")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=pathlib.Path, default=ROOT.parent / "shared" / "models")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    write_blocks(rng)
    write_mxfp4(rng)  # after the others: their random draws stay the same
    summaries = fixture_summaries(args.models)
    (OUT / "fixtures.json").write_text(json.dumps(summaries, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
