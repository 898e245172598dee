#!/usr/bin/env python3
"""Independent NumPy reference ("golden") outputs for Kiln's Llama forward pass.

What this is
------------
A from-the-math Llama forward pass in plain NumPy, float64 throughout, used to
produce expected token ids and logits that Kiln's Rust implementation is tested
against.  It shares no code with Kiln: weights are read with the PyPI `gguf`
package (`gguf.GGUFReader`, `gguf.quants.dequantize`) for GGUF files and with
`safetensors.numpy` for the HF directory; prompts are tokenized with the HF
`tokenizers` package.

The model (per layer, x = residual stream, one row per position):
    h   = RMSNorm(x) * attn_norm            RMSNorm(v) = v / sqrt(mean(v^2) + eps)
    q,k,v = h @ Wq.T, h @ Wk.T, h @ Wv.T    (no biases)
    q,k  = RoPE(q), RoPE(k)                 theta = rope.freq_base (default 10000)
    att  = softmax(q k^T / sqrt(head_dim) + causal_mask) v    (GQA: kv head = q head // (n_head / n_head_kv))
    x   += att @ Wo.T
    h   = RMSNorm(x) * ffn_norm
    x   += (silu(h @ Wgate.T) * (h @ Wup.T)) @ Wdown.T
  logits = (RMSNorm(x) * output_norm) @ Woutput.T        (untied output matrix)

RoPE layout (the one real trap):
  * GGUF llama files store the Q/K weight rows permuted (llama.cpp's converter)
    so that RoPE rotates ADJACENT pairs (x[2i], x[2i+1])  -- "normal"/GPT-J style.
  * HF safetensors keep the original layout: RoPE rotates HALF-SPLIT pairs
    (x[i], x[i + d/2])  -- NeoX style.
  Both use freq_i = theta^(-2i/n_rot), angle = pos * freq_i, pos 0-based.
  The script checks both ways that stories260K.gguf and stories260K-hf agree:
  the weights are the llama.cpp permutation of each other, and the logits match.

Quantized/F16 GGUF weights (F16, Q8_0, Q4_0) are dequantized to float32 at load
(gguf.quants.dequantize, as Kiln does at load) and then computed in float64.
Q8_0/Q4_0 blocks are also decoded by a small own implementation of the block
format and must match gguf-py bit for bit.
No activation quantization is done (llama.cpp's CPU path does quantize
activations for Q8_0/Q4_0 matmuls, so its logits differ slightly from these).

Generation: BOS (id 1) + prompt ids, then 64 greedy steps (argmax; ties -> lowest
id, numpy.argmax), never stopping at EOS. Each step recomputes the full forward
over the whole sequence (no KV cache: simple and obviously correct).

Output: tests/golden/<model-stem>.json, one per model (see "schema" inside each
file). Logits are stored as float32 values rounded to 8 significant digits.
For the 32000-vocab model, full-vocab logit vectors would make the file several
MB, so there only prompt_logits_last of the first prompt is stored in full and
every other vector is stored as its top-K (ids+values) plus the log-sum-exp over
the full vocab (see "logits_storage" in the JSON).

Rerun
-----
    python3 scripts/golden.py            # from the repo root; models from /work/shared/models
    python3 scripts/golden.py --models-dir DIR --out-dir tests/golden
Output is deterministic (no randomness, no timestamps).

requirements (versions used to generate the checked-in files):
    python==3.11.7
    numpy==2.4.6
    gguf==0.19.0
    safetensors==0.8.0
    tokenizers==0.23.3
"""

import argparse
import hashlib
import json
import math
import os
import platform
import sys

import numpy as np

import gguf
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize
from safetensors.numpy import load_file as st_load_file
from tokenizers import Tokenizer

N_NEW = 64
BOS = 1
SIG_DIGITS = 8
# step indices (into generated_ids) whose full logits are recorded in step_logits.
# Step s is the forward pass whose argmax is generated_ids[s]; step 0 is the prefill
# (its logits are prompt_logits_last), steps 1..4 are the first 4 decode steps.
STEP_LOGITS_STEPS = [1, 2, 3, 4, N_NEW - 1]
FULL_VOCAB_LIMIT = 4096   # vocab above this: store top-K instead of full vectors
TOP_K = 64

