//! The CPU forward on tiny random-weight Hugging Face directories of architectures the real
//! fixtures don't cover (`tests/data/arch/<name>/`), against an independent NumPy reference
//! (`scripts/golden_arch.py` wrote them and `tests/golden/arch-<name>.json`): greedy ids
//! token for token, logits within 1e-4 relative error. The directories hold no tokenizer.

mod golden_support;

use std::path::Path;

use golden_support::{check, load, repo};
use kiln::model::spec::Activation;
use kiln::model::{LoadFormat, ModelFiles, ModelSpec};
use serde_json::Value;

/// Opens `tests/data/arch/<name>`, lets `check_spec` look at the parsed spec, then checks
/// every prompt of `tests/golden/arch-<name>.json`.
fn check_model(name: &str, min_exact: usize, check_spec: impl FnOnce(&ModelSpec)) {
    let dir = repo().join("tests/data/arch").join(name);
    let files = ModelFiles::open(&dir, LoadFormat::Hf)
        .unwrap_or_else(|e| panic!("{name}: loading {}: {e}", dir.display()));
    assert!(
        files.tokenizer.is_none(),
        "{name}: the fixture has no tokenizer"
    );
    check_spec(&files.spec);
    check(name, &load(&format!("arch-{name}.json")), &files, min_exact);
}

#[test]
fn qwen2_qkv_bias_tied_embeddings_matches_reference() {
    check_model("qwen2-tied", 16, |s| {
        assert_eq!(s.arch, "qwen2");
        assert!(s.qkv_bias, "qwen2 has q/k/v biases");
        assert!(s.tied_embeddings, "tie_word_embeddings: true");
        assert_eq!((s.n_heads, s.n_kv_heads, s.head_dim), (8, 2, 8));
        assert_eq!(s.rope.theta, 1e6);
    });
}

#[test]
fn llama3_rope_scaling_matches_reference() {
    check_model("llama3-scaled", 16, |s| {
        assert_eq!(s.arch, "llama");
        let l3 = s.rope.llama3.expect("rope_scaling llama3 parsed");
        assert_eq!(
            (
                l3.factor,
                l3.low_freq_factor,
                l3.high_freq_factor,
                l3.original_max_position
            ),
            (8.0, 1.0, 4.0, 64.0)
        );
        assert!(!s.tied_embeddings && !s.qkv_bias);
        assert_eq!((s.n_heads, s.n_kv_heads, s.head_dim), (4, 1, 16));
    });
}

#[test]
fn mistral_bf16_weights_match_reference() {
    check_model("mistral-bf16", 16, |s| {
        assert_eq!(s.arch, "mistral");
        assert!(!s.tied_embeddings && !s.qkv_bias && s.rope.llama3.is_none());
        assert_eq!((s.n_heads, s.n_kv_heads, s.head_dim), (4, 2, 16));
    });
}

#[test]
fn llama_two_shards_matches_reference() {
    check_model("llama-sharded", 16, |s| {
        assert_eq!(s.arch, "llama");
        assert_eq!((s.n_heads, s.n_kv_heads, s.head_dim), (2, 2, 32));
    });
}

#[test]
fn qwen3_qk_norm_head_dim_128_matches_reference() {
    check_model("qwen3", 16, |s| {
        assert_eq!(s.arch, "qwen3");
        assert!(s.variant.qk_norm && !s.qkv_bias && !s.tied_embeddings);
        assert_eq!((s.n_heads, s.n_kv_heads, s.head_dim), (2, 1, 128));
    });
}

#[test]
fn gemma2_softcaps_windows_head_dim_256_match_reference() {
    check_model("gemma2", 16, |s| {
        let v = &s.variant;
        assert_eq!(s.arch, "gemma2");
        assert_eq!(v.act, Activation::GeluTanh);
        assert!(v.post_norms && !v.qk_norm && s.tied_embeddings);
        assert_eq!((v.attn_softcap, v.final_softcap), (Some(2.5), Some(5.0)));
        assert_eq!(
            (v.window, v.sliding.as_slice()),
            (Some(16), &[true, false][..])
        );
        assert_eq!(v.norm_offset, 1.0);
        assert_eq!((s.n_heads, s.n_kv_heads, s.head_dim), (2, 1, 256));
        assert_eq!(s.layer_shape(0).window, Some(16));
        assert_eq!(s.layer_shape(1).window, None);
    });
}

