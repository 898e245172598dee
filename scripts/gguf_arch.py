#!/usr/bin/env python3
"""GGUF versions of the family fixtures that scripts/golden_arch.py writes
(tests/data/arch/{qwen3,gemma2,gemma3,phi3}/), named and keyed as llama.cpp's
convert_hf_to_gguf.py names them, written with llama.cpp's gguf-py:

  tensors  token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
           attn_q_norm, attn_k_norm (qwen3, gemma3), post_attention_norm, ffn_norm
           (gemma: pre_feedforward_layernorm), post_ffw_norm, ffn_gate, ffn_up, ffn_down,
           attn_qkv and a fused ffn_up (phi3)}, output_norm, output (untied only),
           rope_factors_long / rope_factors_short (phi3 longrope)
  keys     <arch>.{context_length, embedding_length, block_count, feed_forward_length,
           attention.head_count(_kv), attention.key_length, value_length,
           attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count,
           attention.sliding_window, attn_logit_softcapping, final_logit_softcapping,
           rope.scaling.{type, factor, attn_factor, original_context_length}}
  Gemma norm weights get +1 as the converter adds it; 1-D tensors are F32, matrices keep
  the fixture's type (F32 or BF16). The llama.cpp snapshot in ../shared/peers predates
  qwen3 and gemma3, so these follow the later converter's conventions (Gemma 3: no
  sliding-window-pattern key (llama.cpp fixes 6), local rope base 10000, linear scaling
  on global layers). The fixtures hold no tokenizer: a placeholder SentencePiece-style
  vocabulary of vocab_size tokens (t0, t1, ...) is written so the file is complete.

  MoE (qwen3moe as `qwen3moe`, qwen2moe as `qwen2moe`, mixtral as `llama`, its q/k rows
  permuted for the adjacent-pair rope as the converter does): blk.N.ffn_gate_inp and the
  3-D ffn_{gate,up,down}_exps ([n_expert, rows, cols]); keys <arch>.expert_count,
  expert_used_count, expert_feed_forward_length (qwen3moe, qwen2moe). Qwen2-MoE adds
  attn_{q,k,v}.bias, the shared expert ffn_{gate,up,down}_shexp and its gate
  ffn_gate_inp_shexp ([1, hidden] as the converter writes it), and the key
  expert_shared_feed_forward_length.

Usage: python3 scripts/gguf_arch.py [path to llama.cpp's gguf-py [fixture names...]]
(default: the gguf-py of ../shared/peers/llama.cpp-*-src.tgz unpacked at /tmp/arch-llama)
"""

import json
import math
import os
import sys

import numpy as np
from safetensors import deserialize

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "/tmp/arch-llama/gguf-py")
import gguf  # noqa: E402

ARCH = {"qwen3": "qwen3", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3",
        "qwen3_moe": "qwen3moe", "mixtral": "llama", "qwen2_moe": "qwen2moe"}


