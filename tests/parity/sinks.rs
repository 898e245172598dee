//! Parity of attention sinks (gpt-oss: one logit per query head in each row's softmax
//! denominator, weighting no value) against the CPU backend, on every GPU attention path:
//! decode rows on the decode kernel unsplit and split-K (the merge folded into the decode
//! kernel, and with `attn_fuse` off by `attn_combine`), decode rows of a head size without
//! the decode variant (the portable kernel's partials merged by `attn_combine`), prefill
//! chunks on the portable passes and, in bf16, the tensor-core kernel (items of more than 8
//! query vectors), mixed batches, GQA, gpt-oss's sliding window of 128, and sinks large
//! positive (the sink takes most of each row's weight), very negative (plain softmax) and
//! mixed per head. Each case also checks that its sinks changed the output where they
//! should, so a backend that ignored them would fail.

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{AttnShape, Backend, HostTensor, KvShape};
use kiln::model::RopeLayout;
use rand_chacha::ChaCha8Rng;

use crate::harness::*;
use crate::parity_test;

/// How a case's sinks are drawn, one per query head.
#[derive(Debug, Clone, Copy)]
enum Sinks {
    /// Head h % 4: 0 a large sink (9), 1 a very negative one (-40), else uniform in [-2, 4].
    Mixed,
    /// Every head a sink far above its scores (14): most of each row's weight.
    Large,
    /// Every head far below (-60): the plain softmax.
    Negligible,
}

impl Sinks {
    fn draw(self, rng: &mut ChaCha8Rng, n_heads: usize) -> Vec<f32> {
        let r = random(rng, n_heads, 3.0);
        (0..n_heads)
            .map(|h| match self {
                Sinks::Mixed => match h % 4 {
                    0 => 9.0,
                    1 => -40.0,
                    _ => 1.0 + r[h],
                },
                Sinks::Large => 14.0,
                Sinks::Negligible => -60.0,
            })
            .collect()
    }
}

/// One scenario: heads (query, KV), head size, block size, per sequence (new tokens,
/// context after the step), the window and the sinks.
struct SinkCase {
    heads: (usize, usize),
    hd: usize,
    block_size: u32,
    seqs: Vec<(u32, u32)>,
    window: Option<usize>,
    sinks: Sinks,
}

