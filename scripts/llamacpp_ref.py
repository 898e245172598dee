#!/usr/bin/env python3
"""llama.cpp as a second reference for a family fixture: runs llama.cpp's own `llama-server`
on a GGUF fixture (tests/data/arch-gguf/<name>.gguf, written by llama.cpp's converter) and
compares its greedy continuation of each golden prompt with the golden file
(tests/golden/arch-<name>.json, the float64 NumPy reference of scripts/golden_arch.py).

Per prompt it asks `/completion` for 32 tokens from the prompt ids (no BOS, temperature 0,
top-k 1, EOS ignored, no prompt cache) with the top-2 probabilities of each step, and reports
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


def check(server, name, port, gguf=None):
    gguf = gguf or os.path.join(ROOT, "tests", "data", "arch-gguf", f"{name}.gguf")
    golden = json.load(open(os.path.join(ROOT, "tests", "golden", f"arch-{name}.json")))
    log = f"/tmp/llamacpp-ref-{name}.log"
    proc = subprocess.Popen([server, "-m", gguf, "--port", str(port), "-c", "1024", "-np", "1",
                             "-t", "2", "--no-warmup"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    ok = True
    try:
        wait_ready(port, proc, log)
        for i, p in enumerate(golden["prompts"]):
            want = p["generated_ids"]
            r = post(port, "/completion", {
                "prompt": p["prompt_ids"], "n_predict": len(want), "temperature": 0.0,
                "top_k": 1, "ignore_eos": True, "cache_prompt": False, "n_probs": 2,
                "return_tokens": True, "samplers": ["top_k"],
            })
            got = r.get("tokens") or [c["id"] for c in r["completion_probabilities"]]
            same = sum(a == b for a, b in zip(got, want))
            first = next((s for s, (a, b) in enumerate(zip(got, want)) if a != b), None)
            upto = first if first is not None else len(want)
            lp = 0.0
            for s, c in enumerate(r.get("completion_probabilities", [])[:upto]):
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--gguf", help="the GGUF to run instead of the fixture (one NAME only)")
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    if a.gguf and len(a.names) != 1:
        sys.exit("--gguf takes one NAME")
    ok = all([check(a.server, n, a.port, a.gguf) for n in a.names])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
