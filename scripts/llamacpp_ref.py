#!/usr/bin/env python3
"""llama.cpp as a second reference for a family fixture: runs llama.cpp's own `llama-server`
on a GGUF fixture (tests/data/arch-gguf/<name>.gguf, written by llama.cpp's converter) and
compares its greedy continuation of each golden prompt with the golden file
(tests/golden/arch-<name>.json, the float64 NumPy reference of scripts/golden_arch.py).

Per prompt it asks `/completion` for 32 tokens from the prompt ids (no BOS, temperature 0,
top-k 1, no prompt cache, going on past an EOS the golden also chose, f32 KV cache, no flash attention: its CPU flash
attention and the default f16 cache round to f16, ~1e-2 in logprobs) with the top-2
probabilities of each step, and reports
  ids     how many of the 32 greedy ids equal the golden `generated_ids`, and the first step
          that differs (a near-tie there, `top2_margin` small, explains a flip)
  lp      max |logprob of the chosen id - golden `generated_logprobs`| over the steps up to
          the first difference
llama.cpp's CPU backend rounds the activations to a weight's type before its dot products
(BF16 weights: BF16 activations, F16: F16), so a BF16 fixture agrees to ~1e-2 in logprobs
and its greedy ids may part after a dozen steps. For an f32 comparison, convert the fixture
with `--outtype f32` (the BF16 values are exact in f32: the same model) and pass it with
`--gguf` (scripts/gptoss_gguf.py takes the converter's options).

Build llama.cpp's CPU server from the source ../shared/peers/get_llama_cpp.sh fetches:
    cmake -S llama.cpp -B b -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \\
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \\
      -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build b -j2 --target llama-server
Usage: python3 scripts/llamacpp_ref.py --server b/bin/llama-server NAME [NAME...]
       python3 scripts/llamacpp_ref.py --server ... --gguf F32.gguf NAME
       python3 scripts/llamacpp_ref.py --server ... --llama-cpp LLAMA_CPP_SRC \
           --variant rope_scaling.truncate=true gptoss

What it found on gptoss (2026-12-02, llama.cpp 0c1e570, f32 GGUF from the converter): with
the fixture as it is (YaRN with `truncate: false`, as gpt-oss's config has it) llama.cpp's
greedy ids part from the golden within 0-8 steps; with `rope_scaling.truncate=true` the
two agree 96/96 and the logprobs to ~1e-5. llama.cpp always rounds YaRN's correction range
outwards (floor/ceil), which transformers does only when `truncate` is true, so on gpt-oss
llama.cpp rotates a few frequencies differently from the model's own definition.
Exit status 1 when any prompt's ids differ before a step whose golden top-2 margin is
above 1e-3 (a real disagreement rather than a tie llama.cpp's rounding may break).
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def wait_ready(port, proc, log):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode}; log: {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"llama-server did not get ready; log: {log}")


def greedy(port, prompt, want):
    """llama.cpp's greedy ids for the golden's steps, with their probability entries. Its
    `ignore_eos` would bar the end-of-text id (the fixtures' vocabularies have one), so EOS is
    left on; where it stops on EOS and the golden chose that id too, the request goes on from
    the prompt plus the golden's ids so far (teacher-forcing only that shared EOS)."""
    got, probs = [], []
    while len(got) < len(want):
        r = post(port, "/completion", {
            "prompt": list(prompt) + want[:len(got)], "n_predict": len(want) - len(got),
            "temperature": 0.0, "top_k": 1, "cache_prompt": False, "n_probs": 2,
            "return_tokens": True, "samplers": ["top_k"],
        })
        toks = r["tokens"]  # an EOS it stopped on is the last of them
        # One probability entry per token, except that the server merges tokens that are not
        # whole UTF-8: kept only while they line up.
        part = r.get("completion_probabilities", [])
        aligned = len(probs) == len(got)
        got += toks
        for c, t in zip(part if aligned else [], toks):
            if c["id"] != t:
                break
            probs.append(c)
        if r.get("stop_type") == "eos" and len(got) < len(want) and got[-1] == want[len(got) - 1]:
            continue
        break
    return got, probs


def check(server, name, port, gguf=None, golden=None):
    gguf = gguf or os.path.join(ROOT, "tests", "data", "arch-gguf", f"{name}.gguf")
    golden = json.load(open(golden or os.path.join(ROOT, "tests", "golden", f"arch-{name}.json")))
    log = f"/tmp/llamacpp-ref-{name}.log"
    proc = subprocess.Popen([server, "-m", gguf, "--port", str(port), "-c", "1024", "-np", "1",
                             "-t", "2", "--no-warmup", "-ctk", "f32", "-ctv", "f32", "-fa", "off"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    ok = True
    try:
        wait_ready(port, proc, log)
        for i, p in enumerate(golden["prompts"]):
            want = p["generated_ids"]
            got, probs = greedy(port, p["prompt_ids"], want)
            same = sum(a == b for a, b in zip(got, want))
            first = next((s for s, (a, b) in enumerate(zip(got, want)) if a != b), None)
            upto = first if first is not None else len(want)
            lp = 0.0
            # One probability entry per token until a token that is not whole UTF-8 (the
            # server merges those): compared while the entries line up with the tokens.
            for s, c in enumerate(probs[:upto]):
                if c["id"] != got[s]:
                    break
                lp = max(lp, abs(c["logprob"] - p["generated_logprobs"][s]))
            margin = p["top2_margin"][first] if first is not None else None
            tie = margin is not None and margin <= 1e-3
            print(f"{name} prompt {i}: ids {same}/{len(want)}"
                  + (f" first difference at step {first} (golden top-2 margin {margin:.2e})"
                     if first is not None else "")
                  + f", max |logprob diff| {lp:.2e}")
            ok &= first is None or tie
    finally:
        proc.terminate()
        proc.wait()
    return ok


CONVERT = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/gguf-py"]
import conversion.base, convert_hf_to_gguf
# The fixtures' tiny tokenizers have no pre-tokenizer hash the converter knows (see
# scripts/gptoss_gguf.py): the family's own name is answered instead.
pre = sys.argv[2]
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[3:]
convert_hf_to_gguf.main()
"""


def variant(name, setting, llama_cpp, pre):
    """A copy of fixture `name`'s HF directory with one config value changed (`KEY=JSON`,
    dots for nesting), transformers' own float32 greedy ids on it as the golden, and the f32
    GGUF llama.cpp's converter writes from it; returns (gguf path, golden path)."""
    import copy
    import shutil
    import torch
    from transformers import AutoModelForCausalLM

    key, value = setting.split("=", 1)
    src = os.path.join(ROOT, "tests", "data", "arch", name)
    out = f"/tmp/llamacpp-ref-{name}-variant"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    cfg = json.load(open(os.path.join(out, "config.json")))
    *parents, leaf = key.split(".")
    target = cfg
    for k in parents:
        target = target.setdefault(k, {})
    target[leaf] = json.loads(value)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    golden = json.load(open(os.path.join(ROOT, "tests", "golden", f"arch-{name}.json")))
    m = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    prompts = []
    for p in golden["prompts"]:
        ids, gen, lps, margins = list(p["prompt_ids"]), [], [], []
        with torch.no_grad():
            for _ in range(len(p["generated_ids"])):
                lg = torch.log_softmax(m(torch.tensor([ids + gen])).logits[0, -1].double(), -1)
                top = lg.topk(2)
                gen.append(int(top.indices[0]))
                lps.append(float(top.values[0]))
                margins.append(float(top.values[0] - top.values[1]))
        prompts.append(dict(prompt_ids=p["prompt_ids"], generated_ids=gen,
                            generated_logprobs=lps, top2_margin=margins))
    gpath = out + ".json"
    json.dump(dict(prompts=prompts), open(gpath, "w"))
    gguf = out + ".gguf"
    subprocess.run([sys.executable, "-c", CONVERT, llama_cpp, pre, out, "--outtype", "f32",
                    "--outfile", gguf], check=True, capture_output=True)
    print(f"{name} with {setting}: transformers float32 greedy ids as the golden, {gguf}")
    return gguf, gpath


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--gguf", help="the GGUF to run instead of the fixture (one NAME only)")
    ap.add_argument("--variant", metavar="KEY=JSON",
                    help="compare on a copy of the fixture with this config value changed "
                         "(transformers' greedy ids as the golden; needs --llama-cpp)")
    ap.add_argument("--llama-cpp", help="llama.cpp's source tree (its converter and gguf-py)")
    ap.add_argument("--pre", default="gpt-4o", help="the pre-tokenizer name the converter "
                                                    "writes for a --variant (gpt-4o)")
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    if (a.gguf or a.variant) and len(a.names) != 1:
        sys.exit("--gguf and --variant take one NAME")
    golden = None
    if a.variant:
        a.gguf, golden = variant(a.names[0], a.variant, a.llama_cpp, a.pre)
    ok = all([check(a.server, n, a.port, a.gguf, golden) for n in a.names])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
