#!/usr/bin/env python3
"""How much bf16 rounding alone moves a family fixture's logits (tests/data/arch/<name>),
with long rope's attention factor applied two ways: "old" (q and k rounded after the rope,
the factor squared in the q.k scale) and "new" (the rotated dims times the factor before
rounding, as Kiln's rope kernels do now). Every activation is rounded to bf16 at each op
boundary (harsher than the GPU, whose residual stream and scores stay f32); the reference is
the same forward in float64 without rounding. Prints, per prompt of the golden file, the
relative L2 error of the last position's logits. Uses scripts/golden_arch.py's reader and
ops. Usage: python3 scripts/bf16_rounding_emulation.py phi3 [phi4mini ...]
(tests/parity/arch_models.rs's `bf16_tol` cites its phi3 result.)
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_arch as G  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))



def r16(a):
    """Round to the nearest bf16 (ties to even), back as float64."""
    a = np.asarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7fff + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def fwd(cfg, W, ids, variant, rnd=True):
    """The phi3-family forward of golden_arch.forward_family, last position's logits."""
    R = r16 if rnd else (lambda a: a)
    fam = cfg["family"]; T = len(ids)
    nh, nkv, hd = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    group, eps, rd = nh // nkv, cfg["eps"], fam["rot_dim"]
    pos = np.arange(T); causal = np.triu(np.full((T, T), -np.inf), k=1)
    ii, jj = np.meshgrid(pos, pos, indexing="ij")
    x = R(W["tok_embd"][np.asarray(ids)])
    ms = fam["mscale"]
    for li, L in enumerate(W["layers"]):
        sliding = fam["sliding"][li] and fam["window"] is not None
        freqs = cfg["theta"] ** (-np.arange(0, rd, 2, dtype=np.float64) / rd) / np.asarray(fam["global_divisor"])
        mask = causal.copy()
        if sliding: mask[jj <= ii - fam["window"]] = -np.inf
        h = R(G.rms_norm(x, L["attn_norm"], eps))
        q, k, v = R(h @ L["wq"].T), R(h @ L["wk"].T), R(h @ L["wv"].T)
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if variant == "old":
            rot = lambda a, m: np.concatenate([G.rope_half(a[..., :rd], pos, freqs) * m, a[..., rd:]], axis=-1)
            q = R(rot(q, 1)); k = R(rot(k, 1)); sc = ms*ms/math.sqrt(hd)
        else:
            rot = lambda a, m: np.concatenate([G.rope_half(a[..., :rd], pos, freqs) * m, a[..., rd:]], axis=-1)
            q = R(rot(q, ms)); k = R(rot(k, ms)); sc = 1/math.sqrt(hd)
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            kv = hh // group
            s = (q[:, hh, :] @ k[:, kv, :].T) * sc
            att[:, hh, :] = G.softmax(s + mask) @ v[:, kv, :]
        o = R(R(att.reshape(T, nh*hd)) @ L["wo"].T)
        x = R(x + o)
        h = R(G.rms_norm(x, L["ffn_norm"], eps))
        m = R(R(G.silu(R(h @ L["w_gate"].T)) * R(h @ L["w_up"].T)) @ L["w_down"].T)
        x = R(x + m)
    return (G.rms_norm(x, W["out_norm"], eps) @ W["output"].T)[-1]


def main():
    for name in sys.argv[1:]:
        cfg, W, _ = G.load_dir(os.path.join(ROOT, "tests/data/arch", name))
        with open(os.path.join(ROOT, "tests/golden", f"arch-{name}.json")) as f:
            gold = json.load(f)
        for p in gold["prompts"]:
            ids = p["prompt_ids"]
            ex = fwd(cfg, W, ids, "new", rnd=False)
            e = {v: np.linalg.norm(fwd(cfg, W, ids, v) - ex) / np.linalg.norm(ex)
                 for v in ("old", "new")}
            print(name, f"prompt of {len(ids)} tokens:",
                  ", ".join(f"{k} {v:.3e}" for k, v in e.items()))


if __name__ == "__main__":
    main()
