#!/usr/bin/env python3
"""The PyTorch peer for Kiln's speed numbers: transformers' Llama in the Llama-3-8B shape,
randomly initialised in bf16 on the GPU, timed the way `bench_llama3_8b_shape` times Kiln.

Prompt 512 tokens, 128 generated greedily (EOS ignored), at batch 1 and 32. Prints the
prefill time and the decode rate (generated tokens over the time after the prefill).
Usage (on the GPU machine): python3 scripts/torch_peer.py [--batches 1 32] [--attn sdpa]
"""

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--attn", default="sdpa", help="transformers attn_implementation")
    args = ap.parse_args()

    cfg = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = args.attn
    torch.manual_seed(0)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    model.eval()
    torch.cuda.synchronize()
    print(f"PEER torch {torch.__version__}, model built on {torch.cuda.get_device_name()} "
          f"in {time.time() - t0:.1f}s ({args.attn})", flush=True)

    g = torch.Generator(device="cuda").manual_seed(1)
    for b in args.batches:
        ids = torch.randint(0, cfg.vocab_size, (b, args.prompt), device="cuda", generator=g)
        with torch.inference_mode():
            model(ids[:, :16])  # warm-up
            torch.cuda.synchronize()
            t = time.time()
            model(ids)
            torch.cuda.synchronize()
            prefill = time.time() - t
            t = time.time()
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.gen,
                min_new_tokens=args.gen,
                do_sample=False,
                pad_token_id=0,
            )
            torch.cuda.synchronize()
            total = time.time() - t
        new = out.shape[1] - args.prompt
        decode = max(total - prefill, 1e-9)
        print(
            f"PEER transformers batch {b}: prefill {args.prompt} x {b} in {prefill * 1e3:.1f} ms; "
            f"{new} generated in {total:.2f} s: {b * (new - 1) / decode:.0f} tok/s decode "
            f"({decode / (new - 1) * 1e3:.2f} ms/step)",
            flush=True,
        )


if __name__ == "__main__":
    main()
