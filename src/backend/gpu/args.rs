//! Typed kernel arguments: one struct per kernel signature, fields named and ordered as the
//! kernel's parameters in `kernels/*.cu`, so a call site names every argument. Each struct
//! turns into the positional [`Arg`] list the launch passes, and says which kernels take
//! it; [`GpuBackend::launch_with`](super::GpuBackend) refuses any other kernel. A unit test
//! parses every entry point's parameter list from the kernel source text and checks it
//! against the struct (names, order, pointer or scalar, scalar width).

use super::device::Arg;
use super::kernels::Kernel;

/// How a kernel parameter is passed: a device address or a scalar of a given width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    Ptr,
    I32,
    U64,
    F32,
}

/// The arguments of one kernel signature.
pub trait KernelArgs {
    /// Parameter names and kinds, in the kernel's order.
    const PARAMS: &'static [(&'static str, ArgKind)];
    /// The positional list the launch passes.
    type List: AsRef<[Arg]>;
    /// The arguments in the kernel's parameter order.
    fn args(&self) -> Self::List;
    /// Whether kernel `k` has this signature.
    fn takes(k: Kernel) -> bool;
}

macro_rules! arg_ty {
    (ptr) => {
        u64
    };
    (i32) => {
        i32
    };
    (u64) => {
        u64
    };
    (f32) => {
        f32
    };
}

macro_rules! arg_kind {
    (ptr) => {
        ArgKind::Ptr
    };
    (i32) => {
        ArgKind::I32
    };
    (u64) => {
        ArgKind::U64
    };
    (f32) => {
        ArgKind::F32
    };
}

macro_rules! arg_val {
    (ptr, $v:expr) => {
        Arg::Ptr($v)
    };
    (i32, $v:expr) => {
        Arg::I32($v)
    };
    (u64, $v:expr) => {
        Arg::U64($v)
    };
    (f32, $v:expr) => {
        Arg::F32($v)
    };
}

/// `Name (kernel pattern) { param: kind, ... }` with kind `ptr` (device address), `i32`,
/// `u64` or `f32`: the struct, its [`KernelArgs`] impl, and [`params`] over all of them.
macro_rules! kernel_args {
    ($($(#[$doc:meta])* $name:ident ($kernels:pat) { $($field:ident: $kind:ident),* $(,)? })*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy, Default)]
            pub struct $name {
                $(pub $field: arg_ty!($kind),)*
            }

            impl KernelArgs for $name {
                const PARAMS: &'static [(&'static str, ArgKind)] =
                    &[$((stringify!($field), arg_kind!($kind))),*];
                type List = [Arg; [$(stringify!($field)),*].len()];
                fn args(&self) -> Self::List {
                    [$(arg_val!($kind, self.$field)),*]
                }
                fn takes(k: Kernel) -> bool {
                    matches!(k, $kernels)
                }
            }
        )*

        /// The parameters of kernel `k` (`None` only for a kernel no struct takes, which the
        /// unit test refuses).
        #[cfg_attr(not(test), allow(dead_code))]
        pub fn params(k: Kernel) -> Option<&'static [(&'static str, ArgKind)]> {
            $(
                if <$name as KernelArgs>::takes(k) {
                    return Some(<$name as KernelArgs>::PARAMS);
                }
            )*
            None
        }

        /// How many argument structs take kernel `k` (exactly one for every kernel).
        #[cfg(test)]
        pub fn takers(k: Kernel) -> usize {
            0 $(+ <$name as KernelArgs>::takes(k) as usize)*
        }
    };
}

