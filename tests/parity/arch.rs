//! Parity of the model-family ops (Qwen3's and Gemma 3's per-head q/k norm, Gemma's GeGLU,
//! embedding scale and logit soft-cap) against the CPU reference, on fresh random inputs.
//! Rows past `n` hold a sentinel that must survive (in-place ops touch only their rows).

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{Activation, AttnShape, Backend};

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
