#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer.json (and tokenizer_config.json) for Llama 3 from the
GPT-2-form files in ../shared/models/tokenizers/llama3.2 (encoder.json + vocab.bpe, 128000
tokens) plus Llama 3's 256 special tokens: 128256 in all, so a dummy-weights directory in a
Llama-3 shape (`--load-format dummy-bf16`) serves text. Usage: llama3_tokenizer_json.py SRC DEST"""
import json
import sys
from pathlib import Path

SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def special(i):
    named = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>",
             7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>"}
    return named.get(i, f"<|reserved_special_token_{i}|>")


def main(src, dest):
    src, dest = Path(src), Path(dest)
    vocab = json.loads((src / "encoder.json").read_text())
    merges = [m for m in (src / "vocab.bpe").read_text().splitlines() if m]
    added = [{"id": 128000 + i, "content": special(i), "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i in range(256)]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin_of_text|>": {
                               "id": "<|begin_of_text|>", "ids": [128000],
                               "tokens": ["<|begin_of_text|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
           "add_bos_token": True, "model_max_length": 131072,
           "tokenizer_class": "PreTrainedTokenizerFast"}
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))


if __name__ == "__main__":
    main(*sys.argv[1:3])
