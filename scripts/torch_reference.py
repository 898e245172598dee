#!/usr/bin/env python3
"""Independent reference logits from PyTorch/transformers for Kiln (issue 5).

Usage: python3 scripts/torch_reference.py OUTDIR [--device cuda|cpu] [--attn eager|sdpa]

Creates a randomly initialised Llama at a realistic shape (hidden 2048, 16 heads of 128,
GQA 4:1, vocab 32000, 4 layers, rope theta 500000), saves it in bf16 with
`save_pretrained` to OUTDIR/model (config.json + model.safetensors, no tokenizer), and
runs a few prompts of random token ids through transformers twice, each prompt on its own
(no padding):
  - bf16: the saved checkpoint loaded in bfloat16 on the device (what a user would run);
  - f32: the same checkpoint loaded in float32 (the bf16 weights, exactly widened), with
    TF32 off: the "exact" reference Kiln's f32 backends are held to.
Both load the files back with `from_pretrained`, so the references see exactly the weights
Kiln reads. Attention is transformers' "eager" implementation by default (plain matmul +
softmax, the most literal reading of the model); `--attn sdpa` switches both runs.

Writes:
  OUTDIR/reference.safetensors  per prompt i: ids_i (int32 [len]), positions_i (int32 [k]),
                                logits_bf16_i and logits_f32_i (float32 [k, 32000]) at the
                                k stored positions (a spread over the prompt plus its end;
                                full logits for every position would be ~120 MB).
  OUTDIR/reference.json         metadata: lengths, positions, versions, and transformers' own
                                bf16-vs-f32 error per prompt (the bf16 noise floor).
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 1234
PROMPT_LENS = [5, 37, 128, 301]
# Stored positions per prompt: up to SPREAD evenly spaced from 0 to the end, plus the last TAIL
# (consecutive, so Kiln's plan mixes a prefill chunk with single-token slices).
SPREAD, TAIL = 12, 4


def config():
    return LlamaConfig(
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=5632,
        vocab_size=32000,
        num_hidden_layers=4,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        initializer_range=0.02,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )


def positions(n):
    spread = np.round(np.linspace(0, n - 1, min(SPREAD, n))).astype(np.int64)
    tail = np.arange(max(0, n - TAIL), n)
    return np.unique(np.concatenate([spread, tail]))


def rel_l2(a, b):
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def build_and_save(model_dir):
    torch.manual_seed(SEED)
    # Initialised on the CPU in f32, so the weights do not depend on --device.
    model = LlamaForCausalLM(config())
    with torch.no_grad():
        # transformers initialises RMSNorm weights to 1; randomise them so that a norm
        # weight read from the wrong tensor (attn vs ffn, final norm) changes the logits.
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    model = model.to(torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    return n_params


def load(model_dir, dtype, device, attn):
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)
    model = model.to(device).eval()
    for p in model.parameters():
        assert p.dtype == dtype, f"{p.dtype} parameter in a {dtype} model"
    # The rotary frequencies must be f32 in both runs (a bf16 inv_freq would be a reference bug).
    rot = model.model.rotary_emb
    assert rot.inv_freq.dtype == torch.float32, rot.inv_freq.dtype
    want = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    assert torch.allclose(rot.inv_freq.cpu(), want, rtol=1e-6), "rope theta not 500000"
    return model


@torch.no_grad()
def run(model, prompts, device):
    out = []
    for ids in prompts:
        x = torch.from_numpy(ids).to(torch.long).unsqueeze(0).to(device)
        logits = model(input_ids=x, use_cache=False).logits[0]
        out.append(logits.float().cpu())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    args = ap.parse_args()
    device = torch.device(args.device)
    # f32 means f32: no TF32 in the reference matmuls (the default, made explicit; only this
    # API, since torch >= 2.9 objects to mixing it with the older allow_tf32 flags).
    torch.set_float32_matmul_precision("highest")

    model_dir = os.path.join(args.outdir, "model")
    os.makedirs(model_dir, exist_ok=True)
    t0 = time.time()
    n_params = build_and_save(model_dir)
    size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir))
    print(f"saved {n_params / 1e6:.1f}M params to {model_dir} ({size / 1e6:.0f} MB) "
          f"in {time.time() - t0:.1f}s", flush=True)

    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(0, 32000, size=n, dtype=np.int64) for n in PROMPT_LENS]
    logits = {}
    for mode, dtype in [("bf16", torch.bfloat16), ("f32", torch.float32)]:
        t0 = time.time()
        model = load(model_dir, dtype, device, args.attn)
        logits[mode] = run(model, prompts, device)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{mode}: {len(prompts)} prompts on {device} ({args.attn}) in "
              f"{time.time() - t0:.1f}s", flush=True)

    tensors, per_prompt = {}, []
    for i, ids in enumerate(prompts):
        pos = positions(len(ids))
        idx = torch.from_numpy(pos)
        b, f = logits["bf16"][i][idx], logits["f32"][i][idx]
        full_err = rel_l2(logits["bf16"][i], logits["f32"][i])
        err = rel_l2(b, f)
        agree = float((b.argmax(-1) == f.argmax(-1)).float().mean())
        top2 = f.topk(2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).median().item()
        distinct = len(set(f.argmax(-1).tolist()))
        std = float(f.std())
        assert std > 0.1 and (len(pos) < 4 or distinct > 1), "degenerate logits"
        tensors[f"ids_{i}"] = torch.from_numpy(ids.astype(np.int32))
        tensors[f"positions_{i}"] = torch.from_numpy(pos.astype(np.int32))
        tensors[f"logits_bf16_{i}"] = b.contiguous()
        tensors[f"logits_f32_{i}"] = f.contiguous()
        per_prompt.append({
            "len": len(ids),
            "positions": pos.tolist(),
            "bf16_vs_f32_rel_l2": err,
            "bf16_vs_f32_rel_l2_all_positions": full_err,
            "bf16_vs_f32_argmax_agree": agree,
            "f32_logits_std": std,
            "f32_median_top1_margin": margin,
            "f32_distinct_argmax": distinct,
        })
        print(f"prompt {i}: len {len(ids):3} stored {len(pos):2} positions; logits std "
              f"{std:.3f}, {distinct} distinct argmax; transformers bf16 vs f32: rel L2 "
              f"{err:.3e}, argmax agree {agree:.0%}", flush=True)

    ref = os.path.join(args.outdir, "reference.safetensors")
    save_file(tensors, ref)
    meta = {
        "seed": SEED,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "attn_implementation": args.attn,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vocab_size": 32000,
        "prompts": per_prompt,
    }
    with open(os.path.join(args.outdir, "reference.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    print(f"wrote {ref} ({os.path.getsize(ref) / 1e6:.1f} MB) and reference.json", flush=True)


if __name__ == "__main__":
    main()
