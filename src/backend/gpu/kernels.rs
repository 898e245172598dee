//! Kernel identity and loading: a typed enum of kernels mapped to their source file and
//! entry point, compiled by the runtime's compiler (NVRTC, hipRTC) for the present device
//! at lane start, cached on disk by (source hash, arch, driver, compiler version), and
//! loaded once into a set the backend owns.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use super::qtype::QType;
use super::runtime::{DeviceInfo, Runtime};
use crate::backend::{BackendError, DType, kernel_cache};

const PRELUDE: &str = include_str!("../../../kernels/prelude.cuh");
/// Device helpers and the portable kernel shared by the three attention sources.
const ATTENTION_HEADER: (&str, &str) = (
    "attention.cuh",
    include_str!("../../../kernels/attention.cuh"),
);
/// The quantized block types shared by the streaming and the tiled quantized matmuls.
const QUANT_HEADER: (&str, &str) = ("quant.cuh", include_str!("../../../kernels/quant.cuh"));
/// The tiled quantized matmul's core (`qmma_tile`), after `quant.cuh`: shared by the dense
/// batched matmul and the grouped expert matmuls.
const QMMA_HEADERS: [(&str, &str); 2] = [
    QUANT_HEADER,
    ("qmma.cuh", include_str!("../../../kernels/qmma.cuh")),
];
/// The MoE tile size (`moe.cuh`, after `quant.cuh`, whose 8-bit activation block it uses), shared by
/// the two MoE sources.
const MOE_HEADER: (&str, &str) = ("moe.cuh", include_str!("../../../kernels/moe.cuh"));
const MOE_HEADERS: [(&str, &str); 2] = [QUANT_HEADER, MOE_HEADER];
const MOE_QUANT_HEADERS: [(&str, &str); 3] = [QUANT_HEADER, QMMA_HEADERS[1], MOE_HEADER];

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
    const ALL: [Source; 15] = [
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

    fn file(self) -> &'static str {
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
    /// For kernel work on a machine without a Rust toolchain, `KILN_KERNEL_DIR` names a
    /// folder whose files (same names as in `kernels/`) replace the built-in texts; the
    /// kernel cache keys on the text, so a variant never reads another's code object.
    pub(super) fn full_text(self) -> String {
        let dir = std::env::var_os("KILN_KERNEL_DIR").map(PathBuf::from);
        let text_of = |name: &str, built_in: &str| match &dir {
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

    fn text(self) -> &'static str {
        match self {
            Source::Embed => include_str!("../../../kernels/embed.cu"),
            Source::Norm => include_str!("../../../kernels/norm.cu"),
            Source::Rope => include_str!("../../../kernels/rope.cu"),
            Source::Kv => include_str!("../../../kernels/kv.cu"),
            Source::Activation => include_str!("../../../kernels/activation.cu"),
            Source::AttentionPrefill => include_str!("../../../kernels/attention_prefill.cu"),
            Source::AttentionTc => include_str!("../../../kernels/attention_tc.cu"),
            Source::AttentionDecode => include_str!("../../../kernels/attention_decode.cu"),
            Source::Sample => include_str!("../../../kernels/sample.cu"),
            Source::Gemv => include_str!("../../../kernels/gemv.cu"),
            Source::Arch => include_str!("../../../kernels/arch.cu"),
            Source::Moe => include_str!("../../../kernels/moe.cu"),
            Source::MoeQuant => include_str!("../../../kernels/moe_quant.cu"),
            Source::Qgemv => include_str!("../../../kernels/qgemv.cu"),
            Source::Qmma => include_str!("../../../kernels/qmma.cu"),
        }
    }
}

/// Head sizes with a dedicated attention instantiation; `Any` takes any size up to 256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnHead {
    D64,
    D80,
    D96,
    D128,
    D256,
    Any,
}

impl AttnHead {
    /// Largest head size the generic variant handles.
    pub const MAX_ANY: usize = 256;

    pub fn for_head_dim(d: usize) -> AttnHead {
        match d {
            64 => AttnHead::D64,
            80 => AttnHead::D80,
            96 => AttnHead::D96,
            128 => AttnHead::D128,
            256 => AttnHead::D256,
            _ => AttnHead::Any,
        }
    }
    /// Whether the head size has a tensor-core variant (`Kernel::AttentionTc`).
    pub fn has_tc(self) -> bool {
        matches!(
            self,
            AttnHead::D64 | AttnHead::D80 | AttnHead::D96 | AttnHead::D128
        )
    }
    /// Whether the head size has a decode variant (`Kernel::AttentionDecode`).
    pub fn has_decode(self) -> bool {
        matches!(self, AttnHead::D64 | AttnHead::D128 | AttnHead::D256)
    }
    /// Query vectors per pass of the decode variant, largest last (head size 256: at most
    /// 4, whose registers fit).
    pub fn decode_sizes(self) -> &'static [u32] {
        match self {
            AttnHead::D256 => &[1, 2, 4],
            _ => &[1, 2, 4, 8],
        }
    }
    /// The decode variant's pass size for items of at most `vectors` query vectors (rows
    /// times the GQA group): the smallest of [`AttnHead::decode_sizes`] that holds them, or
    /// `None` where none does (such items take the tensor-core or the portable variant).
    pub fn decode_pass(self, vectors: usize) -> Option<u32> {
        self.decode_sizes()
            .iter()
            .copied()
            .find(|&q| q as usize >= vectors)
    }
    /// The decode pass sizes a model whose KV heads each serve `group` query heads can
    /// launch: an item of `r` rows has `r * group` query vectors, so a pass smaller than the
    /// group never runs (Llama-3-8B, group 4, runs passes of 4 and 8 only).
    pub fn decode_passes(self, group: usize) -> Vec<u32> {
        let mut v: Vec<u32> = (1..)
            .map(|rows: usize| rows.saturating_mul(group.max(1)))
            .map_while(|vectors| self.decode_pass(vectors))
            .collect();
        v.dedup();
        v
    }
    /// Query vectors per pass the variant is instantiated for, largest last.
    pub fn group_sizes(self) -> &'static [u32] {
        &[1, 4, 8]
    }
    fn tag(self) -> &'static str {
        match self {
            AttnHead::D64 => "64",
            AttnHead::D80 => "80",
            AttnHead::D96 => "96",
            AttnHead::D128 => "128",
            AttnHead::D256 => "256",
            AttnHead::Any => "any",
        }
    }
}

/// Every kernel the backend launches.
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
    fn tag(self) -> Option<String> {
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
    /// The text the runtime compiler sees: the part's defines, then the source's text.
    fn text(self) -> String {
        match self.part.tag() {
            None => self.src.full_text(),
            Some(t) => format!(
                "#define KILN_PARTS 1\n#define KILN_PART_{t} 1\n{}",
                self.src.full_text()
            ),
        }
    }

    /// A name for logs and cache files: `qgemv` or `qgemv.q4k`.
    pub fn name(self) -> String {
        let file = self.src.file().trim_end_matches(".cu");
        match self.part.tag() {
            None => file.to_string(),
            Some(t) => format!("{file}.{t}"),
        }
    }
}

/// What a model runs, so start-up waits only for the kernels a first request may run
/// ([`Class`]). `None`: every type, every head size.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelNeeds {
    /// The model has mixture-of-experts layers.
    pub moe: bool,
    /// The quantized weight types of its file. `None`: a backend opened without a model
    /// (the tests), which waits for every unit at start.
    pub qtypes: Option<Vec<QType>>,
    /// It has matrices stored in a float type (or one the GPU dequantizes at load): the
    /// streaming float-weight matmuls (`gemv.cu`) are its decode path. A file whose matrices
    /// are all quantized never runs them (they compile on first use, if ever).
    pub dense: bool,
    /// Its attention has q/k head norms (Qwen3, Gemma 3): the rope that applies them.
    pub qk_norm: bool,
    /// Its attention head sizes.
    pub head_dims: Option<Vec<usize>>,
    /// Query heads per KV head of its attention (of one tensor-parallel shard): the decode
    /// attention pass sizes it can launch ([`AttnHead::decode_passes`]). `None`: every size.
    pub gqa_group: Option<usize>,
    /// Whether its attention takes the portable kernels (`attention_prefill.cu`) on an
    /// ordinary step: false where decode steps take the decode variant and larger items the
    /// tensor-core one (`attention_kernel` in attention.rs: NVIDIA sm_80+, bf16), which
    /// leaves them only a rare case (more than 65,535 items in a decode step).
    pub portable_attention: bool,
}

