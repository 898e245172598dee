#!/usr/bin/env python3
"""Writes the committed seed inputs for the `gguf` fuzz target into fuzz/corpus/gguf/.

Seeds: small synthetic GGUF files that parse (every metadata value type, nested arrays,
one tensor of each type Kiln dequantizes, an unsupported type, custom alignment, v2),
prefixes of the real fixtures (header, metadata and tensor infos) and a few corrupted
copies of both. Deterministic; needs only the standard library and ../shared/models.

Usage: python3 fuzz/seed.py [--models ../shared/models]
"""

import argparse
import pathlib
import random
import struct

FUZZ = pathlib.Path(__file__).resolve().parent
OUT = FUZZ / "corpus" / "gguf"

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# ggml type id -> (elements per block, bytes per block)
LAYOUTS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 12: (256, 144),
           14: (256, 210), 13: (256, 176)}


def gstr(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def scalar(vtype: int, v) -> bytes:
    fmt = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}[vtype]
    return struct.pack(fmt, v)


def array(etype: int, items: list[bytes]) -> bytes:
    return struct.pack("<IQ", etype, len(items)) + b"".join(items)


def gguf(kvs, tensors, version=3, align=32) -> bytes:
    """kvs: [(key, vtype, payload)], tensors: [(name, dims, ggml_type, data bytes)]."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, vtype, payload in kvs:
        head += gstr(key.encode()) + struct.pack("<I", vtype) + payload
    data = b""
    for name, dims, ty, blob in tensors:
        data += b"\0" * (-len(data) % align)
        head += gstr(name.encode()) + struct.pack("<I", len(dims))
        head += b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", ty, len(data))
        data += blob
    return head + b"\0" * (-len(head) % align) + data


def tensor(rng: random.Random, name: str, ty: int, n_blocks: int):
    block, size = LAYOUTS[ty]
    blob = bytearray(rng.randbytes(size * n_blocks))
    if ty in (8, 2, 12, 13):  # keep f16 scales small and finite
        for b in range(n_blocks):
            blob[b * size + 1] = 0x20
            if ty in (12, 13):
                blob[b * size + 3] = 0x20
    if ty == 14:
        for b in range(n_blocks):
            blob[b * size + 209] = 0x20
    if ty == 0:
        blob = bytearray(b"".join(struct.pack("<f", rng.uniform(-1, 1)) for _ in range(n_blocks)))
    if ty in (1, 30):
        for i in range(1, len(blob), 2):
            blob[i] &= 0x3F
    return (name, [block * n_blocks], ty, bytes(blob))


def synthetic(rng: random.Random) -> dict[str, bytes]:
    kvs = [
        ("general.architecture", STRING, gstr(b"llama")),
        ("u8", U8, scalar(U8, 7)), ("i8", I8, scalar(I8, -7)),
        ("u16", U16, scalar(U16, 700)), ("i16", I16, scalar(I16, -700)),
        ("llama.embedding_length", U32, scalar(U32, 64)), ("i32", I32, scalar(I32, -1)),
        ("eps", F32, scalar(F32, 1e-5)), ("flag", BOOL, scalar(BOOL, True)),
        ("u64", U64, scalar(U64, 2**40)), ("i64", I64, scalar(I64, -(2**40))),
        ("f64", F64, scalar(F64, 0.5)),
        ("tokenizer.ggml.tokens", ARRAY, array(STRING, [gstr(b"<unk>"), gstr(b"a"), gstr("é".encode())])),
        ("tokenizer.ggml.scores", ARRAY, array(F32, [scalar(F32, x) for x in (0.0, -1.0, -2.0)])),
        ("nested", ARRAY, array(ARRAY, [array(U8, [b"\1", b"\2"]), array(I64, [])])),
    ]
    tensors = [tensor(rng, f"t.{ty}", ty, 2) for ty in (0, 1, 30, 8, 2, 12, 14)]
    seeds = {
        "synthetic-all-types": gguf(kvs, tensors),
        "synthetic-v2-align64": gguf([("general.alignment", U32, scalar(U32, 64))] + kvs[:3],
                                     tensors[:3], version=2, align=64),
        "synthetic-unsupported-q5k": gguf(kvs[:1], [tensor(rng, "q5k", 13, 1), tensors[0]]),
        "synthetic-empty": gguf([], []),
        "synthetic-q4k-q6k": gguf([], [tensor(rng, "a", 12, 4), tensor(rng, "b", 14, 4)]),
    }
    return seeds


def spec_seeds() -> dict[str, bytes]:
    """Headers that parse but whose llama spec Kiln must refuse (issue 14 item 9), and a file
    with NaN/Inf weights at the ends of its tensors."""
    base = [("embedding_length", U32, 64), ("attention.head_count", U32, 4),
            ("attention.head_count_kv", U32, 2), ("feed_forward_length", U32, 128),
            ("block_count", U32, 2), ("vocab_size", U32, 100), ("context_length", U32, 256)]

    def llama(**over) -> bytes:
        keys = dict((k, (t, v)) for k, t, v in base)
        keys.update({k.replace("__", "."): tv for k, tv in over.items()})
        kvs = [("general.architecture", STRING, gstr(b"llama"))]
        kvs += [(f"llama.{k}", t, scalar(t, v)) for k, (t, v) in keys.items()]
        return gguf(kvs, [])

    nan_last = struct.pack("<f", 1.0) * 255 + struct.pack("<f", float("nan"))
    inf_first = struct.pack("<e", float("inf")) + struct.pack("<e", 0.5) * 63
    return {
        "spec-block-count-u32-max": llama(block_count=(U32, 2**32 - 1)),
        "spec-block-count-u64-huge": llama(block_count=(U64, 2**62)),
        "spec-context-0": llama(context_length=(U32, 0)),
        "spec-context-1": llama(context_length=(U32, 1)),
        "spec-rope-dim-0": llama(rope__dimension_count=(U32, 0)),
        "spec-rope-dim-wider-than-head": llama(rope__dimension_count=(U32, 18)),
        "spec-rms-eps-nan": llama(attention__layer_norm_rms_epsilon=(F32, float("nan"))),
        "spec-rms-eps-negative": llama(attention__layer_norm_rms_epsilon=(F32, -1e-5)),
        "spec-gqa-not-a-divisor": llama(attention__head_count_kv=(U32, 3)),
        "spec-gqa-group-128": llama(embedding_length=(U32, 2048), attention__head_count=(U32, 128),
                                    attention__head_count_kv=(U32, 1)),
        "weights-nonfinite-ends": gguf([], [("nan_last", [256], 0, nan_last),
                                            ("inf_first", [64], 1, inf_first)]),
    }


def corrupt(rng: random.Random, data: bytes, limit: int, flips: int) -> bytes:
    out = bytearray(data)
    for _ in range(flips):
        at = rng.randrange(min(limit, len(out)))
        out[at] = rng.choice([0x00, 0xFF, out[at] ^ (1 << rng.randrange(8)), rng.randrange(256)])
    return bytes(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=pathlib.Path,
                    default=FUZZ.parent.parent / "shared" / "models")
    args = ap.parse_args()
    rng = random.Random(7)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("seed-*"):
        old.unlink()
    seeds = synthetic(rng)
    for name, data in list(seeds.items()):
        for i in range(2):
            seeds[f"{name}-corrupt{i}"] = corrupt(rng, data, len(data), 3)
    for fixture, cut in [("stories260K-Q4_0.gguf", 16384), ("stories260K-Q8_0.gguf", 15000),
                         ("llama-2-tiny-random.gguf", 8192)]:
        data = (args.models / fixture).read_bytes()
        stem = fixture.removesuffix(".gguf")
        seeds[f"{stem}-prefix{cut}"] = data[:cut]
        seeds[f"{stem}-prefix{cut}-corrupt"] = corrupt(rng, data[:cut], cut, 4)
    seeds["stories260K-prefix100"] = (args.models / "stories260K.gguf").read_bytes()[:100]
    seeds.update(spec_seeds())
    total = 0
    for name, data in sorted(seeds.items()):
        (OUT / f"seed-{name}").write_bytes(data)
        total += len(data)
    print(f"wrote {len(seeds)} seeds, {total} bytes, to {OUT}")


if __name__ == "__main__":
    main()