#[test]
fn gemma3_local_global_layers_match_reference() {
    check_model("gemma3", 16, |s| {
        let v = &s.variant;
        assert_eq!(s.arch, "gemma3");
        assert!(v.qk_norm && v.post_norms && v.attn_softcap.is_none());
        assert_eq!(v.sliding, [true, true, true, true, true, false]);
        assert_eq!(s.layer_rope(0).theta, 10000.0);
        assert_eq!(s.layer_rope(5).theta, 1e6);
        assert_eq!(s.layer_rope(5).freq_factors.as_deref(), Some(&[8.0; 8][..]));
        assert!(s.layer_rope(0).freq_factors.is_none());
    });
}

#[test]
fn phi3_fused_longrope_window_match_reference() {
    check_model("phi3", 16, |s| {
        let v = &s.variant;
        assert_eq!(s.arch, "phi3");
        assert!(v.fused_tensors && !s.tied_embeddings);
        assert_eq!(v.window, Some(48));
        let f = s.rope.freq_factors.as_ref().expect("long factors");
        assert_eq!(f[7], 18.0, "the long factors (context 512 > original 4)");
        // sqrt(1 + ln(512 / 4) / ln 4), on the rotated dims (here all of them).
        assert!((s.rope.attn_factor - 2.1213).abs() < 1e-3);
        assert_eq!(
            v.attn_scale, None,
            "the factor is not folded into the scores"
        );
    });
}

#[test]
fn phi4mini_partial_rotary_tied_matches_reference() {
    check_model("phi4mini", 16, |s| {
        assert_eq!(s.arch, "phi3");
        assert!(s.variant.fused_tensors && s.tied_embeddings);
        assert_eq!(s.variant.window, None);
        // partial_rotary_factor 0.75 of head_dim 16: rope over 12 dims, 6 long factors.
        assert_eq!((s.head_dim, s.rope.dim), (16, 12));
        let f = s.rope.freq_factors.as_ref().expect("longrope factors");
        assert_eq!(f[5], 16.0, "the long factors (context 512 > original 4)");
        // Long rope's attention factor (given in the config, as the real model's 1.19) on
        // the 12 rotated dims only: folded into the q.k scale instead it would be off by
        // 0.35-0.87 (the fixture's sensitivity record).
        assert_eq!(s.rope.attn_factor, 1.19);
        assert_eq!(s.variant.attn_scale, None);
    });
}

#[test]
fn qwen3moe_eight_experts_top2_normalised_matches_reference() {
    check_model("qwen3moe", 16, |s| {
        assert_eq!(s.arch, "qwen3moe");
        assert!(s.variant.qk_norm);
        let m = s.variant.moe.expect("moe parsed");
        assert_eq!(
            (m.n_expert, m.top_k, m.expert_ff, m.norm_topk),
            (8, 2, 16, true)
        );
    });
}

#[test]
fn qwen2moe_shared_expert_biases_top4_matches_reference() {
    check_model("qwen2moe", 16, |s| {
        assert_eq!(s.arch, "qwen2moe");
        assert!(s.qkv_bias, "qwen2_moe's qkv_bias defaults to true");
        assert!(!s.variant.qk_norm);
        let m = s.variant.moe.expect("moe parsed");
        assert_eq!(
            (m.n_expert, m.top_k, m.expert_ff, m.norm_topk, m.shared_ff),
            (8, 4, 16, false, 48)
        );
    });
}

#[test]
fn mixtral_four_experts_top2_matches_reference() {
    check_model("mixtral", 16, |s| {
        assert_eq!(s.arch, "mixtral");
        assert_eq!(s.variant.window, None);
        let m = s.variant.moe.expect("moe parsed");
        assert_eq!(
            (m.n_expert, m.top_k, m.expert_ff, m.norm_topk),
            (4, 2, 24, true)
        );
    });
}