/// When a compile unit compiles and who waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// From [`Kernels::load`] on, while the weights upload; start-up waits for it: what a
    /// first request of any size may run, except [`Class::Later`].
    Core,
    /// Once the core units are ready, in the background (the lane is serving by then);
    /// loaded between steps once compiled ([`Kernels::poll_later`]), or on first use, which
    /// waits for a compile still running and logs it. What only larger steps run: the tiled
    /// quantized matmuls of 9-256 rows (`qmma.cu`) and the 8-bit decode matmuls of 2-8 rows
    /// (`qdot_*` at 2, 4 and 8 rows): until loaded, such steps dequantize for the BLAS instead,
    /// so a first prompt does not wait for them; the decode attention passes of items of
    /// more than one row (the tensor-core or the portable variant takes those meanwhile);
    /// and the portable attention where it is a rare path. A tensor-parallel group waits
    /// for these too before its communicator exists ([`Kernels::wait_model`]).
    Later,
    /// Only on first use: kernels the model does not run (other weight types and head
    /// sizes, MoE in a dense model, the 8-bit tiles of the k-quants, bf16's float-activation
    /// streaming matmuls).
    Lazy,
}

impl KernelNeeds {
    /// Everything: what a backend opened without a model (the tests) waits for.
    pub fn all() -> KernelNeeds {
        KernelNeeds {
            moe: true,
            qtypes: None,
            dense: true,
            qk_norm: true,
            head_dims: None,
            gqa_group: None,
            portable_attention: true,
        }
    }

