//! The matmul family's kernels' facts ([`Kernel::info`]): the float-weight streaming
//! matmuls (`gemv.cu`), bias and SiLU-mul (`activation.cu`), the quantized streaming and
//! 8-bit activation decode matmuls with dequantization and conversion (`qgemv.cu`), and the
//! tiled tensor-core matmuls of batches with their split-K reduces (`qmma.cu`).

use crate::backend::gpu::kernels::{Entry, Kernel, KernelInfo};
use crate::backend::gpu::qtype::QType;
use crate::backend::gpu::registry::{Part, Source};

/// The facts of `k` if it is one of this family's kernels.
pub(crate) fn info(k: Kernel) -> Option<KernelInfo> {
    gemv(k)
        .or_else(|| qgemv(k))
        .or_else(|| qdot(k))
        .or_else(|| qmma(k))
}

/// `gemv.cu` and `activation.cu`.
fn gemv(k: Kernel) -> Option<KernelInfo> {
    let act = |op, entry| KernelInfo::whole(op, Source::Activation, Entry::typed(entry));
    Some(match k {
        Kernel::Gemv { rows } => {
            KernelInfo::whole("matmul", Source::Gemv, Entry::typed("gemv").rows(rows)).pdl()
        }
        Kernel::GemvSiluMul { rows } => KernelInfo::whole(
            "matmul_silu_mul",
            Source::Gemv,
            Entry::typed("gemv_silu_mul").rows(rows),
        )
        .pdl(),
        Kernel::SiluMul => act("silu_mul", "silu_mul"),
        Kernel::SiluMulVec => act("silu_mul", "silu_mul_vec"),
        Kernel::AddBias => act("add_bias", "add_bias"),
        _ => return None,
    })
}

/// `qgemv.cu`'s streaming matmuls on float activations, dequantization and conversion.
fn qgemv(k: Kernel) -> Option<KernelInfo> {
    let q = |op, part, entry| KernelInfo::new(op, Source::Qgemv, part, entry);
    Some(match k {
        Kernel::Qgemv { q: t, rows } => {
            q("matmul", Part::Stream(t), Entry::q("qgemv", t).rows(rows)).pdl()
        }
        Kernel::QgemvSilu { q: t, rows } => q(
            "matmul_silu_mul",
            Part::Stream(t),
            Entry::q("qgemv_silu", t).rows(rows),
        )
        .pdl(),
        Kernel::Dequant { q: t } => q("dequant", Part::Q(t), Entry::q("dequant", t)),
        Kernel::Convert { bf16 } => q(
            "convert",
            Part::Common,
            Entry::typed(if bf16 { "convert_bf16" } else { "convert_f16" }),
        ),
        _ => return None,
    })
}

/// `qgemv.cu`'s decode matmuls on 8-bit activations (bf16 only, every one of the decode
/// chain): one row in the type's part, 2-8 rows in parts of their own, the fused norms in
/// [`Part::Norm`].
fn qdot(k: Kernel) -> Option<KernelInfo> {
    let rows_part = |t, rows| {
        if rows > 1 {
            Part::Rows(t, rows)
        } else {
            Part::Q(t)
        }
    };
    let d = |op, part, entry| KernelInfo::new(op, Source::Qgemv, part, entry).bf16().pdl();
    Some(match k {
        Kernel::QuantizeX => d("quantize_x", Part::Common, Entry::typed("quantize_x")),
        Kernel::Qdot { q, rows } => d("matmul", rows_part(q, rows), Entry::q("qdot", q).rows(rows)),
        Kernel::QdotMix { q, rows } => d(
            "matmul",
            rows_part(q, rows),
            Entry::mix("qdotmix", q).rows(rows),
        ),
        Kernel::QdotSilu { q, rows } => d(
            "matmul_silu_mul",
            rows_part(q, rows),
            Entry::q("qdot_silu", q).rows(rows),
        ),
        Kernel::QdotNorm { q } => d(
            "matmul_add_rms_norm",
            Part::Norm(q),
            Entry::q("qdot_norm", q).rows(1),
        ),
        Kernel::QdotIn { q } => d("matmul", Part::Norm(q), Entry::q("qdot_in", q).rows(1)),
        Kernel::QdotMixIn { q } => d("matmul", Part::Norm(q), Entry::mix("qdotmix_in", q).rows(1)),
        Kernel::QdotSiluIn { q } => d(
            "matmul_silu_mul",
            Part::Norm(q),
            Entry::q("qdot_silu_in", q).rows(1),
        ),
        _ => return None,
    })
}

/// `qmma.cu`: the tiled tensor-core matmuls and their split-K reduces (bf16 only).
fn qmma(k: Kernel) -> Option<KernelInfo> {
    let t = |op, part, entry| KernelInfo::new(op, Source::Qmma, part, entry).bf16();
    let reduce = |op, entry| t(op, Part::Common, Entry::typed(entry));
    Some(match k {
        Kernel::Qmma { q, rows, wide } => {
            t("matmul", Part::Q(q), Entry::q("qmma", q).tile(rows, wide))
        }
        Kernel::QmmaMix { q, rows, wide } => t(
            "matmul",
            Part::Q(q),
            Entry::mix("qmmamix", q).tile(rows, wide),
        ),
        // Q8_0's batches take the 8-bit tiles by default: they are in its type's part.
        Kernel::Qmma8 {
            q: QType::Q8_0,
            rows,
        } => t(
            "matmul",
            Part::Q(QType::Q8_0),
            Entry::q("qmma8", QType::Q8_0).rows(rows),
        ),
        Kernel::Qmma8 { q, rows } => t("matmul", Part::Int8(q), Entry::q("qmma8", q).rows(rows)),
        Kernel::Qmma8Mix { q, rows } => t(
            "matmul",
            Part::Int8(q),
            Entry::mix("qmma8mix", q).rows(rows),
        ),
        Kernel::QmmaGlu { q, rows, wide } => t(
            "matmul_silu_mul",
            Part::Q(q),
            Entry::q("qmmaglu", q).tile(rows, wide),
        ),
        Kernel::QmmaReduce => reduce("matmul", "qmma_reduce"),
        Kernel::QmmaReduceRope => reduce("matmul", "qmma_reduce_rope"),
        Kernel::QmmaReduceGlu => reduce("matmul_silu_mul", "qmma_reduce_glu"),
        Kernel::QmmaReduceAddNorm => reduce("matmul_add_rms_norm", "qmma_reduce_add_norm"),
        _ => return None,
    })
}
