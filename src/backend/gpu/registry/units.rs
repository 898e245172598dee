//! Compile units: the kernel sources under `kernels/` with their texts, and the parts the
//! large ones are split into.

use std::path::Path;

use super::heads::AttnHead;
use crate::backend::gpu::qtype::QType;

pub(super) const PRELUDE: &str = include_str!("../../../../kernels/prelude.cuh");
/// Device helpers and the portable kernel shared by the three attention sources.
const ATTENTION_HEADER: (&str, &str) = (
    "attention.cuh",
    include_str!("../../../../kernels/attention.cuh"),
);
/// The quantized block types shared by the streaming and the tiled quantized matmuls.
const QUANT_HEADER: (&str, &str) = ("quant.cuh", include_str!("../../../../kernels/quant.cuh"));
/// The tiled quantized matmul's core (`qmma_tile`), after `quant.cuh`: shared by the dense
/// batched matmul and the grouped expert matmuls.
const QMMA_HEADERS: [(&str, &str); 2] = [
    QUANT_HEADER,
    ("qmma.cuh", include_str!("../../../../kernels/qmma.cuh")),
];
/// The MoE tile size (`moe.cuh`, after `quant.cuh`, whose 8-bit activation block it uses), shared by
/// the two MoE sources.
const MOE_HEADER: (&str, &str) = ("moe.cuh", include_str!("../../../../kernels/moe.cuh"));
const MOE_HEADERS: [(&str, &str); 2] = [QUANT_HEADER, MOE_HEADER];
const MOE_QUANT_HEADERS: [(&str, &str); 3] = [QUANT_HEADER, QMMA_HEADERS[1], MOE_HEADER];

/// The define a whole-source compile starts with (every part of a split source in:
/// `KILN_ALL_PARTS` in `kernels/prelude.cuh`); `scripts/compile_kernels_hip.sh` writes the
/// same line.
pub(super) const ALL_PARTS: &str = "#define KILN_ALL_PARTS 1\n";

/// A kernel source file under `kernels/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Embed,
    Norm,
    Rope,
    Kv,
    Activation,
    /// The portable attention kernel (`attn_*_q*`).
    AttentionPrefill,
    /// The tensor-core attention kernel (`attn_*_tc`).
    AttentionTc,
    /// The decode attention kernel (`attn_*_dec*`) and the split-K merge.
    AttentionDecode,
    Sample,
    Gemv,
    /// The model-family ops (`arch.cu`).
    Arch,
    /// The mixture-of-experts FFN (`moe.cu`).
    Moe,
    /// The mixture-of-experts grouped matmuls of quantized experts (`moe_quant.cu`).
    MoeQuant,
    /// Quantized weights: streaming matmuls, dequantization, F16/BF16 conversion.
    Qgemv,
    /// Quantized weights: the tiled tensor-core matmul of batches (`qmma.cu`, bf16 only).
    Qmma,
}

impl Source {
    pub(super) const ALL: [Source; 15] = [
        Source::Embed,
        Source::Norm,
        Source::Rope,
        Source::Kv,
        Source::Activation,
        Source::AttentionPrefill,
        Source::AttentionTc,
        Source::AttentionDecode,
        Source::Sample,
        Source::Gemv,
        Source::Arch,
        Source::Moe,
        Source::MoeQuant,
        Source::Qgemv,
        Source::Qmma,
    ];

