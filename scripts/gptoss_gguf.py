#!/usr/bin/env python3
"""Writes tests/data/arch-gguf/gptoss.gguf from the gpt-oss fixture directory
(tests/data/arch/gptoss/, made by scripts/golden_arch.py) with llama.cpp's own
convert_hf_to_gguf.py, so the GGUF test reads exactly what llama.cpp's converter writes
(arch `gpt-oss`: attn_sinks, attn_output.bias, post_attention_norm, ffn_gate_inp.bias,
ffn_{gate,up,down}_exps.{weight,bias} split from the fused, transposed gate_up_proj,
rope.scaling.type yarn with its factor, original context and beta keys).

One change to the converter's behaviour: the fixture's tiny byte-level BPE tokenizer is
not one of the pre-tokenizers whose hash the converter knows, so this script replaces
`TextModel.get_vocab_base_pre` to answer `gpt-4o` (what the converter writes for gpt-oss's
o200k tokenizer). Nothing else is patched; the tensors and keys are the converter's.

Usage: python3 scripts/gptoss_gguf.py [LLAMA_CPP_DIR]
(default /tmp/gptoss/llama.cpp: target/peer/llama.cpp-src.tgz unpacked under /tmp/gptoss)
Needs torch, transformers and the tokenizers package (as the converter does).
"""

import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    llama = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gptoss/llama.cpp"
    sys.path.insert(0, os.path.join(llama, "gguf-py"))
    sys.path.insert(0, llama)
    import conversion.base
    import convert_hf_to_gguf

    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-4o"
    src = os.path.join(ROOT, "tests", "data", "arch", "gptoss")
    out = os.path.join(ROOT, "tests", "data", "arch-gguf", "gptoss.gguf")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    # The fixture is BF16: bf16 keeps every value (the converter stores 1-D tensors as F32).
    sys.argv = ["convert_hf_to_gguf.py", src, "--outfile", out, "--outtype", "bf16"]
    convert_hf_to_gguf.main()
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    main()