STORIES_PROMPTS = [
    "Once upon a time",
    "The little dog was very happy because",
    "Lily and Tom went to the park. They saw a big",
]
# Fixed id lists for llama-2-tiny-random (32000-token Llama-2 vocab); BOS included.
RANDOM_PROMPTS = [
    [1, 450, 4996, 17354, 1701, 29916],
    [1, 15043, 3186],
    # 40 tokens: BOS + 39 ids spread over the vocab (deterministic arithmetic pattern)
    [1] + [(29 + 811 * i) % 31990 + 3 for i in range(39)],
]


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def own_dequant(raw, qt):
    """Block decode written from the ggml format spec, used only to cross-check
    gguf.quants.dequantize. Blocks of 32 weights along ne0:
      Q8_0: f16 scale d, then 32 x int8 q          -> w = d * q
      Q4_0: f16 scale d, then 16 bytes; byte j holds weight j (low nibble) and
            weight j+16 (high nibble)              -> w = d * (nibble - 8)"""
    b = raw.reshape(-1, raw.shape[-1]).view(np.uint8)
    if qt == GGMLQuantizationType.Q8_0:
        blk = b.reshape(b.shape[0], -1, 34)
        d = blk[..., :2].copy().view(np.float16).astype(np.float32)       # [rows, nb, 1]
        q = blk[..., 2:].copy().view(np.int8).astype(np.float32)          # [rows, nb, 32]
        return (d * q).reshape(b.shape[0], -1)
    if qt == GGMLQuantizationType.Q4_0:
        blk = b.reshape(b.shape[0], -1, 18)
        d = blk[..., :2].copy().view(np.float16).astype(np.float32)
        qs = blk[..., 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32) - 8.0
        return (d * q).reshape(b.shape[0], -1)
    return None


def load_gguf(path):
    """Return (cfg, weights, tensor_types). Weights are float64 numpy arrays, with
    matrices shaped [n_out, n_in] (gguf-py reverses ne, ne0 = n_in innermost)."""
    r = GGUFReader(path)
    arch = _field(r, "general.architecture")
    assert arch == "llama", arch
    p = arch + "."
    n_embd = int(_field(r, p + "embedding_length"))
    n_head = int(_field(r, p + "attention.head_count"))
    n_head_kv = int(_field(r, p + "attention.head_count_kv", n_head))
    head_dim = n_embd // n_head
    cfg = dict(
        n_embd=n_embd,
        n_ff=int(_field(r, p + "feed_forward_length")),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_layer=int(_field(r, p + "block_count")),
        n_rot=int(_field(r, p + "rope.dimension_count", head_dim)),
        eps=float(_field(r, p + "attention.layer_norm_rms_epsilon")),
        theta=float(_field(r, p + "rope.freq_base", 10000.0)),
        rope_style="adjacent",
    )
    weights, types = {}, {}
    for t in r.tensors:
        ne = [int(x) for x in t.shape]          # ggml order: ne0 (innermost) first
        qt = GGMLQuantizationType(int(t.tensor_type))
        if qt == GGMLQuantizationType.F32:
            a = np.asarray(t.data, dtype=np.float32)
        elif qt == GGMLQuantizationType.F16:
            a = np.asarray(t.data, dtype=np.float16).astype(np.float32)
        else:
            raw = np.asarray(t.data)
            a = dequantize(raw, qt).astype(np.float32)
            own = own_dequant(raw, qt)           # independent cross-check of gguf-py
            assert own is not None and np.array_equal(own.reshape(a.shape), a), t.name
        a = a.reshape(list(reversed(ne)))       # numpy shape = reversed(ne)
        weights[t.name] = a.astype(np.float64)
        types[t.name] = qt.name
    cfg["n_vocab"] = weights["token_embd.weight"].shape[0]
    W = {
        "tok_embd": weights["token_embd.weight"],
        "out_norm": weights["output_norm.weight"],
        "output": weights.get("output.weight", weights["token_embd.weight"]),
        "layers": [],
    }
    for i in range(cfg["n_layer"]):
        b = f"blk.{i}."
        W["layers"].append(dict(
            attn_norm=weights[b + "attn_norm.weight"],
            wq=weights[b + "attn_q.weight"],
            wk=weights[b + "attn_k.weight"],
            wv=weights[b + "attn_v.weight"],
            wo=weights[b + "attn_output.weight"],
            ffn_norm=weights[b + "ffn_norm.weight"],
            w_gate=weights[b + "ffn_gate.weight"],
            w_up=weights[b + "ffn_up.weight"],
            w_down=weights[b + "ffn_down.weight"],
        ))
    check_shapes(cfg, W)
    return cfg, W, types