/// Values Kiln does not implement are refused by name.
#[test]
fn moe_configs_kiln_does_not_run_are_refused_by_name() {
    let dir = repo().join("tests/data/arch/qwen3moe");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let base: Value = serde_json::from_str(&text).unwrap();
    for (key, value) in [
        ("decoder_sparse_step", serde_json::json!(2)),
        ("mlp_only_layers", serde_json::json!([0])),
        ("shared_expert_intermediate_size", serde_json::json!(64)),
        ("num_experts", serde_json::json!(4096)),
        ("num_experts_per_tok", serde_json::json!(9)),
    ] {
        let mut c = base.clone();
        c[key] = value;
        let err = ModelSpec::from_hf_config(&c.to_string())
            .unwrap_err()
            .to_string();
        let named = err.contains(key) || err.contains("expert");
        assert!(named, "{key}: {err}");
    }
    // Qwen2-MoE runs its shared expert, with the same refusals of layouts Kiln lacks.
    let mut c = base.clone();
    c["model_type"] = "qwen2_moe".into();
    c["shared_expert_intermediate_size"] = serde_json::json!(64);
    let s = ModelSpec::from_hf_config(&c.to_string()).unwrap();
    assert_eq!(s.variant.moe.map(|m| m.shared_ff), Some(64));
    c["decoder_sparse_step"] = serde_json::json!(2);
    let err = ModelSpec::from_hf_config(&c.to_string()).unwrap_err();
    assert!(err.to_string().contains("decoder_sparse_step"), "{err}");
}

/// The same fixtures as GGUF files with llama.cpp's tensor names and metadata keys
/// (`scripts/gguf_arch.py`): the spec read from the metadata equals the one from
/// `config.json` (Gemma's `1 + w` already in the norm weights), and the logits match the
/// same reference.
fn check_gguf(name: &str) {
    let path = repo().join(format!("tests/data/arch-gguf/{name}.gguf"));
    let files = ModelFiles::open(&path, LoadFormat::Gguf)
        .unwrap_or_else(|e| panic!("{name}: loading {}: {e}", path.display()));
    let hf = ModelFiles::open(&repo().join("tests/data/arch").join(name), LoadFormat::Hf)
        .unwrap()
        .spec;
    let (g, h) = (&files.spec, &hf);
    assert_eq!(g.arch, h.arch);
    assert_eq!(
        (
            g.n_layers,
            g.n_heads,
            g.n_kv_heads,
            g.head_dim,
            g.tied_embeddings
        ),
        (
            h.n_layers,
            h.n_heads,
            h.n_kv_heads,
            h.head_dim,
            h.tied_embeddings
        )
    );
    for l in 0..g.n_layers {
        let (a, b) = (g.layer_shape(l), h.layer_shape(l));
        assert_eq!(
            (a.window, a.softcap),
            (b.window, b.softcap),
            "{name} layer {l}"
        );
        let (sa, sb) = (a.score_scale(), b.score_scale());
        assert!(
            (sa - sb).abs() <= 1e-6 * sb,
            "{name} layer {l}: scale {sa} vs {sb}"
        );
        assert_eq!(g.layer_rope(l), h.layer_rope(l), "{name} layer {l}");
    }
    let (vg, vh) = (&g.variant, &h.variant);
    assert_eq!(vg.norm_offset, 0.0);
    assert_eq!(
        (
            vg.act,
            vg.qk_norm,
            vg.post_norms,
            vg.embed_scale,
            vg.final_softcap
        ),
        (
            vh.act,
            vh.qk_norm,
            vh.post_norms,
            vh.embed_scale,
            vh.final_softcap
        )
    );
    check(
        &format!("{name}.gguf"),
        &load(&format!("arch-{name}.json")),
        &files,
        16,
    );
}

#[test]
fn family_ggufs_match_the_same_reference() {
    for name in ["qwen3", "gemma2", "gemma3", "phi3"] {
        check_gguf(name);
    }
}