/// Runs `c` on `b` with sinks and without, against the CPU with the same sinks (as `b`
/// stores them: bf16-rounded in bf16).
fn sink_case<B: TestBackend>(b: &mut B, c: &SinkCase, rng: &mut ChaCha8Rng) {
    let mut cpu = CpuBackend::new();
    let (s, bkv, ckv, sp) =
        crate::attention_rig(b, &mut cpu, c.heads, c.hd, c.block_size, &c.seqs, rng);
    let t = sp.num_tokens();
    // Queries of a few units: scores spread over several natural-log units, so a sink of
    // moderate size weighs about as much as the context.
    let q = b.quantize(&random(rng, t * s.qkv_dim(), 3.0));
    let (bb, cb) = (b.prepare(&sp).unwrap(), cpu.prepare(&sp).unwrap());
    let bq = tensor(b, t, s.qkv_dim(), &q);
    let cq = tensor(&mut cpu, t, s.qkv_dim(), &q);
    let ashape = AttnShape {
        window: c.window,
        ..s.attn_shape()
    };
    let sinks = b.quantize(&c.sinks.draw(rng, s.n_heads));
    let bs = b
        .upload_weight(HostTensor::new(vec![s.n_heads], sinks.clone()))
        .unwrap();
    let cs = cpu
        .upload_weight(HostTensor::new(vec![s.n_heads], sinks.clone()))
        .unwrap();
    let what = format!(
        "{} attention sinks {:?} heads {:?} hd {} bs {} seqs {:?} window {:?}",
        b.label(),
        c.sinks,
        c.heads,
        c.hd,
        c.block_size,
        c.seqs,
        c.window
    );
    let mut out = poisoned(b, t, s.q_dim());
    let mut cout = cpu.alloc(t, s.q_dim()).unwrap();
    b.attention(&bq, &bkv, 1, &bb, &ashape, Some(&bs), &mut out)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    cpu.attention(&cq, &ckv, 1, &cb, &ashape, Some(&cs), &mut cout)
        .unwrap();
    let want = cpu.to_host(&cout, t).unwrap();
    assert_close(&what, &b.to_host(&out, t).unwrap(), &want, b.tol());
    // Without sinks: the plain softmax, which the sinks must have moved away from (by far
    // more than the tolerance) unless they are negligible.
    let mut plain = poisoned(b, t, s.q_dim());
    b.attention(&bq, &bkv, 1, &bb, &ashape, None, &mut plain)
        .unwrap();
    let mut cplain = cpu.alloc(t, s.q_dim()).unwrap();
    cpu.attention(&cq, &ckv, 1, &cb, &ashape, None, &mut cplain)
        .unwrap();
    let plain = b.to_host(&plain, t).unwrap();
    assert_close(
        &format!("{what} (no sinks)"),
        &plain,
        &cpu.to_host(&cplain, t).unwrap(),
        b.tol(),
    );
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (p, w) in plain.iter().zip(&want) {
        num += (*p as f64 - *w as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    let moved = (num / den.max(1e-30)).sqrt();
    match c.sinks {
        Sinks::Negligible => assert!(
            moved <= b.tol(),
            "{what}: sinks of -60 moved the output by {moved:.3e}"
        ),
        _ => assert!(
            moved > 3.0 * b.tol(),
            "{what}: the sinks moved the output by only {moved:.3e}"
        ),
    }
}

/// The cases: decode rows short (unsplit) and long (split-K), prefill chunks long enough for
/// the tensor-core kernel, a mixed batch, gpt-oss's shape (64 heads over 8, head size 64,
/// window 128), and head sizes 80 (no decode variant) and 128.
fn cases() -> Vec<SinkCase> {
    let case = |heads, hd, seqs: &[(u32, u32)], window, sinks| SinkCase {
        heads,
        hd,
        block_size: 16,
        seqs: seqs.to_vec(),
        window,
        sinks,
    };
    use Sinks::*;
    vec![
        // Decode: one short row per sequence (unsplit) and long ones (split-K parts).
        case((8, 2), 64, &[(1, 40), (1, 7)], None, Mixed),
        case((8, 2), 64, &[(1, 3000), (1, 40), (1, 700)], None, Mixed),
        case((16, 2), 128, &[(1, 4097)], None, Large),
        case((16, 2), 128, &[(1, 4097)], None, Negligible),
        case((8, 8), 256, &[(1, 2000), (1, 9)], None, Mixed),
        // Decode rows of head size 80: the portable kernel, split parts by attn_combine.
        case((8, 2), 80, &[(1, 3000), (1, 77)], None, Mixed),
        // A sliding window on decode rows, split and not.
        case((8, 2), 64, &[(1, 2500), (1, 100)], Some(128), Mixed),
        // Prefill chunks: GQA 4, more than 8 query vectors per item (tensor cores in bf16).
        case((16, 4), 64, &[(40, 40), (33, 1100)], None, Mixed),
        case((16, 4), 64, &[(200, 300)], Some(128), Large),
        case((16, 4), 128, &[(17, 40), (1, 2048), (1, 5)], None, Mixed),
        case((8, 2), 80, &[(3, 300), (20, 20)], None, Mixed),
        // gpt-oss-20b's attention: 64 heads over 8, head size 64, window 128.
        case(
            (64, 8),
            64,
            &[(1, 1000), (1, 130), (64, 64)],
            Some(128),
            Mixed,
        ),
        case((64, 8), 64, &[(1, 1000), (1, 130), (64, 64)], None, Mixed),
    ]
}

fn sinks<B: TestBackend>(b: &mut B) {
    let mut rng = rng("attention_sinks");
    for c in cases() {
        sink_case(b, &c, &mut rng);
    }
}
parity_test!(attention_sinks_every_path, sinks);

/// The decode cases with `attn_fuse` off: split-K parts merged by `attn_combine` instead of
/// the decode kernel's last part block (the sink joins once, in that merge).
#[cfg(feature = "cuda")]
#[test]
fn attention_sinks_unfused_merge() {
    let mut rng = rng("attention_sinks_unfused");
    for dt in [kiln::backend::DType::F32, kiln::backend::DType::Bf16] {
        let tuning = kiln::backend::GpuTuning {
            attn_fuse: false,
            ..env_tuning()
        };
        let Some(mut b) = cuda_tuned(dt, tuning) else {
            return;
        };
        for c in cases().iter().filter(|c| c.seqs.iter().all(|s| s.0 == 1)) {
            sink_case(&mut b, c, &mut rng);
        }
    }
}

/// A sink vector of the wrong length is refused by name, never read past its end.
fn sinks_shape<B: TestBackend>(b: &mut B) {
    let s = crate::spec(8, 2, 64, crate::rope(64, RopeLayout::Half));
    let shape = KvShape {
        num_layers: 1,
        num_blocks: 4,
        block_size: 16,
        n_kv_heads: 2,
        head_dim: 64,
    };
    let kv = b.alloc_kv(&shape).unwrap();
    let p = plan(&[(1, 5, vec![0])], 16, |_| 0);
    let bb = b.prepare(&p).unwrap();
    let q = tensor(b, 1, s.qkv_dim(), &vec![0.5; s.qkv_dim()]);
    let mut out = poisoned(b, 1, s.q_dim());
    let bad = b
        .upload_weight(HostTensor::new(vec![4], vec![0.0; 4]))
        .unwrap();
    let err = b
        .attention(&q, &kv, 0, &bb, &s.attn_shape(), Some(&bad), &mut out)
        .expect_err("4 sinks for 8 heads");
    assert!(
        err.to_string().contains("sinks"),
        "{}: the error names the sinks: {err}",
        b.label()
    );
}
parity_test!(attention_sinks_of_the_wrong_length_are_refused, sinks_shape);
