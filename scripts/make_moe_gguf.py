#!/usr/bin/env python3
"""Writes a random-weight GGUF directly in quantized types, laid out as llama.cpp's Q4_K_M
would lay it out, so Kiln and llama.cpp load the very same file for a speed comparison.
No F16 file and no llama-quantize step: blocks are random bytes with valid scales.

Shapes (`--shape`):
  qwen3-30b-a3b  Qwen3-30B-A3B's mixture-of-experts shape written as a Mixtral-style `llama`
                 file (llama.cpp c392e50 predates `qwen3moe`): hidden 2048, 48 layers, 32 q
                 heads / 4 kv heads of 128, 128 experts of width 768, top-8 (weights
                 renormalised, as both engines do for `llama` MoE), rope theta 1e6, eps 1e-6.
                 Differences from the real model: no per-head q/k RMSNorm, the Llama-3 vocab
                 (128256 rows) instead of Qwen's 151936, the adjacent-pair rope of `llama`
                 files (same cost) and a Llama-3 chat template.
  llama3-8b      the Llama-3-8B shape of ../shared/peers/make_gguf.py (for issue 15's
                 serve and cold-start comparison without its 16 GB F16 + llama-quantize step).
  gpt-oss-20b    gpt-oss-20b as ggml-org's MXFP4 GGUF lays it out (arch `gpt-oss`, llama.cpp's
  gpt-oss-120b   MXFP4_MOE mix: experts MXFP4, every other matrix Q8_0 (token_embd and output
                 too), the router, biases, sinks and norms F32): hidden 2880, 24 (120b: 36)
                 layers, 64 q heads / 8 kv heads of 64, 32 (120b: 128) experts of width 2880,
                 top-4, q/k/v/o biases, per-head sinks, sliding window 128 on even layers, rope
                 theta 150000 with YaRN (factor 32, original context 4096), the o200k_harmony
                 vocabulary (201088 rows) and chat template. The vocabulary comes from a
                 vocab-only gpt-oss GGUF (`--vocab-gguf`, as scripts/o200k_files.py writes it).

Types follow llama.cpp's Q4_K_M rule for these shapes (src/llama-quant.cpp at c392e50):
Q4_K by default (token_embd too), Q6_K for `output` and for attn_v and ffn_down(_exps) on the
"more bits" layers (i < n/8, i >= 7n/8, (i - n/8) % 3 == 2), F32 for norms and the router
(llama.cpp never quantizes ffn_gate_inp). Dequantized weights are centred with a standard
deviation near 0.02, so activations stay finite and the router spreads tokens over experts.
Every layer reuses the same random blocks (speed does not depend on the values) except the
router, drawn per layer.

Prints the file's tensor bytes by type and the bytes a decode step must read (active weights
at batch 1; at batch B the expected distinct experts, 128 * (1 - (1 - 8/128)^B), under
uniform routing), as `BYTES key=value` lines a runner can grep.

Usage: make_moe_gguf.py OUT.gguf [--shape qwen3-30b-a3b|llama3-8b|gpt-oss-20b|gpt-oss-120b]
       [--layers N] [--seed S] [--vocab-gguf VOCAB.gguf (gpt-oss shapes)]
Needs numpy and llama.cpp's gguf-py (PYTHONPATH=<llama.cpp>/gguf-py; it imports pyyaml and
sentencepiece), and the Llama-3 BPE vocab (LLAMA3_TOKENIZER_DIR, default
../shared/models/tokenizers/llama3.2 next to the repo).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import gguf

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TOK = os.environ.get("LLAMA3_TOKENIZER_DIR",
                     os.path.join(ROOT, "..", "shared", "models", "tokenizers", "llama3.2"))

Q = gguf.GGMLQuantizationType
QK_K = 256
BLOCK_BYTES = {Q.Q4_K: 144, Q.Q6_K: 210}

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

SHAPES = {
    # hidden, ff (expert width for MoE), heads, kv heads, head_dim, vocab, layers,
    # experts, top-k, rope theta, eps, context
    "qwen3-30b-a3b": dict(d=2048, ff=768, nh=32, nkv=4, hd=128, nv=128256, nl=48,
                          ne=128, k=8, theta=1e6, eps=1e-6, ctx=40960),
    "llama3-8b": dict(d=4096, ff=14336, nh=32, nkv=8, hd=128, nv=128256, nl=32,
                      ne=0, k=0, theta=500000.0, eps=1e-5, ctx=8192),
    "gpt-oss-20b": dict(d=2880, ff=2880, nh=64, nkv=8, hd=64, nv=201088, nl=24,
                        ne=32, k=4, theta=150000.0, eps=1e-5, ctx=131072),
    "gpt-oss-120b": dict(d=2880, ff=2880, nh=64, nkv=8, hd=64, nv=201088, nl=36,
                         ne=128, k=4, theta=150000.0, eps=1e-5, ctx=131072),
}
GPT_OSS_TEMPLATE = os.environ.get("GPT_OSS_TEMPLATE") or os.path.join(ROOT, "..", "shared", "models", "chat-templates",
                                "openai-gpt-oss-120b.jinja")


def vocab():
    """The Llama-3 BPE vocabulary: 128000 pieces, 256 special tokens, the merges."""
    with open(os.path.join(TOK, "encoder.json"), encoding="utf-8") as f:
        enc = json.load(f)
    tokens = [None] * len(enc)
    for piece, i in enc.items():
        tokens[i] = piece
    assert len(tokens) == 128000 and all(t is not None for t in tokens)
    special = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>",
               7: "<|end_header_id|>", 9: "<|eot_id|>"}
    reserved = 0
    for k in range(256):
        if k in special:
            tokens.append(special[k])
        else:
            tokens.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    types = [1] * 128000 + [3] * 256
    with open(os.path.join(TOK, "vocab.bpe"), encoding="utf-8") as f:
        merges = [line.rstrip("\n") for line in f if line.strip()]
    return tokens, types, merges


def f16_bytes(values):
    """[n] float values as [n, 2] little-endian f16 bytes."""
    return np.asarray(values, dtype="<f2").view(np.uint8).reshape(-1, 2)


def q4_k(rng, lead, rows, cols):
    """Random Q4_K blocks for a [*lead, rows, cols] matrix as uint8 [*lead, rows, bytes/row].

    Block (144 bytes): d, dmin (f16), 12 bytes of packed 6-bit (scale, min) pairs for 8
    sub-blocks of 32, 128 bytes of 4-bit quants; w = d * sc * q - dmin * m. With dmin = d and
    m = round(7.5 * sc) each sub-block is centred; sc in 1..8, d near 8.6e-4: std ~ 0.02."""
    n = int(np.prod(lead, dtype=np.int64)) * rows * cols // QK_K
    b = np.frombuffer(rng.bytes(n * 144), dtype=np.uint8).reshape(n, 144).copy()
    d = rng.uniform(0.75, 1.25, n).astype(np.float32) * 8.6e-4
    b[:, 0:2] = f16_bytes(d)
    b[:, 2:4] = f16_bytes(d)
    sc = rng.integers(1, 9, (n, 8), dtype=np.uint8)
    m = np.rint(7.5 * sc).astype(np.uint8)
    # ggml's get_scale_min_k4, inverted: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scale)
    # and 4-7 (min); 4-7 as low nibbles in bytes 8-11 and their top 2 bits above 0-3 / 4-7.
    s = b[:, 4:16]
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return b.reshape(*lead, rows, cols // QK_K * 144)


def q6_k(rng, lead, rows, cols):
    """Random Q6_K blocks (210 bytes: 128 low-nibble, 64 high-bit bytes, 16 int8 scales,
    f16 d; w = d * sc * (q - 32)): scales 1..16, d near 1.1e-4: centred, std ~ 0.02."""
    n = int(np.prod(lead, dtype=np.int64)) * rows * cols // QK_K
    b = np.frombuffer(rng.bytes(n * 210), dtype=np.uint8).reshape(n, 210).copy()
    b[:, 192:208] = rng.integers(1, 17, (n, 16), dtype=np.uint8)
    b[:, 208:210] = f16_bytes(rng.uniform(0.75, 1.25, n).astype(np.float32) * 1.1e-4)
    return b.reshape(*lead, rows, cols // QK_K * 210)


def q8_0(rng, lead, rows, cols):
    """Random Q8_0 blocks (34 bytes: f16 d, 32 int8; w = d * q): d near 2.7e-4, std ~ 0.02."""
    n = int(np.prod(lead, dtype=np.int64)) * rows * cols // 32
    b = np.frombuffer(rng.bytes(n * 34), dtype=np.uint8).reshape(n, 34).copy()
    b[:, 0:2] = f16_bytes(rng.uniform(0.75, 1.25, n).astype(np.float32) * 2.7e-4)
    return b.reshape(*lead, rows, cols // 32 * 34)


def mxfp4(rng, lead, rows, cols):
    """Random MXFP4 blocks (17 bytes: an E8M0 exponent e, 16 bytes of E2M1 nibbles; w =
    k * 2^(e - 128) with k in ggml's table 0, +-1, 2, 3, 4, 6, 8, 12): e in 119..121, so
    |w| is mostly below 0.05 and the std near 0.02."""
    n = int(np.prod(lead, dtype=np.int64)) * rows * cols // 32
    b = np.frombuffer(rng.bytes(n * 17), dtype=np.uint8).reshape(n, 17).copy()
    b[:, 0] = rng.integers(119, 122, n, dtype=np.uint8)
    return b.reshape(*lead, rows, cols // 32 * 17)


def shape_keys(w, s, nl):
    """The keys every shape writes: context, widths, layers, heads, rope base, eps."""
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["d"])
    w.add_block_count(nl)
    w.add_feed_forward_length(s["ff"])
    w.add_head_count(s["nh"])
    w.add_head_count_kv(s["nkv"])
    w.add_key_length(s["hd"])
    w.add_value_length(s["hd"])
    w.add_rope_dimension_count(s["hd"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])


def adder(w, by_type, active):
    """`add(name, array, type, kind)`: writes a tensor (type None: F32) and counts its bytes
    by type and, but for the embedding table, into a decode step's `active[kind]`."""
    def add(name, arr, ty, kind="dense"):
        if ty is None:
            w.add_tensor(name, arr)
            tname = "F32"
        else:
            w.add_tensor(name, arr, raw_dtype=ty)
            tname = ty.name
        by_type[tname] = by_type.get(tname, 0) + arr.nbytes
        if name != "token_embd.weight":
            active[kind] += arr.nbytes
    return add


def gpt_oss_vocab(path):
    """Tokens, types, merges and special ids of a vocab-only gpt-oss GGUF."""
    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields[key]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            return [int(f.parts[i][0]) for i in f.data]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode("utf-8")
        return int(f.parts[f.data[0]][0])

    ids = {k: field(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding")
           if f"tokenizer.ggml.{k}_token_id" in r.fields}
    return (field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type"),
            field("tokenizer.ggml.merges"), ids)


def gpt_oss(a, s, nl):
    """The gpt-oss shapes (see the docstring): MXFP4 experts, Q8_0 elsewhere."""
    if not a.vocab_gguf:
        sys.exit("--vocab-gguf VOCAB.gguf is needed for the gpt-oss shapes")
    d, ff, nh, nkv, hd, nv, ne, k = (s[x] for x in ("d", "ff", "nh", "nkv", "hd", "nv", "ne", "k"))
    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    tokens, types, merges, ids = gpt_oss_vocab(a.vocab_gguf)
    assert len(tokens) == nv, f"{a.vocab_gguf}: {len(tokens)} tokens, expected {nv}"
    arch = "gpt-oss"
    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"dummy-{a.shape}-mxfp4")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    shape_keys(w, s, nl)
    w.add_expert_feed_forward_length(ff)
    w.add_sliding_window(128)
    w.add_expert_count(ne)
    w.add_expert_used_count(k)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_vocab_size(nv)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, v in ids.items():
        getattr(w, {"bos": "add_bos_token_id", "eos": "add_eos_token_id",
                    "padding": "add_pad_token_id"}[key])(v)
    with open(GPT_OSS_TEMPLATE, encoding="utf-8") as f:
        w.add_chat_template(f.read())

    by_type, active = {}, {"dense": 0, "experts": 0}
    add = adder(w, by_type, active)

    def small(*shape):
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    q_dim, kv_dim = nh * hd, nkv * hd
    norm = np.ones(d, dtype=np.float32)
    add("token_embd.weight", q8_0(rng, (), nv, d), Q.Q8_0)
    wq, wk, wv = q8_0(rng, (), q_dim, d), q8_0(rng, (), kv_dim, d), q8_0(rng, (), kv_dim, d)
    wo = q8_0(rng, (), d, q_dim)
    gate, up, down = mxfp4(rng, (ne,), ff, d), mxfp4(rng, (ne,), ff, d), mxfp4(rng, (ne,), d, ff)
    for i in range(nl):
        add(f"blk.{i}.attn_norm.weight", norm, None)
        add(f"blk.{i}.attn_q.weight", wq, Q.Q8_0)
        add(f"blk.{i}.attn_k.weight", wk, Q.Q8_0)
        add(f"blk.{i}.attn_v.weight", wv, Q.Q8_0)
        add(f"blk.{i}.attn_q.bias", small(q_dim), None)
        add(f"blk.{i}.attn_k.bias", small(kv_dim), None)
        add(f"blk.{i}.attn_v.bias", small(kv_dim), None)
        add(f"blk.{i}.attn_output.weight", wo, Q.Q8_0)
        add(f"blk.{i}.attn_output.bias", small(d), None)
        add(f"blk.{i}.attn_sinks.weight", small(nh), None)
        add(f"blk.{i}.post_attention_norm.weight", norm, None)
        add(f"blk.{i}.ffn_gate_inp.weight", small(ne, d), None)
        add(f"blk.{i}.ffn_gate_inp.bias", small(ne), None)
        add(f"blk.{i}.ffn_gate_exps.weight", gate, Q.MXFP4, "experts")
        add(f"blk.{i}.ffn_up_exps.weight", up, Q.MXFP4, "experts")
        add(f"blk.{i}.ffn_down_exps.weight", down, Q.MXFP4, "experts")
        add(f"blk.{i}.ffn_gate_exps.bias", small(ne, ff), None, "experts")
        add(f"blk.{i}.ffn_up_exps.bias", small(ne, ff), None, "experts")
        add(f"blk.{i}.ffn_down_exps.bias", small(ne, d), None, "experts")
    add("output_norm.weight", norm, None)
    add("output.weight", q8_0(rng, (), nv, d), Q.Q8_0)
    finish(w, a, t0, by_type, active, kv_dim, nl, ne, k)


def finish(w, a, t0, by_type, active, kv_dim, nl, ne, k):
    """Writes the file and prints its bytes by type and a decode step's bytes."""
    t1 = time.time()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    t2 = time.time()
    size = os.path.getsize(a.out)
    print(f"wrote {a.out}: {size / 1e9:.2f} GB ({t1 - t0:.1f} s to draw, {t2 - t1:.1f} s to write)")
    print("BYTES file=%d %s" % (size, " ".join(f"{t}={b}" for t, b in sorted(by_type.items()))))
    # A decode step reads every dense weight, the router and the experts some token chose.
    kv_token = 2 * kv_dim * 2 * nl  # f16/bf16 K and V of one token, all layers
    line = f"BYTES dense={active['dense']} experts_all={active['experts']} kv_per_token={kv_token}"
    if ne:
        for b in (1, 16, 32, 64):
            hit = ne * (1 - (1 - k / ne) ** b)
            step = active["dense"] + active["experts"] * hit / ne
            line += f" step_b{b}={step:.0f} experts_hit_b{b}={hit:.1f}"
    else:
        line += f" step_b1={active['dense'] + active['experts']}"
    print(line)


def more_bits(i, n):
    """llama.cpp's use_more_bits: the layers Q4_K_M gives Q6_K attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-gguf", default=None)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    d, ff, nh, nkv, hd, nv, ne, k = (s[x] for x in ("d", "ff", "nh", "nkv", "hd", "nv", "ne", "k"))
    nl = a.layers if a.layers is not None else s["nl"]
    if a.shape.startswith("gpt-oss"):
        return gpt_oss(a, s, nl)
    t0 = time.time()
    rng = np.random.default_rng(a.seed)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"dummy-{a.shape}-q4_k_m")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    shape_keys(w, s, nl)
    w.add_vocab_size(nv)
    if ne:
        w.add_expert_count(ne)
        w.add_expert_used_count(k)
    tokens, types, merges = vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(128000)
    w.add_eos_token_id(128009)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)

    by_type = {}     # bytes in the file by type name
    active = {"dense": 0, "experts": 0}   # per decode step at batch 1 (experts: all of them)
    add = adder(w, by_type, active)

    q_dim, kv_dim = nh * hd, nkv * hd
    norm = np.ones(d, dtype=np.float32)
    add("token_embd.weight", q4_k(rng, (), nv, d), Q.Q4_K)
    wq, wk, wo = q4_k(rng, (), q_dim, d), q4_k(rng, (), kv_dim, d), q4_k(rng, (), d, q_dim)
    wv = {Q.Q4_K: q4_k(rng, (), kv_dim, d), Q.Q6_K: q6_k(rng, (), kv_dim, d)}
    lead = (ne,) if ne else ()
    gate, up = q4_k(rng, lead, ff, d), q4_k(rng, lead, ff, d)
    down = {Q.Q4_K: q4_k(rng, lead, d, ff), Q.Q6_K: q6_k(rng, lead, d, ff)}
    suffix = "_exps" if ne else ""
    for i in range(nl):
        big = Q.Q6_K if more_bits(i, nl) else Q.Q4_K
        add(f"blk.{i}.attn_norm.weight", norm, None)
        add(f"blk.{i}.attn_q.weight", wq, Q.Q4_K)
        add(f"blk.{i}.attn_k.weight", wk, Q.Q4_K)
        add(f"blk.{i}.attn_v.weight", wv[big], big)
        add(f"blk.{i}.attn_output.weight", wo, Q.Q4_K)
        add(f"blk.{i}.ffn_norm.weight", norm, None)
        kind = "experts" if ne else "dense"
        if ne:
            router = (rng.standard_normal((ne, d), dtype=np.float32) * 0.02)
            add(f"blk.{i}.ffn_gate_inp.weight", router, None)
        add(f"blk.{i}.ffn_gate{suffix}.weight", gate, Q.Q4_K, kind)
        add(f"blk.{i}.ffn_up{suffix}.weight", up, Q.Q4_K, kind)
        add(f"blk.{i}.ffn_down{suffix}.weight", down[big], big, kind)
    add("output_norm.weight", norm, None)
    add("output.weight", q6_k(rng, (), nv, d), Q.Q6_K)
    finish(w, a, t0, by_type, active, kv_dim, nl, ne, k)


if __name__ == "__main__":
    sys.exit(main())