/// The MoE fixtures as GGUF files (`scripts/gguf_arch.py`: 3-D `ffn_*_exps` tensors,
/// `expert_*` keys; Mixtral as llama.cpp writes it, arch `llama` with q/k permuted for the
/// adjacent-pair rope): the same experts and routing read from the metadata, the same
/// reference logits (qwen3moe's experts stay BF16 and are multiplied in their own type;
/// qwen2moe's shared expert `*_shexp` and its `[1, hidden]` gate, and top-k unnormalised as
/// llama.cpp runs qwen2moe).
#[test]
fn moe_ggufs_match_the_same_reference() {
    for (name, arch) in [
        ("qwen3moe", "qwen3moe"),
        ("mixtral", "llama"),
        ("qwen2moe", "qwen2moe"),
    ] {
        let path = repo().join(format!("tests/data/arch-gguf/{name}.gguf"));
        let files = ModelFiles::open(&path, LoadFormat::Gguf)
            .unwrap_or_else(|e| panic!("{name}: loading {}: {e}", path.display()));
        let hf = ModelFiles::open(&repo().join("tests/data/arch").join(name), LoadFormat::Hf)
            .unwrap()
            .spec;
        let g = &files.spec;
        assert_eq!(g.arch, arch);
        assert_eq!(g.variant.moe, hf.variant.moe, "{name}");
        assert_eq!(g.variant.qk_norm, hf.variant.qk_norm, "{name}");
        assert_eq!(g.qkv_bias, hf.qkv_bias, "{name}");
        assert_eq!(
            (g.n_layers, g.n_heads, g.n_kv_heads, g.head_dim),
            (hf.n_layers, hf.n_heads, hf.n_kv_heads, hf.head_dim)
        );
        check(
            &format!("{name}.gguf"),
            &load(&format!("arch-{name}.json")),
            &files,
            16,
        );
    }
}

/// The fixtures stay small and the shard layout stays what the test claims to cover.
#[test]
fn fixture_files_are_small_and_sharded_as_described() {
    let dir = repo().join("tests/data/arch");
    for name in [
        "qwen2-tied",
        "llama3-scaled",
        "mistral-bf16",
        "llama-sharded",
        "qwen3",
        "gemma2",
        "gemma3",
        "phi3",
        "phi4mini",
        "qwen3moe",
        "mixtral",
        "qwen2moe",
        "gptoss",
        "gptoss-mxfp4",
    ] {
        for e in std::fs::read_dir(dir.join(name)).unwrap() {
            let e = e.unwrap();
            assert!(
                e.metadata().unwrap().len() < 300 * 1024,
                "{} too large",
                e.path().display()
            );
        }
    }
    for e in std::fs::read_dir(repo().join("tests/data/arch-gguf")).unwrap() {
        let p = e.unwrap().path();
        assert!(p.metadata().unwrap().len() < 300 * 1024, "{}", p.display());
    }
    let sharded = dir.join("llama-sharded");
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(sharded.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let shards: std::collections::BTreeSet<&str> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(shards.len(), 2);
    assert!(shards.iter().all(|s| Path::new(&sharded).join(s).exists()));
    assert!(!sharded.join("model.safetensors").exists());
    assert!(!dir.join("qwen2-tied/tokenizer.json").exists());
}

/// gpt-oss (`tests/data/arch/gptoss`, the released checkpoints' config keys): per-head
/// sinks, sliding (window 8) and full layers alternating, q/k/v/o biases, YaRN (truncate
/// false), 8 experts top 4 with router and expert biases read from the fused, transposed
/// `gate_up_proj` (gate the even columns) and `down_proj`, the clamped SwiGLU. The
/// directory ships a tokenizer (for llama.cpp's converter); ids are fed directly.
#[test]
fn gptoss_sinks_windows_yarn_biased_experts_match_reference() {
    let dir = repo().join("tests/data/arch/gptoss");
    let files = ModelFiles::open(&dir, LoadFormat::Hf)
        .unwrap_or_else(|e| panic!("gptoss: loading {}: {e}", dir.display()));
    let golden = load("arch-gptoss.json");
    check_gptoss_spec(&files.spec, &golden);
    check("gptoss", &golden, &files, 16);
}

/// The gpt-oss spec of the fixture, its YaRN frequencies against the reference's.
fn check_gptoss_spec(s: &ModelSpec, golden: &Value) {
    use kiln::backend::MoeAct;
    let v = &s.variant;
    assert_eq!(s.arch, "gpt-oss");
    assert!(s.qkv_bias && v.out_bias && v.sinks && v.moe_bias && !s.tied_embeddings);
    assert_eq!(
        (s.hidden, s.n_heads, s.n_kv_heads, s.head_dim),
        (32, 4, 2, 16)
    );
    assert_eq!(v.window, Some(8));
    assert_eq!(v.sliding, [true, false, true, false]);
    assert_eq!(s.layer_shape(0).window, Some(8));
    assert_eq!(s.layer_shape(1).window, None);
    let m = v.moe.expect("moe parsed");
    assert_eq!(
        (m.n_expert, m.top_k, m.expert_ff, m.norm_topk, m.shared_ff),
        (8, 4, 16, true, 0)
    );
    assert_eq!(
        m.act,
        MoeAct::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0
        }
    );
    assert_eq!(s.rope.theta, 150000.0);
    // 0.1 ln(4) + 1 on cos and sin.
    assert!(
        (s.rope.attn_factor - 1.138_629_4).abs() < 1e-6,
        "{}",
        s.rope.attn_factor
    );
    let want = golden["config"]["gptoss"]["inv_freq"].as_array().unwrap();
    let got = s.rope.inv_freqs();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let w = w.as_f64().unwrap();
        assert!(
            ((*g as f64) - w).abs() <= 1e-6 * w,
            "YaRN inv_freq {i}: {g} vs {w}"
        );
    }
}

