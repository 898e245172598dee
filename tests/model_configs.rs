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
