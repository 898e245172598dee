#!/usr/bin/env python3
"""Writes the embeddings reference fixture: a tiny random Qwen3 (Qwen3-Embedding's
architecture) saved by transformers as a Hugging Face directory, with a sentence-transformers
`modules.json` and `1_Pooling/config.json` stating last-token pooling, a small byte-level BPE
`tokenizer.json`, and the embeddings transformers computes for a few inputs.

  tests/data/embed-qwen3/      config.json, model.safetensors (float32), tokenizer.json,
                               tokenizer_config.json, modules.json, 1_Pooling/config.json
  tests/golden/embed-qwen3.json
      {"inputs": [{"text": ..., "ids": [...]}, ...],
       "embeddings": {"last": [[...], ...], "mean": [...], "cls": [...]}}

Each vector is pooled from `Qwen3Model(...).last_hidden_state` (the hidden state after the
final RMSNorm) of one input alone, then L2-normalized: the last token's row (Qwen3-Embedding's
pooling, what the fixture's files state), the mean over the tokens, and the first token's row
(the other two poolings Kiln implements, checked on the same model). The ids are the
tokenizer's own (`add_special_tokens=False`, as Kiln encodes: no BOS, no EOS appended).
The forward runs in float64 (eager attention), so the reference carries no float32 rounding.

Needs torch, transformers and tokenizers (`pip install torch transformers`). Deterministic:
a fixed seed for the weights, and the tokenizer trained on a fixed text. Used by
tests/api_embeddings.rs (`embeddings_match_transformers_on_a_tiny_qwen3`).

Usage: python3 scripts/make_embedding_fixture.py
"""

import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen3Config, Qwen3ForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "data", "embed-qwen3")
GOLDEN = os.path.join(ROOT, "tests", "golden", "embed-qwen3.json")

CORPUS = [
    "Once upon a time there was a little girl named Lily.",
    "She liked to play in the park with her dog.",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors; similar texts map to nearby vectors.",
    "Kiln serves models on the CPU and on GPUs.",
]
INPUTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog.",
    "similar texts map to nearby vectors",
    "a",
]
VOCAB = 320


def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 1,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def model():
    torch.manual_seed(1234)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=2,
    )
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        # Norm weights away from 1, so a wrong or missing final norm shows.
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return m


def pooled(m, ids):
    with torch.no_grad():
        h = m.model(torch.tensor([ids])).last_hidden_state[0].double()
    out = {"last": h[-1], "mean": h.mean(0), "cls": h[0]}
    return {k: (v / v.norm()).tolist() for k, v in out.items()}


def main():
    os.makedirs(os.path.join(OUT, "1_Pooling"), exist_ok=True)
    tok = tokenizer()
    tok.save(os.path.join(OUT, "tokenizer.json"))
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": False, "eos_token": "<|endoftext|>",
                   "model_max_length": 512}, f, indent=2)
    m = model()
    m.save_pretrained(OUT, safe_serialization=True)
    for extra in ["generation_config.json"]:
        p = os.path.join(OUT, extra)
        if os.path.exists(p):
            os.remove(p)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]
    with open(os.path.join(OUT, "modules.json"), "w") as f:
        json.dump(modules, f, indent=2)
    with open(os.path.join(OUT, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
                   "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
                   "pooling_mode_mean_sqrt_len_tokens": False,
                   "pooling_mode_weightedmean_tokens": False,
                   "pooling_mode_lasttoken": True, "include_prompt": True}, f, indent=2)
    m = m.double()
    m.config._attn_implementation = "eager"
    inputs, embeddings = [], {"last": [], "mean": [], "cls": []}
    for text in INPUTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        inputs.append({"text": text, "ids": ids})
        for k, v in pooled(m, ids).items():
            embeddings[k].append([round(x, 9) for x in v])
    with open(GOLDEN, "w") as f:
        json.dump({"model": "tests/data/embed-qwen3", "inputs": inputs,
                   "embeddings": embeddings}, f)
        f.write("\n")
    print(f"wrote {OUT} and {GOLDEN}")


if __name__ == "__main__":
    main()