/// The gpt-oss fixture as llama.cpp's own converter writes it (`scripts/gptoss_gguf.py`:
/// arch `gpt-oss`, `attn_sinks`, `attn_output.bias`, `post_attention_norm`,
/// `ffn_gate_inp.bias`, split `ffn_{gate,up,down}_exps.{weight,bias}`, `rope.scaling.type`
/// yarn): the spec equals the `config.json` one and the logits match the same reference.
/// The tokenizer (`gpt-4o` pre-tokenizer) is built on its own thread and not needed here.
#[test]
fn gptoss_gguf_from_llama_cpp_converter_matches_the_same_reference() {
    let path = repo().join("tests/data/arch-gguf/gptoss.gguf");
    let (files, _tokenizer) = ModelFiles::open_overlapped(&path, LoadFormat::Gguf)
        .unwrap_or_else(|e| panic!("gptoss.gguf: loading {}: {e}", path.display()));
    let hf = ModelFiles::open(&repo().join("tests/data/arch/gptoss"), LoadFormat::Hf)
        .unwrap()
        .spec;
    let golden = load("arch-gptoss.json");
    check_gptoss_spec(&files.spec, &golden);
    let g = &files.spec;
    assert_eq!(g.variant, hf.variant);
    assert_eq!((g.rope.clone(), g.rms_eps), (hf.rope.clone(), hf.rms_eps));
    for l in 0..g.n_layers {
        assert_eq!(g.layer_shape(l), hf.layer_shape(l), "layer {l}");
    }
    check("gptoss.gguf", &golden, &files, 16);
}

/// gpt-oss as released: the experts in MXFP4 (`*_blocks` / `*_scales`,
/// `quantization_config` mxfp4), read into ggml's MXFP4 blocks without a dequantized copy;
/// the CPU's f32 path against the reference, which decodes the OpenAI layout itself.
#[test]
fn gptoss_mxfp4_experts_match_reference() {
    let dir = repo().join("tests/data/arch/gptoss-mxfp4");
    let files = ModelFiles::open(&dir, LoadFormat::Hf)
        .unwrap_or_else(|e| panic!("gptoss-mxfp4: loading {}: {e}", dir.display()));
    let s = &files.spec;
    let m = s.variant.moe.expect("moe parsed");
    assert_eq!((m.n_expert, m.expert_ff), (8, 32));
    let gate = files
        .source
        .fetch_host("blk.0.ffn_gate_exps.weight", &[8, 32, 32])
        .unwrap()
        .unwrap();
    assert_eq!(gate.weight_type(), kiln::model::quant::GgmlType::Mxfp4);
    let types = files.source.weight_types().unwrap();
    assert!(types.contains(&kiln::model::quant::GgmlType::Mxfp4));
    check("gptoss-mxfp4", &load("arch-gptoss-mxfp4.json"), &files, 16);
}
