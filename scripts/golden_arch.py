#!/usr/bin/env python3
"""Random-weight Hugging Face model directories for architectures the real fixtures
don't cover, plus independent NumPy (float64) golden outputs for them.

What this is
------------
`scripts/golden.py` checks Kiln against real Llama files. This script builds four
tiny random-weight HF directories, each covering a feature those files lack:

  qwen2-tied     model_type qwen2: q/k/v biases, tie_word_embeddings (no lm_head
                 tensor), rope_theta 1e6, GQA 8 heads / 2 kv heads, head_dim 8.
  llama3-scaled  model_type llama with rope_scaling llama3 (factor 8, low 1, high 4,
                 original_max_position_embeddings 64), rope_theta 5e5, head_dim 16,
                 GQA 4:1, separate lm_head. The test prompts reach position 121, well
                 past the original 64, and the head_dim-16 frequencies fall in all
                 three Llama-3 regimes (kept / smoothed / divided by factor).
  mistral-bf16   model_type mistral, every tensor stored as BF16 (rounded to
                 nearest-even from the float32 draw), untied, GQA 2:1, head_dim 16.
  llama-sharded  model_type llama in two safetensors shards plus
                 model.safetensors.index.json (one layer's attention is split
                 across the shards), head_dim 32, MHA.

  phi4mini       model_type phi3 as Phi-4-mini lays it out: partial_rotary_factor 0.75
                 (rope over 12 of 16 head dims, 6 longrope factors: the long ones, past
                 the original context, with attention factor 1.19 on the rotated dims
                 only), tied embeddings, no sliding window.
  qwen3moe       model_type qwen3_moe: 8 experts, top 2, norm_topk_prob true, q/k norms,
                 BF16; the longest prompt sends tokens to every expert of every layer,
                 while each decode step leaves 6 of 8 experts without a token.
  mixtral        model_type mixtral: 4 experts, top 2 (softmax over the top-2 logits),
                 block_sparse_moe.experts.E.w1/w3/w2, F32, no sliding window.
  qwen2moe       model_type qwen2_moe: 8 experts, top 4, norm_topk_prob false, q/k/v
                 biases, and a shared expert (mlp.shared_expert.{gate,up,down}_proj, width
                 48) scaled per token by sigmoid(h . mlp.shared_expert_gate), BF16.
  gptoss         model_type gpt_oss (the released checkpoints' config keys: rope_scaling,
                 experts_per_token, initial_context_length, swiglu_limit): 4 layers
                 alternating sliding (window 8) and full attention, per-head sinks, q/k/v/o
                 biases, YaRN (factor 4, original context 2048, truncate false: the ramp
                 spans frequency dims 1.6-3.9 of 8), 8 experts top 4 with router and expert
                 biases, gate_up interleaved and transposed as HF stores it, the clamped
                 SwiGLU (limit 7.0 as llama.cpp fixes it; gate_up 4x wider, so the clamp is hit), BF16, hidden 32 != 4 heads x 16;
                 with a tiny byte-level BPE tokenizer.json (for llama.cpp's converter,
                 scripts/gptoss_gguf.py). Reference: forward_gptoss below.
  gptoss-mxfp4   the same layout as released: experts in MXFP4 (`*_blocks` / `*_scales`,
                 quantization_config mxfp4), expert width 32; the reference decodes the
                 OpenAI layout itself (mxfp4_dequantize), equal to transformers'
                 convert_moe_packed_tensors on every expert tensor (max abs diff 0, 5.24).

Written: tests/data/arch/<name>/{config.json, *.safetensors[, index]} (no tokenizer)
and tests/golden/arch-<name>.json (the schema of tests/golden/*.json).

The reference reads the model back FROM THE WRITTEN FILES (config.json parsed
field by field; safetensors decoded from raw bytes via `safetensors.deserialize`,
BF16 -> float32 by a 16-bit shift; shards found through the index's weight_map)
and computes in float64 with the Hugging Face conventions, written from the math
and sharing no code with Kiln:
    h = RMSNorm(x) * w                    RMSNorm(v) = v / sqrt(mean(v^2) + eps)
    q = h Wq^T + bq, k = h Wk^T + bk, v = h Wv^T + bv   (biases: qwen2 only)
    q, k = RoPE(q), RoPE(k)               rotate_half: pairs (x[i], x[i + d/2])
        inv_freq_i = theta^(-2i/d), angle = pos * inv_freq_i, pos 0-based
        llama3 scaling: wavelen = 2 pi / f; wavelen < orig/high: keep;
        wavelen > orig/low: f / factor; else s = (orig/wavelen - low)/(high - low),
        f = (1 - s) f / factor + s f
    att = softmax(q k^T / sqrt(head_dim) + causal) v     (kv head = q head // group)
    x += att Wo^T ; x += (silu(h Wg^T) * (h Wu^T)) Wd^T  (h = RMSNorm(x) * post norm)
    logits = RMSNorm(x) * norm @ (lm_head or embed_tokens)^T

Generation: the prompt ids as given (no BOS), 32 greedy steps (argmax, ties ->
lowest id), full forward recomputed each step (no KV cache).

Rerun (deterministic: fixed seeds, no timestamps):
    python3 scripts/golden_arch.py          # from anywhere; writes into the repo
    python3 scripts/golden_arch.py qwen3moe mixtral      # only the named fixtures

requirements (versions used for the checked-in files): python 3.11.7,
numpy 2.4.6, safetensors 0.8.0 (torch/transformers not used).
"""

import hashlib
import json
import math
import os
import platform
import shutil

import numpy as np
import safetensors
from safetensors import TensorSpec, deserialize, serialize_file

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DATA_DIR = os.path.join(ROOT, "tests", "data", "arch")
GOLDEN_DIR = os.path.join(ROOT, "tests", "golden")

N_NEW = 32
PROMPT_LENS = [5, 37, 90]
STEP_LOGITS_STEPS = [1, 2, 3, 4, 8, 16, N_NEW - 1]
SIG_DIGITS = 8
MAX_FILE_BYTES = 300 * 1024
MIN_EXACT = 16          # the test requires ids exact for at least this many steps