    pub(super) fn file(self) -> &'static str {
        match self {
            Source::Embed => "embed.cu",
            Source::Norm => "norm.cu",
            Source::Rope => "rope.cu",
            Source::Kv => "kv.cu",
            Source::Activation => "activation.cu",
            Source::AttentionPrefill => "attention_prefill.cu",
            Source::AttentionTc => "attention_tc.cu",
            Source::AttentionDecode => "attention_decode.cu",
            Source::Sample => "sample.cu",
            Source::Gemv => "gemv.cu",
            Source::Arch => "arch.cu",
            Source::Moe => "moe.cu",
            Source::MoeQuant => "moe_quant.cu",
            Source::Qgemv => "qgemv.cu",
            Source::Qmma => "qmma.cu",
        }
    }

    /// Shared text prepended to the file, after the prelude: (file name, text).
    fn headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Source::AttentionPrefill | Source::AttentionTc | Source::AttentionDecode => {
                std::slice::from_ref(&ATTENTION_HEADER)
            }
            Source::Qgemv => std::slice::from_ref(&QUANT_HEADER),
            Source::Qmma => &QMMA_HEADERS,
            Source::Moe => &MOE_HEADERS,
            Source::MoeQuant => &MOE_QUANT_HEADERS,
            _ => &[],
        }
    }

    /// The translation unit the runtime compiler sees: the prelude, then each header and the
    /// file, each after a `#line` marker (`scripts/compile_kernels_hip.sh` builds the same).
    /// For kernel work on a machine without a Rust toolchain, `dir`
    /// ([`GpuTuning::kernel_dir`](crate::backend::GpuTuning::kernel_dir)) names a folder
    /// whose files (same names as in `kernels/`) replace the built-in texts; the kernel
    /// cache keys on the text, so a variant never reads another's code object.
    pub(crate) fn full_text(self, dir: Option<&Path>) -> String {
        let text_of = |name: &str, built_in: &str| match dir {
            Some(d) => {
                std::fs::read_to_string(d.join(name)).unwrap_or_else(|_| built_in.to_string())
            }
            None => built_in.to_string(),
        };
        let mut text = text_of("prelude.cuh", PRELUDE);
        for (name, body) in self.headers().iter().chain([&(self.file(), self.text())]) {
            let body = text_of(name, body);
            text.push_str(&format!("\n#line 1 \"{name}\"\n{body}"));
        }
        text
    }

    pub(super) fn text(self) -> &'static str {
        match self {
            Source::Embed => include_str!("../../../../kernels/embed.cu"),
            Source::Norm => include_str!("../../../../kernels/norm.cu"),
            Source::Rope => include_str!("../../../../kernels/rope.cu"),
            Source::Kv => include_str!("../../../../kernels/kv.cu"),
            Source::Activation => include_str!("../../../../kernels/activation.cu"),
            Source::AttentionPrefill => include_str!("../../../../kernels/attention_prefill.cu"),
            Source::AttentionTc => include_str!("../../../../kernels/attention_tc.cu"),
            Source::AttentionDecode => include_str!("../../../../kernels/attention_decode.cu"),
            Source::Sample => include_str!("../../../../kernels/sample.cu"),
            Source::Gemv => include_str!("../../../../kernels/gemv.cu"),
            Source::Arch => include_str!("../../../../kernels/arch.cu"),
            Source::Moe => include_str!("../../../../kernels/moe.cu"),
            Source::MoeQuant => include_str!("../../../../kernels/moe_quant.cu"),
            Source::Qgemv => include_str!("../../../../kernels/qgemv.cu"),
            Source::Qmma => include_str!("../../../../kernels/qmma.cu"),
        }
    }
}

/// The part of a source one compile unit holds (`KILN_IN_PART` in `kernels/prelude.cuh`): the
/// large sources are compiled once per weight type or head size, plus their other kernels,
/// so start-up waits only for what the model runs (a first start with an empty kernel cache
/// compiled every type and head size of `qgemv.cu` and `attention_prefill.cu`, 7-8 s each on
/// an H100's 16 cores).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// A source that is not split.
    Whole,
    /// The kernels of a split source that belong to no type or head size.
    Common,
    Q(QType),
    Head(AttnHead),
    /// The 8-bit tiles of a type that takes the bf16 tiles by default (`KILN_QMMA8=all`).
    Int8(QType),
    /// The streaming matmuls of a type on activations of the compute type (`qgemv_*`): the
    /// decode path in f32; in bf16 decode runs on 8-bit activations (`qdot_*`, in
    /// `Part::Q` at one row and `Part::Rows` at more), so these serve only a step the 8-bit
    /// path cannot take.
    Stream(QType),
    /// The 8-bit activation decode kernels of a type (`qdot_*`, bf16) at one row bucket
    /// above one (2, 4 or 8 rows; one row is in `Part::Q`, with the type's dequant).
    Rows(QType, u32),
    /// The decode attention kernel of a head size at one pass size (`attn_*_dec<qv>`).
    Pass(AttnHead, u32),
    /// The one-row decode matmuls of a type that leave a residual norm to the next and
    /// finish it (`qdot_norm_*`, `qdot_in_*`, `qdotmix_in_*`, `qdot_silu_in_*`; bf16).
    Norm(QType),
    /// The rope that applies the q/k head norms too (`rope_kv_norm_*`): only the models
    /// with those norms run it.
    QkNorm,
}

impl Part {
    /// The `KILN_PART_<tag>` the unit defines; `None` for a whole source.
    pub(super) fn tag(self) -> Option<String> {
        match self {
            Part::Whole => None,
            Part::Common => Some("common".into()),
            Part::Q(q) => Some(q.tag().into()),
            Part::Head(h) => Some(format!("h{}", h.tag())),
            Part::Int8(q) => Some(format!("i8{}", q.tag())),
            Part::Stream(q) => Some(format!("s{}", q.tag())),
            Part::Rows(q, rows) => Some(format!("{}m{rows}", q.tag())),
            Part::Pass(h, qv) => Some(format!("h{}q{qv}", h.tag())),
            Part::Norm(q) => Some(format!("n{}", q.tag())),
            Part::QkNorm => Some("qkn".into()),
        }
    }
}

/// One compile unit: a source, or one part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Unit {
    pub src: Source,
    pub part: Part,
}

impl Unit {
    /// A name for logs and cache files: `qgemv` or `qgemv.q4k`.
    pub fn name(self) -> String {
        let file = self.src.file().trim_end_matches(".cu");
        match self.part.tag() {
            None => file.to_string(),
            Some(t) => format!("{file}.{t}"),
        }
    }
}
