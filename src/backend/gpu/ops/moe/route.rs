//! Which kernels a mixture-of-experts FFN takes, as a value ([`MoePath`]): a pure function
//! of the storage type, the step's rows, the experts' shape and their types.

use super::geometry::{MMA_BK, MMA_MIN_ROWS, PREP_MAX, PREP_ROWS, SELF_MAX, moe8_slots};
use crate::backend::gpu::qtype::QType;
use crate::backend::{DType, MoeShape};

/// The kernels of one grouped matmul (gate/up, or down) over the sorted assignments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::backend::gpu) enum MoeStage {
    /// Compute-type experts (`moe_gate_up`, `moe_down`).
    Dense,
    /// Quantized experts on compute-type activations (`moe_q*`: f32, or rows that are not
    /// whole blocks of 32).
    Quant(QType),
    /// Quantized experts on 8-bit activations, the dp4a tiles of `moe_quant.cu` (`moe8_*`) at
    /// slot bucket `slots`: gate/up reads x's 8-bit rows, down quantizes the activations first.
    Q8 { q: QType, slots: u32 },
    /// Down at one slot a tile: each block quantizes its slot's activations itself
    /// (`moe8_down_self_*`).
    Q8Self(QType),
    /// Many rows per expert (prefill): tensor cores over 64 slots of one expert (`moemma_*`).
    Mma(QType),
}

/// The route of one MoE FFN step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::backend::gpu) struct MoePath {
    /// Decode sizes: route, align and x's 8-bit rows in one launch (`moe_prep`), else
    /// `moe_route` then `moe_align` (and `quantize_x` for [`MoeStage::Q8`] gate/up).
    pub prep: bool,
    pub gate_up: MoeStage,
    pub down: MoeStage,
}

impl MoePath {
    /// The gate/up tiles read 8-bit rows of x (which `moe_prep` then also writes).
    pub fn x8(&self) -> bool {
        matches!(self.gate_up, MoeStage::Q8 { .. })
    }
}

/// The route of `n` rows through experts of shape `s` over `h` hidden columns, gate/up of
/// type `gu_q` and down of type `down_q` (`None`: the compute type), in storage type `dt`.
pub(in crate::backend::gpu) fn moe_path(
    dt: DType,
    n: usize,
    s: &MoeShape,
    h: usize,
    gu_q: Option<QType>,
    down_q: Option<QType>,
) -> MoePath {
    let (ne, f, k) = (s.n_expert, s.expert_ff, s.top_k);
    let total = n * k;
    let bf16 = dt == DType::Bf16;
    // bf16 with quantized experts: dp4a on 8-bit activations (whole blocks of 32).
    let q8 = |cols: usize| bf16 && cols.is_multiple_of(32);
    // Many rows per expert (prefill): tensor cores over 64 slots of one expert.
    let many = total >= MMA_MIN_ROWS * ne;
    // (MXFP4's tiles take a partial last k-tile: whole blocks of 32.)
    let step = |q: QType| if q == QType::Mxfp4 { 32 } else { MMA_BK };
    let mma = |q: QType, cols: usize| many && bf16 && cols.is_multiple_of(step(q));
    let slots = moe8_slots(n);
    let gate_up = match gu_q {
        Some(q) if mma(q, h) => MoeStage::Mma(q),
        Some(q) if q8(h) => MoeStage::Q8 { q, slots },
        None => MoeStage::Dense,
        Some(q) => MoeStage::Quant(q),
    };
    let down = match down_q {
        Some(q) if mma(q, f) => MoeStage::Mma(q),
        Some(q) if q8(f) && slots == 1 && f <= SELF_MAX => MoeStage::Q8Self(q),
        Some(q) if q8(f) => MoeStage::Q8 { q, slots },
        None => MoeStage::Dense,
        Some(q) => MoeStage::Quant(q),
    };
    MoePath {
        prep: total <= PREP_MAX && n <= PREP_ROWS,
        gate_up,
        down,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_moe_routes_by_rows_types_and_dtype() {
        // Qwen3-30B-A3B shape: 128 experts, top 8, 768 expert columns, 2048 hidden.
        let s = MoeShape {
            n_expert: 128,
            top_k: 8,
            expert_ff: 768,
            norm_topk: true,
            shared_ff: 0,
            act: crate::backend::MoeAct::Silu,
        };
        let h = 2048;
        let (q4k, q6k) = (Some(QType::Q4K), Some(QType::Q6K));
        let table = [
            // (dtype, rows, gate/up type, down type, prep, gate/up, down)
            (
                DType::Bf16,
                1,
                q4k,
                q6k,
                true,
                MoeStage::Q8 {
                    q: QType::Q4K,
                    slots: 1,
                },
                MoeStage::Q8Self(QType::Q6K),
            ),
            (
                DType::Bf16,
                8,
                q4k,
                q6k,
                true,
                MoeStage::Q8 {
                    q: QType::Q4K,
                    slots: 4,
                },
                MoeStage::Q8 {
                    q: QType::Q6K,
                    slots: 4,
                },
            ),
            (
                DType::Bf16,
                64,
                q4k,
                q6k,
                false,
                MoeStage::Q8 {
                    q: QType::Q4K,
                    slots: 4,
                },
                MoeStage::Q8 {
                    q: QType::Q6K,
                    slots: 4,
                },
            ),
            (
                DType::Bf16,
                300,
                q4k,
                q6k,
                false,
                MoeStage::Mma(QType::Q4K),
                MoeStage::Mma(QType::Q6K),
            ),
            (
                DType::F32,
                1,
                q4k,
                q6k,
                true,
                MoeStage::Quant(QType::Q4K),
                MoeStage::Quant(QType::Q6K),
            ),
            (
                DType::Bf16,
                300,
                None,
                None,
                false,
                MoeStage::Dense,
                MoeStage::Dense,
            ),
        ];
        for (dt, n, gq, dq, prep, gate_up, down) in table {
            let p = moe_path(dt, n, &s, h, gq, dq);
            println!("{dt:?} rows {n:3} {gq:?}/{dq:?}: {p:?}");
            assert_eq!(
                p,
                MoePath {
                    prep,
                    gate_up,
                    down
                },
                "{dt:?} {n}"
            );
            assert_eq!(p.x8(), matches!(gate_up, MoeStage::Q8 { .. }));
        }
        // Between 64 and 256 rows (2048 assignments = 16 a expert) the dp4a tiles take all 8
        // slots in one pass.
        let p = moe_path(DType::Bf16, 128, &s, h, q4k, q6k);
        assert_eq!(
            p.gate_up,
            MoeStage::Q8 {
                q: QType::Q4K,
                slots: 8
            }
        );
    }
}