    /// When `unit` of storage type `dt` compiles.
    pub(super) fn class(&self, unit: Unit, dt: DType) -> Class {
        // A backend opened without a model waits for every unit.
        let everything = self.qtypes.is_none();
        let has_q = |q: QType| self.qtypes.as_ref().is_none_or(|t| t.contains(&q));
        let has_head = |h: AttnHead| {
            self.head_dims
                .as_ref()
                .is_none_or(|d| d.iter().any(|&d| AttnHead::for_head_dim(d) == h))
        };
        let runs = match unit.part {
            _ if !self.moe && matches!(unit.src, Source::Moe | Source::MoeQuant) => false,
            _ if !self.dense && unit.src == Source::Gemv => false,
            Part::Q(q) | Part::Rows(q, _) | Part::Norm(q) => has_q(q),
            Part::Head(h) => has_head(h),
            // A pass smaller than the GQA group never runs.
            Part::Pass(h, qv) => {
                has_head(h)
                    && self
                        .gqa_group
                        .is_none_or(|g| h.decode_passes(g).contains(&qv))
            }
            Part::Int8(_) => everything,
            Part::QkNorm => self.qk_norm,
            // bf16 decode streams 8-bit activations (`qdot_*`): these only where that
            // cannot take a step (no room for the 8-bit rows in the dequant scratch).
            Part::Stream(q) => everything || (dt != DType::Bf16 && has_q(q)),
            Part::Whole | Part::Common => true,
        };
        let later = match (unit.src, unit.part) {
            (Source::Qmma, _) => true,
            // Decode steps of 2-8 rows (prompts of a few tokens, 2+ sequences at once):
            // until these load, they dequantize for the BLAS (matmul.rs, `qgemv_rows`). A
            // start waits for the one-row decode only: the two-row units were its longest
            // compiles (Q4_K 1.4-1.6 s on one core against 1.0-1.1 s for one row) and a
            // quarter of its compile work.
            (Source::Qgemv, Part::Rows(..)) => true,
            // The one-row decode's fused norms: the plain launches run until they load
            // (matmul.rs, `launch_qdot_norm`).
            (Source::Qgemv, Part::Norm(_)) => true,
            // Decode attention passes above a single row's (items of 2-8 rows: prompts of a
            // few tokens): the tensor-core or the portable variant takes them meanwhile
            // (attention.rs, `attention_kernel`).
            (Source::AttentionDecode, Part::Pass(h, qv)) => self
                .gqa_group
                .is_some_and(|g| h.decode_pass(g).is_some_and(|one_row| qv > one_row)),
            (Source::AttentionPrefill, Part::Head(h)) => {
                !self.portable_attention && h.has_decode() && h.has_tc()
            }
            // The tensor-core attention (the longest core compile otherwise): steps pack
            // items of one row for the decode variant's one-row pass meanwhile (batch.rs).
            (Source::AttentionTc, Part::Head(h)) => self
                .gqa_group
                .is_some_and(|g| h.has_decode() && h.decode_pass(g).is_some()),
            _ => false,
        };
        match (runs, everything, later) {
            (false, ..) => Class::Lazy,
            (true, false, true) => Class::Later,
            _ => Class::Core,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    Embed,
    GatherRows,
    RmsNorm,
    AddRmsNorm,
    /// The norms over whole 16-byte chunks.
    RmsNormVec,
    AddRmsNormVec,
    Rope,
    /// Rope, then the k/v heads written to the paged cache (rope + write_kv in one launch).
    RopeKv,
    /// The per-head q/k RMSNorm, then `RopeKv` (head_rms_norm + rope + write_kv in one launch).
    RopeKvNorm,
    WriteKv,
    SiluMul,
    /// SiLU-mul over whole 16-byte chunks.
    SiluMulVec,
    AddBias,
    /// Paged attention for a head size, `qv` query vectors per pass.
    Attention {
        head: AttnHead,
        qv: u32,
    },
    /// Paged attention on tensor cores for items of many query vectors (bf16 on NVIDIA
    /// sm_80+; elsewhere the entry runs the portable kernel at its largest pass).
    AttentionTc {
        head: AttnHead,
    },
    /// Paged attention for items of at most `qv` query vectors (decode rows): thread groups
    /// share each K/V row, query vectors in registers.
    AttentionDecode {
        head: AttnHead,
        qv: u32,
    },
    AttnCombine,
    SamplePrep,
    SampleTopN,
    SamplePenalty,
    /// Constrained rows: tokens outside each row's bitmask become -inf.
    SampleMask,
    SamplePick,
    /// Greedy pick and its logprob in one pass over the raw logits (no penalties, no top-n).
    SampleGreedy,
    /// Matmul of `rows` (1..=GEMV_MAX_ROWS) input rows, streamed over the weight.
    Gemv {
        rows: u32,
    },
    /// Gate/up matmul and SiLU-mul in one pass, for `rows` input rows.
    GemvSiluMul {
        rows: u32,
    },
    /// Per-head RMSNorm of q and k in place (`arch.cu`).
    HeadRmsNorm,
    /// GeGLU, tanh approximation.
    GeluTanhMul,
    /// `x *= s`.
    ScaleRows,
    /// `x = cap * tanh(x / cap)`.
    Softcap,
    /// MoE: top-k experts and weights per row (`moe.cu`).
    MoeRoute,
    /// MoE: assignments sorted by expert, padded to tiles (one block, any dtype).
    MoeAlign,
    /// MoE at decode sizes: route, align and (bf16) the 8-bit rows of x in one block.
    MoePrep,
    /// MoE: grouped gate/up matmuls and SiLU-mul.
    MoeGateUp,
    /// MoE: grouped down matmul.
    MoeDown,
    /// MoE: weighted sum of each token's expert outputs.
    MoeCombine,
    /// MoE: [`Kernel::MoeCombine`] added to the residual, then the next RMSNorm (with the
    /// 8-bit rows in bf16), one block per row.
    MoeCombineNorm,
    /// MoE: the shared expert's output added under its sigmoid gate.
    MoeSharedAdd,
    /// MoE: grouped gate/up matmuls and SiLU-mul of quantized experts.
    MoeQGateUp {
        q: QType,
    },
    /// MoE: grouped down matmul of quantized experts.
    MoeQDown {
        q: QType,
    },
    /// [`Kernel::MoeQGateUp`] by dp4a on the 8-bit activations of [`Kernel::QuantizeX`]
    /// (bf16 only).
    MoeQ8GateUp {
        q: QType,
        slots: u32,
    },
    /// [`Kernel::MoeQDown`] by dp4a on 8-bit activations (bf16 only). `slots` (of
    /// [`MOE8_SLOTS`], both kernels): the real slots of a tile one pass takes.
    MoeQ8Down {
        q: QType,
        slots: u32,
    },
    /// [`Kernel::MoeQ8Down`] at one slot a tile, each block quantizing its slot's
    /// activations itself (bf16 only).
    MoeQ8DownSelf {
        q: QType,
    },
    /// [`Kernel::MoeQGateUp`] on tensor cores (`qmma.cuh`), for many rows per expert (bf16
    /// only).
    MoeMmaGateUp {
        q: QType,
    },
    /// [`Kernel::MoeQDown`] on tensor cores (bf16 only).
    MoeMmaDown {
        q: QType,
    },
    /// Matmul of up to `rows` (one of [`QGEMV_ROWS`]) input rows with a quantized weight
    /// part, dequantized in registers.
    Qgemv {
        q: QType,
        rows: u32,
    },
    /// Gate/up matmul of quantized gate and up parts and SiLU-mul in one pass.
    QgemvSilu {
        q: QType,
        rows: u32,
    },
    /// Rows of a quantized weight part to the compute type (embedding; GEMM scratch).
    Dequant {
        q: QType,
    },
    /// F16 (or BF16) elements to the compute type.
    Convert {
        bf16: bool,
    },
    /// Tiled matmul of up to three quantized parts of type `q` in one launch, `rows` (one of
    /// [`QMMA_ROWS`]) input rows per block on tensor cores (bf16 compute only:
    /// [`Kernel::available`]); `wide`: the 64-row tile in blocks of 128 columns (`_m64w`).
    Qmma {
        q: QType,
        rows: u32,
        wide: bool,
    },
    /// [`Kernel::Qmma`] of two parts of type `q` ([`QDOT_MIX_TYPES`]) and a third of Q6_K.
    QmmaMix {
        q: QType,
        rows: u32,
        wide: bool,
    },
    /// [`Kernel::Qmma`] on 8-bit activations ([`Kernel::QuantizeX`]'s rows): the weight tile
    /// unpacked to 8-bit quants, int8 tensor-core products (bf16 only).
    Qmma8 {
        q: QType,
        rows: u32,
    },
    /// [`Kernel::QmmaMix`] on 8-bit activations.
    Qmma8Mix {
        q: QType,
        rows: u32,
    },
    /// [`Kernel::Qmma`] of a gate and an up part of type `q` ([`QMMA_GLU_TYPES`]) fused with
    /// SiLU-mul: each block pairs its gate and up rows (bf16 only).
    QmmaGlu {
        q: QType,
        rows: u32,
        wide: bool,
    },
    /// Sums the split-k partials of [`Kernel::Qmma`] (+ bias) into the output (bf16 only).
    QmmaReduce,
    /// [`Kernel::QmmaReduce`] of a [`Kernel::QmmaGlu`] launch: SiLU-mul of the gate and up
    /// sums (bf16 only).
    QmmaReduceGlu,
    /// [`Kernel::QmmaReduce`] of a residual delta (no bias) with the residual add and RMSNorm
    /// after it, one block per row (`AddRmsNorm`'s values; bf16 only).
    QmmaReduceAddNorm,
    /// [`Kernel::QmmaReduce`] of a whole qkv launch that also ropes q and k and writes k and
    /// v to the cache (what `rope_kv` does after it otherwise; bf16 only).
    QmmaReduceRope,
    /// Activation rows to 8-bit blocks of 32 for [`Kernel::Qdot`] (bf16 only).
    QuantizeX,
    /// Decode matmul of up to three quantized parts of type `q` in one launch, dp4a on the
    /// 8-bit activations of [`Kernel::QuantizeX`]; `rows` is one of [`QGEMV_ROWS`] (bf16 only).
    Qdot {
        q: QType,
        rows: u32,
    },
    /// [`Kernel::Qdot`] of two parts of type `q` (Q4_K or Q5_K: [`QDOT_MIX_TYPES`]) and a
    /// third of Q6_K in one launch (the qkv of a Q4_K_M or Q5_K_M file; bf16 only).
    QdotMix {
        q: QType,
        rows: u32,
    },
    /// [`Kernel::Qdot`] of a gate and an up part of type `q`, fused with SiLU-mul (bf16 only).
    QdotSilu {
        q: QType,
        rows: u32,
    },
    /// [`Kernel::Qdot`] of one row and one part of type `q` that adds its output into the
    /// residual and leaves the RMSNorm after it to the quantized matmul that reads the
    /// norm's output (`qdot_norm_impl` in `kernels/qgemv.cu`; bf16 only).
    QdotNorm {
        q: QType,
    },
    /// [`Kernel::Qdot`] at one row on the rows a [`Kernel::QdotNorm`] left: it finishes that
    /// norm (`NormIn` in `kernels/qgemv.cu`; entries of their own keep the plain kernels'
    /// code as it was).
    QdotIn {
        q: QType,
    },
    /// [`Kernel::QdotMix`] at one row finishing a [`Kernel::QdotNorm`]'s norm.
    QdotMixIn {
        q: QType,
    },
    /// [`Kernel::QdotSilu`] at one row finishing a [`Kernel::QdotNorm`]'s norm.
    QdotSiluIn {
        q: QType,
    },
}

/// Row tiles of the tiled quantized matmul (`kernels/qmma.cu`): a step runs the smallest
/// tile of at least its rows, or blocks of the largest.
pub const QMMA_ROWS: [u32; 3] = [16, 32, 64];
/// The `Kernel::Qmma` / `Kernel::QmmaMix` instantiations: (rows, wide) (the last row tile
/// also in wide blocks).
const QMMA_TILES: [(u32, bool); 4] = [(16, false), (32, false), (64, false), (64, true)];

/// Row buckets of the quantized streaming matmuls (`kernels/qgemv.cu`): a step of `n` rows
/// runs the smallest bucket of at least `n`.
pub const QGEMV_ROWS: [u32; 4] = [1, 2, 4, 8];

/// Slot buckets of the MoE dp4a tiles (`kernels/moe_quant.cu`, `moe8_*_s<slots>`): one real
/// slot a tile (a one-row step), groups of 4 slots (a second pass over the weights for a
/// tile with more), or the whole tile of 8.
pub const MOE8_SLOTS: [u32; 3] = [1, 4, 8];

/// The types of [`Kernel::QdotMix`]'s first parts (its last part is Q6_K).
pub const QDOT_MIX_TYPES: [QType; 2] = [QType::Q4K, QType::Q5K];

/// Types with a [`Kernel::QmmaGlu`]: those whose batches run on the bf16 tiles (Q8_0's take
/// the 8-bit ones).
pub const QMMA_GLU_TYPES: [QType; 4] = [QType::Q4_0, QType::Q4K, QType::Q5K, QType::Q6K];

/// Most input rows of the streaming matmul kernels (`kernels/gemv.cu`).
pub const GEMV_MAX_ROWS: usize = 2;

impl Kernel {
    /// All kernels, in load order.
    pub fn all() -> Vec<Kernel> {
        let mut v = vec![
            Kernel::Embed,
            Kernel::GatherRows,
            Kernel::RmsNorm,
            Kernel::AddRmsNorm,
            Kernel::RmsNormVec,
            Kernel::AddRmsNormVec,
            Kernel::Rope,
            Kernel::RopeKv,
            Kernel::RopeKvNorm,
            Kernel::WriteKv,
            Kernel::SiluMul,
            Kernel::SiluMulVec,
            Kernel::AddBias,
            Kernel::AttnCombine,
            Kernel::SamplePrep,
            Kernel::SampleTopN,
            Kernel::SamplePenalty,
            Kernel::SampleMask,
            Kernel::SamplePick,
            Kernel::SampleGreedy,
            Kernel::HeadRmsNorm,
            Kernel::GeluTanhMul,
            Kernel::ScaleRows,
            Kernel::Softcap,
            Kernel::MoeRoute,
            Kernel::MoeAlign,
            Kernel::MoePrep,
            Kernel::MoeGateUp,
            Kernel::MoeDown,
            Kernel::MoeCombine,
            Kernel::MoeCombineNorm,
            Kernel::MoeSharedAdd,
        ];
        for rows in 1..=GEMV_MAX_ROWS as u32 {
            v.push(Kernel::Gemv { rows });
            v.push(Kernel::GemvSiluMul { rows });
        }
        for q in QType::ALL {
            for rows in QGEMV_ROWS {
                v.push(Kernel::Qgemv { q, rows });
                v.push(Kernel::QgemvSilu { q, rows });
            }
            v.push(Kernel::Dequant { q });
            v.push(Kernel::MoeQGateUp { q });
            v.push(Kernel::MoeQDown { q });
            for slots in MOE8_SLOTS {
                v.push(Kernel::MoeQ8GateUp { q, slots });
                v.push(Kernel::MoeQ8Down { q, slots });
            }
            v.push(Kernel::MoeQ8DownSelf { q });
            v.push(Kernel::MoeMmaGateUp { q });
            v.push(Kernel::MoeMmaDown { q });
            v.extend(QMMA_TILES.map(|(rows, wide)| Kernel::Qmma { q, rows, wide }));
            v.extend(QMMA_ROWS.map(|rows| Kernel::Qmma8 { q, rows }));
            v.extend(QGEMV_ROWS.map(|rows| Kernel::Qdot { q, rows }));
            v.extend(QGEMV_ROWS.map(|rows| Kernel::QdotSilu { q, rows }));
            v.push(Kernel::QdotNorm { q });
            v.push(Kernel::QdotIn { q });
            v.push(Kernel::QdotSiluIn { q });
        }
        for q in QDOT_MIX_TYPES {
            v.push(Kernel::QdotMixIn { q });
            v.extend(QGEMV_ROWS.map(|rows| Kernel::QdotMix { q, rows }));
            v.extend(QMMA_TILES.map(|(rows, wide)| Kernel::QmmaMix { q, rows, wide }));
            v.extend(QMMA_ROWS.map(|rows| Kernel::Qmma8Mix { q, rows }));
        }
        for q in QMMA_GLU_TYPES {
            v.extend(QMMA_TILES.map(|(rows, wide)| Kernel::QmmaGlu { q, rows, wide }));
        }
        v.push(Kernel::QmmaReduce);
        v.push(Kernel::QmmaReduceRope);
        v.push(Kernel::QmmaReduceGlu);
        v.push(Kernel::QmmaReduceAddNorm);
        v.push(Kernel::QuantizeX);
        v.push(Kernel::Convert { bf16: false });
        v.push(Kernel::Convert { bf16: true });
        for head in [
            AttnHead::D64,
            AttnHead::D80,
            AttnHead::D96,
            AttnHead::D128,
            AttnHead::D256,
            AttnHead::Any,
        ] {
            v.extend(
                head.group_sizes()
                    .iter()
                    .map(|&qv| Kernel::Attention { head, qv }),
            );
            if head.has_tc() {
                v.push(Kernel::AttentionTc { head });
            }
            if head.has_decode() {
                v.extend(
                    head.decode_sizes()
                        .iter()
                        .map(|&qv| Kernel::AttentionDecode { head, qv }),
                );
            }
        }
        v
    }

    /// The op name used in errors and metrics.
    pub fn op(self) -> &'static str {
        match self {
            Kernel::Embed => "embed",
            Kernel::GatherRows => "gather_rows",
            Kernel::RmsNorm | Kernel::RmsNormVec => "rms_norm",
            Kernel::AddRmsNorm | Kernel::AddRmsNormVec => "add_rms_norm",
            Kernel::Rope => "rope",
            Kernel::RopeKv => "rope_kv",
            Kernel::RopeKvNorm => "rope_kv_norm",
            Kernel::WriteKv => "write_kv",
            Kernel::SiluMul | Kernel::SiluMulVec => "silu_mul",
            Kernel::AddBias => "add_bias",
            Kernel::Attention { .. }
            | Kernel::AttentionTc { .. }
            | Kernel::AttentionDecode { .. } => "attention",
            Kernel::AttnCombine => "attn_combine",
            Kernel::SamplePrep => "sample_prep",
            Kernel::SampleTopN => "sample_topn",
            Kernel::SamplePenalty => "sample_penalty",
            Kernel::SampleMask => "sample_mask",
            Kernel::SamplePick => "sample_pick",
            Kernel::SampleGreedy => "sample_greedy",
            Kernel::HeadRmsNorm => "head_rms_norm",
            Kernel::GeluTanhMul => "gelu_tanh_mul",
            Kernel::ScaleRows => "scale_rows",
            Kernel::Softcap => "softcap",
            Kernel::MoeRoute => "moe_route",
            Kernel::MoeAlign => "moe_align",
            Kernel::MoePrep => "moe_prep",
            Kernel::MoeGateUp
            | Kernel::MoeQGateUp { .. }
            | Kernel::MoeQ8GateUp { .. }
            | Kernel::MoeMmaGateUp { .. } => "moe_gate_up",
            Kernel::MoeDown
            | Kernel::MoeQDown { .. }
            | Kernel::MoeQ8Down { .. }
            | Kernel::MoeQ8DownSelf { .. }
            | Kernel::MoeMmaDown { .. } => "moe_down",
            Kernel::MoeCombine => "moe_combine",
            Kernel::MoeCombineNorm => "moe_combine_norm",
            Kernel::MoeSharedAdd => "moe_shared_add",
            Kernel::Gemv { .. }
            | Kernel::Qgemv { .. }
            | Kernel::Qmma { .. }
            | Kernel::QmmaMix { .. }
            | Kernel::Qmma8 { .. }
            | Kernel::Qmma8Mix { .. }
            | Kernel::QmmaReduce
            | Kernel::QmmaReduceRope
            | Kernel::Qdot { .. }
            | Kernel::QdotMix { .. }
            | Kernel::QdotIn { .. }
            | Kernel::QdotMixIn { .. } => "matmul",
            Kernel::GemvSiluMul { .. }
            | Kernel::QgemvSilu { .. }
            | Kernel::QdotSilu { .. }
            | Kernel::QdotSiluIn { .. }
            | Kernel::QmmaGlu { .. }
            | Kernel::QmmaReduceGlu => "matmul_silu_mul",
            Kernel::QmmaReduceAddNorm | Kernel::QdotNorm { .. } => "matmul_add_rms_norm",
            Kernel::QuantizeX => "quantize_x",
            Kernel::Dequant { .. } => "dequant",
            Kernel::Convert { .. } => "convert",
        }
    }

    /// Whether the kernel executes `KILN_PDL_WAIT()` (prelude.cuh) on every path before it
    /// reads or writes a buffer that a kernel before it may use, so it may be launched to
    /// start while that kernel drains ([`super::runtime::Runtime::launch_dependent`]). Only
    /// the kernels of the decode chain: the norms, the fused rope + cache write, decode
    /// attention and its combine, the streaming matmuls (bf16 and quantized) and
    /// `quantize_x`. Every
    /// other kernel keeps the plain launch.
    pub(super) fn waits_for_predecessor(self) -> bool {
        matches!(
            self,
            Kernel::RmsNorm
                | Kernel::AddRmsNorm
                | Kernel::RmsNormVec
                | Kernel::AddRmsNormVec
                | Kernel::RopeKv
                | Kernel::RopeKvNorm
                | Kernel::AttentionDecode { .. }
                | Kernel::AttnCombine
                | Kernel::Qgemv { .. }
                | Kernel::QgemvSilu { .. }
                | Kernel::QuantizeX
                | Kernel::Qdot { .. }
                | Kernel::QdotMix { .. }
                | Kernel::QdotSilu { .. }
                | Kernel::QdotNorm { .. }
                | Kernel::QdotIn { .. }
                | Kernel::QdotMixIn { .. }
                | Kernel::QdotSiluIn { .. }
                | Kernel::Gemv { .. }
                | Kernel::GemvSiluMul { .. }
        )
    }

    pub(super) fn source(self) -> Source {
        match self {
            Kernel::Embed | Kernel::GatherRows => Source::Embed,
            Kernel::RmsNorm | Kernel::AddRmsNorm | Kernel::RmsNormVec | Kernel::AddRmsNormVec => {
                Source::Norm
            }
            Kernel::Rope | Kernel::RopeKv | Kernel::RopeKvNorm => Source::Rope,
            Kernel::WriteKv => Source::Kv,
            Kernel::SiluMul | Kernel::SiluMulVec | Kernel::AddBias => Source::Activation,
            Kernel::Attention { .. } => Source::AttentionPrefill,
            Kernel::AttentionTc { .. } => Source::AttentionTc,
            Kernel::AttentionDecode { .. } | Kernel::AttnCombine => Source::AttentionDecode,
            Kernel::SamplePrep
            | Kernel::SampleTopN
            | Kernel::SamplePenalty
            | Kernel::SampleMask
            | Kernel::SamplePick
            | Kernel::SampleGreedy => Source::Sample,
            Kernel::Gemv { .. } | Kernel::GemvSiluMul { .. } => Source::Gemv,
            Kernel::HeadRmsNorm | Kernel::GeluTanhMul | Kernel::ScaleRows | Kernel::Softcap => {
                Source::Arch
            }
            Kernel::MoeRoute
            | Kernel::MoeAlign
            | Kernel::MoePrep
            | Kernel::MoeGateUp
            | Kernel::MoeDown
            | Kernel::MoeCombine
            | Kernel::MoeCombineNorm
            | Kernel::MoeSharedAdd => Source::Moe,
            Kernel::MoeQGateUp { .. }
            | Kernel::MoeQDown { .. }
            | Kernel::MoeQ8GateUp { .. }
            | Kernel::MoeQ8Down { .. }
            | Kernel::MoeQ8DownSelf { .. }
            | Kernel::MoeMmaGateUp { .. }
            | Kernel::MoeMmaDown { .. } => Source::MoeQuant,
            Kernel::Qgemv { .. }
            | Kernel::QgemvSilu { .. }
            | Kernel::Dequant { .. }
            | Kernel::Convert { .. }
            | Kernel::QuantizeX
            | Kernel::Qdot { .. }
            | Kernel::QdotMix { .. }
            | Kernel::QdotSilu { .. }
            | Kernel::QdotNorm { .. }
            | Kernel::QdotIn { .. }
            | Kernel::QdotMixIn { .. }
            | Kernel::QdotSiluIn { .. } => Source::Qgemv,
            Kernel::Qmma { .. }
            | Kernel::QmmaMix { .. }
            | Kernel::Qmma8 { .. }
            | Kernel::Qmma8Mix { .. }
            | Kernel::QmmaGlu { .. }
            | Kernel::QmmaReduce
            | Kernel::QmmaReduceRope
            | Kernel::QmmaReduceGlu
            | Kernel::QmmaReduceAddNorm => Source::Qmma,
        }
    }

    /// The compile unit holding the kernel.
    pub(super) fn unit(self) -> Unit {
        let src = self.source();
        let part = match self {
            Kernel::Qgemv { q, .. } | Kernel::QgemvSilu { q, .. } => Part::Stream(q),
            Kernel::QdotNorm { q }
            | Kernel::QdotIn { q }
            | Kernel::QdotMixIn { q }
            | Kernel::QdotSiluIn { q } => Part::Norm(q),
            Kernel::Qdot { q, rows }
            | Kernel::QdotMix { q, rows }
            | Kernel::QdotSilu { q, rows }
                if rows > 1 =>
            {
                Part::Rows(q, rows)
            }
            Kernel::Dequant { q }
            | Kernel::Qdot { q, .. }
            | Kernel::QdotMix { q, .. }
            | Kernel::QdotSilu { q, .. }
            | Kernel::Qmma { q, .. }
            | Kernel::QmmaMix { q, .. }
            | Kernel::QmmaGlu { q, .. }
            | Kernel::MoeQGateUp { q }
            | Kernel::MoeQDown { q }
            | Kernel::MoeQ8GateUp { q, .. }
            | Kernel::MoeQ8Down { q, .. }
            | Kernel::MoeQ8DownSelf { q }
            | Kernel::MoeMmaGateUp { q }
            | Kernel::MoeMmaDown { q } => Part::Q(q),
            Kernel::Qmma8 { q: QType::Q8_0, .. } => Part::Q(QType::Q8_0),
            Kernel::Qmma8 { q, .. } | Kernel::Qmma8Mix { q, .. } => Part::Int8(q),
            Kernel::AttentionDecode { head, qv } => Part::Pass(head, qv),
            Kernel::Attention { head, .. } | Kernel::AttentionTc { head } => Part::Head(head),
            Kernel::Convert { .. }
            | Kernel::QuantizeX
            | Kernel::QmmaReduce
            | Kernel::QmmaReduceRope
            | Kernel::QmmaReduceGlu
            | Kernel::QmmaReduceAddNorm
            | Kernel::AttnCombine
            | Kernel::Rope
            | Kernel::RopeKv => Part::Common,
            Kernel::RopeKvNorm => Part::QkNorm,
            _ => Part::Whole,
        };
        Unit { src, part }
    }

    /// Whether the kernel exists for storage type `dt` (the tensor-core quantized matmul
    /// and the 8-bit activation decode path are bf16 only; f32 keeps exact float products:
    /// batches dequantize and run the f32 GEMM, decode streams through `qgemv`).
    pub fn available(self, dt: DType) -> bool {
        let bf16_only = matches!(
            self,
            Kernel::Qmma { .. }
                | Kernel::QmmaMix { .. }
                | Kernel::Qmma8 { .. }
                | Kernel::Qmma8Mix { .. }
                | Kernel::QmmaGlu { .. }
                | Kernel::QmmaReduce
                | Kernel::QmmaReduceRope
                | Kernel::QmmaReduceGlu
                | Kernel::QmmaReduceAddNorm
                | Kernel::QuantizeX
                | Kernel::Qdot { .. }
                | Kernel::QdotMix { .. }
                | Kernel::QdotSilu { .. }
                | Kernel::QdotNorm { .. }
                | Kernel::QdotIn { .. }
                | Kernel::QdotMixIn { .. }
                | Kernel::QdotSiluIn { .. }
                | Kernel::MoeQ8GateUp { .. }
                | Kernel::MoeQ8Down { .. }
                | Kernel::MoeQ8DownSelf { .. }
                | Kernel::MoeMmaGateUp { .. }
                | Kernel::MoeMmaDown { .. }
        );
        !bf16_only || dt == DType::Bf16
    }

    /// Entry point name for storage type `dt`.
    pub(super) fn entry(self, dt: DType) -> String {
        let d = dt.suffix();
        match self {
            Kernel::Attention { head, qv } => format!("attn_{d}_d{}_q{qv}", head.tag()),
            Kernel::AttentionTc { head } => format!("attn_{d}_d{}_tc", head.tag()),
            Kernel::AttentionDecode { head, qv } => format!("attn_{d}_d{}_dec{qv}", head.tag()),
            Kernel::Gemv { rows } => format!("gemv_{d}_m{rows}"),
            Kernel::GemvSiluMul { rows } => format!("gemv_silu_mul_{d}_m{rows}"),
            Kernel::Qgemv { q, rows } => format!("qgemv_{}_{d}_m{rows}", q.tag()),
            Kernel::QgemvSilu { q, rows } => format!("qgemv_silu_{}_{d}_m{rows}", q.tag()),
            Kernel::Dequant { q } => format!("dequant_{}_{d}", q.tag()),
            Kernel::MoeQGateUp { q } => format!("moe_gate_up_{}_{d}", q.tag()),
            Kernel::MoeQDown { q } => format!("moe_down_{}_{d}", q.tag()),
            Kernel::MoeQ8GateUp { q, slots } => format!("moe8_gate_up_{}_{d}_s{slots}", q.tag()),
            Kernel::MoeQ8Down { q, slots } => format!("moe8_down_{}_{d}_s{slots}", q.tag()),
            Kernel::MoeQ8DownSelf { q } => format!("moe8_down_self_{}_{d}", q.tag()),
            Kernel::MoeMmaGateUp { q } => format!("moemma_gate_up_{}_{d}", q.tag()),
            Kernel::MoeMmaDown { q } => format!("moemma_down_{}_{d}", q.tag()),
            Kernel::Qmma { q, rows, wide } => {
                format!(
                    "qmma_{}_{d}_m{rows}{}",
                    q.tag(),
                    if wide { "w" } else { "" }
                )
            }
            Kernel::QmmaMix { q, rows, wide } => {
                let w = if wide { "w" } else { "" };
                format!("qmmamix_{}_q6k_{d}_m{rows}{w}", q.tag())
            }
            Kernel::Qmma8 { q, rows } => format!("qmma8_{}_{d}_m{rows}", q.tag()),
            Kernel::Qmma8Mix { q, rows } => format!("qmma8mix_{}_q6k_{d}_m{rows}", q.tag()),
            Kernel::QmmaGlu { q, rows, wide } => {
                let w = if wide { "w" } else { "" };
                format!("qmmaglu_{}_{d}_m{rows}{w}", q.tag())
            }
            Kernel::QmmaReduce => format!("qmma_reduce_{d}"),
            Kernel::QmmaReduceGlu => format!("qmma_reduce_glu_{d}"),
            Kernel::QmmaReduceAddNorm => format!("qmma_reduce_add_norm_{d}"),
            Kernel::QmmaReduceRope => format!("qmma_reduce_rope_{d}"),
            Kernel::QuantizeX => format!("quantize_x_{d}"),
            Kernel::Qdot { q, rows } => format!("qdot_{}_{d}_m{rows}", q.tag()),
            Kernel::QdotMix { q, rows } => format!("qdotmix_{}_q6k_{d}_m{rows}", q.tag()),
            Kernel::QdotSilu { q, rows } => format!("qdot_silu_{}_{d}_m{rows}", q.tag()),
            Kernel::QdotNorm { q } => format!("qdot_norm_{}_{d}_m1", q.tag()),
            Kernel::QdotIn { q } => format!("qdot_in_{}_{d}_m1", q.tag()),
            Kernel::QdotMixIn { q } => format!("qdotmix_in_{}_q6k_{d}_m1", q.tag()),
            Kernel::QdotSiluIn { q } => format!("qdot_silu_in_{}_{d}_m1", q.tag()),
            Kernel::Convert { bf16 } => {
                format!("convert_{}_{d}", if bf16 { "bf16" } else { "f16" })
            }
            Kernel::SiluMulVec => format!("silu_mul_vec_{d}"),
            Kernel::RmsNormVec => format!("rms_norm_vec_{d}"),
            Kernel::AddRmsNormVec => format!("add_rms_norm_vec_{d}"),
            Kernel::SampleTopN | Kernel::SamplePenalty | Kernel::SampleMask | Kernel::MoeAlign => {
                self.op().to_string()
            }
            _ => format!("{}_{d}", self.op()),
        }
    }
}

/// The loaded kernels of one backend. Every compile unit a first request may run compiles
/// (or is read from the cache) on a thread of its own from [`Kernels::load`] on, while the
/// model's weights upload; what only larger steps run starts once those are ready, the rest
/// when one of its kernels is first asked for ([`Class`]). A unit's module is loaded when
/// one of its kernels is first asked for ([`Kernels::get`]) or when [`Kernels::wait_core`]
/// asks for every core unit. Modules stay loaded as long as this lives.
pub struct Kernels<R: Runtime> {
    slots: HashMap<Unit, Slot<R>>,
    dt: DType,
    /// How every unit compiles (the units not started at load compile from it on first use).
    job: Arc<CompileJob>,
    /// Every [`Class::Later`] unit is loaded ([`Kernels::poll_later`] has nothing to do).
    later_done: std::sync::atomic::AtomicBool,
    started: Instant,
}

impl<R: Runtime> Drop for Kernels<R> {
    /// Joins the compile threads no one waited for (a backend dropped before its lane was
    /// ready, a test that ran a few kernels): a thread still inside NVRTC when the process
    /// exits can crash it there (`free(): invalid pointer` after a passing test run).
    fn drop(&mut self) {
        for slot in self.slots.values() {
            let pending = slot
                .pending
                .lock()
                .map(|mut p| std::mem::replace(&mut *p, Pending::Taken));
            if let Ok(Pending::Running(handle)) = pending {
                let _ = handle.join();
            }
        }
    }
}

/// The compiler options and cache salts, for the core units and for the others
/// ([`core_options`]), and the cache folder every unit of one backend shares.
struct CompileJob {
    opts: Vec<String>,
    salt: String,
    core_opts: Vec<String>,
    core_salt: String,
    dir: Option<PathBuf>,
}

/// The options a start's core units compile with: the others' without NVRTC's split compile
/// (`--split-compile`, cuda_rt.rs: one unit's kernels optimized on threads of their own),
/// unless `KILN_NVRTC_SPLIT` is set. The core units compile all at once, more units than
/// the machine has cores, and one thread each was ready sooner: H100 (16 cores), Q4_K_M
/// Llama-3-8B, an empty cache: kernels ready 1.51-1.60 s after load against 1.48-1.87 s
/// with `--split-compile=0` (first answer 2.04-2.12 s against 2.17-2.54 s). The units that
/// compile later, a few at a time, keep it (`qmma.q4k`: 2.8-3.4 s against 6.4-7.4 s).
fn core_options(opts: &[String]) -> Vec<String> {
    if std::env::var_os("KILN_NVRTC_SPLIT").is_some() {
        return opts.to_vec();
    }
    opts.iter()
        .filter(|o| !o.starts_with("--split-compile"))
        .cloned()
        .collect()
}

impl CompileJob {
    /// Compiles (or reads from the cache) `unit` on a thread of its own at the lowest CPU
    /// priority, logging how it went; `core`: with the core units' options.
    fn spawn<R: Runtime>(
        self: Arc<Self>,
        unit: Unit,
        core: bool,
    ) -> Result<JoinHandle<Result<Compiled, BackendError>>, BackendError> {
        std::thread::Builder::new()
            .name(format!("kiln-nvrtc-{}", unit.name()))
            .spawn(move || {
                compile_priority(core);
                let (opts, salt) = if core {
                    (&self.core_opts, &self.core_salt)
                } else {
                    (&self.opts, &self.salt)
                };
                let c = cached_compile::<R>(unit, opts, salt, self.dir.as_deref());
                if let Ok(c) = &c {
                    tracing::info!(
                        backend = R::NAME,
                        source = unit.name(),
                        cached = c.cached,
                        secs = c.secs,
                        bytes = c.image.len(),
                        "kernel source compiled"
                    );
                }
                c
            })
            .map_err(|e| compile_err::<R>(format!("cannot start a compile thread: {e}")))
    }
}

/// One unit: when it compiles, its compile thread until joined (none before it starts:
/// [`Pending`]), then its module and functions (or the error, kept as text and returned for
/// every later kernel of the unit).
struct Slot<R: Runtime> {
    class: Class,
    pending: Mutex<Pending>,
    loaded: OnceLock<Result<Loaded<R>, String>>,
}

/// A unit's compile thread.
enum Pending {
    /// Not started (a [`Class::Later`] unit before the core units are ready, a
    /// [`Class::Lazy`] one before its first use).
    NotStarted,
    Running(JoinHandle<Result<Compiled, BackendError>>),
    /// Joined (or being joined) by the unit's first use.
    Taken,
}

/// A source's code object and how it was made.
struct Compiled {
    image: Vec<u8>,
    /// Read from the kernel cache rather than compiled.
    cached: bool,
    /// Seconds the compile (or the cache read) took on its thread.
    secs: f64,
}

struct Loaded<R: Runtime> {
    funcs: HashMap<Kernel, R::Func>,
    _module: R::Module,
}

/// Lowers the calling thread's CPU priority to the least (Linux; elsewhere nothing), so the
/// compiles take the cores the weight upload leaves (with NVRTC's split-compile threads, a
/// cold start ran ~40 compile threads, and the upload on the lane's thread fell from 2.7 to
/// 0.7 GB/s on an H100 machine's 16 cores). `KILN_NVRTC_NICE=N` (0-19) gives a start's core
/// units (`core`) nice N instead, for measurements: the upload's staging now fills every
/// core for the first ~0.5 s of a start, and at nice 19 the core units barely progress
/// meanwhile (H100, Q4_K_M Llama-3-8B, an empty cache: the smallest units finish only as
/// the upload ends, and the longest, ~1 s of one core, ends the wait ~1.5 s after load).
fn compile_priority(core: bool) {
    let nice = std::env::var("KILN_NVRTC_NICE")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|_| core)
        .map_or(19, |n| n.clamp(0, 19));
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread's own id; a failure leaves the priority.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

impl<R: Runtime> Kernels<R> {
    /// Starts compiling (or reading from `cache_dir`) every compile unit with kernels for
    /// `dt` that `needs` says a first request may run ([`Class::Core`]), one thread each, for
    /// the device `info` describes (the others later or on first use; no context is needed
    /// until a module loads). Nothing waits here: a compile error or a missing entry point
    /// is returned by the first [`Kernels::get`] of a kernel in that unit, and by
    /// [`Kernels::wait_core`], which start-up calls before the lane reports ready.
    pub fn load(
        info: &DeviceInfo,
        dt: DType,
        cache_dir: Option<&Path>,
        needs: KernelNeeds,
    ) -> Result<Kernels<R>, BackendError> {
        let opts = compile_options::<R>(info, dt);
        let salt_of = |opts: &[String]| {
            format!(
                "{} {opts:?} {} driver {} {}",
                R::NAME,
                info.arch,
                info.driver_version,
                R::compiler_version()
            )
        };
        let core_opts = core_options(&opts);
        // A unit with no entry point for `dt` (qmma.cu in f32) is not compiled. The largest
        // units start first, so they are not queued behind small ones.
        let mut used: Vec<Unit> = Kernel::all()
            .into_iter()
            .filter(|k| k.available(dt))
            .map(Kernel::unit)
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .collect();
        used.sort_by_cached_key(|&u| (std::cmp::Reverse(u.src.full_text().len()), u.name()));
        let job = Arc::new(CompileJob {
            salt: salt_of(&opts),
            core_salt: salt_of(&core_opts),
            opts,
            core_opts,
            dir: cache_dir.map(Path::to_path_buf),
        });
        let mut slots = HashMap::new();
        for unit in used {
            // What a first request may run compiles now, each unit on a thread of its own
            // at the lowest CPU priority (the weight upload on the lane's thread goes first;
            // NVRTC's own threads inherit it); the rest once those are ready, or when first
            // asked for ([`Class`]).
            let class = needs.class(unit, dt);
            let pending = match class {
                Class::Core => Pending::Running(job.clone().spawn::<R>(unit, true)?),
                Class::Later | Class::Lazy => Pending::NotStarted,
            };
            slots.insert(
                unit,
                Slot {
                    class,
                    pending: Mutex::new(pending),
                    loaded: OnceLock::new(),
                },
            );
        }
        Ok(Kernels {
            slots,
            dt,
            job,
            later_done: std::sync::atomic::AtomicBool::new(false),
            started: Instant::now(),
        })
    }

