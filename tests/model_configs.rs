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
