#!/usr/bin/env python3
"""Cross-checks the NumPy reference of scripts/golden_arch.py against Hugging Face
transformers: each family fixture (tests/data/arch/<name>/, the very files the CI test
loads) is built by transformers' own model class from its config.json and safetensors,
run on the golden file's sequence (prompt_ids + generated_ids, one causal forward), and
its logits at the recorded steps compared with tests/golden/arch-<name>.json.

Reported per fixture and dtype (float32 as the issue asks, float64 to separate rounding
from a real difference):
  rel    max |hf - golden| / max |golden| over every recorded logits record (the metric
         of tests/golden_arch.rs, tolerance 1e-4)
  abs    max |hf - golden|
  ids    greedy ids agreeing with generated_ids (argmax of each of the 32 steps)

Needs torch and transformers (the GPU machine has both; this is not run in CI). The
fixtures have no tokenizer: ids are fed directly. Eager attention everywhere (Gemma 2's
logit soft cap needs it).

Usage: python3 scripts/arch_transformers_check.py [--device cuda] [--json OUT] [names...]
Exit status 1 when any comparison is above 1e-4 (float64 runs still compute rope
angles and some norms in float32 inside transformers) or any greedy id differs. The MoE
families run in float32 only (transformers 5's grouped expert matmul has no float64).

Measured on the H100 (transformers 5.17.0, torch 2.11.0+cu130), rel / ids, float32:
qwen3 2.1e-6, gemma2 5.7e-7, gemma3 5.2e-7, phi3 1.1e-5, qwen3moe 1.2e-6, mixtral 7.6e-6,
qwen2moe 7.4e-6, qwen2-tied 2.5e-6, llama3-scaled 2.6e-6, mistral-bf16 2.7e-6,
llama-sharded 1.2e-5; greedy ids 96/96 for every fixture.
gptoss (sinks, alternating windows, YaRN, biases, clamped SwiGLU; transformers 5.24.0, torch
2.15.0, CPU): float32 rel 4.1e-5, abs 2.0e-4, ids 96/96 (float64 skipped: the grouped
expert matmul).
"""

import argparse
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FAMILIES = ["qwen3", "gemma2", "gemma3", "phi3", "phi4mini", "qwen3moe", "mixtral", "qwen2moe",
            "qwen2-tied", "llama3-scaled", "mistral-bf16", "llama-sharded", "gptoss"]
LIMITS = {torch.float32: 1e-4, torch.float64: 1e-4}


def records(prompt):
    """(step, logits record) of the golden prompt: step 0 and the step_logits steps."""
    out = [(0, prompt["prompt_logits_last"])]
    out += [(s["step"], s) for s in prompt["step_logits"]]
    return out


def check(name, dtype, device):
    d = os.path.join(ROOT, "tests", "data", "arch", name)
    with open(os.path.join(ROOT, "tests", "golden", f"arch-{name}.json")) as f:
        golden = json.load(f)
    config = AutoConfig.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(
        d, config=config, dtype=dtype, attn_implementation="eager").to(device).eval()
    worst_rel, worst_abs, same, total = 0.0, 0.0, 0, 0
    for p in golden["prompts"]:
        ids = p["prompt_ids"] + p["generated_ids"][:-1]
        with torch.no_grad():
            x = torch.tensor([ids], device=device)
            lg = model(input_ids=x, use_cache=False).logits[0].to(torch.float64).cpu()
        n = len(p["prompt_ids"])
        got_ids = lg[n - 1:].argmax(-1).tolist()
        agree = next((i for i, (a, b) in enumerate(zip(got_ids, p["generated_ids"]))
                      if a != b), len(got_ids))
        same += agree
        total += len(p["generated_ids"])
        for step, rec in records(p):
            want = torch.tensor(rec["logits"], dtype=torch.float64)
            diff = (lg[n - 1 + step] - want).abs().max().item()
            worst_abs = max(worst_abs, diff)
            worst_rel = max(worst_rel, diff / want.abs().max().item())
    return dict(rel=worst_rel, abs=worst_abs, ids=same, of=total,
                hf_class=type(model).__name__)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"device {a.device}")
    if a.device == "cuda":
        # Full-precision matmuls: TF32 would add ~1e-3 errors of its own.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    results, bad = {}, False
    for name in a.names or FAMILIES:
        if not os.path.isdir(os.path.join(ROOT, "tests", "data", "arch", name)):
            print(f"{name}: no fixture")
            continue
        for dtype in (torch.float32, torch.float64):
            key = f"{name} {str(dtype).removeprefix('torch.')}"
            try:
                r = check(name, dtype, a.device)
            except RuntimeError as e:
                if dtype == torch.float64 and "Double" in str(e):
                    # transformers 5's grouped expert matmul (MoE) has no float64 kernel.
                    print(f"{key}: skipped ({e})")
                    results[key] = dict(skipped=str(e))
                    continue
                print(f"{key}: ERROR RuntimeError: {e}")
                results[key] = dict(error=f"RuntimeError: {e}")
                bad = True
                continue
            except Exception as e:  # noqa: BLE001 - report every family, then fail
                print(f"{key}: ERROR {type(e).__name__}: {e}")
                results[key] = dict(error=f"{type(e).__name__}: {e}")
                bad = True
                continue
            ok = r["rel"] < LIMITS[dtype] and r["ids"] == r["of"]
            bad |= not ok
            results[key] = r
            print(f"{key:24} {r['hf_class']:26} rel {r['rel']:.2e} abs {r['abs']:.2e} "
                  f"ids {r['ids']}/{r['of']} {'ok' if ok else 'DIFFERS'}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(transformers=transformers.__version__, torch=torch.__version__,
                           results=results), f, indent=1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
