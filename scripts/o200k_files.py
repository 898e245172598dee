#!/usr/bin/env python3
"""Writes the o200k_harmony tokenizer (gpt-oss) in three forms, offline, from bpe-openai's ranks.

    python3 scripts/o200k_files.py OUTDIR [--only tiktoken|tokenizer.json|gguf]

OUTDIR gets:
  o200k_base.tiktoken    `base64(bytes) rank` per line, the file openai-harmony reads from the
                         folder named by TIKTOKEN_ENCODINGS_BASE
  tokenizer.json         a Hugging Face tokenizer as the gpt-oss checkpoints ship it: byte-level
                         BPE with merges derived from the ranks, the o200k split regex then
                         ByteLevel, the 1,090 harmony special tokens as added tokens
  tokenizer_config.json  bos `<|startoftext|>`, eos `<|return|>`, pad `<|endoftext|>`
  o200k-harmony.gguf     a vocabulary-only GGUF of arch `gpt-oss` with the tokenizer keys that
                         llama.cpp's convert_hf_to_gguf.py --vocab-only writes for gpt-oss from
                         the tokenizer.json above (checked key for key against it)

Needs the PyPI package bpe-openai; the GGUF part needs numpy and llama.cpp's gguf-py: the folder
KILN_GGUF_PY names, else the one in target/peer/llama.cpp-src.tgz, else an installed `gguf`.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

VOCAB_SIZE = 201088
FIRST_SPECIAL = 199998

# The named harmony tokens; every other id in FIRST_SPECIAL..VOCAB_SIZE is `<|reserved_ID|>`.
NAMED_SPECIALS = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}

BOS, EOS, PAD = "<|startoftext|>", "<|return|>", "<|endoftext|>"


def special_tokens() -> list[tuple[int, str]]:
    """(id, text) of the 1,090 special tokens, in id order."""
    return [
        (i, NAMED_SPECIALS.get(i, f"<|reserved_{i}|>")) for i in range(FIRST_SPECIAL, VOCAB_SIZE)
    ]


def o200k_base():
    import bpe_openai

    enc = bpe_openai.get_encoding("o200k_base")
    ranks: dict[bytes, int] = enc._mergeable_ranks
    assert len(ranks) == FIRST_SPECIAL, len(ranks)
    assert sorted(ranks.values()) == list(range(FIRST_SPECIAL)), "ranks are not 0..199997"
    return ranks, enc._pat_str


def write_tiktoken(ranks: dict[bytes, int], path: Path) -> None:
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for piece, rank in by_rank:
            f.write(f"{base64.b64encode(piece).decode('ascii')} {rank}\n")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ByteLevel alphabet)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """BPE merges equivalent to rank-ordered merging: for every token of two or more bytes,
    each split into two tokens of lower rank is a merge, ordered by the merged token's rank,
    then by the left and right parts' ranks."""
    found: list[tuple[int, int, int, bytes, bytes]] = []
    for piece, rank in ranks.items():
        if len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            lr, rr = ranks.get(left), ranks.get(right)
            if lr is not None and rr is not None and lr < rank and rr < rank:
                found.append((rank, lr, rr, left, right))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]


def tokenizer_json(ranks: dict[bytes, int], pat_str: str) -> dict:
    b2u = byte_to_unicode()

    def text(piece: bytes) -> str:
        return "".join(b2u[b] for b in piece)

    vocab = {text(piece): rank for piece, rank in sorted(ranks.items(), key=lambda kv: kv[1])}
    merges = [[text(a), text(b)] for a, b in derive_merges(ranks)]
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in special_tokens()
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": pat_str},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }


def tokenizer_config() -> dict:
    decoder = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in special_tokens()
    }
    return {
        "added_tokens_decoder": decoder,
        "bos_token": BOS,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "extra_special_tokens": {},
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": PAD,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def gguf_module():
    """gguf-py: KILN_GGUF_PY (a folder holding the `gguf` package), else unpacked from the
    llama.cpp source tarball under target/peer, else the installed package."""
    root = os.environ.get("KILN_GGUF_PY")
    tgz = Path(__file__).resolve().parent.parent / "target/peer/llama.cpp-src.tgz"
    if not root and not tgz.is_file():
        try:
            import gguf
        except ImportError:
            sys.exit(f"gguf-py not found: set KILN_GGUF_PY, provide {tgz} or install gguf")
        return gguf
    if not root:
        dest = Path(tempfile.mkdtemp(prefix="o200k-gguf-py-"))
        atexit.register(shutil.rmtree, dest, True)
        with tarfile.open(tgz) as tar:
            members = [m for m in tar.getmembers() if "/gguf-py/gguf/" in m.name and m.isfile()]
            tar.extractall(dest, members=members, filter="data")
        root = str(next(dest.glob("*/gguf-py")))
    sys.path.insert(0, root)
    import gguf

    return gguf


def write_gguf(ranks: dict[bytes, int], path: Path) -> None:
    """The tokenizer keys of convert_hf_to_gguf.py's GptOssModel (`_set_vocab_gpt2`): every
    id's piece, NORMAL for the ranks and CONTROL for the special tokens, the merges of the
    tokenizer.json, pre `gpt-4o`, and bos/eos/pad from tokenizer_config.json."""
    gguf = gguf_module()
    b2u = byte_to_unicode()

    def text(piece: bytes) -> str:
        return "".join(b2u[b] for b in piece)

    tokens = [""] * VOCAB_SIZE
    types = [gguf.TokenType.NORMAL] * VOCAB_SIZE
    for piece, rank in ranks.items():
        tokens[rank] = text(piece)
    ids = {}
    for i, t in special_tokens():
        tokens[i] = t
        types[i] = gguf.TokenType.CONTROL
        ids[t] = i
    merges = [f"{text(a)} {text(b)}" for a, b in derive_merges(ranks)]

    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("o200k_harmony vocabulary")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids[BOS])
    w.add_eos_token_id(ids[EOS])
    w.add_pad_token_id(ids[PAD])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--only", choices=["tiktoken", "tokenizer.json", "gguf"])
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    ranks, pat_str = o200k_base()
    if args.only in (None, "tiktoken"):
        write_tiktoken(ranks, args.outdir / "o200k_base.tiktoken")
    if args.only in (None, "tokenizer.json"):
        with open(args.outdir / "tokenizer.json", "w", encoding="utf-8") as f:
            json.dump(tokenizer_json(ranks, pat_str), f, ensure_ascii=False)
        with open(args.outdir / "tokenizer_config.json", "w", encoding="utf-8") as f:
            json.dump(tokenizer_config(), f, ensure_ascii=False, indent=2)
    if args.only in (None, "gguf"):
        write_gguf(ranks, args.outdir / "o200k-harmony.gguf")


if __name__ == "__main__":
    main()