kernel_args! {
    /// `embed_<dt>`: rows `id - first` of a table of `rows` rows by token id (zero rows for
    /// ids outside them: another shard's part of the vocabulary).
    EmbedArgs (Kernel::Embed) { table: ptr, ids: ptr, out: ptr, cols: i32, first: i32, rows: i32 }
    /// `gather_rows_<dt>`: the rows of `x` listed in `rows`.
    GatherRowsArgs (Kernel::GatherRows) { x: ptr, rows: ptr, out: ptr, cols: i32 }
    /// `rms_norm_<dt>`.
    RmsNormArgs (Kernel::RmsNorm) { x: ptr, w: ptr, out: ptr, h: i32, eps: f32 }
    /// `rms_norm_vec_<dt>`: also `out` as 8-bit blocks of 32 at `xq` when non-zero.
    RmsNormVecArgs (Kernel::RmsNormVec) { x: ptr, w: ptr, out: ptr, xq: ptr, h: i32, eps: f32 }
    /// `add_rms_norm_<dt>`: `residual += x`, then its norm.
    AddRmsNormArgs (Kernel::AddRmsNorm) {
        x: ptr, residual: ptr, w: ptr, out: ptr, h: i32, eps: f32,
    }
    /// `add_rms_norm_vec_<dt>`: [`AddRmsNormArgs`] and [`RmsNormVecArgs`]'s `xq`.
    AddRmsNormVecArgs (Kernel::AddRmsNormVec) {
        x: ptr, residual: ptr, w: ptr, out: ptr, xq: ptr, h: i32, eps: f32,
    }
    /// `rope_<dt>`: rotary embedding of the first `heads` heads of each row, in place.
    RopeArgs (Kernel::Rope) {
        qkv: ptr, stride: i32, positions: ptr, inv_freq: ptr, head_dim: i32, rot_dim: i32,
        interleaved: i32, mscale: f32, heads: i32,
    }
    /// `rope_kv_<dt>`: rope, then the k/v heads written to the paged cache.
    RopeKvArgs (Kernel::RopeKv) {
        qkv: ptr, stride: i32, positions: ptr, inv_freq: ptr, head_dim: i32, rot_dim: i32,
        interleaved: i32, mscale: f32, n_heads: i32, n_kv: i32, slots: ptr, k_cache: ptr, v_cache: ptr,
    }
    /// `rope_kv_norm_<dt>`: the q/k head norms (weights `qw`, `kw`), rope, then the k/v heads
    /// written to the paged cache.
    RopeKvNormArgs (Kernel::RopeKvNorm) {
        qkv: ptr, stride: i32, positions: ptr, inv_freq: ptr, head_dim: i32, rot_dim: i32,
        interleaved: i32, mscale: f32, n_heads: i32, n_kv: i32, slots: ptr, k_cache: ptr, v_cache: ptr,
        qw: ptr, kw: ptr, eps: f32,
    }
    /// `write_kv_<dt>`: the k/v heads of each row to their cache slot.
    WriteKvArgs (Kernel::WriteKv) {
        qkv: ptr, stride: i32, q_dim: i32, width: i32, slots: ptr, k_cache: ptr, v_cache: ptr,
    }
    /// `silu_mul_<dt>`: `out = silu(gate) * up` over `total` outputs.
    SiluMulArgs (Kernel::SiluMul) { gu: ptr, out: ptr, f: i32, total: u64 }
    /// `silu_mul_vec_<dt>`: the same over `n` rows of whole 16-byte chunks.
    SiluMulVecArgs (Kernel::SiluMulVec) { gu: ptr, out: ptr, f: i32, n: i32 }
    /// `add_bias_<dt>`: `x[i] += bias[i % cols]` over `total` elements.
    AddBiasArgs (Kernel::AddBias) { x: ptr, bias: ptr, cols: i32, total: u64 }
    /// The paged attention variants of prefill (`attn_<dt>_d<D>_q<QV>`, `_tc`); `sinks`
    /// (null: none) one compute-type logit per query head in each row's denominator.
    AttnArgs (Kernel::Attention { .. } | Kernel::AttentionTc { .. }) {
        qkv: ptr, qkv_stride: i32, k_cache: ptr, v_cache: ptr, out: ptr, part_acc: ptr,
        part_ml: ptr, positions: ptr, seqinfo: ptr, tables: ptr, items: ptr, n_heads: i32,
        n_kv: i32, head_dim: i32, block_size: i32, scale: f32, window: i32, softcap: f32,
        sinks: ptr,
    }
    /// The decode variant (`attn_<dt>_d<D>_dec<QV>`): [`AttnArgs`], then with `counters`
    /// (non-null) the split-K merge folded in: `splits`, each part's split row
    /// (`part_split`), one zeroed counter per split row and KV head, and `xq`/`rows` as
    /// [`AttnCombineArgs`] has them.
    AttnDecArgs (Kernel::AttentionDecode { .. }) {
        qkv: ptr, qkv_stride: i32, k_cache: ptr, v_cache: ptr, out: ptr, part_acc: ptr,
        part_ml: ptr, positions: ptr, seqinfo: ptr, tables: ptr, items: ptr, n_heads: i32,
        n_kv: i32, head_dim: i32, block_size: i32, scale: f32, window: i32, softcap: f32,
        splits: ptr, part_split: ptr, counters: ptr, xq: ptr, rows: i32, sinks: ptr,
    }
    /// `attn_combine_<dt>`: merges split-K partials into the rows listed in `splits`; with `xq`
    /// (non-null) also writes them as 8-bit rows of `rows` rows (`quantize_x`'s layout).
    AttnCombineArgs (Kernel::AttnCombine) {
        part_acc: ptr, part_ml: ptr, splits: ptr, out: ptr, n_heads: i32, hd: i32, xq: ptr,
        rows: i32, sinks: ptr,
    }
    /// `gemv_<dt>_m<rows>`: `y = x @ w^T (+ bias)`, `k` inputs, `n` outputs.
    GemvArgs (Kernel::Gemv { .. }) { x: ptr, w: ptr, bias: ptr, y: ptr, k: i32, n: i32 }
    /// `gemv_silu_mul_<dt>_m<rows>`: the gate/up product and SiLU-mul, `f` outputs.
    GemvSiluMulArgs (Kernel::GemvSiluMul { .. }) { x: ptr, w: ptr, y: ptr, k: i32, f: i32 }
    /// `qgemv_<q>_<dt>_m<rows>`: `y[:, ..n] = x @ w^T (+ bias)` for `rows` rows of `x`, `y`'s row
    /// stride `ldy` (a part writes its columns of a stacked weight's output).
    QgemvArgs (Kernel::Qgemv { .. }) {
        w: ptr, x: ptr, bias: ptr, y: ptr, k: i32, n: i32, rows: i32, ldy: i32,
    }
    /// `qgemv_silu_<q>_<dt>_m<rows>`: gate part `wg`, up part `wu` (`f` rows each), SiLU-mul.
    QgemvSiluArgs (Kernel::QgemvSilu { .. }) {
        wg: ptr, wu: ptr, x: ptr, y: ptr, k: i32, f: i32, rows: i32, ldy: i32,
    }
    /// `dequant_<q>_<dt>`: rows `ids[i] - first` (all rows when `ids` is 0) of a part of `n`
    /// rows; an id outside `first..first + n` gives a zero row.
    DequantArgs (Kernel::Dequant { .. }) {
        w: ptr, ids: ptr, out: ptr, k: i32, n: i32, ldo: i32, first: i32,
    }
    /// `qmma_<q>_bf16_m<rows>`: `y[:, ..n] = x @ [w0; w1; w2]^T (+ bias)`, n = r0 + r1 + r2
    /// (absent parts have 0 rows), for `rows` rows of `x` in blocks of the kernel's row tile
    /// (`y`'s row stride `ldy`, as [`QgemvArgs`]); with k split over grid z, f32 partials
    /// `[z][rows][n]` to `ws` instead (summed by `qmma_reduce_bf16`).
    /// `qmmamix_<q>_q6k_*` (QmmaMix): part 2 is Q6_K. `qmma8_*`, `qmma8mix_*` (Qmma8,
    /// Qmma8Mix): `x` is the 8-bit rows of `quantize_x_bf16` (`rows` rows of `k`).
    QmmaArgs (Kernel::Qmma { .. } | Kernel::QmmaMix { .. } | Kernel::Qmma8 { .. } | Kernel::Qmma8Mix { .. }) {
        w0: ptr, w1: ptr, w2: ptr, x: ptr, bias: ptr, y: ptr, ws: ptr, k: i32, r0: i32, r1: i32,
        r2: i32, rows: i32, ldy: i32,
    }
    /// `qmma_reduce_bf16`: `y[r, j] = sum_z ws[z][r][j] (+ bias[j])`, `n` columns, stride `ldy`.
    QmmaReduceArgs (Kernel::QmmaReduce) {
        ws: ptr, bias: ptr, y: ptr, n: i32, rows: i32, ldy: i32, splits: i32,
    }
    /// `qmmaglu_<q>_bf16_m<rows>[w]`: `y[:, ..f] = silu(x @ wg^T) * (x @ wu^T)` (gate part
    /// `wg`, up part `wu`, `f` rows each; `y`'s row stride `ldy`); with k split over grid z,
    /// f32 partials `[z][rows][2f]` (gate, then up) to `ws`, finished by
    /// `qmma_reduce_glu_bf16`.
    QmmaGluArgs (Kernel::QmmaGlu { .. }) {
        wg: ptr, wu: ptr, x: ptr, y: ptr, ws: ptr, k: i32, f: i32, rows: i32, ldy: i32,
    }
    /// `qmma_reduce_glu_bf16`: `y[r, j] = silu(sum_z ws[z][r][j]) * sum_z ws[z][r][f + j]`.
    QmmaReduceGluArgs (Kernel::QmmaReduceGlu) {
        ws: ptr, y: ptr, f: i32, rows: i32, ldy: i32, splits: i32,
    }
    /// `qmma_reduce_add_norm_bf16`: `residual[r] += bf16(sum_z ws[z][r])`, then
    /// `out[r] = rmsnorm(residual[r]) * w` over `h` columns, one block per row.
    QmmaReduceAddNormArgs (Kernel::QmmaReduceAddNorm) {
        ws: ptr, residual: ptr, w: ptr, out: ptr, h: i32, rows: i32, splits: i32, eps: f32,
    }
    /// `qmma_reduce_rope_bf16`: the reduce of a whole qkv launch, then rope_kv's rope and
    /// cache write (`rope.rs`).
    QmmaReduceRopeArgs (Kernel::QmmaReduceRope) {
        ws: ptr, bias: ptr, y: ptr, n: i32, rows: i32, ldy: i32, splits: i32,
        positions: ptr, inv_freq: ptr, slots: ptr, k_cache: ptr, v_cache: ptr,
        q_dim: i32, kv_dim: i32, head_dim: i32, rot_dim: i32, interleaved: i32, mscale: f32,
    }
    /// `quantize_x_bf16`: `rows` rows of `x` (`k` columns) to 8-bit blocks of 32 at `xq`
    /// (i8 values, then the (scale, sum) pairs; `kernels/qgemv.cu`).
    QuantizeXArgs (Kernel::QuantizeX) { x: ptr, xq: ptr, k: i32, rows: i32 }
    /// `qdot_<q>_bf16_m<rows>`: `y[:, ..r0 + r1 + r2] = x @ [w0; w1; w2]^T (+ bias)` from the
    /// 8-bit activations at `xq` (parts of `r0`, `r1`, `r2` rows; absent parts have 0).
    /// `qdotmix_<q>_q6k_*` (QdotMix): part 2 is Q6_K. With `inv_freq` non-null, a qkv
    /// launch that ropes its q and k pairs and writes k and v to the cache (`QkvRope`;
    /// `cbase`: the qkv column of `y`'s first).
    QdotArgs (Kernel::Qdot { .. } | Kernel::QdotMix { .. }) {
        xq: ptr, w0: ptr, w1: ptr, w2: ptr, bias: ptr, y: ptr, k: i32, r0: i32, r1: i32, r2: i32,
        rows: i32, ldy: i32, positions: ptr, inv_freq: ptr, slots: ptr, k_cache: ptr,
        v_cache: ptr, cbase: i32, q_dim: i32, kv_dim: i32, head_dim: i32, rot_dim: i32,
        mscale: f32,
    }
    /// `qdot_in_<q>_bf16_m1`, `qdotmix_in_<q>_q6k_bf16_m1`: [`QdotArgs`] where `xq` holds a
    /// residual norm's input left by `qdot_norm_*` ([`NormIn`](super::ops::matmul::NormIn):
    /// partial sums `nss`, residual `nres`, weight `nw`, output `nout`, `neps`).
    QdotInArgs (Kernel::QdotIn { .. } | Kernel::QdotMixIn { .. }) {
        xq: ptr, w0: ptr, w1: ptr, w2: ptr, bias: ptr, y: ptr, k: i32, r0: i32, r1: i32, r2: i32,
        rows: i32, ldy: i32, positions: ptr, inv_freq: ptr, slots: ptr, k_cache: ptr,
        v_cache: ptr, cbase: i32, q_dim: i32, kv_dim: i32, head_dim: i32, rot_dim: i32,
        mscale: f32, nss: ptr, nres: ptr, nw: ptr, nout: ptr, neps: f32,
    }
    /// `qdot_norm_<q>_bf16_m1`: one row of `x` (8-bit at `xq`, `k` columns) times `w` (`h`
    /// rows) added into `res`; then per 32 columns, `res * nw` as 8-bit rows at `oxq` and
    /// the sum of `res^2` at `oss` (the norm the next matmul finishes: `NormIn`).
    QdotNormArgs (Kernel::QdotNorm { .. }) {
        xq: ptr, w: ptr, k: i32, h: i32, rows: i32, res: ptr, nw: ptr, oxq: ptr, oss: ptr,
    }
    /// `qdot_silu_<q>_bf16_m<rows>`: [`QgemvSiluArgs`] from the 8-bit activations at `xq`.
    QdotSiluArgs (Kernel::QdotSilu { .. }) {
        xq: ptr, wg: ptr, wu: ptr, y: ptr, k: i32, f: i32, rows: i32, ldy: i32,
    }
    /// `qdot_silu_in_<q>_bf16_m1`: [`QdotSiluArgs`] with a norm to finish, as [`QdotInArgs`].
    QdotSiluInArgs (Kernel::QdotSiluIn { .. }) {
        xq: ptr, wg: ptr, wu: ptr, y: ptr, k: i32, f: i32, rows: i32, ldy: i32, nss: ptr,
        nres: ptr, nw: ptr, nout: ptr, neps: f32,
    }
    /// `convert_f16_<dt>`, `convert_bf16_<dt>`: `total` elements to the compute type.
    ConvertArgs (Kernel::Convert { .. }) { src: ptr, dst: ptr, total: u64 }
    /// `sample_prep_<dt>`: logits copied to f32 `work` and each row's log-sum-exp.
    SamplePrepArgs (Kernel::SamplePrep) { logits: ptr, v: i32, work: ptr, lse: ptr }
    /// `sample_topn`: each row's top-N log-probabilities on the raw values.
    SampleTopNArgs (Kernel::SampleTopN) {
        work: ptr, lse: ptr, params: ptr, v: i32, rows: i32, out: ptr,
    }
    /// `sample_penalty`: `n` (row, token, bias/penalty) entries applied to `work`.
    SamplePenaltyArgs (Kernel::SamplePenalty) { entries: ptr, n: i32, work: ptr, v: i32 }
    /// `sample_mask`: tokens outside each constrained row's bitmask (`w` words) set to -inf.
    SampleMaskArgs (Kernel::SampleMask) { rows: ptr, masks: ptr, w: i32, work: ptr, v: i32 }
    /// `sample_pick_<dt>`: the token of each row (greedy or drawn) and its logprob.
    SamplePickArgs (Kernel::SamplePick) {
        logits: ptr, work: ptr, lse: ptr, params: ptr, v: i32, out: ptr,
    }
    /// `sample_greedy_<dt>`: argmax and log-sum-exp in one pass over the raw logits.
    SampleGreedyArgs (Kernel::SampleGreedy) { logits: ptr, v: i32, out: ptr, part: ptr, counts: ptr }
    /// `head_rms_norm_<dt>`: q heads (weight `qw`) and k heads (`kw`) normalized in place.
    HeadRmsNormArgs (Kernel::HeadRmsNorm) {
        qkv: ptr, stride: i32, qw: ptr, kw: ptr, n_heads: i32, head_dim: i32, eps: f32,
    }
    /// `gelu_tanh_mul_<dt>`: `out = gelu_tanh(gate) * up` over `total` outputs.
    GeluTanhMulArgs (Kernel::GeluTanhMul) { gu: ptr, out: ptr, f: i32, total: u64 }
    /// `scale_rows_<dt>`: `x *= s` over `total` elements.
    ScaleRowsArgs (Kernel::ScaleRows) { x: ptr, s: f32, total: u64 }
    /// `softcap_<dt>`: `x = cap * tanh(x / cap)` over `total` elements.
    SoftcapArgs (Kernel::Softcap) { x: ptr, cap: f32, total: u64 }
    /// `moe_route_<dt>`: top-k expert ids and weights of each of `n` rows.
    MoeRouteArgs (Kernel::MoeRoute) {
        logits: ptr, n: i32, ne: i32, k: i32, norm: i32, ids: ptr, wts: ptr,
    }
    /// `moe_align`: assignments sorted by expert and padded to tiles (one block).
    MoeAlignArgs (Kernel::MoeAlign) {
        ids: ptr, total: i32, ne: i32, sorted: ptr, tile_expert: ptr, inv: ptr, max_tiles: i32,
        estart: ptr,
    }
    /// `moe_prep_<dt>`: [`MoeRouteArgs`] then [`MoeAlignArgs`] in one block (ids in shared
    /// memory), and with `xq` (bf16) the 8-bit rows of the `n` rows of `x` (`h` columns).
    MoePrepArgs (Kernel::MoePrep) {
        logits: ptr, x: ptr, n: i32, ne: i32, k: i32, norm: i32, h: i32, wts: ptr, sorted: ptr,
        tile_expert: ptr, inv: ptr, max_tiles: i32, estart: ptr, xq: ptr,
    }
    /// `moe_gate_up_<dt>`: `act[slot] = silu(Wg_e x) * (Wu_e x)` per tile of one expert; with
    /// `bg`/`bu` (non-null) the experts' biases first, with `limit > 0` gpt-oss's clamped
    /// SwiGLU (`alpha`, `limit`) instead of SiLU (every gate/up kernel below alike).
    MoeGateUpArgs (Kernel::MoeGateUp) {
        x: ptr, wg: ptr, wu: ptr, sorted: ptr, tile_expert: ptr, k: i32, h: i32, f: i32,
        cols: i32, act: ptr, bg: ptr, bu: ptr, alpha: f32, limit: f32,
    }
    /// `moe_down_<dt>`: `y[slot] = Wd_e act[slot]` per tile of one expert.
    MoeDownArgs (Kernel::MoeDown) {
        act: ptr, wd: ptr, sorted: ptr, tile_expert: ptr, f: i32, h: i32, cols: i32, y: ptr,
    }
    /// `moe_combine_<dt>`: `out[t] = sum_j w[t, j] * y[inv[t, j]]` over `total` outputs; with
    /// `bd` (non-null) each slot's expert's (`tile_expert`) down bias added to its `y` first.
    MoeCombineArgs (Kernel::MoeCombine) {
        y: ptr, inv: ptr, wts: ptr, k: i32, h: i32, total: u64, out: ptr, tile_expert: ptr,
        bd: ptr,
    }
    /// `moe_combine_norm_<dt>`: [`MoeCombineArgs`]'s sums of each of the grid's rows added to
    /// `residual`, then `out = rms_norm(residual) * w`, and with `xq` (bf16) out's 8-bit rows.
    MoeCombineNormArgs (Kernel::MoeCombineNorm) {
        y: ptr, inv: ptr, wts: ptr, k: i32, h: i32, residual: ptr, w: ptr, out: ptr, xq: ptr,
        eps: f32, tile_expert: ptr, bd: ptr,
    }
    /// `moe_gate_up_<q>_<dt>`: [`MoeGateUpArgs`] over quantized experts (`n_rows` = E * f).
    MoeQGateUpArgs (Kernel::MoeQGateUp { .. }) {
        x: ptr, wg: ptr, wu: ptr, sorted: ptr, tile_expert: ptr, k: i32, h: i32, f: i32,
        n_rows: i32, cols: i32, act: ptr, bg: ptr, bu: ptr, alpha: f32, limit: f32,
    }
    /// `moe_down_<q>_<dt>`: [`MoeDownArgs`] over quantized experts (`n_rows` = E * h).
    MoeQDownArgs (Kernel::MoeQDown { .. }) {
        act: ptr, wd: ptr, sorted: ptr, tile_expert: ptr, f: i32, h: i32, n_rows: i32, cols: i32,
        y: ptr,
    }
    /// `moe8_gate_up_<q>_bf16`: [`MoeQGateUpArgs`] on the 8-bit rows `xq` of x (`xrows`
    /// rows), one column per group of `lanes` lanes.
    MoeQ8GateUpArgs (Kernel::MoeQ8GateUp { .. }) {
        xq: ptr, xrows: i32, wg: ptr, wu: ptr, sorted: ptr, tile_expert: ptr, k: i32, h: i32,
        f: i32, n_rows: i32, lanes: i32, act: ptr, bg: ptr, bu: ptr, alpha: f32, limit: f32,
    }
    /// `moe8_down_<q>_bf16`: [`MoeQDownArgs`] on the 8-bit rows `xq` of the activations
    /// (`xrows` slots).
    MoeQ8DownArgs (Kernel::MoeQ8Down { .. }) {
        xq: ptr, xrows: i32, wd: ptr, sorted: ptr, tile_expert: ptr, f: i32, h: i32, n_rows: i32,
        lanes: i32, y: ptr,
    }
    /// `moe8_down_self_<q>_bf16`: [`MoeQ8DownArgs`] at one slot a tile, each block quantizing
    /// its slot's row of `act` itself.
    MoeQ8DownSelfArgs (Kernel::MoeQ8DownSelf { .. }) {
        act: ptr, wd: ptr, sorted: ptr, tile_expert: ptr, f: i32, h: i32, n_rows: i32, lanes: i32,
        y: ptr,
    }
    /// `moemma_gate_up_<q>_bf16`: [`MoeQGateUpArgs`] on tensor cores, 64 slots of one expert
    /// per block (`estart`: each expert's first slot).
    MoeMmaGateUpArgs (Kernel::MoeMmaGateUp { .. }) {
        x: ptr, wg: ptr, wu: ptr, sorted: ptr, tile_expert: ptr, estart: ptr, k: i32, h: i32,
        f: i32, n_rows: i32, act: ptr, bg: ptr, bu: ptr, alpha: f32, limit: f32,
    }
    /// `moemma_down_<q>_bf16`: [`MoeQDownArgs`] on tensor cores.
    MoeMmaDownArgs (Kernel::MoeMmaDown { .. }) {
        act: ptr, wd: ptr, sorted: ptr, tile_expert: ptr, estart: ptr, f: i32, h: i32,
        n_rows: i32, y: ptr,
    }
    /// `moe_shared_add_<dt>`: `out[t] += sigmoid(x[t] . g) * ys[t]` over `n` rows of `h`.
    MoeSharedAddArgs (Kernel::MoeSharedAdd) { x: ptr, g: ptr, ys: ptr, h: i32, n: i32, out: ptr }
}

#[cfg(test)]
mod tests;
