//! The GPU switches (`GpuTuning`) belong to one backend, not to the process: two backends
//! with different switches live side by side in one test and each launches the kernels its
//! own switches say.

/// Two bf16 CUDA backends open at once, one with the decode attention's folded split-K
/// merge and the one-row matmul's deferred residual norm (`attn_fuse`, `qdot_norm`), one
/// without; the same steps run on both, interleaved: the first merges inside the decode
/// attention (no `attn_combine` launch) and leaves its residual norm to the next matmul
/// (`matmul_add_rms_norm` alone), the second launches `attn_combine` and `matmul` then
/// `add_rms_norm`; their outputs agree.
#[cfg(feature = "cuda")]
#[test]
fn two_backends_with_different_switches_in_one_process() {
    use kiln::backend::cuda::{CudaBackend, DType};
    use kiln::backend::quant::GgmlType;
    use kiln::backend::{AttnShape, Backend, GpuTuning, HostTensor, KvShape};

    use crate::harness::*;

    let tuned = |on: bool| GpuTuning {
        attn_fuse: on,
        qdot_norm: on,
        ..env_tuning()
    };
    let Some(fused) = cuda_tuned(DType::Bf16, tuned(true)) else {
        return;
    };
    let unfused = cuda_tuned(DType::Bf16, tuned(false)).expect("a second backend opens");
    let mut bs = [fused, unfused];
    let mut rng = rng("two_backends_with_different_switches");
    let shape = AttnShape::new(32, 8, 128);
    let (qd, ctx, batch) = (shape.q_dim(), 700u32, 2usize);
    let bps = (ctx + 1).div_ceil(16);
    let kvs = KvShape {
        num_layers: 1,
        num_blocks: batch * bps as usize,
        block_size: 16,
        n_kv_heads: 8,
        head_dim: 128,
    };
    let tables: Vec<Vec<u32>> = (0..batch as u32)
        .map(|i| (i * bps..(i + 1) * bps).collect())
        .collect();
    let seqs = |q: u32, c: u32| tables.iter().map(|t| (q, c, t.clone())).collect::<Vec<_>>();
    let (pre, dec) = (
        plan(&seqs(ctx, ctx), 16, |_| 0),
        plan(&seqs(1, ctx + 1), 16, |_| 0),
    );
    let n_pre = batch * ctx as usize;
    let ctx_qkv = random(&mut rng, n_pre * shape.qkv_dim(), 1.0);
    let q = random(&mut rng, batch * shape.qkv_dim(), 1.0);
    // A Q4_K output projection of one decode row with its residual norm.
    let (h, k) = (1024usize, 1024usize);
    let wo = HostTensor::raw(
        vec![h, k],
        GgmlType::Q4K,
        random_blocks(&mut rng, GgmlType::Q4K, h, k),
    )
    .expect("blocks");
    let norm = random(&mut rng, h, 1.0);
    let x = random(&mut rng, k, 1.0);
    let r0 = random(&mut rng, h, 1.0);

    let mut state: Vec<_> = bs
        .iter_mut()
        .map(|b| {
            b.wait_kernels().unwrap();
            let kv = b.alloc_kv(&kvs).unwrap();
            let w = b.upload_weight(wo.clone()).unwrap();
            let nw = weight(b, vec![h], &norm);
            (kv, w, nw)
        })
        .collect();
    // Each step on one backend, then on the other (both live throughout).
    let mut attn_ops: Vec<Vec<&'static str>> = Vec::new();
    let mut attn_out: Vec<Vec<f32>> = Vec::new();
    for (b, (kv, _, _)) in bs.iter_mut().zip(&mut state) {
        let ctx_t = tensor(b, n_pre, shape.qkv_dim(), &ctx_qkv);
        let pb = b.prepare(&pre).unwrap();
        b.write_kv(kv, 0, &ctx_t, &pb, &shape).unwrap();
        let qt = tensor(b, batch, shape.qkv_dim(), &q);
        b.set_timing_period(Some(1));
        let db = b.prepare(&dec).unwrap();
        b.write_kv(kv, 0, &qt, &db, &shape).unwrap();
        let mut out = poisoned(b, batch, qd);
        b.attention(&qt, kv, 0, &db, &shape, None, &mut out)
            .unwrap();
        attn_ops.push(ops_of(b));
        b.set_timing_period(None);
        attn_out.push(b.to_host(&out, batch).unwrap());
    }
    let mut norm_ops: Vec<Vec<&'static str>> = Vec::new();
    let mut norm_out: Vec<Vec<f32>> = Vec::new();
    for (b, (_, w, nw)) in bs.iter_mut().zip(&state) {
        let bx = tensor(b, 1, k, &x);
        let mut res = tensor(b, 1, h, &r0);
        let (mut d, mut out) = (poisoned(b, 1, h), poisoned(b, 1, h));
        b.fuse_across_ops(true).unwrap();
        b.set_timing_period(Some(1));
        let _ = b.prepare(&plan(&[(1, 2, vec![0])], 16, |_| 0)).unwrap();
        b.matmul_add_rms_norm(&bx, w, 1, &mut d, &mut res, nw, 1e-5, &mut out)
            .unwrap();
        norm_ops.push(ops_of(b));
        b.fuse_across_ops(false).unwrap();
        b.set_timing_period(None);
        norm_out.push(b.to_host(&out, 1).unwrap());
    }

    // The folded merge: no attn_combine on the first, attn_combine on the second.
    assert!(
        attn_ops[0].contains(&"attention") && !attn_ops[0].contains(&"attn_combine"),
        "attn_fuse on: {:?}",
        attn_ops[0]
    );
    assert!(
        attn_ops[1].contains(&"attn_combine"),
        "attn_fuse off: {:?}",
        attn_ops[1]
    );
    assert_close(
        "attention, fused against unfused",
        &attn_out[0],
        &attn_out[1],
        2e-2,
    );
    // The deferred residual norm: one launch on the first, the matmul and the norm on the
    // second (each after the `quantize_x` of the written input).
    assert!(
        norm_ops[0].contains(&"matmul_add_rms_norm") && !norm_ops[0].contains(&"add_rms_norm"),
        "qdot_norm on: {:?}",
        norm_ops[0]
    );
    assert!(
        norm_ops[1].contains(&"matmul") && norm_ops[1].contains(&"add_rms_norm"),
        "qdot_norm off: {:?}",
        norm_ops[1]
    );
    assert!(
        !norm_ops[1].contains(&"matmul_add_rms_norm"),
        "qdot_norm off: {:?}",
        norm_ops[1]
    );
    assert_close(
        "residual norm, fused against unfused",
        &norm_out[0],
        &norm_out[1],
        2e-2,
    );

    /// The ops of the launches timed since the last call.
    fn ops_of(b: &mut CudaBackend) -> Vec<&'static str> {
        b.take_kernel_timings()
            .unwrap()
            .iter()
            .map(|t| t.kernel)
            .collect()
    }
}