    /// The units of `class`, by name.
    fn units_of(&self, class: Class) -> Vec<Unit> {
        let mut v: Vec<Unit> = self
            .slots
            .iter()
            .filter(|(_, s)| s.class == class)
            .map(|(&u, _)| u)
            .collect();
        v.sort_by_key(|u| u.name());
        v
    }

    /// Waits for every unit a first request may run ([`Class::Core`]) and loads its module,
    /// then starts the [`Class::Later`] compiles in the background: after this, start-up
    /// has seen every compile error that a first request could meet. Logs what the wait
    /// cost.
    pub fn wait_core(&self, rt: &R) -> Result<(), BackendError> {
        let t0 = Instant::now();
        let core = self.units_of(Class::Core);
        for &unit in &core {
            self.slot(rt, unit)?;
        }
        tracing::info!(
            backend = R::NAME,
            sources = core.len(),
            since_start_s = self.started.elapsed().as_secs_f64(),
            waited_s = t0.elapsed().as_secs_f64(),
            "kernels ready"
        );
        // Largest first, as at load.
        let mut later = self.units_of(Class::Later);
        later.sort_by_cached_key(|&u| std::cmp::Reverse(u.src.full_text().len()));
        for unit in later {
            let slot = &self.slots[&unit];
            let mut pending = slot
                .pending
                .lock()
                .map_err(|_| compile_err::<R>("compile slot poisoned".into()))?;
            if matches!(*pending, Pending::NotStarted) && slot.loaded.get().is_none() {
                *pending = Pending::Running(self.job.clone().spawn::<R>(unit, false)?);
            }
        }
        Ok(())
    }

