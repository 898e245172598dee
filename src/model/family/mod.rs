//! The model families Kiln runs, one descriptor ([`Family`]) each in a file of its own, and
//! the table the readers look them up in. Adding a family is a new file here and one line
//! in [`FAMILIES`]: its names in both formats, its tensor names, rope layout, flags,
//! experts, and hooks reading its own keys.
//!
//! Chat and tool-call formats are not family facts here: they follow the chat template a
//! model ships (`api/tools/format.rs`). Byte-level pre-tokenizer names (`tokenizer.ggml.pre`)
//! name vocabularies, which cross families, and stay with the tokenizer.

mod desc;
mod gemma;
mod gemma2;
mod gemma3;
mod gptoss;
mod llama;
mod mistral;
mod mixtral;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen3moe;

pub use desc::{
    Experts, Family, Flags, GgufBase, GgufHook, HfBase, HfDerived, HfHook, HfTensors, QkvBias,
    get_f32, get_str, get_usize, spec_err,
};
pub use gptoss::{SWIGLU_ALPHA, SWIGLU_LIMIT, Yarn, hf_swiglu};

/// Every family, in no particular order.
pub static FAMILIES: &[&Family] = &[
    &llama::LLAMA,
    &mistral::MISTRAL,
    &mixtral::MIXTRAL,
    &qwen2::QWEN2,
    &qwen2moe::QWEN2MOE,
    &qwen3::QWEN3,
    &qwen3moe::QWEN3MOE,
    &gemma2::GEMMA2,
    &gemma3::GEMMA3,
    &phi3::PHI3,
    &gptoss::GPTOSS,
];

/// The family of GGUF `general.architecture` `arch` (`None`: not supported).
pub fn by_gguf_arch(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.gguf && f.arch == arch)
}

/// The family of `config.json` `model_type` `t` (`None`: not supported).
pub fn by_hf_type(t: &str) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.hf_types.contains(&t))
}

/// The family whose `text_config` a `config.json` of `model_type` `t` nests.
pub fn by_hf_wrapper(t: &str) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.hf_wrapper == Some(t))
}

/// The family of a spec's `arch` (`None`: not one Kiln reads).
pub fn by_arch(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.arch == arch)
}

/// Llama, the family whose names an unknown architecture's tensors are read by.
pub fn llama() -> &'static Family {
    &llama::LLAMA
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_family_is_found_by_each_of_its_names() {
        for (i, f) in FAMILIES.iter().enumerate() {
            assert!(
                FAMILIES[i + 1..].iter().all(|o| o.arch != f.arch),
                "{} twice",
                f.arch
            );
            assert!(std::ptr::eq(by_arch(f.arch).unwrap(), *f));
            if f.gguf {
                assert!(std::ptr::eq(by_gguf_arch(f.arch).unwrap(), *f));
            }
            for t in f.hf_types {
                assert!(std::ptr::eq(by_hf_type(t).unwrap(), *f), "{t}");
            }
        }
        assert!(
            by_gguf_arch("mixtral").is_none(),
            "Mixtral's GGUF files are llama"
        );
        assert_eq!(by_hf_wrapper("gemma3").map(|f| f.arch), Some("gemma3"));
        assert!(by_hf_type("gpt2").is_none() && by_gguf_arch("gpt2").is_none());
    }

    #[test]
    fn tensor_names_follow_the_family() {
        let name = |arch: &str, g: &str| by_arch(arch).unwrap().hf_name(g);
        let l = "blk.3.ffn_norm.weight";
        assert_eq!(
            name("llama", l),
            "model.layers.3.post_attention_layernorm.weight"
        );
        assert_eq!(
            name("gemma2", l),
            "model.layers.3.pre_feedforward_layernorm.weight"
        );
        let up = "blk.0.ffn_up.weight";
        assert_eq!(name("phi3", up), "model.layers.0.mlp.gate_up_proj.weight");
        assert_eq!(name("qwen3", up), "model.layers.0.mlp.up_proj.weight");
        let e = "blk.1.ffn_up.7.weight";
        assert_eq!(
            name("mixtral", e),
            "model.layers.1.block_sparse_moe.experts.7.w3.weight"
        );
        assert_eq!(
            name("qwen3moe", e),
            "model.layers.1.mlp.experts.7.up_proj.weight"
        );
        let r = "blk.1.ffn_gate_inp.weight";
        assert_eq!(
            name("mixtral", r),
            "model.layers.1.block_sparse_moe.gate.weight"
        );
        assert_eq!(name("qwen2moe", r), "model.layers.1.mlp.gate.weight");
        assert_eq!(name("llama", "output.weight"), "lm_head.weight");
        assert_eq!(name("llama", "rope_freqs.weight"), "rope_freqs.weight");
    }
}
