//! The shipped model configs parse into the shapes of the real models, and dummy weights
//! load through the same loader as real files.

use std::path::Path;

use kiln::backend::cpu::CpuBackend;
use kiln::model::{LoadFormat, ModelFiles, ModelSpec, RopeLayout};

fn spec(name: &str) -> ModelSpec {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/models")
        .join(name);
    ModelSpec::from_hf_config(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn llama3_8b_shapes() {
    let s = spec("llama-3-8b.json");
    assert_eq!(
        (s.hidden, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim),
        (4096, 32, 32, 8, 128)
    );
    assert_eq!(
        (s.vocab_size, s.intermediate, s.rope.theta),
        (128256, 14336, 500000.0)
    );
    assert_eq!(s.rope.layout, RopeLayout::Half);
    assert!(!s.tied_embeddings && !s.qkv_bias);
}

#[test]
fn llama2_7b_shapes() {
    let s = spec("llama-2-7b.json");
    assert_eq!(
        (s.hidden, s.n_kv_heads, s.head_dim, s.vocab_size),
        (4096, 32, 128, 32000)
    );
}

#[test]
fn llama32_1b_has_llama3_scaling_and_tied_embeddings() {
    let s = spec("llama-3.2-1b.json");
    let l3 = s.rope.llama3.expect("llama3 rope scaling");
    assert_eq!((l3.factor, l3.original_max_position), (32.0, 8192.0));
    assert!(s.tied_embeddings);
    let f = s.rope.inv_freqs();
    assert_eq!(f.len(), 32);
    assert!(
        f[31] < 500000f32.powf(-62.0 / 64.0),
        "low frequencies are divided by the factor"
    );
}

#[test]
fn dummy_weights_load_at_config_shapes_and_run() {
    let dir = std::env::temp_dir().join(format!("kiln-dummy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = r#"{"model_type":"qwen2","hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,
        "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"tie_word_embeddings":true}"#;
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let files = ModelFiles::open(&dir.join("config.json"), LoadFormat::Dummy).unwrap();
    assert!(files.spec.qkv_bias && files.spec.tied_embeddings);
    let opts = kiln::generate::GenerateOptions {
        max_tokens: 5,
        params: kiln::sampling::SamplingParams::greedy(),
        stop_ids: vec![],
        chunk: 8,
        block_size: 4,
        record_logits: 1,
    };
    let mut g = kiln::generate::SingleGenerator::new(CpuBackend::new(), &files, 32, 8, 4).unwrap();
    let a = g.generate(&[1, 2, 3], &opts, |_| {}).unwrap();
    let b = g.generate(&[1, 2, 3], &opts, |_| {}).unwrap();
    assert_eq!(a.token_ids, b.token_ids, "dummy weights are deterministic");
    assert!(a.step_logits[0].iter().all(|x| x.is_finite()));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_hf_constants_are_refused_naming_the_key() {
    let base = serde_json::json!({"hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100});
    assert!(ModelSpec::from_hf_config(&base.to_string()).is_ok());
    for (key, value) in [
        ("max_position_embeddings", serde_json::json!(1)),
        ("rms_norm_eps", serde_json::json!(-1e-5)),
        ("num_key_value_heads", serde_json::json!(3)),
        ("num_hidden_layers", serde_json::json!(4294967295u64)),
    ] {
        let mut cfg = base.clone();
        cfg[key] = value;
        let err = ModelSpec::from_hf_config(&cfg.to_string())
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
}

/// What the GPU backend is told a model runs, derived by `runner` from the spec and the
/// source: the dense fixture needs no MoE kernels nor the q/k-norm rope, its one head size
/// and its query heads per KV head; a Qwen3-MoE directory needs the experts and the q/k
/// norms; a tensor-parallel shard keeps the group (KV heads replicated when fewer).
#[test]
fn derived_model_needs_of_fixtures() {
    use kiln::backend::quant::GgmlType;
    use kiln::runner::{Shard, model_needs};
    let root = kiln::config::project_root();
    let one = Shard { rank: 0, size: 1 };

    let stories = ModelFiles::open(
        &root.join("../shared/models/stories260K.gguf"),
        LoadFormat::Gguf,
    )
    .unwrap();
    let s = &stories.spec;
    let n = model_needs(s, &*stories.source, one);
    assert!(!n.moe && !n.qk_norm);
    assert_eq!(n.head_dims, Some(vec![s.head_dim]));
    assert_eq!(n.head_dims, Some(vec![8]));
    assert_eq!(n.gqa_group, Some(s.n_heads / s.n_kv_heads));
    assert_eq!(n.gqa_group, Some(2));
    assert_eq!(n.weight_types, Some(vec![GgmlType::F32]));

    let q8 = ModelFiles::open(
        &root.join("../shared/models/stories260K-Q8_0.gguf"),
        LoadFormat::Gguf,
    )
    .unwrap();
    let types = model_needs(&q8.spec, &*q8.source, one)
        .weight_types
        .unwrap();
    assert!(types.contains(&GgmlType::Q8_0), "{types:?}");

    let moe = ModelFiles::open(&root.join("tests/data/arch/qwen3moe"), LoadFormat::Hf).unwrap();
    let n = model_needs(&moe.spec, &*moe.source, one);
    assert!(n.moe && n.qk_norm);
    assert_eq!(n.head_dims, Some(vec![moe.spec.head_dim]));
    let group = moe.spec.n_heads / moe.spec.n_kv_heads;
    assert_eq!(n.gqa_group, Some(group));
    assert_eq!(
        n.weight_types,
        Some(vec![GgmlType::F32, GgmlType::F16, GgmlType::BF16])
    );
    // Two shards: each has half the query heads and half the KV heads (or every KV head,
    // replicated, when there is one).
    let two = model_needs(&moe.spec, &*moe.source, Shard { rank: 1, size: 2 });
    let kv = (moe.spec.n_kv_heads / 2).max(1);
    assert_eq!(two.gqa_group, Some(moe.spec.n_heads / 2 / kv));
}

/// The gpt-oss fixture's `config.json` (the released checkpoints' keys).
fn gptoss_config() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch/gptoss/config.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// transformers 5 writes `rope_parameters` (with `rope_theta` inside) and no
/// `experts_per_token` / `initial_context_length`: the same spec as the released keys.
#[test]
fn gptoss_both_config_eras_give_one_spec() {
    let released = gptoss_config();
    let want = ModelSpec::from_hf_config(&released.to_string()).unwrap();
    let mut v5 = released.clone();
    let o = v5.as_object_mut().unwrap();
    let mut rope = o.remove("rope_scaling").unwrap();
    rope["rope_theta"] = o.remove("rope_theta").unwrap();
    o.insert("rope_parameters".into(), rope);
    o.remove("experts_per_token");
    o.remove("initial_context_length");
    let got = ModelSpec::from_hf_config(&v5.to_string()).unwrap();
    assert_eq!(got, want);
    // Without any rope keys: transformers' gpt-oss defaults (theta 150000, YaRN factor 32
    // over 4096 without truncation, attention factor 0.1 ln 32 + 1).
    let mut bare = released.clone();
    let o = bare.as_object_mut().unwrap();
    o.remove("rope_scaling");
    o.remove("rope_theta");
    let s = ModelSpec::from_hf_config(&bare.to_string()).unwrap();
    assert_eq!(s.rope.theta, 150000.0);
    assert!((s.rope.attn_factor - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
    let f = s.rope.freq_factors.as_ref().unwrap();
    assert_eq!((f[0], f[7]), (1.0, 32.0), "{f:?}");
    // truncate true (transformers' default) floors and ceils the ramp: other divisors.
    let mut trunc = released.clone();
    trunc["rope_scaling"]["truncate"] = true.into();
    let t = ModelSpec::from_hf_config(&trunc.to_string()).unwrap();
    assert_ne!(t.rope.freq_factors, want.rope.freq_factors);
}

/// A change to a config.
type Edit = fn(&mut serde_json::Value);

/// Values of a gpt-oss config Kiln does not implement are refused, naming the key.
#[test]
fn gptoss_configs_kiln_does_not_run_are_refused_by_name() {
    let base = gptoss_config();
    let cases: [(&str, Edit); 10] = [
        ("rope_scaling", |c| {
            c["rope_scaling"]["rope_type"] = "linear".into()
        }),
        ("mscale", |c| c["rope_scaling"]["mscale"] = 1.0.into()),
        ("layer_types", |c| {
            c["layer_types"][1] = "chunked_attention".into()
        }),
        ("layer_types", |c| {
            c["layer_types"] = serde_json::json!(["sliding_attention"])
        }),
        ("sliding_window", |c| {
            c["sliding_window"] = serde_json::Value::Null
        }),
        ("attention_bias", |c| c["attention_bias"] = false.into()),
        ("quantization_config", |c| {
            c["quantization_config"] = serde_json::json!({"quant_method": "fp8"})
        }),
        ("experts_per_token", |c| c["experts_per_token"] = 2.into()),
        ("swiglu_limit", |c| c["swiglu_limit"] = (-1.0).into()),
        ("attention_dropout", |c| c["attention_dropout"] = 0.1.into()),
    ];
    for (key, edit) in cases {
        let mut c = base.clone();
        edit(&mut c);
        let err = ModelSpec::from_hf_config(&c.to_string())
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
}