def load_hf(dirpath):
    with open(os.path.join(dirpath, "config.json")) as f:
        c = json.load(f)
    n_embd = c["hidden_size"]
    n_head = c["num_attention_heads"]
    head_dim = c.get("head_dim") or n_embd // n_head
    rope_params = c.get("rope_parameters") or {}
    theta = rope_params.get("rope_theta", c.get("rope_theta", 10000.0))
    assert rope_params.get("rope_type", "default") == "default"
    cfg = dict(
        n_embd=n_embd,
        n_ff=c["intermediate_size"],
        n_head=n_head,
        n_head_kv=c.get("num_key_value_heads", n_head),
        head_dim=head_dim,
        n_layer=c["num_hidden_layers"],
        n_rot=head_dim,
        eps=float(c["rms_norm_eps"]),
        theta=float(theta),
        rope_style="half",
        n_vocab=c["vocab_size"],
    )
    t = st_load_file(os.path.join(dirpath, "model.safetensors"))
    types = {k: str(v.dtype) for k, v in t.items()}
    t = {k: v.astype(np.float64) for k, v in t.items()}
    tied = c.get("tie_word_embeddings", False)
    W = {
        "tok_embd": t["model.embed_tokens.weight"],
        "out_norm": t["model.norm.weight"],
        "output": t["model.embed_tokens.weight"] if tied else t["lm_head.weight"],
        "layers": [],
    }
    for i in range(cfg["n_layer"]):
        b = f"model.layers.{i}."
        W["layers"].append(dict(
            attn_norm=t[b + "input_layernorm.weight"],
            wq=t[b + "self_attn.q_proj.weight"],
            wk=t[b + "self_attn.k_proj.weight"],
            wv=t[b + "self_attn.v_proj.weight"],
            wo=t[b + "self_attn.o_proj.weight"],
            ffn_norm=t[b + "post_attention_layernorm.weight"],
            w_gate=t[b + "mlp.gate_proj.weight"],
            w_up=t[b + "mlp.up_proj.weight"],
            w_down=t[b + "mlp.down_proj.weight"],
        ))
    check_shapes(cfg, W)
    return cfg, W, types


def check_shapes(cfg, W):
    d, f, hd = cfg["n_embd"], cfg["n_ff"], cfg["head_dim"]
    nh, nkv, V = cfg["n_head"], cfg["n_head_kv"], cfg["n_vocab"]
    assert W["tok_embd"].shape == (V, d), W["tok_embd"].shape
    assert W["output"].shape == (V, d), W["output"].shape
    assert W["out_norm"].shape == (d,)
    assert nh % nkv == 0 and cfg["n_rot"] % 2 == 0 and cfg["n_rot"] <= hd
    for L in W["layers"]:
        assert L["wq"].shape == (nh * hd, d), L["wq"].shape
        assert L["wk"].shape == (nkv * hd, d), L["wk"].shape
        assert L["wv"].shape == (nkv * hd, d), L["wv"].shape
        assert L["wo"].shape == (d, nh * hd), L["wo"].shape
        assert L["w_gate"].shape == (f, d) and L["w_up"].shape == (f, d)
        assert L["w_down"].shape == (d, f), L["w_down"].shape
        assert L["attn_norm"].shape == (d,) and L["ffn_norm"].shape == (d,)


# ---------------------------------------------------------------------------
# forward pass (float64)
# ---------------------------------------------------------------------------

