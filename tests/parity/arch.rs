//! Parity of the model-family ops (Qwen3's and Gemma 3's per-head q/k norm, Gemma's GeGLU,
//! embedding scale and logit soft-cap) against the CPU reference, on fresh random inputs.
//! Rows past `n` hold a sentinel that must survive (in-place ops touch only their rows).

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{Activation, AttnShape, Backend, KvShape, QkNorm, RopeLayout, RopeSpec};

use crate::harness::*;
use crate::parity_test;

/// The sentinel rows past `n` are unchanged; the first `n` rows match `want`.
fn check_in_place(what: &str, got: &[f32], want: &[f32], extra: usize, cols: usize, tol: f64) {
    let n = want.len();
    assert_close(what, &got[..n], want, tol);
    assert!(
        got[n..n + extra * cols].iter().all(|&v| v == 0.5),
        "{what}: wrote past its rows"
    );
}

fn head_norms<B: TestBackend>(b: &mut B) {
    let mut rng = rng("head_rms_norm");
    let mut cpu = CpuBackend::new();
    // Qwen3 (head 128, GQA 4:1), Gemma 3 (head 256), a head size off the warp multiple.
    for (n, nh, nkv, hd) in [(1, 8, 2, 128), (7, 4, 2, 256), (3, 3, 1, 40)] {
        let shape = AttnShape::new(nh, nkv, hd);
        let cols = shape.qkv_dim();
        let x = random(&mut rng, n * cols, 3.0);
        let (qw, kw) = (random(&mut rng, hd, 1.5), random(&mut rng, hd, 1.5));
        let mut bx = tensor(b, n + 1, cols, &[x.clone(), vec![0.5; cols]].concat());
        let mut cx = tensor(&mut cpu, n, cols, &b.quantize(&x));
        let (bq, bk) = (weight(b, vec![hd], &qw), weight(b, vec![hd], &kw));
        let cq = weight(&mut cpu, vec![hd], &b.quantize(&qw));
        let ck = weight(&mut cpu, vec![hd], &b.quantize(&kw));
        b.head_rms_norm(&mut bx, &bq, &bk, &shape, 1e-6, n).unwrap();
        cpu.head_rms_norm(&mut cx, &cq, &ck, &shape, 1e-6, n)
            .unwrap();
        let what = format!("{} head_rms_norm {n}x{nh}+{nkv}x{hd}", b.label());
        let want = cpu.to_host(&cx, n).unwrap();
        // v is untouched: the reference keeps it as given.
        let v0 = (nh + nkv) * hd;
        assert_eq!(want[v0..cols], b.quantize(&x)[v0..cols]);
        check_in_place(
            &what,
            &b.to_host(&bx, n + 1).unwrap(),
            &want,
            1,
            cols,
            b.tol(),
        );
    }
}
parity_test!(head_rms_norm_q_and_k, head_norms);

