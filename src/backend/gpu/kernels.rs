//! The kernel table: every kernel the backend launches as one typed value ([`Kernel`]), and
//! its facts written once ([`Kernel::info`]: op name, compile unit, entry point, the storage
//! types it exists for, whether it waits for its predecessor), next to the family that
//! launches it (`ops/<family>/kernels.rs`, or `kernels/table.rs` for the families without
//! a folder of their own yet). The compile registry (`registry/`) compiles and loads the
//! units; its names are re-exported here.

mod table;

use super::qtype::QType;
use super::registry::Unit;
use crate::backend::DType;

pub use super::registry::{
    AttnHead, KernelNeeds, Kernels, Part, Source, compile_options, sources, units,
};

/// Every kernel the backend launches.
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
pub const QMMA_GLU_TYPES: [QType; 5] = [
    QType::Q4_0,
    QType::Q4K,
    QType::Q5K,
    QType::Q6K,
    QType::Mxfp4,
];

/// Most input rows of the streaming matmul kernels (`kernels/gemv.cu`).
pub const GEMV_MAX_ROWS: usize = 2;

/// A kernel's facts, written once per kernel ([`Kernel::info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelInfo {
    /// The op name used in errors and metrics.
    pub op: &'static str,
    /// The compile unit holding it.
    pub unit: Unit,
    /// Its entry point's name.
    pub entry: Entry,
    /// It exists for bf16 storage only (the tensor-core quantized matmul and the 8-bit
    /// activation decode path; f32 keeps exact float products: batches dequantize and run
    /// the f32 GEMM, decode streams through `qgemv`).
    pub bf16_only: bool,
    /// It executes `KILN_PDL_WAIT()` (prelude.cuh) on every path before it reads or writes a
    /// buffer that a kernel before it may use, so it may be launched to start while that
    /// kernel drains ([`super::runtime::Runtime::launch_dependent`]). Only the kernels of
    /// the decode chain: the norms, the fused rope + cache write, decode attention and its
    /// combine, the streaming matmuls (bf16 and quantized) and `quantize_x`. Every other
    /// kernel keeps the plain launch.
    pub waits: bool,
}

impl KernelInfo {
    /// Kernel `op` of unit (`src`, `part`) at `entry`, for both storage types, plainly
    /// launched.
    pub(super) const fn new(op: &'static str, src: Source, part: Part, entry: Entry) -> Self {
        KernelInfo {
            op,
            unit: Unit { src, part },
            entry,
            bf16_only: false,
            waits: false,
        }
    }

    /// The kernel of a source that is not split ([`Part::Whole`]).
    pub(super) const fn whole(op: &'static str, src: Source, entry: Entry) -> Self {
        Self::new(op, src, Part::Whole, entry)
    }

    /// For bf16 storage only.
    pub(super) const fn bf16(mut self) -> Self {
        self.bf16_only = true;
        self
    }

    /// Waits for its predecessor ([`KernelInfo::waits`]).
    pub(super) const fn pdl(mut self) -> Self {
        self.waits = true;
        self
    }
}

/// An entry point's name: `{stem}[_{q}[_q6k]]_{dtype}{tail}`, or `stem` alone for a kernel
/// built once for both storage types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    stem: &'static str,
    q: Option<QType>,
    /// `_q6k` after the type (the mixed kernels' last part).
    mix: bool,
    /// The storage type's suffix follows.
    typed: bool,
    tail: Tail,
}

/// What follows the storage type in an entry point's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    None,
    /// `_m{rows}`, with `w` for the wide tile.
    Rows(u32, bool),
    /// `_s{slots}`.
    Slots(u32),
    /// `_d{head}_{kind}`, then the pass size if any (`_d128_q4`, `_d128_tc`, `_d64_dec2`).
    Head(AttnHead, &'static str, Option<u32>),
}

impl Entry {
    /// `{stem}_{dtype}`.
    pub(super) const fn typed(stem: &'static str) -> Entry {
        Entry {
            stem,
            q: None,
            mix: false,
            typed: true,
            tail: Tail::None,
        }
    }

    /// `stem`, one entry point for both storage types.
    pub(super) const fn untyped(stem: &'static str) -> Entry {
        Entry {
            typed: false,
            ..Entry::typed(stem)
        }
    }

    /// `{stem}_{q}_{dtype}`.
    pub(super) const fn q(stem: &'static str, q: QType) -> Entry {
        Entry {
            q: Some(q),
            ..Entry::typed(stem)
        }
    }

    /// `{stem}_{q}_q6k_{dtype}`.
    pub(super) const fn mix(stem: &'static str, q: QType) -> Entry {
        Entry {
            mix: true,
            ..Entry::q(stem, q)
        }
    }

    /// Followed by `_m{rows}`.
    pub(super) const fn rows(self, rows: u32) -> Entry {
        self.tile(rows, false)
    }

    /// Followed by `_m{rows}`, and `w` where `wide`.
    pub(super) const fn tile(mut self, rows: u32, wide: bool) -> Entry {
        self.tail = Tail::Rows(rows, wide);
        self
    }

    /// Followed by `_s{slots}`.
    pub(super) const fn slots(mut self, slots: u32) -> Entry {
        self.tail = Tail::Slots(slots);
        self
    }

    /// Followed by `_d{head}_{kind}` and the pass size `qv`, if any.
    pub(super) const fn head(
        mut self,
        head: AttnHead,
        kind: &'static str,
        qv: Option<u32>,
    ) -> Entry {
        self.tail = Tail::Head(head, kind, qv);
        self
    }

    /// The name for storage type `dt`.
    pub fn name(self, dt: DType) -> String {
        let mut s = self.stem.to_string();
        if let Some(q) = self.q {
            s.push('_');
            s.push_str(q.tag());
            if self.mix {
                s.push_str("_q6k");
            }
        }
        if !self.typed {
            return s;
        }
        s.push('_');
        s.push_str(dt.suffix());
        match self.tail {
            Tail::None => {}
            Tail::Rows(rows, wide) => {
                s.push_str(&format!("_m{rows}{}", if wide { "w" } else { "" }))
            }
            Tail::Slots(slots) => s.push_str(&format!("_s{slots}")),
            Tail::Head(h, kind, qv) => {
                s.push_str(&format!("_d{}_{kind}", h.tag()));
                if let Some(qv) = qv {
                    s.push_str(&qv.to_string());
                }
            }
        }
        s
    }
}

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
        Kernel::push_matmuls(&mut v);
        Kernel::push_attention(&mut v);
        v
    }

    /// The float-weight and quantized matmuls (and the quantized MoE experts), in load order.
    fn push_matmuls(v: &mut Vec<Kernel>) {
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
    }

    /// The attention kernels of every head size, in load order.
    fn push_attention(v: &mut Vec<Kernel>) {
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
    }
}