MODELS = [
    dict(
        name="qwen2-tied", seed=1001, dtype="F32", shards=None,
        config=dict(
            architectures=["Qwen2ForCausalLM"], model_type="qwen2",
            hidden_size=64, intermediate_size=88, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, head_dim=8,
            vocab_size=256, max_position_embeddings=512,
            rms_norm_eps=1e-6, rope_theta=1000000.0,
            tie_word_embeddings=True, hidden_act="silu", torch_dtype="float32",
        ),
    ),
    dict(
        name="llama3-scaled", seed=1002, dtype="F32", shards=None,
        config=dict(
            architectures=["LlamaForCausalLM"], model_type="llama",
            hidden_size=64, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16,
            vocab_size=256, max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_theta=500000.0,
            rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=64),
            tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            hidden_act="silu", torch_dtype="float32",
        ),
    ),
    dict(
        name="mistral-bf16", seed=1003, dtype="BF16", shards=None,
        config=dict(
            architectures=["MistralForCausalLM"], model_type="mistral",
            hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=384, max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=None,
            tie_word_embeddings=False, hidden_act="silu", torch_dtype="bfloat16",
        ),
    ),
    dict(
        name="llama-sharded", seed=1004, dtype="F32",
        # shard 1: embeddings, layer 0, and layer 1's q/k projections; shard 2: the rest.
        shards=lambda n: 1 if (n == "model.embed_tokens.weight" or n.startswith("model.layers.0.")
                               or n.startswith("model.layers.1.self_attn.q_proj")
                               or n.startswith("model.layers.1.self_attn.k_proj")) else 2,
        config=dict(
            architectures=["LlamaForCausalLM"], model_type="llama",
            hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, head_dim=32,
            vocab_size=256, max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_theta=10000.0,
            tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            hidden_act="silu", torch_dtype="float32",
        ),
    ),
    dict(
        name="qwen3", seed=1005, dtype="BF16", shards=None,
        config=dict(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3",
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=128,
            vocab_size=256, max_position_embeddings=512,
            rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False,
            use_sliding_window=False, sliding_window=None, max_window_layers=2,
            tie_word_embeddings=False, hidden_act="silu", torch_dtype="bfloat16",
        ),
    ),
    dict(
        name="gemma2", seed=1006, dtype="BF16", shards=None,
        config=dict(
            architectures=["Gemma2ForCausalLM"], model_type="gemma2",
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=256,
            vocab_size=256, max_position_embeddings=512,
            rms_norm_eps=1e-6, rope_theta=10000.0, query_pre_attn_scalar=256,
            attn_logit_softcapping=2.5, final_logit_softcapping=5.0, sliding_window=16,
            hidden_activation="gelu_pytorch_tanh", hidden_act="gelu_pytorch_tanh",
            tie_word_embeddings=True, attention_bias=False, torch_dtype="bfloat16",
            bos_token_id=1, eos_token_id=2, pad_token_id=0,
        ),
    ),
    dict(
        name="gemma3", seed=1007, dtype="F32", shards=None,
        config=dict(
            architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
            hidden_size=32, intermediate_size=32, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=256, max_position_embeddings=512,
            rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
            rope_scaling=dict(rope_type="linear", factor=8.0),
            query_pre_attn_scalar=16, sliding_window=24, sliding_window_pattern=6,
            attn_logit_softcapping=None, final_logit_softcapping=None,
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True, attention_bias=False, torch_dtype="float32",
            bos_token_id=1, eos_token_id=2, pad_token_id=0,
        ),
    ),
    dict(
        name="phi3", seed=1008, dtype="F32", shards=None,
        config=dict(
            architectures=["Phi3ForCausalLM"], model_type="phi3",
            hidden_size=64, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=512, original_max_position_embeddings=4,
            rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=48,
            rope_scaling=dict(type="longrope",
                              short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                              long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0]),
            tie_word_embeddings=False, hidden_act="silu", torch_dtype="float32",
            bos_token_id=1, eos_token_id=2, pad_token_id=0,
        ),
    ),
    dict(
        # Phi-4-mini's layout: rope over the first 3/4 of each head (partial_rotary_factor,
        # longrope factors for those 12 of 16 dims), tied embeddings, no window. The context
        # is past the original, so the long factors apply with an attention factor on the 12
        # rotated dims only (transformers multiplies cos and sin by it), which differs from
        # folding it into the q.k scale (the sensitivity record's
        # attention_factor_on_whole_scores). The factor is given (rope_scaling's
        # attention_factor) as the real model's: sqrt(1 + ln 32 / ln 4096) = 1.19; the one
        # computed from this context would be 2.12, and scores 4.5 times sharper make the
        # bf16 GPU check noisy.
        name="phi4mini", seed=1030, dtype="F32", shards=None,
        config=dict(
            architectures=["Phi3ForCausalLM"], model_type="phi3",
            hidden_size=64, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.75,
            vocab_size=256, max_position_embeddings=512, original_max_position_embeddings=4,
            rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=None,
            rope_scaling=dict(type="longrope",
                              short_factor=[1.0, 1.2, 1.5, 2.0, 2.6, 3.3],
                              long_factor=[1.0, 2.0, 3.5, 6.0, 10.0, 16.0],
                              attention_factor=1.19),
            tie_word_embeddings=True, hidden_act="silu", torch_dtype="float32",
            bos_token_id=1, eos_token_id=2, pad_token_id=0,
        ),
    ),
    dict(
        name="qwen3moe", seed=1012, dtype="BF16", shards=None,
        config=dict(
            architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
            hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=256, max_position_embeddings=512,
            rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False,
            use_sliding_window=False, sliding_window=None, max_window_layers=2,
            router_aux_loss_coef=0.001, output_router_logits=False,
            tie_word_embeddings=False, hidden_act="silu", torch_dtype="bfloat16",
        ),
    ),
    dict(
        name="mixtral", seed=1026, dtype="F32", shards=None,
        config=dict(
            architectures=["MixtralForCausalLM"], model_type="mixtral",
            hidden_size=32, intermediate_size=24, num_local_experts=4,
            num_experts_per_tok=2, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            vocab_size=256, max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
            router_aux_loss_coef=0.02, router_jitter_noise=0.0,
            tie_word_embeddings=False, hidden_act="silu", torch_dtype="float32",
        ),
    ),
    dict(
        name="qwen2moe", seed=1028, dtype="BF16", shards=None,
        config=dict(
            architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
            hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
            shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=4,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=512, qkv_bias=True,
            rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False,
            sliding_window=None, max_window_layers=2, router_aux_loss_coef=0.001,
            output_router_logits=False, tie_word_embeddings=False, hidden_act="silu",
            torch_dtype="bfloat16",
        ),
    ),
    dict(
        name="gptoss", seed=1040, dtype="BF16", shards=None, tokenizer=True,
        config=dict(
            architectures=["GptOssForCausalLM"], model_type="gpt_oss",
            hidden_size=32, intermediate_size=16, num_local_experts=8,
            num_experts_per_tok=4, experts_per_token=4, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=300, max_position_embeddings=8192, initial_context_length=2048,
            rms_norm_eps=1e-5, rope_theta=150000.0,
            rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                              truncate=False, original_max_position_embeddings=2048),
            sliding_window=8, swiglu_limit=7.0, attention_bias=True,
            layer_types=["sliding_attention", "full_attention"] * 2,
            router_aux_loss_coef=0.9, output_router_logits=False,
            tie_word_embeddings=False, hidden_act="silu", torch_dtype="bfloat16",
            attention_dropout=0.0, initializer_range=0.02, use_cache=True,
            eos_token_id=1, pad_token_id=0,
        ),
    ),
]
# gpt-oss as released: the experts in MXFP4 (`*_blocks` [E, rows, cols/32, 16] uint8 with two
# E2M1 codes a byte, element 2j in the low nibble; `*_scales` [E, rows, cols/32] E8M0),
# quantization_config mxfp4; expert width 32 (MXFP4 blocks of 32 along each row).
_GPTOSS = next(m for m in MODELS if m["name"] == "gptoss")
MODELS.append(dict(
    name="gptoss-mxfp4", seed=1048, dtype="BF16", shards=None, mxfp4=True,
    config=dict(_GPTOSS["config"], intermediate_size=32, quantization_config=dict(
        quant_method="mxfp4", modules_to_not_convert=[
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"])),
))


# ---------------------------------------------------------------------------
# random weights and writing
# ---------------------------------------------------------------------------

def make_weights(cfg, seed):
    """float32 tensors by HF name, in a fixed draw order."""
    rng = np.random.default_rng(seed)
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // nh
    mt = cfg["model_type"]
    bias = mt in ("qwen2", "qwen2_moe")
    gemma = mt in ("gemma2", "gemma3_text")

    def mat(r, c):
        return rng.normal(0.0, 0.3, size=(r, c)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.normal(size=n)).astype(np.float32)

    def vec(n):
        return rng.normal(0.0, 0.5, size=n).astype(np.float32)

    if gemma:
        # Gemma stores w for (1 + w): small values, multiples of 1/128 so that 1 + w is
        # exact in BF16 too (llama.cpp's converter adds the 1 in the tensor's own type).
        def norm(n):
            return (np.round(0.1 * rng.normal(size=n) * 128) / 128).astype(np.float32)

    if mt == "phi3":
        return make_phi3_weights(cfg, mat, norm)
    if mt == "gpt_oss":
        return make_gptoss_weights(cfg, mat, norm, vec)
    t = {"model.embed_tokens.weight": mat(V, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(d)
        if mt in ("qwen3", "gemma3_text", "qwen3_moe"):
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        if gemma:
            t[p + "pre_feedforward_layernorm.weight"] = norm(d)
            t[p + "post_feedforward_layernorm.weight"] = norm(d)
        t[p + "self_attn.q_proj.weight"] = mat(nh * hd, d)
        t[p + "self_attn.k_proj.weight"] = mat(nkv * hd, d)
        t[p + "self_attn.v_proj.weight"] = mat(nkv * hd, d)
        if bias:
            t[p + "self_attn.q_proj.bias"] = vec(nh * hd)
            t[p + "self_attn.k_proj.bias"] = vec(nkv * hd)
            t[p + "self_attn.v_proj.bias"] = vec(nkv * hd)
        t[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
        t[p + "post_attention_layernorm.weight"] = norm(d)
        if mt in ("qwen3_moe", "mixtral", "qwen2_moe"):
            t.update(moe_weights(cfg, p, mat))
            continue
        t[p + "mlp.gate_proj.weight"] = mat(f, d)
        t[p + "mlp.up_proj.weight"] = mat(f, d)
        t[p + "mlp.down_proj.weight"] = mat(d, f)
    t["model.norm.weight"] = norm(d)
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = mat(V, d)
    return t


def moe_names(cfg, p, e):
    """HF names of layer prefix p's router and expert e's gate, up, down."""
    if cfg["model_type"] == "mixtral":
        b = p + "block_sparse_moe."
        x = f"{b}experts.{e}."
        return b + "gate.weight", x + "w1.weight", x + "w3.weight", x + "w2.weight"
    x = f"{p}mlp.experts.{e}."
    return (p + "mlp.gate.weight", x + "gate_proj.weight", x + "up_proj.weight",
            x + "down_proj.weight")


def moe_experts(cfg):
    """(n_expert, top_k, expert_ff) from config.json."""
    if cfg["model_type"] == "mixtral":
        return cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"]
    return cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]


def moe_weights(cfg, p, mat):
    """The router (wider spread, so routes are decisive) and every expert's matrices, plus
    the shared expert and its gate where the config has one."""
    d = cfg["hidden_size"]
    E, _, f = moe_experts(cfg)
    # Qwen2-MoE's top 4 of 8, unnormalised: a softer router, so the 4th expert counts.
    spread = 1.0 if cfg["model_type"] == "qwen2_moe" else 3.0
    t = {moe_names(cfg, p, 0)[0]: spread * mat(E, d)}
    for e in range(E):
        _, g, u, dn = moe_names(cfg, p, e)
        t[g], t[u], t[dn] = mat(f, d), mat(f, d), mat(d, f)
    if cfg.get("shared_expert_intermediate_size"):
        fs = cfg["shared_expert_intermediate_size"]
        x = p + "mlp.shared_expert."
        t[x + "gate_proj.weight"], t[x + "up_proj.weight"] = mat(fs, d), mat(fs, d)
        t[x + "down_proj.weight"] = mat(d, fs)
        t[p + "mlp.shared_expert_gate.weight"] = mat(1, d)
    return t


def make_phi3_weights(cfg, mat, norm):
    """Phi-3 stores q/k/v in one qkv_proj and gate/up in one gate_up_proj."""
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // nh
    t = {"model.embed_tokens.weight": mat(V, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(d)
        t[p + "self_attn.qkv_proj.weight"] = mat((nh + 2 * nkv) * hd, d)
        t[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
        t[p + "post_attention_layernorm.weight"] = norm(d)
        t[p + "mlp.gate_up_proj.weight"] = mat(2 * f, d)
        t[p + "mlp.down_proj.weight"] = mat(d, f)
    t["model.norm.weight"] = norm(d)
    if not cfg.get("tie_word_embeddings"):
        t["lm_head.weight"] = mat(V, d)
    return t


def f32_to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even."""
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    assert np.all(np.isfinite(a))
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def bf16_bits_to_f32(u):
    return (u.astype(np.uint32) << 16).view(np.float32)


def check_bf16_rounding():
    """Each rounded value is the nearer of its two bf16 neighbours (ties: even)."""
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(0, 0.3, 10000), rng.normal(0, 100, 1000)]).astype(np.float32)
    # exact ties: halfway between 0x3F80 and 0x3F81, and between 0x3F81 and 0x3F82
    ties = np.array([0x3F808000, 0x3F818000], np.uint32).view(np.float32)
    got = f32_to_bf16_bits(ties)
    assert list(got) == [0x3F80, 0x3F82], got
    r = bf16_bits_to_f32(f32_to_bf16_bits(x)).astype(np.float64)
    lo = bf16_bits_to_f32((x.view(np.uint32) >> 16).astype(np.uint16)).astype(np.float64)
    hi = bf16_bits_to_f32(((x.view(np.uint32) >> 16) + 1).astype(np.uint16)).astype(np.float64)
    xd = x.astype(np.float64)
    assert np.all((r == lo) | (r == hi))
    assert np.all(np.abs(r - xd) <= np.minimum(np.abs(lo - xd), np.abs(hi - xd)))


def write_safetensors(path, tensors, dtype):
    """tensors: name -> float32 array. dtype 'F32' or 'BF16' (round to nearest even)."""
    keep, specs = [], {}
    for name in sorted(tensors):
        if tensors[name].dtype == np.uint8:          # MXFP4 blocks and scales
            buf = np.ascontiguousarray(tensors[name])
            keep.append(buf)
            specs[name] = TensorSpec(dtype="uint8", shape=buf.shape, data_ptr=buf.ctypes.data,
                                     data_len=buf.nbytes)
            continue
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype == "BF16":
            buf, dname = f32_to_bf16_bits(a), "bfloat16"
        else:
            buf, dname = a.astype("<f4"), "float32"
        buf = np.ascontiguousarray(buf)
        keep.append(buf)
        specs[name] = TensorSpec(dtype=dname, shape=a.shape, data_ptr=buf.ctypes.data,
                                 data_len=buf.nbytes)
    serialize_file(specs, path, metadata={"format": "pt"})
    size = os.path.getsize(path)
    assert size < MAX_FILE_BYTES, f"{path}: {size} bytes"
    return size


def write_model(m):
    d = os.path.join(DATA_DIR, m["name"])
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    cfg = m["config"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    t = make_weights(cfg, m["seed"])
    if m.get("tokenizer"):
        write_tokenizer(d, cfg["vocab_size"])
    if m.get("mxfp4"):
        t = mxfp4_experts(t)
    if m["shards"] is None:
        write_safetensors(os.path.join(d, "model.safetensors"), t, m["dtype"])
    else:
        n = 2
        names = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
        parts = {i: {} for i in range(1, n + 1)}
        for k, v in t.items():
            parts[m["shards"](k)][k] = v
        for i in range(1, n + 1):
            assert parts[i], "empty shard"
            write_safetensors(os.path.join(d, names[i - 1]), parts[i], m["dtype"])
        index = {
            "metadata": {"total_size": int(sum(v.nbytes for v in t.values()))},
            "weight_map": {k: names[m["shards"](k) - 1] for k in sorted(t)},
        }
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    return d


# ---------------------------------------------------------------------------
# reading back (the reference sees only the files)
# ---------------------------------------------------------------------------

def read_safetensors(path):
    """name -> (float64 array, dtype string), decoded from the raw bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    out = {}
    for name, info in deserialize(raw):
        data, shape, dt = bytes(info["data"]), info["shape"], info["dtype"]
        if dt == "F32":
            a = np.frombuffer(data, dtype="<f4")
        elif dt == "BF16":
            a = bf16_bits_to_f32(np.frombuffer(data, dtype="<u2"))
        elif dt == "U8":
            out[name] = (np.frombuffer(data, dtype=np.uint8).reshape(shape), dt)
            continue
        else:
            raise ValueError(f"{name}: dtype {dt}")
        out[name] = (a.reshape(shape).astype(np.float64), dt)
    return out


def load_dir(d):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    mt = c["model_type"]
    if mt == "gpt_oss":
        return load_gptoss(d, c)
    assert mt in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3",
                  "qwen3_moe", "mixtral", "qwen2_moe"), mt
    nh = c["num_attention_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // nh
    sc = c.get("rope_scaling")
    if mt in ("gemma3_text", "phi3"):
        scaling = None       # read by family_config
    elif sc is not None:
        assert sc.get("rope_type", sc.get("type")) == "llama3", sc
        scaling = dict(factor=float(sc["factor"]), low=float(sc["low_freq_factor"]),
                       high=float(sc["high_freq_factor"]),
                       orig=float(sc["original_max_position_embeddings"]))
    else:
        scaling = None
    assert c.get("sliding_window") is None or mt in ("gemma2", "gemma3_text", "phi3")
    cfg = dict(
        model_type=c["model_type"], n_embd=c["hidden_size"], n_ff=c["intermediate_size"],
        n_head=nh, n_head_kv=c.get("num_key_value_heads", nh), head_dim=hd,
        n_layer=c["num_hidden_layers"], n_vocab=c["vocab_size"], eps=float(c["rms_norm_eps"]),
        theta=float(c["rope_theta"]), llama3_scaling=scaling,
        tied=bool(c.get("tie_word_embeddings", False)),
        qkv_bias=(c["model_type"] == "qwen2" or bool(c.get("attention_bias", False))
                  or (mt == "qwen2_moe" and c.get("qkv_bias", True))),
    )
    if mt in ("qwen3", "gemma2", "gemma3_text", "phi3", "qwen3_moe", "mixtral", "qwen2_moe"):
        cfg["family"] = family_config(c, hd)
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wmap = json.load(f)["weight_map"]
        files = sorted(set(wmap.values()))
    else:
        wmap, files = None, ["model.safetensors"]
    t, types = {}, {}
    for fn in files:
        for k, (a, dt) in read_safetensors(os.path.join(d, fn)).items():
            assert k not in t, k
            assert wmap is None or wmap[k] == fn, k
            t[k], types[k] = a, dt
    assert wmap is None or set(wmap) == set(t)
    assert (cfg["tied"]) == ("lm_head.weight" not in t)
    W = {
        "tok_embd": t["model.embed_tokens.weight"],
        "out_norm": t["model.norm.weight"],
        "output": t["model.embed_tokens.weight"] if cfg["tied"] else t["lm_head.weight"],
        "layers": [],
    }
    fam = cfg.get("family", {})
    for i in range(cfg["n_layer"]):
        b = f"model.layers.{i}."
        if "family" in cfg:
            W["layers"].append(family_layer(cfg, t, b))
            continue
        L = dict(
            attn_norm=t[b + "input_layernorm.weight"],
            wq=t[b + "self_attn.q_proj.weight"],
            wk=t[b + "self_attn.k_proj.weight"],
            wv=t[b + "self_attn.v_proj.weight"],
            wo=t[b + "self_attn.o_proj.weight"],
            ffn_norm=t[b + "post_attention_layernorm.weight"],
            w_gate=t[b + "mlp.gate_proj.weight"],
            w_up=t[b + "mlp.up_proj.weight"],
            w_down=t[b + "mlp.down_proj.weight"],
        )
        if cfg["qkv_bias"]:
            L.update(bq=t[b + "self_attn.q_proj.bias"], bk=t[b + "self_attn.k_proj.bias"],
                     bv=t[b + "self_attn.v_proj.bias"])
        W["layers"].append(L)
    n_used = 2 + (not cfg["tied"]) + sum(len(L) - L.get("_derived", 0) for L in W["layers"])
    assert n_used == len(t), (n_used, len(t))      # every tensor in the files is used
    if fam.get("norm_offset"):
        W["out_norm"] = W["out_norm"] + fam["norm_offset"]
    check_shapes(cfg, W)
    return cfg, W, types


def family_config(c, hd):
    """What Qwen3 / Gemma 2 / Gemma 3 / Phi-3 add, from config.json."""
    mt, n = c["model_type"], c["num_hidden_layers"]
    gemma = mt in ("gemma2", "gemma3_text")
    fam = dict(qk_norm=mt in ("qwen3", "gemma3_text", "qwen3_moe"), post_norms=gemma,
               act="gelu_tanh" if gemma else "silu", norm_offset=1.0 if gemma else 0.0,
               embed_scale=math.sqrt(c["hidden_size"]) if gemma else 1.0,
               scale=1.0 / math.sqrt(hd), attn_softcap=None, final_softcap=None,
               window=None, sliding=[False] * n, local_theta=None, global_divisor=None,
               fused=mt == "phi3", rot_dim=hd, mscale=1.0, moe=None)
    if mt in ("qwen3_moe", "qwen2_moe"):
        assert c["decoder_sparse_step"] == 1 and c["mlp_only_layers"] == []
        fam["moe"] = dict(n_expert=c["num_experts"], top_k=c["num_experts_per_tok"],
                          norm=bool(c["norm_topk_prob"]),
                          shared=c.get("shared_expert_intermediate_size", 0) > 0)
    if mt == "mixtral":
        # softmax over the top-k router logits = top-k probabilities renormalised
        assert c.get("sliding_window") is None
        fam["moe"] = dict(n_expert=c["num_local_experts"], top_k=c["num_experts_per_tok"],
                          norm=True)
    if gemma:
        assert c["hidden_activation"] == "gelu_pytorch_tanh"
        fam["scale"] = float(c["query_pre_attn_scalar"]) ** -0.5
        fam["attn_softcap"] = c.get("attn_logit_softcapping")
        fam["final_softcap"] = c.get("final_logit_softcapping")
        fam["window"] = c["sliding_window"]
        if mt == "gemma2":
            fam["sliding"] = [l % 2 == 0 for l in range(n)]
        else:
            p = c["sliding_window_pattern"]
            fam["sliding"] = [(l + 1) % p != 0 for l in range(n)]
            fam["local_theta"] = float(c["rope_local_base_freq"])
            rs = c["rope_scaling"]
            assert rs["rope_type"] == "linear"
            fam["global_divisor"] = [float(rs["factor"])] * (hd // 2)
    if mt == "phi3":
        fam["window"] = c.get("sliding_window")
        fam["sliding"] = [True] * n
        # rope over the first partial_rotary_factor of each head's dims (Phi-4-mini: 3/4)
        fam["rot_dim"] = int(hd * c.get("partial_rotary_factor", 1.0))
        rs = c["rope_scaling"]
        assert rs["type"] == "longrope"
        orig, mx = c["original_max_position_embeddings"], c["max_position_embeddings"]
        # Kiln and llama.cpp take the long factors when the context exceeds `orig`;
        # transformers when the sequence does: every prompt is longer than phi3's and
        # phi4mini's orig of 4, so both rules agree here.
        which = "long_factor" if mx > orig else "short_factor"
        fam["global_divisor"] = [float(x) for x in rs[which]]
        s = mx / orig
        mscale = math.sqrt(1 + math.log(s) / math.log(orig)) if s > 1 else 1.0
        fam["mscale"] = float(rs.get("attention_factor") or mscale)
    return fam


def family_layer(cfg, t, b):
    """One layer's tensors of the families above; norms with Gemma's offset added."""
    fam = cfg["family"]
    off = fam["norm_offset"]
    nh, nkv, hd, f = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"], cfg["n_ff"]
    L = dict(attn_norm=t[b + "input_layernorm.weight"] + off, wo=t[b + "self_attn.o_proj.weight"])
    derived = 0
    if fam["fused"]:
        qkv = t[b + "self_attn.qkv_proj.weight"]
        L.update(wq=qkv[:nh * hd], wk=qkv[nh * hd:(nh + nkv) * hd], wv=qkv[(nh + nkv) * hd:])
        gu = t[b + "mlp.gate_up_proj.weight"]
        L.update(w_gate=gu[:f], w_up=gu[f:])
        derived = 3      # 2 fused tensors give 5 entries
    elif fam["moe"]:
        L.update(wq=t[b + "self_attn.q_proj.weight"], wk=t[b + "self_attn.k_proj.weight"],
                 wv=t[b + "self_attn.v_proj.weight"])
        E = fam["moe"]["n_expert"]
        names = [moe_names({"model_type": cfg["model_type"]}, b, e) for e in range(E)]
        L["router"] = t[names[0][0]]
        L["exp_gate"] = np.stack([t[n[1]] for n in names])
        L["exp_up"] = np.stack([t[n[2]] for n in names])
        L["exp_down"] = np.stack([t[n[3]] for n in names])
        derived = 4 - (1 + 3 * E)      # 4 entries from 1 + 3E tensors
        if fam["moe"].get("shared"):
            x = b + "mlp.shared_expert."
            L.update(sh_gate=t[x + "gate_proj.weight"], sh_up=t[x + "up_proj.weight"],
                     sh_down=t[x + "down_proj.weight"],
                     sh_inp=t[b + "mlp.shared_expert_gate.weight"])
    else:
        L.update(wq=t[b + "self_attn.q_proj.weight"], wk=t[b + "self_attn.k_proj.weight"],
                 wv=t[b + "self_attn.v_proj.weight"], w_gate=t[b + "mlp.gate_proj.weight"],
                 w_up=t[b + "mlp.up_proj.weight"])
    if not fam["moe"]:
        L["w_down"] = t[b + "mlp.down_proj.weight"]
    if fam["post_norms"]:
        L.update(post_attn_norm=t[b + "post_attention_layernorm.weight"] + off,
                 ffn_norm=t[b + "pre_feedforward_layernorm.weight"] + off,
                 post_ffn_norm=t[b + "post_feedforward_layernorm.weight"] + off)
    else:
        L["ffn_norm"] = t[b + "post_attention_layernorm.weight"] + off
    if fam["qk_norm"]:
        L.update(q_norm=t[b + "self_attn.q_norm.weight"] + off,
                 k_norm=t[b + "self_attn.k_norm.weight"] + off)
    if cfg["qkv_bias"]:
        L.update(bq=t[b + "self_attn.q_proj.bias"], bk=t[b + "self_attn.k_proj.bias"],
                 bv=t[b + "self_attn.v_proj.bias"])
    L["_derived"] = derived + 1      # `_derived` itself
    return L


def check_shapes(cfg, W):
    d, f, hd = cfg["n_embd"], cfg["n_ff"], cfg["head_dim"]
    nh, nkv, V = cfg["n_head"], cfg["n_head_kv"], cfg["n_vocab"]
    assert W["tok_embd"].shape == (V, d) and W["output"].shape == (V, d)
    assert W["out_norm"].shape == (d,) and nh % nkv == 0 and hd % 2 == 0
    for L in W["layers"]:
        assert L["wq"].shape == (nh * hd, d) and L["wo"].shape == (d, nh * hd)
        assert L["wk"].shape == (nkv * hd, d) and L["wv"].shape == (nkv * hd, d)
        if "router" in L:
            E, fe = L["exp_gate"].shape[:2]
            assert L["router"].shape == (E, d) and L["exp_up"].shape == (E, fe, d)
            assert L["exp_gate"].shape == (E, fe, d) and L["exp_down"].shape == (E, d, fe)
        else:
            assert L["w_gate"].shape == (f, d) and L["w_up"].shape == (f, d)
            assert L["w_down"].shape == (d, f)
        assert L["attn_norm"].shape == (d,) and L["ffn_norm"].shape == (d,)
        if cfg["qkv_bias"]:
            assert L["bq"].shape == (nh * hd,) and L["bk"].shape == (nkv * hd,)
            assert L["bv"].shape == (nkv * hd,)


# ---------------------------------------------------------------------------
# forward pass (float64)
# ---------------------------------------------------------------------------

def inv_freqs(cfg):
    d = cfg["head_dim"]
    f = cfg["theta"] ** (-np.arange(0, d, 2, dtype=np.float64) / d)      # [d/2]
    s = cfg["llama3_scaling"]
    if s is None:
        return f
    wavelen = 2.0 * math.pi / f
    smooth = (s["orig"] / wavelen - s["low"]) / (s["high"] - s["low"])
    if s.get("control_no_smoothing"):              # sensitivity control only
        smooth = np.ones_like(smooth)
    return np.where(wavelen < s["orig"] / s["high"], f,
                    np.where(wavelen > s["orig"] / s["low"], f / s["factor"],
                             (1.0 - smooth) * f / s["factor"] + smooth * f))


def llama3_regimes(cfg):
    """(kept, smoothed, divided) counts, from a per-element scalar rewrite."""
    s = cfg["llama3_scaling"]
    d = cfg["head_dim"]
    counts = [0, 0, 0]
    got = inv_freqs(cfg)
    for i in range(d // 2):
        f = cfg["theta"] ** (-(2.0 * i) / d)
        wl = 2 * math.pi / f
        if wl < s["orig"] / s["high"]:
            want, k = f, 0
        elif wl > s["orig"] / s["low"]:
            want, k = f / s["factor"], 2
        else:
            sm = (s["orig"] / wl - s["low"]) / (s["high"] - s["low"])
            want, k = (1 - sm) * f / s["factor"] + sm * f, 1
        assert abs(got[i] - want) <= 1e-15 * want
        counts[k] += 1
    return counts


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope_half(x, positions, inv_freq):
    """x: [T, heads, d]; rotate_half layout: pairs (x[i], x[i + d/2])."""
    half = x.shape[-1] // 2
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def rope_adjacent(x, positions, inv_freq):
    """Wrong-layout control only: pairs (x[2i], x[2i+1]) (GGUF llama layout)."""
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def forward_last(cfg, W, ids, rope_layout="half"):
    if "gptoss" in cfg:
        return forward_gptoss(cfg, W, ids)
    if "family" in cfg:
        return forward_family(cfg, W, ids)
    T = len(ids)
    nh, nkv, hd = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    group = nh // nkv
    pos = np.arange(T)
    freqs = inv_freqs(cfg)
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    scale = 1.0 / math.sqrt(hd)
    x = W["tok_embd"][np.asarray(ids)]
    for L in W["layers"]:
        h = rms_norm(x, L["attn_norm"], cfg["eps"])
        q, k, v = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
        if cfg["qkv_bias"]:
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
        rope = rope_half if rope_layout == "half" else rope_adjacent
        q = rope(q.reshape(T, nh, hd), pos, freqs)
        k = rope(k.reshape(T, nkv, hd), pos, freqs)
        v = v.reshape(T, nkv, hd)
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            kv = hh % nkv if cfg.get("gqa_mod") else hh // group
            s = (q[:, hh, :] @ k[:, kv, :].T) * scale + mask
            att[:, hh, :] = softmax(s) @ v[:, kv, :]
        x = x + att.reshape(T, nh * hd) @ L["wo"].T
        h = rms_norm(x, L["ffn_norm"], cfg["eps"])
        x = x + (silu(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
    hl = rms_norm(x[-1:], W["out_norm"], cfg["eps"])
    return (hl @ W["output"].T)[0]


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward_family(cfg, W, ids):
    """Qwen3 / Gemma 2 / Gemma 3 / Phi-3 (transformers' modeling files, from the math):
        x = embed[ids] * embed_scale                       (Gemma: sqrt(hidden))
        per layer: h = RMSNorm(x) * w_in
          q, k, v = h Wq^T, h Wk^T, h Wv^T (+ biases: Qwen2-MoE; Phi-3: one qkv_proj)
          q, k = RMSNorm per head * q_norm / k_norm        (Qwen3, Gemma 3)
          q, k = RoPE over the first rot_dim dims, rotate_half layout; inv_freq
                 theta^(-2i/d) / divisor_i (Gemma 3 global: linear factor; Phi-3: long
                 factors); Gemma 3 sliding layers use rope_local_base_freq, no divisor
                 Phi-3 long rope: the rotated dims times mscale (transformers' cos and
                 sin times attention_factor), the others as they are
          s = q k^T * scale  (1/sqrt(d); Gemma: query_pre_attn_scalar^-0.5)
          s = cap * tanh(s / cap)                          (Gemma 2 attn_logit_softcapping)
          causal mask; sliding layers also mask j <= i - window
          o = softmax(s) v Wo^T ; Gemma: o = RMSNorm(o) * post_attention_layernorm
          x += o ; h = RMSNorm(x) * (pre_feedforward | post_attention)_layernorm
          m = (act(h Wg^T) * h Wu^T) Wd^T  act: silu, Gemma: gelu tanh approximation
          Gemma: m = RMSNorm(m) * post_feedforward_layernorm ; x += m
        logits = RMSNorm(x) * norm @ out^T ; Gemma 2: cap * tanh(logits / cap)
    Gemma's norm weights are (1 + w) (added at load)."""
    fam = cfg["family"]
    T = len(ids)
    nh, nkv, hd = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    group, eps, rd = nh // nkv, cfg["eps"], fam["rot_dim"]
    pos = np.arange(T)
    causal = np.triu(np.full((T, T), -np.inf), k=1)
    ii, jj = np.meshgrid(pos, pos, indexing="ij")
    x = W["tok_embd"][np.asarray(ids)] * fam["embed_scale"]
    act = gelu_tanh if fam["act"] == "gelu_tanh" else silu
    for li, L in enumerate(W["layers"]):
        sliding = fam["sliding"][li] and fam["window"] is not None
        theta = fam["local_theta"] if (sliding and fam["local_theta"]) else cfg["theta"]
        freqs = theta ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
        if fam["global_divisor"] is not None and not (sliding and fam["local_theta"]):
            freqs = freqs / np.asarray(fam["global_divisor"])
        mask = causal.copy()
        if sliding:
            mask[jj <= ii - fam["window"]] = -np.inf
        h = rms_norm(x, L["attn_norm"], eps)
        q, k, v = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
        if cfg["qkv_bias"]:
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if fam["qk_norm"]:
            q, k = rms_norm(q, L["q_norm"], eps), rms_norm(k, L["k_norm"], eps)
        ms = fam["mscale"]
        q = np.concatenate([rope_half(q[..., :rd], pos, freqs) * ms, q[..., rd:]], axis=-1)
        k = np.concatenate([rope_half(k[..., :rd], pos, freqs) * ms, k[..., rd:]], axis=-1)
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            kv = hh // group
            s = (q[:, hh, :] @ k[:, kv, :].T) * fam["scale"]
            if fam["attn_softcap"]:
                s = fam["attn_softcap"] * np.tanh(s / fam["attn_softcap"])
            att[:, hh, :] = softmax(s + mask) @ v[:, kv, :]
        o = att.reshape(T, nh * hd) @ L["wo"].T
        if fam["post_norms"]:
            o = rms_norm(o, L["post_attn_norm"], eps)
        x = x + o
        h = rms_norm(x, L["ffn_norm"], eps)
        if fam["moe"]:
            m = moe_ffn(h, L, fam["moe"])
        else:
            m = (act(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
        if fam["post_norms"]:
            m = rms_norm(m, L["post_ffn_norm"], eps)
        x = x + m
    hl = rms_norm(x[-1:], W["out_norm"], eps)
    lg = (hl @ W["output"].T)[0]
    if fam["final_softcap"]:
        lg = fam["final_softcap"] * np.tanh(lg / fam["final_softcap"])
    return lg


def moe_ffn(h, L, moe):
    """Mixture of experts (Qwen3-MoE / Mixtral / Qwen2-MoE), token by token:
        p = softmax(h W_router^T) over all experts
        top = the top_k experts by p (ties -> lowest index; stable sort)
        w = p[top], divided by its sum when norm (norm_topk_prob; Mixtral always)
        out = sum_i w_i * (silu(h Wg_e^T) * (h Wu_e^T)) Wd_e^T   (e = top_i)
        Qwen2-MoE's shared expert, every token:
        out += sigmoid(h . w_shared_gate) * (silu(h Wsg^T) * (h Wsu^T)) Wsd^T
    `moe` may carry sensitivity controls: `top_k`, `norm`, `shared_gate` (False: the
    shared expert unscaled), `shared` (False: ignored)."""
    T = h.shape[0]
    p = softmax(h @ L["router"].T)
    out = np.zeros_like(h)
    for t in range(T):
        top = np.argsort(-p[t], kind="stable")[:moe["top_k"]]
        w = p[t, top]
        if moe["norm"]:
            w = w / np.sum(w)
        for e, wt in zip(top, w):
            g, u = h[t] @ L["exp_gate"][e].T, h[t] @ L["exp_up"][e].T
            out[t] += wt * ((silu(g) * u) @ L["exp_down"][e].T)
    if moe.get("shared"):
        y = (silu(h @ L["sh_gate"].T) * (h @ L["sh_up"].T)) @ L["sh_down"].T
        gate = 1.0 / (1.0 + np.exp(-(h @ L["sh_inp"].T)))          # [T, 1]
        out += (gate if moe.get("shared_gate", True) else 1.0) * y
    return out


def moe_usage(cfg, W, ids):
    """Per layer, how many positions of `ids` route to each expert (full forward)."""
    fam = cfg["family"]
    counts, gaps = [], []
    orig = moe_ffn

    def spy(h, L, moe):
        lg = h @ L["router"].T
        p = softmax(lg)
        c = [0] * moe["n_expert"]
        for t in range(h.shape[0]):
            o = np.argsort(-p[t], kind="stable")
            for e in o[:moe["top_k"]]:
                c[int(e)] += 1
            gaps.append(lg[t, o[moe["top_k"] - 1]] - lg[t, o[moe["top_k"]]])
        counts.append(c)
        return orig(h, L, moe)
    globals()["moe_ffn"] = spy
    try:
        forward_family(cfg, W, ids)
    finally:
        globals()["moe_ffn"] = orig
    assert fam["moe"]
    return counts, float(min(gaps))


def sensitivity(cfg, W, prompt, ref):
    """Relative logit error (the test's metric) that plausible loader/forward mistakes
    would cause on this prompt's last-position logits; each must be far above 1e-4,
    or the fixture would not exercise the feature."""
    def err(lg):
        return float(np.max(np.abs(lg - ref)) / np.max(np.abs(ref)))
    if "gptoss" in cfg:
        return gptoss_sensitivity(cfg, W, prompt, err)
    if "family" in cfg:
        return family_sensitivity(cfg, W, prompt, err)
    out = {"rope_adjacent_pairs": err(forward_last(cfg, W, prompt, rope_layout="adjacent"))}
    if cfg["llama3_scaling"]:
        out["llama3_scaling_ignored"] = err(forward_last(dict(cfg, llama3_scaling=None), W, prompt))
        no_smooth = dict(cfg["llama3_scaling"], control_no_smoothing=True)
        out["llama3_middle_band_kept"] = err(
            forward_last(dict(cfg, llama3_scaling=no_smooth), W, prompt))
    if cfg["qkv_bias"]:
        out["qkv_bias_ignored"] = err(forward_last(dict(cfg, qkv_bias=False), W, prompt))
        Wk = dict(W, layers=[dict(L, bk=np.zeros_like(L["bk"])) for L in W["layers"]])
        out["k_bias_ignored"] = err(forward_last(cfg, Wk, prompt))
    if 1 < cfg["n_head_kv"] < cfg["n_head"]:
        # kv head = q head % n_kv (interleaved GQA grouping) instead of q head // group
        out["gqa_wrong_grouping"] = err(forward_last(dict(cfg, gqa_mod=True), W, prompt))
    for k, v in out.items():
        assert v > 1e-2, (k, v)
    return {k: float(f"{v:.3g}") for k, v in out.items()}


def family_sensitivity(cfg, W, prompt, err):
    fam = cfg["family"]

    def with_fam(**kw):
        return forward_last(dict(cfg, family=dict(fam, **kw)), W, prompt)

    out = {}
    if fam["qk_norm"]:
        out["qk_norm_ignored"] = err(with_fam(qk_norm=False))
    if fam["post_norms"]:
        out["post_norms_ignored"] = err(with_fam(post_norms=False))
        out["embed_scale_ignored"] = err(with_fam(embed_scale=1.0))
        out["silu_instead_of_gelu_tanh"] = err(with_fam(act="silu"))
    if fam["attn_softcap"]:
        out["attn_softcap_ignored"] = err(with_fam(attn_softcap=None))
    if fam["final_softcap"]:
        out["final_softcap_ignored"] = err(with_fam(final_softcap=None))
    if fam["local_theta"]:
        out["local_rope_base_ignored"] = err(with_fam(local_theta=None))
    if fam["global_divisor"] is not None:
        out["rope_divisors_ignored"] = err(with_fam(global_divisor=None))
    if fam["rot_dim"] < cfg["head_dim"]:
        # rope over every dim (the extra ones unscaled by the long factors)
        pad = [1.0] * ((cfg["head_dim"] - fam["rot_dim"]) // 2)
        out["partial_rotary_ignored"] = err(with_fam(
            rot_dim=cfg["head_dim"], global_divisor=list(fam["global_divisor"] or []) + pad
            if fam["global_divisor"] is not None else None))
    if fam["mscale"] != 1.0:
        out["attention_factor_ignored"] = err(with_fam(mscale=1.0))
        if fam["rot_dim"] < cfg["head_dim"]:
            # the factor folded into the score scale (mscale^2 on every dim's product)
            out["attention_factor_on_whole_scores"] = err(with_fam(
                mscale=1.0, scale=fam["mscale"] ** 2 / math.sqrt(cfg["head_dim"])))
    if fam["moe"]:
        moe = fam["moe"]
        out["top_k_minus_one"] = err(with_fam(moe=dict(moe, top_k=moe["top_k"] - 1)))
        out["norm_topk_flipped"] = err(with_fam(moe=dict(moe, norm=not moe["norm"])))
        Wr = dict(W, layers=[dict(L, router=L["router"][::-1]) for L in W["layers"]])
        out["experts_reversed"] = err(forward_last(cfg, Wr, prompt))
        if moe.get("shared"):
            out["shared_expert_ignored"] = err(with_fam(moe=dict(moe, shared=False)))
            out["shared_gate_ignored"] = err(with_fam(moe=dict(moe, shared_gate=False)))
    if cfg["qkv_bias"]:
        out["qkv_bias_ignored"] = err(forward_last(dict(cfg, qkv_bias=False), W, prompt))
    if fam["window"] is not None and len(prompt) > fam["window"]:
        out["window_ignored"] = err(with_fam(window=None))
    for k, v in out.items():
        assert v > 1e-2, (k, v)
    return {k: float(f"{v:.3g}") for k, v in out.items()}


# ---------------------------------------------------------------------------
# gpt-oss (model_type gpt_oss): weights, tokenizer, reading back, forward
# ---------------------------------------------------------------------------

def make_gptoss_weights(cfg, mat, norm, vec):
    """gpt-oss as Hugging Face stores it: q/k/v/o with biases, per-head sinks, the router
    with a bias, and the experts fused and transposed: gate_up_proj [E, hidden, 2 ff]
    (gate at the even columns, up at the odd ones) with gate_up_proj_bias [E, 2 ff],
    down_proj [E, ff, hidden] with down_proj_bias [E, hidden]."""
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E = cfg["num_local_experts"]
    t = {"model.embed_tokens.weight": mat(V, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(d)
        for name, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
            t[p + f"self_attn.{name}_proj.weight"] = mat(rows, d)
            t[p + f"self_attn.{name}_proj.bias"] = vec(rows)
        t[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
        t[p + "self_attn.o_proj.bias"] = vec(d)
        t[p + "self_attn.sinks"] = 2.0 * vec(nh)
        t[p + "post_attention_layernorm.weight"] = norm(d)
        t[p + "mlp.router.weight"] = 3.0 * mat(E, d)
        t[p + "mlp.router.bias"] = vec(E)
        x = p + "mlp.experts."
        t[x + "gate_up_proj"] = np.stack([4.0 * mat(d, 2 * f) for _ in range(E)])
        t[x + "gate_up_proj_bias"] = np.stack([vec(2 * f) for _ in range(E)])
        t[x + "down_proj"] = np.stack([mat(f, d) for _ in range(E)])
        t[x + "down_proj_bias"] = np.stack([vec(d) for _ in range(E)])
    t["model.norm.weight"] = norm(d)
    t["lm_head.weight"] = mat(V, d)
    return t


def write_tokenizer(d, vocab_size):
    """A tiny byte-level BPE tokenizer.json (256 byte symbols, merges learned from a fixed
    text, two special tokens) and a tokenizer_config.json naming the fast tokenizer class:
    llama.cpp's converter needs a tokenizer; the fixture's ids are fed directly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|return|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 8, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["the quick brown fox jumps over the lazy dog and then the dog sleeps " * 4,
            "once upon a time there was a tiny model that answered every question " * 4]
    tok.train_from_iterator(text, trainer)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|return|>",
                   "pad_token": "<|endoftext|>", "model_max_length": 8192}, f, indent=2)
        f.write("\n")


def yarn_inv_freqs(theta, dim, s):
    """YaRN (transformers' rope_type yarn) from the formulas, float64:
        f_i = theta^(-2i/d); corr(r) = d ln(orig / (2 pi r)) / (2 ln theta)
        low, high = corr(beta_fast), corr(beta_slow) (floor / ceil when truncate),
        clipped to [0, d - 1]; ramp_i = clip((i - low) / (high - low), 0, 1)
        f'_i = f_i / factor * ramp_i + f_i * (1 - ramp_i)
    and the attention factor on cos and sin: attention_factor, else 0.1 ln(factor) + 1."""
    f = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)

    def corr(r):
        return dim * math.log(s["orig"] / (r * 2 * math.pi)) / (2 * math.log(theta))
    low, high = corr(s["beta_fast"]), corr(s["beta_slow"])
    if s["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0.0, 1.0)
    freqs = f / s["factor"] * ramp + f * (1.0 - ramp)
    mscale = s["attention_factor"] or (0.1 * math.log(s["factor"]) + 1.0)
    return freqs, mscale, (low, high)


def load_gptoss(d, c):
    """gpt-oss's config (both eras: rope_scaling / rope_parameters, experts_per_token /
    num_experts_per_tok) and tensors, read back from the written files."""
    rs = c.get("rope_parameters") or c["rope_scaling"]
    assert rs["rope_type"] == "yarn", rs
    nh = c["num_attention_heads"]
    cfg = dict(
        model_type="gpt_oss", n_embd=c["hidden_size"], n_ff=c["intermediate_size"],
        n_head=nh, n_head_kv=c["num_key_value_heads"], head_dim=c["head_dim"],
        n_layer=c["num_hidden_layers"], n_vocab=c["vocab_size"], eps=float(c["rms_norm_eps"]),
        theta=float(rs.get("rope_theta") or c["rope_theta"]), llama3_scaling=None,
        tied=False, qkv_bias=True,
        gptoss=dict(
            yarn=dict(factor=float(rs["factor"]), beta_fast=float(rs["beta_fast"]),
                      beta_slow=float(rs["beta_slow"]), truncate=bool(rs["truncate"]),
                      orig=float(rs["original_max_position_embeddings"]),
                      attention_factor=rs.get("attention_factor")),
            window=c["sliding_window"],
            sliding=[t == "sliding_attention" for t in c["layer_types"]],
            n_expert=c["num_local_experts"],
            top_k=c.get("num_experts_per_tok") or c["experts_per_token"],
            limit=float(c["swiglu_limit"]), alpha=float(c.get("swiglu_alpha", 1.702)),
            sinks=True, o_bias=True, router_bias=True, expert_bias=True, interleaved=True),
    )
    freqs, mscale, band = yarn_inv_freqs(cfg["theta"], cfg["head_dim"], cfg["gptoss"]["yarn"])
    cfg["gptoss"].update(inv_freq=[float(x) for x in freqs], mscale=mscale, yarn_band=band)
    t, types = {}, {}
    for k, (a, dt) in read_safetensors(os.path.join(d, "model.safetensors")).items():
        t[k], types[k] = a, dt
    q = c.get("quantization_config")
    if q:
        assert q["quant_method"] == "mxfp4", q
        t = mxfp4_read(t)
    W = {"tok_embd": t["model.embed_tokens.weight"], "out_norm": t["model.norm.weight"],
         "output": t["lm_head.weight"], "layers": []}
    for i in range(cfg["n_layer"]):
        b = f"model.layers.{i}."
        a, x = b + "self_attn.", b + "mlp.experts."
        W["layers"].append(dict(
            attn_norm=t[b + "input_layernorm.weight"],
            wq=t[a + "q_proj.weight"], wk=t[a + "k_proj.weight"], wv=t[a + "v_proj.weight"],
            bq=t[a + "q_proj.bias"], bk=t[a + "k_proj.bias"], bv=t[a + "v_proj.bias"],
            wo=t[a + "o_proj.weight"], bo=t[a + "o_proj.bias"], sinks=t[a + "sinks"],
            ffn_norm=t[b + "post_attention_layernorm.weight"],
            router=t[b + "mlp.router.weight"], router_b=t[b + "mlp.router.bias"],
            gate_up=t[x + "gate_up_proj"], gate_up_b=t[x + "gate_up_proj_bias"],
            down=t[x + "down_proj"], down_b=t[x + "down_proj_bias"]))
    assert 3 + 17 * cfg["n_layer"] == len(t), len(t)      # every tensor is used
    E, d, f = cfg["gptoss"]["n_expert"], cfg["n_embd"], cfg["n_ff"]
    for L in W["layers"]:
        assert L["gate_up"].shape == (E, d, 2 * f) and L["down"].shape == (E, f, d)
        assert L["sinks"].shape == (cfg["n_head"],) and L["router"].shape == (E, d)
    return cfg, W, types


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_quantize(w):
    """w [E, rows, cols] -> (blocks [E, rows, cols/32, 16] uint8, scales [E, rows, cols/32]
    uint8): per 32 elements an E8M0 scale 2^(s-127) (the smallest with max |w| / scale <= 6)
    and each element's nearest E2M1 code, two a byte, element 2j in the low nibble."""
    E, R, C = w.shape
    b = w.astype(np.float64).reshape(E, R, C // 32, 32)
    amax = np.max(np.abs(b), axis=-1)
    e = np.clip(np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), -127, 127)
    scale = 2.0 ** e
    codes = np.argmin(np.abs(b[..., None] / scale[..., None, None] - E2M1), axis=-1)
    codes = codes.astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.astype(np.uint8), (e + 127).astype(np.uint8)


def mxfp4_dequantize(blocks, scales):
    """The inverse layout, from the OpenAI format's definition: [E, rows, cols] float64."""
    lo, hi = E2M1[blocks & 15], E2M1[blocks >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * 2.0 ** (scales.astype(np.float64) - 127)[..., None]
    return vals.reshape(blocks.shape[0], blocks.shape[1], -1)


def mxfp4_experts(t):
    """The experts' matrices as the released checkpoints store them: [out, in] rows (gate_up
    rows interleaved gate/up), quantized; the biases stay BF16."""
    out = {}
    for k, v in t.items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = mxfp4_quantize(np.swapaxes(v, 1, 2))
            out[k + "_blocks"], out[k + "_scales"] = blocks, scales
        else:
            out[k] = v
    return out


def mxfp4_read(t):
    """The MXFP4 experts back in the transformers layout the forward reads."""
    out = {}
    for k, v in t.items():
        if k.endswith("_blocks"):
            base = k[:-len("_blocks")]
            out[base] = np.swapaxes(mxfp4_dequantize(v, t[base + "_scales"]), 1, 2)
        elif not k.endswith("_scales"):
            out[k] = v
    return out


def gptoss_rope_note(cfg):
    g = cfg["gptoss"]
    lo, hi = g["yarn_band"]
    return (f"HF rotate_half layout; YaRN: inv_freq theta^(-2i/d) blended with it / factor by "
            f"the ramp over frequency dims {lo:.4g}..{hi:.4g} (truncate "
            f"{g['yarn']['truncate']}); cos and sin times {g['mscale']:.6g}; inv_freq "
            f"{[float(f'{x:.6g}') for x in g['inv_freq']]}")


def forward_gptoss(cfg, W, ids):
    """gpt-oss (transformers' modeling_gpt_oss.py, from the math):
        per layer: h = RMSNorm(x) * input_layernorm
          q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv
          q, k = RoPE (rotate_half) at the YaRN frequencies, cos and sin times mscale
          s = q k^T / sqrt(head_dim), causal; sliding layers also mask j <= i - window
          p_j = exp(s_j) / (exp(sink_h) + sum_i exp(s_i))       (the sink weighs no value)
          x += (p v) Wo^T + bo
          h = RMSNorm(x) * post_attention_layernorm
          r = h Wr^T + br; top = the top_k experts by r; w = softmax(r[top])
          gu = h gate_up[e] + gate_up_b[e]   ([hidden, 2 ff]); g, u = gu[0::2], gu[1::2]
          g = min(g, limit); u = clip(u, -limit, limit); a = g sigmoid(alpha g) (u + 1)
          x += sum_e w_e (a down[e] + down_b[e])                ([ff, hidden])
        logits = RMSNorm(x) * norm @ lm_head^T
    `cfg["gptoss"]` may switch parts off (the sensitivity controls)."""
    g = cfg["gptoss"]
    T = len(ids)
    nh, nkv, hd, eps = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"], cfg["eps"]
    group = nh // nkv
    pos = np.arange(T)
    ii, jj = np.meshgrid(pos, pos, indexing="ij")
    freqs = np.asarray(g["inv_freq"])
    x = W["tok_embd"][np.asarray(ids)]
    for li, L in enumerate(W["layers"]):
        mask = np.triu(np.full((T, T), -np.inf), k=1)
        if g["sliding"][li] and g["window"] is not None:
            mask[jj <= ii - g["window"]] = -np.inf
        h = rms_norm(x, L["attn_norm"], eps)
        q = (h @ L["wq"].T + L["bq"]).reshape(T, nh, hd)
        k = (h @ L["wk"].T + L["bk"]).reshape(T, nkv, hd)
        v = (h @ L["wv"].T + L["bv"]).reshape(T, nkv, hd)
        q, k = rope_half(q, pos, freqs) * g["mscale"], rope_half(k, pos, freqs) * g["mscale"]
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            kv = hh // group
            s = q[:, hh, :] @ k[:, kv, :].T / math.sqrt(hd) + mask
            m = np.max(s, axis=-1, keepdims=True)
            sink = L["sinks"][hh] if g["sinks"] else -np.inf
            m = np.maximum(m, sink)
            e = np.exp(s - m)
            p = e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sink - m))
            att[:, hh, :] = p @ v[:, kv, :]
        o = att.reshape(T, nh * hd) @ L["wo"].T
        x = x + (o + L["bo"] if g["o_bias"] else o)
        h = rms_norm(x, L["ffn_norm"], eps)
        x = x + gptoss_moe(h, L, g)
    hl = rms_norm(x[-1:], W["out_norm"], eps)
    return (hl @ W["output"].T)[0]


def gptoss_route(h, L, g):
    """Router logits [T, E] and, per token, the top_k experts (ties -> lowest index)."""
    r = h @ L["router"].T + (L["router_b"] if g["router_bias"] else 0.0)
    return r, [np.argsort(-r[t], kind="stable")[:g["top_k"]] for t in range(h.shape[0])]


def gptoss_moe(h, L, g):
    r, tops = gptoss_route(h, L, g)
    f = L["down"].shape[1]
    out = np.zeros_like(h)
    for t, top in enumerate(tops):
        w = softmax(r[t, top])
        for e, wt in zip(top, w):
            gu = h[t] @ L["gate_up"][e] + (L["gate_up_b"][e] if g["expert_bias"] else 0.0)
            if g["interleaved"]:
                gate, up = gu[0::2], gu[1::2]
            else:                                   # control: halves instead of interleaved
                gate, up = gu[:f], gu[f:]
            if g["limit"] is not None:
                gate = np.minimum(gate, g["limit"])
                up = np.clip(up, -g["limit"], g["limit"])
            a = gate / (1.0 + np.exp(-g["alpha"] * gate)) * (up + 1.0)
            y = a @ L["down"][e] + (L["down_b"][e] if g["expert_bias"] else 0.0)
            out[t] += wt * y
    return out


def gptoss_usage(cfg, W, ids):
    """Per layer, the tokens routed to each expert, and the smallest k-th/next router gap."""
    g = cfg["gptoss"]
    counts, gaps = [], []
    orig = globals()["gptoss_moe"]

    def spy(h, L, g):
        r, tops = gptoss_route(h, L, g)
        c = [0] * g["n_expert"]
        for t, top in enumerate(tops):
            for e in top:
                c[int(e)] += 1
            o = np.argsort(-r[t], kind="stable")
            gaps.append(r[t, o[g["top_k"] - 1]] - r[t, o[g["top_k"]]])
        counts.append(c)
        return orig(h, L, g)
    globals()["gptoss_moe"] = spy
    try:
        forward_gptoss(cfg, W, ids)
    finally:
        globals()["gptoss_moe"] = orig
    assert g
    return counts, float(min(gaps))


def gptoss_sensitivity(cfg, W, prompt, err):
    """What each gpt-oss part is worth on this prompt's logits (each must be far above
    1e-4: a loader or forward that skipped it would fail the test)."""
    g = cfg["gptoss"]

    def with_g(**kw):
        return forward_gptoss(dict(cfg, gptoss=dict(g, **kw)), W, prompt)

    plain = cfg["theta"] ** (-np.arange(0, cfg["head_dim"], 2) / cfg["head_dim"])
    trunc, _, _ = yarn_inv_freqs(cfg["theta"], cfg["head_dim"], dict(g["yarn"], truncate=True))
    out = {
        "sinks_ignored": err(with_g(sinks=False)),
        "o_bias_ignored": err(with_g(o_bias=False)),
        "router_bias_ignored": err(with_g(router_bias=False)),
        "expert_biases_ignored": err(with_g(expert_bias=False)),
        "gate_up_halves_not_interleaved": err(with_g(interleaved=False)),
        "swiglu_clamp_ignored": err(with_g(limit=None)),
        "yarn_ignored": err(with_g(inv_freq=list(plain), mscale=1.0)),
        "yarn_attention_factor_ignored": err(with_g(mscale=1.0)),
        "yarn_truncated": err(with_g(inv_freq=list(trunc))),
        "top_k_minus_one": err(with_g(top_k=g["top_k"] - 1)),
    }
    if len(prompt) > g["window"]:
        out["window_ignored"] = err(with_g(window=None))
        out["window_on_every_layer"] = err(with_g(sliding=[True] * len(g["sliding"])))
    for k, v in out.items():
        assert v > 1e-3, (k, v)
    return {k: float(f"{v:.3g}") for k, v in out.items()}


def logsumexp(v):
    m = np.max(v)
    return float(m + np.log(np.sum(np.exp(v - m))))


def generate(cfg, W, prompt_ids):
    ids = list(prompt_ids)
    gen, lgs = [], []
    for _ in range(N_NEW):
        lg = forward_last(cfg, W, ids)
        nxt = int(np.argmax(lg))
        gen.append(nxt)
        lgs.append(lg)
        ids.append(nxt)
    return gen, lgs


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------

def r(x):
    return float(f"{float(np.float32(x)):.{SIG_DIGITS}g}")


def logits_record(lg):
    return {"argmax": int(np.argmax(lg)), "logsumexp": r(logsumexp(lg)),
            "logits": [r(x) for x in lg]}


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run(m, versions):
    d = write_model(m)
    cfg, W, types = load_dir(d)
    notes = []
    if cfg["llama3_scaling"]:
        kept, smoothed, divided = llama3_regimes(cfg)
        assert kept and smoothed and divided, (kept, smoothed, divided)
        notes.append(f"llama3 inv_freq regimes over head_dim {cfg['head_dim']}: kept {kept}, "
                     f"smoothed {smoothed}, divided by factor {divided}")
        plain = cfg["theta"] ** (-np.arange(0, cfg["head_dim"], 2) / cfg["head_dim"])
        assert not np.allclose(inv_freqs(cfg), plain)
    rng = np.random.default_rng(m["seed"] + 500)
    prompts = [[int(i) for i in rng.integers(0, cfg["n_vocab"], n)] for n in PROMPT_LENS]
    recs = []
    for pi, pids in enumerate(prompts):
        gen, lgs = generate(cfg, W, pids)
        margins, logprobs = [], []
        for g, lg in zip(gen, lgs):
            o = np.argsort(-lg, kind="stable")
            assert o[0] == g
            margins.append(r(lg[o[0]] - lg[o[1]]))
            logprobs.append(r(lg[g] - logsumexp(lg)))
        exact = next((i for i, mg in enumerate(margins) if mg < 1e-3), N_NEW)
        assert exact >= MIN_EXACT, f"{m['name']} prompt {pi}: near-tie at step {exact}"
        moe_rec = {}
        if cfg.get("family", {}).get("moe") or "gptoss" in cfg:
            full = pids + gen[:-1]
            counts, gap = (gptoss_usage if "gptoss" in cfg else moe_usage)(cfg, W, full)
            # Kiln routes in float32: a near-tie of the k-th and next router logits would
            # flip a route.
            assert gap > 2e-3, f"{m['name']} prompt {pi}: router near-tie {gap}"
            moe_rec = {"moe_expert_tokens_per_layer": counts, "moe_min_router_logit_gap": r(gap)}
            if pi == len(prompts) - 1:
                assert all(min(c) > 0 for c in counts), counts     # every expert chosen
            print(f"    experts chosen per layer {counts}; min k-th gap {gap:.3g}")
        sens = sensitivity(cfg, W, pids, lgs[0])
        print(f"    sensitivity (rel err of plausible mistakes): {sens}")
        recs.append({
            "prompt_text": None,
            "prompt_ids": pids,
            "generated_ids": gen,
            "generated_text": None,
            "top2_margin": margins,
            "generated_logprobs": logprobs,
            "sensitivity": sens,
            **moe_rec,
            "prompt_logits_last": logits_record(lgs[0]),
            "step_logits": [dict(step=s, position=len(pids) + s - 1, input_token=gen[s - 1],
                                 **logits_record(lgs[s])) for s in STEP_LOGITS_STEPS],
        })
        print(f"[{m['name']}] prompt {pi} (len {len(pids)}): gen {gen}")
        print(f"    min top2 margin {min(margins):.4g} at step {int(np.argmin(margins))}; "
              f"logit std {np.std(lgs[0]):.3g}; distinct generated ids {len(set(gen))}")
    type_counts = {}
    for t in types.values():
        type_counts[t] = type_counts.get(t, 0) + 1
    files = sorted(os.listdir(d))
    weights_note = (
            "Random weights (numpy default_rng seed %d): matrices normal(0, 0.3), norms "
            "1 + 0.1*normal, biases normal(0, 0.5), drawn in float32%s; the reference reads "
            "the written files back and computes in float64." % (
                m["seed"], ", then stored as BF16 (round to nearest even); the reference "
                "uses the BF16 values" if m["dtype"] == "BF16" else ""))
    if "gptoss" in cfg:
        weights_note += (" gpt-oss: sinks normal(0, 1), router 3 * normal(0, 0.3) with its "
                         "bias, expert gate_up [E, hidden, 2 ff] (gate at even columns) 4 * "
                         "normal(0, 0.3), down [E, ff, hidden] normal(0, 0.3), all biases normal(0, 0.5).")
    doc = {
        "model": f"tests/data/arch/{m['name']}",
        "format": "hf",
        "sha256": {f: sha256_file(os.path.join(d, f)) for f in files},
        "config": cfg,
        "tensor_types": dict(sorted(type_counts.items())),
        "weights_note": weights_note,
        "rope_note": (gptoss_rope_note(cfg) if "gptoss" in cfg else "HF rotate_half layout: pairs (x[i], x[i+d/2]); inv_freq theta^(-2i/d)"
                      + ("; Llama-3 scaling applied. " + notes[0] if notes else "")),
        "method": (f"prompt ids as given (no BOS), {N_NEW} greedy argmax steps (ties -> "
                   "lowest id), no EOS stop, full forward recomputed each step, float64 "
                   "NumPy reference."),
        "schema": {
            "prompt_ids": "input ids (random, no BOS)",
            "generated_ids": f"{N_NEW} greedy ids; generated_ids[s] = argmax of step s logits",
            "step s": ("forward over prompt_ids + generated_ids[:s]; step 0 = prefill, its "
                       "logits are prompt_logits_last (position len(prompt_ids)-1)"),
            "prompt_logits_last": "logits record of step 0",
            "step_logits": (f"logits records of steps {STEP_LOGITS_STEPS}; position = 0-based "
                            "position of the last input token, input_token = "
                            "generated_ids[step-1]"),
            "logits record": "argmax, logsumexp and the full-vocab 'logits'",
            "top2_margin": "per step: best logit - second-best logit (small = near-tie)",
            "generated_logprobs": "per step: log-softmax of the chosen id",
            "sensitivity": ("relative error (max abs diff / max abs ref) of prompt_logits_last "
                            "that the named mistake would cause; the test tolerance is 1e-4"),
            "precision": f"float32 values rounded to {SIG_DIGITS} significant digits",
        },
        "logits_storage": "full vocab for every logits record",
        "versions": versions,
        "command": "python3 scripts/golden_arch.py",
        "prompts": recs,
    }
    out = os.path.join(GOLDEN_DIR, f"arch-{m['name']}.json")
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    sizes = {f: os.path.getsize(os.path.join(d, f)) for f in files}
    print(f"    wrote {d} {sizes} and {out} ({os.path.getsize(out)} bytes)")


def main():
    check_bf16_rounding()
    os.makedirs(DATA_DIR, exist_ok=True)
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    from importlib.metadata import version
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "safetensors": version("safetensors")}
    assert safetensors.__version__
    import sys
    only = set(sys.argv[1:])
    for m in MODELS:
        if not only or m["name"] in only:
            run(m, versions)


if __name__ == "__main__":
    main()