/// The q/k head norms, rope and the cache write in one op (the GPU's `rope_kv` with norm
/// weights) against the CPU's head_rms_norm, rope and write_kv, and against the backend's own
/// head_rms_norm then rope_write_kv: the qkv rows, then attention over the written cache (the
/// cache holds the normalized, rotated K). Ragged shapes: head groups of the rope kernel
/// (8 heads) across the q/k boundary, partial rope with an attention factor, interleaved
/// pairs, a head size off the warp multiple and one of no whole 16-byte chunk; sequences of
/// 37, 5, 300 and 1 tokens.
fn norm_rope_kv<B: TestBackend>(b: &mut B) {
    let mut rng = rng("norm_rope_write_kv");
    let mut cpu = CpuBackend::new();
    let rope = |dim: usize, layout: RopeLayout, attn_factor: f32| RopeSpec {
        theta: 1e6,
        dim,
        layout,
        llama3: None,
        freq_factors: None,
        attn_factor,
    };
    let cases = [
        // Qwen3's head size and GQA 3:1 (the second group holds 4 q and 4 k heads).
        (12, 4, 128, rope(128, RopeLayout::Half, 1.0)),
        // Gemma 3's head size, one group of 6 q and 2 k heads.
        (6, 2, 256, rope(256, RopeLayout::Half, 1.0)),
        // Partial rope with an attention factor: 32 of 96 dims rotate, the rest only normalized.
        (10, 2, 96, rope(32, RopeLayout::Half, 1.3)),
        (3, 1, 40, rope(24, RopeLayout::Interleaved, 1.0)),
        (4, 1, 6, rope(6, RopeLayout::Half, 1.0)),
    ];
    for (nh, nkv, hd, rope) in cases {
        let shape = AttnShape::new(nh, nkv, hd);
        let cols = shape.qkv_dim();
        let ctx = [37u32, 5, 300, 1];
        let tables = block_tables(&mut rng, &ctx, 16, 40);
        let kv_shape = KvShape {
            num_layers: 2,
            num_blocks: 40,
            block_size: 16,
            n_kv_heads: nkv,
            head_dim: hd,
        };
        let seqs: Vec<_> = ctx
            .iter()
            .zip(&tables)
            .map(|(&n, t)| (n, n, t.clone()))
            .collect();
        let p = plan(&seqs, 16, |_| 0);
        let t = p.num_tokens();
        // Caches for the op under test, the backend's separate ops and the reference.
        let mut bkv = b.alloc_kv(&kv_shape).unwrap();
        let mut skv = b.alloc_kv(&kv_shape).unwrap();
        let mut ckv = cpu.alloc_kv(&kv_shape).unwrap();
        let (bb, cb) = (b.prepare(&p).unwrap(), cpu.prepare(&p).unwrap());
        let x = b.quantize(&random(&mut rng, t * cols, 3.0));
        let (qw, kw) = (
            b.quantize(&random(&mut rng, hd, 1.5)),
            b.quantize(&random(&mut rng, hd, 1.5)),
        );
        let (bq, bk) = (weight(b, vec![hd], &qw), weight(b, vec![hd], &kw));
        let (cq, ck) = (
            weight(&mut cpu, vec![hd], &qw),
            weight(&mut cpu, vec![hd], &kw),
        );
        let eps = 1e-6;
        // The op under test.
        let mut bx = tensor(b, t, cols, &x);
        let norm = QkNorm {
            q: &bq,
            k: &bk,
            eps,
            n: t,
        };
        b.norm_rope_write_kv(&mut bx, &mut bkv, 1, &bb, &shape, &rope, norm)
            .unwrap();
        // The backend's separate ops.
        let mut sx = tensor(b, t, cols, &x);
        b.head_rms_norm(&mut sx, &bq, &bk, &shape, eps, t).unwrap();
        b.rope_write_kv(&mut sx, &mut skv, 1, &bb, &shape, &rope)
            .unwrap();
        // The CPU reference, op by op.
        let mut cx = tensor(&mut cpu, t, cols, &x);
        cpu.head_rms_norm(&mut cx, &cq, &ck, &shape, eps, t)
            .unwrap();
        cpu.rope(&mut cx, &cb, &shape, &rope).unwrap();
        cpu.write_kv(&mut ckv, 1, &cx, &cb, &shape).unwrap();
        let what = format!(
            "{} norm_rope_write_kv {nh}+{nkv}x{hd} rot {} {:?} x{}",
            b.label(),
            rope.dim,
            rope.layout,
            rope.attn_factor
        );
        let got = b.to_host(&bx, t).unwrap();
        assert_close(&what, &got, &cpu.to_host(&cx, t).unwrap(), b.tol());
        assert_close(
            &format!("{what} against the separate ops"),
            &got,
            &b.to_host(&sx, t).unwrap(),
            b.tol(),
        );
        let q_dim = shape.q_dim();
        let mut out = poisoned(b, t, q_dim);
        let mut sout = poisoned(b, t, q_dim);
        let mut cout = cpu.alloc(t, q_dim).unwrap();
        b.attention(&bx, &bkv, 1, &bb, &shape, None, &mut out)
            .unwrap();
        b.attention(&sx, &skv, 1, &bb, &shape, None, &mut sout)
            .unwrap();
        cpu.attention(&cx, &ckv, 1, &cb, &shape, None, &mut cout)
            .unwrap();
        let out = b.to_host(&out, t).unwrap();
        assert_close(
            &format!("{what}: attention over the written cache"),
            &out,
            &cpu.to_host(&cout, t).unwrap(),
            b.tol(),
        );
        assert_close(
            &format!("{what}: attention against the separate ops' cache"),
            &out,
            &b.to_host(&sout, t).unwrap(),
            b.tol(),
        );
    }
}
parity_test!(norm_rope_write_kv_fused, norm_rope_kv);

fn gelu<B: TestBackend>(b: &mut B) {
    let mut rng = rng("gelu_tanh_mul");
    let mut cpu = CpuBackend::new();
    for (n, f) in [(1, 172), (9, 1000), (2, 9216)] {
        let gu = random(&mut rng, n * 2 * f, 6.0);
        let bg = tensor(b, n, 2 * f, &gu);
        let cg = tensor(&mut cpu, n, 2 * f, &b.quantize(&gu));
        let mut out = poisoned(b, n + 1, f);
        let mut cout = cpu.alloc(n, f).unwrap();
        b.glu(Activation::GeluTanh, &bg, n, &mut out).unwrap();
        cpu.glu(Activation::GeluTanh, &cg, n, &mut cout).unwrap();
        let what = format!("{} gelu_tanh_mul {n}x{f}", b.label());
        assert_rows_only(
            &what,
            &b.to_host(&out, n + 1).unwrap(),
            &cpu.to_host(&cout, n).unwrap(),
            b.tol(),
        );
    }
}
parity_test!(gelu_tanh_mul, gelu);

fn scale_and_softcap<B: TestBackend>(b: &mut B) {
    let mut rng = rng("scale_softcap");
    let mut cpu = CpuBackend::new();
    for (n, cols) in [(1, 2304), (5, 3000)] {
        let x = random(&mut rng, n * cols, 80.0);
        for op in ["scale", "softcap"] {
            let mut bx = tensor(b, n + 1, cols, &[x.clone(), vec![0.5; cols]].concat());
            let mut cx = tensor(&mut cpu, n, cols, &b.quantize(&x));
            if op == "scale" {
                b.scale(&mut bx, 48.0, n).unwrap();
                cpu.scale(&mut cx, 48.0, n).unwrap();
            } else {
                b.softcap(&mut bx, 30.0, n).unwrap();
                cpu.softcap(&mut cx, 30.0, n).unwrap();
            }
            let what = format!("{} {op} {n}x{cols}", b.label());
            let want = cpu.to_host(&cx, n).unwrap();
            check_in_place(
                &what,
                &b.to_host(&bx, n + 1).unwrap(),
                &want,
                1,
                cols,
                b.tol(),
            );
        }
    }
}
parity_test!(scale_and_softcap_in_place, scale_and_softcap);