def permute(w, n_head):
    """llama.cpp's converter reorders q/k rows of `llama` files for its adjacent-pair rope
    (LlamaModel.permute): each head's halves interleaved."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def moe_tensor(hf):
    """(layer, gguf leaf, expert or None) of a mixture-of-experts tensor, else None."""
    parts = hf.split(".")
    if parts[3] == "block_sparse_moe" and parts[4] == "gate":
        return parts[2], "ffn_gate_inp", None
    if parts[3] == "mlp" and parts[4] == "gate":
        return parts[2], "ffn_gate_inp", None
    if parts[4] == "experts":
        kind = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate",
                "up_proj": "up", "down_proj": "down"}[parts[6]]
        return parts[2], f"ffn_{kind}_exps", int(parts[5])
    return None


def read(d):
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        raw = f.read()
    out = {}
    for name, info in deserialize(raw):
        data, shape, dt = bytes(info["data"]), info["shape"], info["dtype"]
        a = np.frombuffer(data, dtype="<f4" if dt == "F32" else "<u2").reshape(shape)
        out[name] = (a, dt)
    return out


def to_f32(a, dt):
    return a if dt == "F32" else (a.astype(np.uint32) << 16).view(np.float32)


def write(name):
    d = os.path.join(ROOT, "tests", "data", "arch", name)
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    arch = ARCH[c["model_type"]]
    gemma = arch.startswith("gemma")
    t = read(d)
    out = os.path.join(ROOT, "tests", "data", "arch-gguf", f"{name}.gguf")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    w = gguf.GGUFWriter(out, arch)
    nh, n = c["num_attention_heads"], c["num_hidden_layers"]
    hd = c.get("head_dim") or c["hidden_size"] // nh
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(n)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c["rope_theta"])
    if arch in ("qwen3moe", "qwen2moe"):
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    if c["model_type"] == "mixtral":
        w.add_expert_count(c["num_local_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_rope_dimension_count(hd)
    if arch != "phi3":
        w.add_key_length(hd)
        w.add_value_length(hd)
    if gemma:
        if c.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
        if c.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(c["final_logit_softcapping"])
        w.add_sliding_window(c["sliding_window"])
        rs = c.get("rope_scaling")
        if rs and rs.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rs["factor"])
    if arch == "phi3":
        orig = c["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_rope_dimension_count(c["hidden_size"] // nh)
        w.add_sliding_window(c.get("sliding_window") or 0)
        s = c["max_position_embeddings"] / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(s) / math.log(orig)) if s > 1 else 1.0)
        rs = c["rope_scaling"]
        w.add_tensor("rope_factors_long.weight", np.asarray(rs["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rs["short_factor"], np.float32))
    # placeholder vocabulary
    V = c["vocab_size"]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"t{i}".encode() for i in range(V)])
    w.add_token_scores([-float(i) for i in range(V)])
    w.add_token_types([gguf.TokenType.NORMAL] * V)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    leaf = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
            "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
            "self_attn.k_norm": "attn_k_norm", "self_attn.qkv_proj": "attn_qkv",
            "post_attention_layernorm": "post_attention_norm" if gemma else "ffn_norm",
            "pre_feedforward_layernorm": "ffn_norm",
            "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
            "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
            "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
            "mlp.shared_expert.up_proj": "ffn_up_shexp",
            "mlp.shared_expert.down_proj": "ffn_down_shexp",
            "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
    experts = {}
    for hf in sorted(t):
        a, dt = t[hf]
        moe = moe_tensor(hf) if hf.startswith("model.layers.") else None
        if moe and moe[2] is not None:
            experts.setdefault((moe[0], moe[1]), {})[moe[2]] = (a, dt)
            continue
        if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = nh if "q_proj" in hf else c["num_key_value_heads"]
            a = permute(a, heads)
        if moe:
            g = f"blk.{moe[0]}.{moe[1]}.weight"
        elif hf == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif hf == "model.norm.weight":
            g = "output_norm.weight"
        elif hf == "lm_head.weight":
            g = "output.weight"
        else:
            parts = hf.split(".")
            assert parts[:2] == ["model", "layers"] and parts[-1] in ("weight", "bias"), hf
            g = f"blk.{parts[2]}.{leaf['.'.join(parts[3:-1])]}.{parts[-1]}"
        if a.ndim == 1 or (gemma and hf.endswith("norm.weight")) or "shared_expert_gate" in hf:
            v = to_f32(a, dt)
            if gemma and hf.endswith("norm.weight"):
                v = (v + np.float32(1.0)).astype(np.float32)
            w.add_tensor(g, np.ascontiguousarray(v, dtype=np.float32))
        elif dt == "BF16":
            w.add_tensor(g, np.ascontiguousarray(a), raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(g, np.ascontiguousarray(a, dtype=np.float32))
    # llama.cpp's 3-D expert tensors: [n_expert, rows, cols] (ggml ne = cols, rows, n_expert)
    for (layer, leaf), by_e in sorted(experts.items()):
        stack = np.stack([by_e[e][0] for e in range(len(by_e))])
        g = f"blk.{layer}.{leaf}.weight"
        if by_e[0][1] == "BF16":
            w.add_tensor(g, np.ascontiguousarray(stack), raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(g, np.ascontiguousarray(stack, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    only = sys.argv[2:]
    for m in only or ["qwen3", "gemma2", "gemma3", "phi3", "qwen3moe", "mixtral", "qwen2moe"]:
        write(m)