def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope(x, positions, n_rot, theta, style):
    """x: [T, n_heads, head_dim]. Rotates the first n_rot dims of each head."""
    half = n_rot // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)   # [half]
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]         # [T, half]
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    out = x.copy()
    if style == "adjacent":          # pairs (x[2i], x[2i+1]) -- GGUF llama layout
        a = x[..., 0:n_rot:2]
        b = x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    elif style == "half":            # pairs (x[i], x[i+n_rot/2]) -- HF layout
        a = x[..., :half]
        b = x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    else:
        raise ValueError(style)
    return out


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def forward_last(cfg, W, ids):
    """Full forward over ids; returns float64 logits of the LAST position [n_vocab]."""
    T = len(ids)
    nh, nkv, hd = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    group = nh // nkv
    pos = np.arange(T)
    mask = np.triu(np.full((T, T), -np.inf), k=1)          # j > i masked
    scale = 1.0 / math.sqrt(hd)
    x = W["tok_embd"][np.asarray(ids)]                     # [T, d]
    for L in W["layers"]:
        h = rms_norm(x, L["attn_norm"], cfg["eps"])
        q = (h @ L["wq"].T).reshape(T, nh, hd)
        k = (h @ L["wk"].T).reshape(T, nkv, hd)
        v = (h @ L["wv"].T).reshape(T, nkv, hd)
        q = rope(q, pos, cfg["n_rot"], cfg["theta"], cfg["rope_style"])
        k = rope(k, pos, cfg["n_rot"], cfg["theta"], cfg["rope_style"])
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            kv = hh // group
            s = (q[:, hh, :] @ k[:, kv, :].T) * scale + mask     # [T, T]
            att[:, hh, :] = softmax(s) @ v[:, kv, :]
        x = x + att.reshape(T, nh * hd) @ L["wo"].T
        h = rms_norm(x, L["ffn_norm"], cfg["eps"])
        x = x + (silu(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
    hl = rms_norm(x[-1:], W["out_norm"], cfg["eps"])
    return (hl @ W["output"].T)[0]


def logsumexp(v):
    m = np.max(v)
    return float(m + np.log(np.sum(np.exp(v - m))))


def top2(v):
    o = np.argsort(-v, kind="stable")
    return int(o[0]), int(o[1])


def generate(cfg, W, prompt_ids, n_new=N_NEW):
    ids = list(prompt_ids)
    gen, all_logits = [], []
    for _ in range(n_new):
        lg = forward_last(cfg, W, ids)
        nxt = int(np.argmax(lg))                            # ties -> lowest id
        all_logits.append(lg)
        gen.append(nxt)
        ids.append(nxt)
    return gen, all_logits


# ---------------------------------------------------------------------------
# self-checks
# ---------------------------------------------------------------------------

def permute_hf_to_gguf(w, n_head):
    """llama.cpp convert permutation: HF half-split rows -> GGUF adjacent-pair rows."""
    n_out, n_in = w.shape
    hd = n_out // n_head
    return w.reshape(n_head, 2, hd // 2, n_in).swapaxes(1, 2).reshape(n_out, n_in)


def check_rope_equivalence():
    """RoPE(adjacent) on permuted rows == permute(RoPE(half) on original rows)."""
    rng = np.random.default_rng(0)
    hd, T = 8, 5
    x = rng.standard_normal((T, 3, hd))
    perm = np.arange(hd).reshape(2, hd // 2).T.reshape(-1)   # gguf index j <- hf index perm[j]
    a = rope(x[..., perm], np.arange(T), hd, 10000.0, "adjacent")
    b = rope(x, np.arange(T), hd, 10000.0, "half")[..., perm]
    assert np.allclose(a, b, atol=1e-12), "rope layouts inconsistent"


def check_weights_equivalent(cfg_g, Wg, cfg_h, Wh):
    """GGUF Q/K rows are the llama.cpp permutation of the HF rows; rest identical."""
    md = 0.0
    for key in ("tok_embd", "out_norm", "output"):
        md = max(md, float(np.max(np.abs(Wg[key] - Wh[key]))))
    for Lg, Lh in zip(Wg["layers"], Wh["layers"]):
        for key in Lg:
            hv = Lh[key]
            if key == "wq":
                hv = permute_hf_to_gguf(hv, cfg_h["n_head"])
            elif key == "wk":
                hv = permute_hf_to_gguf(hv, cfg_h["n_head_kv"])
            md = max(md, float(np.max(np.abs(Lg[key] - hv))))
    return md


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------

def r(x):
    """float32 value rounded to SIG_DIGITS significant digits, as a Python float."""
    return float(f"{float(np.float32(x)):.{SIG_DIGITS}g}")


def rlist(v):
    return [r(x) for x in v]


def logits_record(lg, full):
    rec = {"argmax": int(np.argmax(lg)), "logsumexp": r(logsumexp(lg))}
    if full:
        rec["logits"] = rlist(lg)
    else:
        o = np.argsort(-lg, kind="stable")[:TOP_K]
        rec["top_k_ids"] = [int(i) for i in o]
        rec["top_k_logits"] = rlist(lg[o])
    return rec


def run_model(name, cfg, W, prompts, tok):
    full = cfg["n_vocab"] <= FULL_VOCAB_LIMIT
    out = []
    for pi, (text, pids) in enumerate(prompts):
        gen, lgs = generate(cfg, W, pids)
        margins, logprobs = [], []
        for g, lg in zip(gen, lgs):
            a, b = top2(lg)
            assert a == g
            margins.append(r(lg[a] - lg[b]))
            logprobs.append(r(lg[g] - logsumexp(lg)))
        rec = {
            "prompt_text": text,
            "prompt_ids": [int(i) for i in pids],
            "generated_ids": gen,
            "generated_text": tok.decode(gen, skip_special_tokens=False) if tok else None,
            "top2_margin": margins,
            "generated_logprobs": logprobs,
            "prompt_logits_last": logits_record(lgs[0], full or pi == 0),
            "step_logits": [
                dict(step=s, position=len(pids) + s - 1, input_token=gen[s - 1],
                     **logits_record(lgs[s], full))
                for s in STEP_LOGITS_STEPS
            ],
        }
        out.append((rec, lgs))
        print(f"[{name}] prompt {pi}: {pids}")
        print(f"    gen ids: {gen}")
        if tok:
            print(f"    text: {text!r} -> {rec['generated_text']!r}")
        print(f"    min top2 margin: {min(margins):.4g} at step {int(np.argmin(margins))}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", default="/work/shared/models")
    ap.add_argument("--out-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
    args = ap.parse_args()
    md = args.models_dir
    out_dir = os.path.normpath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)

    check_rope_equivalence()
    tok = Tokenizer.from_file(os.path.join(md, "stories260K-hf", "tokenizer.json"))
    stories_prompts = []
    for s in STORIES_PROMPTS:
        ids = tok.encode(s, add_special_tokens=False).ids
        assert ids[0] != BOS
        stories_prompts.append((s, [BOS] + ids))
    random_prompts = [(None, p) for p in RANDOM_PROMPTS]
    assert len(RANDOM_PROMPTS[2]) == 40 and all(0 <= i < 32000 for p in RANDOM_PROMPTS for i in p)

    versions = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "gguf": getattr(gguf, "__version__", None) or _pkg_version("gguf"),
        "safetensors": _pkg_version("safetensors"),
        "tokenizers": _pkg_version("tokenizers"),
    }
    command = "python3 scripts/golden.py"
    if md != "/work/shared/models":
        command += f" --models-dir {md}"

    jobs = [
        ("stories260K.gguf", "gguf", stories_prompts),
        ("stories260K-F16.gguf", "gguf", stories_prompts),
        ("stories260K-Q8_0.gguf", "gguf", stories_prompts),
        ("stories260K-Q4_0.gguf", "gguf", stories_prompts),
        ("stories260K-hf", "hf", stories_prompts),
        ("llama-2-tiny-random.gguf", "gguf", random_prompts),
    ]
    results = {}
    loaded = {}
    for fname, kind, prompts in jobs:
        path = os.path.join(md, fname)
        if kind == "gguf":
            cfg, W, types = load_gguf(path)
            files = {fname: sha256_file(path)}
        else:
            cfg, W, types = load_hf(path)
            files = {f"{fname}/{f}": sha256_file(os.path.join(path, f))
                     for f in ("config.json", "model.safetensors")}
        loaded[fname] = (cfg, W)
        use_tok = tok if fname.startswith("stories260K") else None
        print(f"== {fname}: {cfg}")
        res = run_model(fname, cfg, W, prompts, use_tok)
        results[fname] = res

        type_counts = {}
        for t in types.values():
            type_counts[t] = type_counts.get(t, 0) + 1
        quantized = any(t not in ("F32", "float32") for t in types.values())
        full = cfg["n_vocab"] <= FULL_VOCAB_LIMIT
        doc = {
            "model": fname,
            "format": kind,
            "sha256": files,
            "config": cfg,
            "tensor_types": dict(sorted(type_counts.items())),
            "weights_note": (
                "Non-F32 weights (F16/Q8_0/Q4_0) dequantized to float32 at load with "
                "gguf.quants.dequantize (as Kiln does); all math in float64; no activation "
                "quantization." if quantized else
                "All weights F32; all math in float64."),
            "rope_note": ("GGUF layout: RoPE rotates adjacent pairs (x[2i], x[2i+1])."
                          if kind == "gguf" else
                          "HF layout: RoPE rotates half-split pairs (x[i], x[i+d/2])."),
            "method": ("BOS(1)+prompt, 64 greedy argmax steps (ties -> lowest id), no EOS stop, "
                       "full forward recomputed each step, float64 NumPy reference."),
            "schema": {
                "prompt_ids": "input ids incl. BOS",
                "generated_ids": "64 greedy ids; generated_ids[s] = argmax of step s logits",
                "step s": ("forward over prompt_ids + generated_ids[:s]; step 0 = prefill, its "
                           "logits are prompt_logits_last (position len(prompt_ids)-1)"),
                "prompt_logits_last": "logits record of step 0",
                "step_logits": (f"logits records of steps {STEP_LOGITS_STEPS} (step 1..4 = first "
                                "4 decode steps, 63 = final); position = 0-based position of the "
                                "last input token, input_token = generated_ids[step-1]"),
                "logits record": ("argmax, logsumexp (over full vocab), and either 'logits' "
                                  "(full vocab) or 'top_k_ids'+'top_k_logits' (top K, descending)"),
                "top2_margin": "per step: best logit - second-best logit (small = near-tie)",
                "generated_logprobs": "per step: log-softmax of the chosen id",
                "precision": f"float32 values rounded to {SIG_DIGITS} significant digits",
            },
            "logits_storage": (
                "full vocab for every logits record" if full else
                f"vocab {cfg['n_vocab']} > {FULL_VOCAB_LIMIT}: full vector only for prompt 0's "
                f"prompt_logits_last; all other records store the top {TOP_K} ids/logits plus "
                "logsumexp over the full vocab (keeps the file < 1 MB)"),
            "versions": versions,
            "command": command,
            "prompts": [rec for rec, _ in res],
        }
        stem = fname[:-5] if fname.endswith(".gguf") else fname
        out_path = os.path.join(out_dir, stem + ".json")
        with open(out_path, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
        print(f"    wrote {out_path} ({os.path.getsize(out_path)} bytes)")

    # ---- cross-checks -------------------------------------------------------
    print("\n== cross-checks")
    cg, Wg = loaded["stories260K.gguf"]
    ch, Wh = loaded["stories260K-hf"]
    wdiff = check_weights_equivalent(cg, Wg, ch, Wh)
    print(f"stories260K.gguf vs stories260K-hf: max |weight diff| after llama.cpp Q/K permutation = {wdiff:.3g}")
    assert wdiff == 0.0
    ref = results["stories260K.gguf"]
    for other in ("stories260K-hf", "stories260K-F16.gguf", "stories260K-Q8_0.gguf",
                  "stories260K-Q4_0.gguf"):
        res = results[other]
        maxd, same_ids, first_div = 0.0, 0, []
        for (ra, la), (rb, lb) in zip(ref, res):
            n = min(len(la), len(lb))
            # compare logits only while the sequences are identical
            k = next((i for i in range(N_NEW) if ra["generated_ids"][i] != rb["generated_ids"][i]), N_NEW)
            for i in range(min(n, k + 1)):
                maxd = max(maxd, float(np.max(np.abs(la[i] - lb[i]))))
            same_ids += ra["generated_ids"] == rb["generated_ids"]
            first_div.append(k)
        print(f"stories260K.gguf vs {other}: max |logit diff| (over steps with identical "
              f"context) = {maxd:.3g}; identical generations {same_ids}/3; first divergence "
              f"step per prompt = {first_div}")
        if other == "stories260K-hf":
            assert maxd < 1e-9 and same_ids == 3, "GGUF and HF paths disagree"


def _pkg_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
