//! The compile plan's unit tests: which units a model's start waits for, the decode
//! attention passes of a GQA group, the core units' compiler options, and every unit's part
//! tags.

use super::compile::core_options;
use super::texts::part_tags;
use super::units::{ALL_PARTS, PRELUDE};
use super::*;
use crate::backend::gpu::qtype::QType;
use crate::backend::tuning::NvrtcSplit;

/// The units of `class` under `needs`, by name.
fn names(needs: &KernelNeeds, dt: DType, class: Class) -> Vec<String> {
    let mut v: Vec<String> = Kernel::all()
        .into_iter()
        .filter(|k| k.available(dt))
        .map(Kernel::unit)
        .filter(|&u| needs.class(u, dt) == class)
        .map(Unit::name)
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The units start-up waits for under `needs`, by name.
fn core_names(needs: &KernelNeeds, dt: DType) -> Vec<String> {
    names(needs, dt, Class::Core)
}

/// A Q4_K_M Llama-3-8B (Q4_K and Q6_K, head size 128, 4 query heads per KV head) in
/// bf16 on a GPU with tensor-core attention.
fn q4_k_m_llama() -> KernelNeeds {
    KernelNeeds {
        moe: false,
        qtypes: Some(vec![QType::Q4K, QType::Q6K]),
        dense: false,
        qk_norm: false,
        head_dims: Some(vec![128]),
        gqa_group: Some(4),
        portable_attention: false,
    }
}

#[test]
fn a_q4_k_m_llama_waits_for_what_a_first_request_runs_only() {
    let needs = q4_k_m_llama();
    let core = core_names(&needs, DType::Bf16);
    // Embedding (dequant), decode and prompts (qdot of one row, decode attention at
    // group 4's pass of one row: 4 query vectors, items of one row until the tensor-core
    // attention loads; prompts of more rows dequantize for the BLAS meanwhile),
    // sampling.
    for want in [
        "qgemv.q4k",
        "qgemv.q6k",
        "qgemv.common",
        "attention_decode.h128q4",
        "attention_decode.common",
        "norm",
        "rope.common",
        "embed",
        "sample",
    ] {
        assert!(core.contains(&want.to_string()), "{want} not in {core:?}");
    }
    for not in [
        "rope.qkn",
        "gemv",
        "qgemv.q80",
        "qgemv.q4km2",
        "qgemv.q6km2",
        "qgemv.q4km4",
        "qgemv.q4km8",
        "qgemv.q6km8",
        "attention_decode.h128q1",
        "attention_decode.h128q2",
        "attention_decode.h64q4",
        "qgemv.sq4k",
        "qgemv.sq6k",
        "qmma.q4k",
        "qmma.common",
        "qmma.q40",
        "attention_tc.h128",
        "attention_prefill.h128",
        "attention_prefill.h64",
        "attention_prefill.hany",
        "moe",
        "moe_quant.q4k",
        "qmma.i8q4k",
    ] {
        assert!(!core.contains(&not.to_string()), "{not} in {core:?}");
    }
    // The entry points a first request runs are in the core units; the float-activation
    // streaming matmuls are not.
    for k in [
        Kernel::Dequant { q: QType::Q4K },
        Kernel::Dequant { q: QType::Q6K },
        Kernel::QuantizeX,
        Kernel::QdotMix {
            q: QType::Q4K,
            rows: 1,
        },
        Kernel::QdotSilu {
            q: QType::Q4K,
            rows: 1,
        },
        Kernel::Qdot {
            q: QType::Q6K,
            rows: 1,
        },
        Kernel::AttentionDecode {
            head: AttnHead::D128,
            qv: 4,
        },
    ] {
        assert!(core.contains(&k.unit().name()), "{k:?}");
    }
    for k in [
        Kernel::Qgemv {
            q: QType::Q4K,
            rows: 1,
        },
        Kernel::QgemvSilu {
            q: QType::Q6K,
            rows: 8,
        },
    ] {
        assert!(!core.contains(&k.unit().name()), "{k:?}");
    }
}

#[test]
fn a_q4_k_m_llama_compiles_what_larger_steps_run_after_start() {
    let needs = q4_k_m_llama();
    // Decode steps of 2-8 rows, batches of 9-256 rows, the decode attention of items of
    // two rows (8 query vectors), the tensor-core and the portable attention, and the
    // one-row decode's fused norms compile once those are ready.
    assert_eq!(
        names(&needs, DType::Bf16, Class::Later),
        [
            "attention_decode.h128q8",
            "attention_prefill.h128",
            "attention_tc.h128",
            "qgemv.nq4k",
            "qgemv.nq6k",
            "qgemv.q4km2",
            "qgemv.q4km4",
            "qgemv.q4km8",
            "qgemv.q6km2",
            "qgemv.q6km4",
            "qgemv.q6km8",
            "qmma.common",
            "qmma.q4k",
            "qmma.q6k"
        ]
    );
    for k in [
        Kernel::QdotSilu {
            q: QType::Q4K,
            rows: 8,
        },
        Kernel::QdotMix {
            q: QType::Q4K,
            rows: 4,
        },
        Kernel::QdotMix {
            q: QType::Q4K,
            rows: 2,
        },
        Kernel::Qdot {
            q: QType::Q6K,
            rows: 2,
        },
    ] {
        assert_eq!(needs.class(k.unit(), DType::Bf16), Class::Later, "{k:?}");
    }
}

#[test]
fn what_a_model_does_not_run_waits_for_first_use_and_no_model_waits_for_all() {
    let needs = q4_k_m_llama();
    let core = core_names(&needs, DType::Bf16);
    // Its matrices are all quantized: the float-weight streaming matmuls compile on
    // first use, if ever; a file with a float matrix (an F16 output head) waits for them.
    let gemv = Kernel::Gemv { rows: 1 }.unit();
    assert_eq!(needs.class(gemv, DType::Bf16), Class::Lazy);
    let with_float = KernelNeeds {
        dense: true,
        ..needs.clone()
    };
    assert_eq!(with_float.class(gemv, DType::Bf16), Class::Core);
    // Llama has no q/k head norms: its rope is the plain one; a Qwen3 waits for the one
    // with the norms.
    let rope_norm = Kernel::RopeKvNorm.unit();
    assert_eq!(needs.class(rope_norm, DType::Bf16), Class::Lazy);
    assert_eq!(needs.class(Kernel::RopeKv.unit(), DType::Bf16), Class::Core);
    let qwen3 = KernelNeeds {
        qk_norm: true,
        ..needs.clone()
    };
    assert_eq!(qwen3.class(rope_norm, DType::Bf16), Class::Core);
    // Everything, as a backend opened without a model waits for it.
    let all = core_names(&KernelNeeds::all(), DType::Bf16);
    assert!(
        all.len() > core.len() + 20,
        "{} vs {}",
        all.len(),
        core.len()
    );
    for want in [
        "moe_quant.q80",
        "qmma.i8q4k",
        "qmma.q4k",
        "qgemv.sq4k",
        "qgemv.q4km8",
        "attention_prefill.h128",
        "attention_decode.h128q1",
        "attention_decode.h64q2",
    ] {
        assert!(all.contains(&want.to_string()), "{want}");
    }
    assert!(names(&KernelNeeds::all(), DType::Bf16, Class::Later).is_empty());
    // A head size without its own kernels waits for the any-size part.
    let odd = KernelNeeds {
        head_dims: Some(vec![112]),
        ..needs.clone()
    };
    assert!(core_names(&odd, DType::Bf16).contains(&"attention_prefill.hany".into()));
    // Where decode steps may take the portable attention, start-up waits for it.
    let portable = KernelNeeds {
        portable_attention: true,
        ..needs.clone()
    };
    assert!(core_names(&portable, DType::Bf16).contains(&"attention_prefill.h128".into()));
    // Head size 256 has no tensor-core variant: its larger items run the portable one.
    let h256 = KernelNeeds {
        head_dims: Some(vec![256]),
        ..needs.clone()
    };
    assert!(core_names(&h256, DType::Bf16).contains(&"attention_prefill.h256".into()));
    // f32 decode streams float activations: those parts are its decode path.
    let f32_core = core_names(&needs, DType::F32);
    for want in ["qgemv.sq4k", "qgemv.sq6k", "qgemv.q4k"] {
        assert!(
            f32_core.contains(&want.to_string()),
            "{want} not in {f32_core:?}"
        );
    }
    assert!(!f32_core.iter().any(|u| u.starts_with("qmma")));
}

#[test]
fn decode_attention_compiles_the_pass_sizes_of_the_gqa_group_only() {
    let passes = |h: AttnHead, g: usize| h.decode_passes(g);
    assert_eq!(passes(AttnHead::D128, 1), [1, 2, 4, 8]);
    assert_eq!(passes(AttnHead::D128, 2), [2, 4, 8]);
    assert_eq!(passes(AttnHead::D128, 3), [4, 8]);
    assert_eq!(passes(AttnHead::D128, 4), [4, 8]);
    assert_eq!(passes(AttnHead::D128, 5), [8]);
    assert_eq!(passes(AttnHead::D128, 8), [8]);
    assert!(passes(AttnHead::D128, 16).is_empty());
    assert_eq!(passes(AttnHead::D256, 2), [2, 4]);
    assert_eq!(passes(AttnHead::D256, 4), [4]);
    assert!(passes(AttnHead::D256, 8).is_empty());
    // Every pass an item of any row count takes (as `attention_kernel` picks it) is in.
    for h in [AttnHead::D64, AttnHead::D128, AttnHead::D256] {
        for g in 1..=20 {
            for rows in 1..=16 {
                if let Some(qv) = h.decode_pass(rows * g) {
                    assert!(passes(h, g).contains(&qv), "{h:?} group {g} rows {rows}");
                }
            }
        }
    }
    // A start waits for the pass of a single row only; the larger passes the group
    // launches compile after it, the others on first use.
    let class = |g: Option<usize>, qv: u32| {
        let needs = KernelNeeds {
            gqa_group: g,
            ..q4_k_m_llama()
        };
        let k = Kernel::AttentionDecode {
            head: AttnHead::D128,
            qv,
        };
        needs.class(k.unit(), DType::Bf16)
    };
    assert_eq!(class(Some(4), 1), Class::Lazy);
    assert_eq!(class(Some(4), 2), Class::Lazy);
    assert_eq!(class(Some(4), 4), Class::Core);
    assert_eq!(class(Some(4), 8), Class::Later);
    assert_eq!(class(Some(8), 4), Class::Lazy);
    assert_eq!(class(Some(8), 8), Class::Core);
    assert_eq!(class(Some(1), 1), Class::Core);
    assert_eq!(class(Some(1), 2), Class::Later);
    assert_eq!(class(Some(3), 4), Class::Core);
    assert_eq!(class(Some(3), 8), Class::Later);
    assert_eq!(class(Some(32), 8), Class::Lazy);
    for qv in [1, 2, 4, 8] {
        assert_eq!(class(None, qv), Class::Core);
    }
}

#[test]
fn core_units_compile_one_thread_each() {
    let opts = [
        "--gpu-architecture=sm_90",
        "--split-compile=0",
        "-DKILN_DTYPE_BF16",
    ]
    .map(String::from);
    assert_eq!(
        core_options(&opts, NvrtcSplit::Auto),
        ["--gpu-architecture=sm_90", "-DKILN_DTYPE_BF16"]
    );
    // A split chosen in the tuning applies to the core units too.
    for split in [NvrtcSplit::Off, NvrtcSplit::Threads(4)] {
        assert_eq!(core_options(&opts, split), opts);
    }
}

#[test]
fn split_sources_compile_in_parts_and_the_rest_whole() {
    let split = [
        Source::Qgemv,
        Source::Qmma,
        Source::MoeQuant,
        Source::AttentionPrefill,
        Source::AttentionTc,
        Source::AttentionDecode,
        Source::Rope,
    ];
    for k in Kernel::all() {
        let u = k.unit();
        assert_eq!(u.src, k.source());
        assert_eq!(
            split.contains(&u.src),
            u.part != Part::Whole,
            "{k:?} in {}",
            u.name()
        );
        // The part's define is the tag KILN_IN_PART uses in the source (pasted from the
        // type and row count, or the head and pass size, for the finest parts).
        if let Some(tag) = u.part.tag() {
            let pasted = match u.part {
                Part::Rows(_, rows) => Some(format!("KILN_IN_PART(QN##m{rows},")),
                Part::Norm(_) => Some("KILN_IN_PART(n##QN,".to_string()),
                Part::Pass(..) => Some("KILN_IN_PART(h##D##q##QV,".to_string()),
                _ => None,
            };
            assert!(
                u.src.text().contains(&format!("KILN_IN_PART({tag},"))
                    || u.src.text().contains(&format!("#if KILN_HAS_PART({tag})"))
                    || pasted.is_some_and(|p| u.src.text().contains(&p)),
                "{} has no part {tag}",
                u.src.file()
            );
            let text = u.text(None);
            assert!(text.starts_with("#define KILN_PARTS 1\n"));
            // The host defines the unit's own tag as 1 and every other part of its source
            // as 0 (prelude.cuh has no defaults).
            assert!(
                text.contains(&format!("\n#define KILN_PART_{tag} 1\n")),
                "{} does not define its part {tag}",
                u.name()
            );
            for other in part_tags(u.src).into_iter().filter(|t| *t != tag) {
                assert!(
                    text.contains(&format!("\n#define KILN_PART_{other} 0\n")),
                    "{} does not define part {other} as 0",
                    u.name()
                );
            }
        }
    }
    assert!(
        !PRELUDE.contains("KILN_PART_common"),
        "prelude.cuh defines part tags"
    );
}

/// Every part tag a split source names literally (`KILN_IN_PART(tag, ...)`, `#if
/// KILN_HAS_PART(tag)`) is one its units define; a whole-source compile keeps every part.
#[test]
fn every_part_tag_a_source_names_is_defined_by_its_units() {
    for src in Source::ALL {
        let tags = part_tags(src);
        let text = src.text();
        for (at, _) in text.match_indices("KILN_IN_PART(") {
            let rest = &text[at + "KILN_IN_PART(".len()..];
            let tag = &rest[..rest.find(',').unwrap()];
            // Tags are lower case; an upper-case name is a macro parameter (`QN`, pasted).
            if tag
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            {
                assert!(
                    tags.contains(&tag.to_string()),
                    "{}: part {tag} undefined",
                    src.file()
                );
            }
        }
        for (at, _) in text.match_indices("KILN_HAS_PART(") {
            let rest = &text[at + "KILN_HAS_PART(".len()..];
            let tag: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            assert!(tags.contains(&tag), "{}: part {tag} undefined", src.file());
        }
        assert_eq!(
            tags.is_empty(),
            !text.contains("KILN_IN_PART("),
            "{}",
            src.file()
        );
        // A bare tag in `#if` would read as 0 where the host left it undefined.
        assert!(
            !text.contains("#if KILN_PART_"),
            "{}: #if KILN_HAS_PART(tag)",
            src.file()
        );
    }
    for (file, text, _) in sources(DType::Bf16) {
        assert!(text.starts_with(ALL_PARTS), "{file}");
    }
}