    /// Whether `unit` is a [`Class::Later`] unit whose module is not loaded yet (its compile
    /// may still run): a step that can do without it takes another path rather than wait
    /// (matmul.rs: batches dequantize for the BLAS while the tiled matmuls compile).
    pub(super) fn pending(&self, unit: Unit) -> bool {
        // Once every Later unit is loaded (soon after start-up), without a lookup: decode
        // steps ask for each matmul and attention launch.
        !self.later_done.load(std::sync::atomic::Ordering::Relaxed)
            && self
                .slots
                .get(&unit)
                .is_some_and(|s| s.class == Class::Later && s.loaded.get().is_none())
    }

    /// Loads every [`Class::Later`] unit whose compile has ended; true if one was loaded
    /// (its error, if it failed, is returned by its first [`Kernels::get`]). Called between
    /// steps, so no module loads while a graph records.
    pub(super) fn poll_later(&self, rt: &R) -> bool {
        if self.later_done.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        let (mut loaded, mut left) = (false, false);
        for (&unit, slot) in &self.slots {
            if slot.class != Class::Later || slot.loaded.get().is_some() {
                continue;
            }
            let done = slot
                .pending
                .lock()
                .is_ok_and(|p| matches!(&*p, Pending::Running(h) if h.is_finished()));
            if done {
                let _ = self.slot(rt, unit);
                loaded = true;
            } else {
                left = true;
            }
        }
        if !left {
            self.later_done
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        loaded
    }

    /// [`Kernels::wait_core`], then waits for the [`Class::Later`] units too: every kernel
    /// the model may run is loaded after this (a tensor-parallel rank loads no module once
    /// its communicator exists: loading one while a peer's collective waits on the same
    /// GPUs can deadlock).
    pub fn wait_model(&self, rt: &R) -> Result<(), BackendError> {
        self.wait_core(rt)?;
        let t0 = Instant::now();
        let later = self.units_of(Class::Later);
        for &unit in &later {
            self.slot(rt, unit)?;
        }
        tracing::info!(
            backend = R::NAME,
            sources = later.len(),
            since_start_s = self.started.elapsed().as_secs_f64(),
            waited_s = t0.elapsed().as_secs_f64(),
            "kernels for larger steps ready"
        );
        Ok(())
    }

    /// The loaded module of `unit` (joining its compile thread and loading it on first use).
    fn slot(&self, rt: &R, unit: Unit) -> Result<&Loaded<R>, BackendError> {
        let slot = self.slots.get(&unit).ok_or(BackendError::Unsupported {
            backend: R::NAME,
            op: "kernel source",
            dtype: format!("{:?} ({} has no entry points)", self.dt, unit.name()),
        })?;
        slot.loaded
            .get_or_init(|| Self::finish(rt, unit, self.dt, slot, &self.job, self.started))
            .as_ref()
            .map_err(|message| compile_err::<R>(message.clone()))
    }

    /// Joins `unit`'s compile, loads the module and resolves every entry point of `dt`.
    fn finish(
        rt: &R,
        unit: Unit,
        dt: DType,
        slot: &Slot<R>,
        job: &Arc<CompileJob>,
        started: Instant,
    ) -> Result<Loaded<R>, String> {
        let t0 = Instant::now();
        let pending = std::mem::replace(
            &mut *slot
                .pending
                .lock()
                .map_err(|_| "compile slot poisoned".to_string())?,
            Pending::Taken,
        );
        let handle = match pending {
            Pending::Running(h) => h,
            Pending::NotStarted | Pending::Taken => job
                .clone()
                .spawn::<R>(unit, slot.class == Class::Core)
                .map_err(|e| e.to_string())?,
        };
        let compiled = handle
            .join()
            .unwrap_or_else(|_| Err(compile_err::<R>("compile thread panicked".into())))
            .map_err(|e| e.to_string())?;
        let waited = t0.elapsed().as_secs_f64();
        let module = rt
            .load_module(&compiled.image)
            .map_err(|e| format!("load_module {}: {e}", unit.name()))?;
        let mut funcs = HashMap::new();
        for k in Kernel::all()
            .into_iter()
            .filter(|k| k.unit() == unit && k.available(dt))
        {
            let f = rt.function(&module, &k.entry(dt)).ok_or_else(|| {
                format!(
                    "op {}: {dt:?} entry point {} missing in {}",
                    k.op(),
                    k.entry(dt),
                    unit.name()
                )
            })?;
            funcs.insert(k, f);
        }
        let load_s = t0.elapsed().as_secs_f64() - waited;
        let since_start_s = started.elapsed().as_secs_f64();
        let source = unit.name();
        if slot.class == Class::Core {
            tracing::debug!(
                backend = R::NAME,
                source,
                waited_s = waited,
                load_s,
                since_start_s,
                "kernel source loaded"
            );
        } else {
            // After start-up: a step waited `waited_s` for it (a compile still running, or
            // never started), or it was loaded between steps once compiled.
            tracing::info!(backend = R::NAME, source, class = ?slot.class, waited_s = waited, load_s, since_start_s, "kernel source loaded after start-up");
        }
        Ok(Loaded {
            funcs,
            _module: module,
        })
    }

    /// Compiler resource use of every kernel (each source loaded first; one that fails to
    /// compile is left out): (kernel, registers per thread, local (spill) bytes per thread,
    /// static shared bytes per block).
    pub fn resources(&self, rt: &R) -> Vec<(Kernel, i32, i32, i32)> {
        let mut v: Vec<_> = self
            .slots
            .keys()
            .filter_map(|&unit| self.slot(rt, unit).ok())
            .flat_map(|l| l.funcs.iter())
            .map(|(k, f)| {
                let (regs, local, shared) = rt.resources(f);
                (*k, regs, local, shared)
            })
            .collect();
        v.sort_by_key(|r| format!("{:?}", r.0));
        v
    }

    /// The function of `k`, its source's module loaded on first use.
    pub fn get(&self, rt: &R, k: Kernel) -> Result<&R::Func, BackendError> {
        let unsupported = || BackendError::Unsupported {
            backend: R::NAME,
            op: k.op(),
            dtype: format!("{:?}", self.dt),
        };
        if !k.available(self.dt) {
            return Err(unsupported());
        }
        self.slot(rt, k.unit())?
            .funcs
            .get(&k)
            .ok_or_else(unsupported)
    }
}

/// The compiler options of every kernel source for `info`'s device and storage type `dt`.
pub fn compile_options<R: Runtime>(info: &DeviceInfo, dt: DType) -> Vec<String> {
    let mut opts = R::compile_options(info);
    opts.push(format!("-DKILN_DTYPE_{}", dt.suffix().to_uppercase()));
    opts
}

/// Every kernel source with entry points for storage type `dt` (a source with none, such as
/// the bf16-only tensor-core matmul in f32, is left out), exactly as [`Kernels::load`]
/// compiles it: (file name, full text, entry points). For checks that run the compiler
/// without a device (`tests/hiprtc.rs`).
pub fn sources(dt: DType) -> Vec<(&'static str, String, Vec<String>)> {
    Source::ALL
        .iter()
        .filter_map(|&src| {
            let entries: Vec<String> = Kernel::all()
                .into_iter()
                .filter(|k| k.source() == src && k.available(dt))
                .map(|k| k.entry(dt))
                .collect();
            (!entries.is_empty()).then(|| (src.file(), src.full_text(), entries))
        })
        .collect()
}

/// Every compile unit with entry points for storage type `dt`, exactly as [`Kernels::load`]
/// compiles it (a split source once per part): (unit name, text, entry points). For checks
/// that run the compiler without a device (`tests/hiprtc.rs`).
pub fn units(dt: DType) -> Vec<(String, String, Vec<String>)> {
    let mut by_unit: HashMap<Unit, Vec<String>> = HashMap::new();
    for k in Kernel::all().into_iter().filter(|k| k.available(dt)) {
        by_unit.entry(k.unit()).or_default().push(k.entry(dt));
    }
    let mut v: Vec<_> = by_unit
        .into_iter()
        .map(|(u, entries)| (u.name(), u.text(), entries))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn compile_err<R: Runtime>(message: String) -> BackendError {
    BackendError::Device {
        op: R::COMPILER,
        message,
    }
}

/// FNV-1a, 64 bits: stable across builds, unlike the std hasher.
fn fnv64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Compiles `unit`, or reads its image from the disk cache under `dir` (checked; a file
/// failing the check is recompiled and overwritten: `backend::kernel_cache`).
fn cached_compile<R: Runtime>(
    unit: Unit,
    opts: &[String],
    salt: &str,
    dir: Option<&Path>,
) -> Result<Compiled, BackendError> {
    let t0 = Instant::now();
    let text = unit.text();
    let key = format!("{:016x}", fnv64(&[text.as_bytes(), salt.as_bytes()]));
    let path: Option<PathBuf> =
        dir.map(|d| d.join(format!("{}-{}-{key}.bin", R::NAME, unit.name())));
    let (image, cached) = kernel_cache::load_or_compile(path.as_deref(), &key, || {
        R::compile(&text, &unit.name(), opts).map_err(|e| compile_err::<R>(e.to_string()))
    })?;
    Ok(Compiled {
        image,
        cached,
        secs: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        if std::env::var_os("KILN_NVRTC_SPLIT").is_some() {
            return;
        }
        let opts = [
            "--gpu-architecture=sm_90",
            "--split-compile=0",
            "-DKILN_DTYPE_BF16",
        ]
        .map(String::from);
        assert_eq!(
            core_options(&opts),
            ["--gpu-architecture=sm_90", "-DKILN_DTYPE_BF16"]
        );
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
                        || u.src.text().contains(&format!("#if KILN_PART_{tag}"))
                        || pasted.is_some_and(|p| u.src.text().contains(&p)),
                    "{} has no part {tag}",
                    u.src.file()
                );
                assert!(u.text().starts_with("#define KILN_PARTS 1\n"));
                assert!(
                    PRELUDE.contains(&format!("#ifndef KILN_PART_{tag}\n")),
                    "prelude.cuh has no default for part {tag}"
                );
            }
        }
    }
}
