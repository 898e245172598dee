//! Op parity: one test body per op, run on every compiled backend against the CPU reference
//! (CPU against itself when CUDA is off; CUDA in f32 and bf16 when a GPU is present).
//! Fresh random inputs each run (the seed is printed), outputs poisoned with NaN before each
//! launch, errors by relative norm with a tolerance per dtype.

#[path = "parity/arch.rs"]
mod arch;
#[path = "parity/arch_models.rs"]
mod arch_models;
#[path = "parity/attn_window.rs"]
mod attn_window;
#[path = "parity/bench.rs"]
mod bench;
#[path = "parity/bench_arch.rs"]
mod bench_arch;
#[path = "parity/harness.rs"]
mod harness;
#[path = "parity/model.rs"]
mod model;
#[path = "parity/moe.rs"]
mod moe;
#[path = "parity/mxfp4.rs"]
mod mxfp4;
#[path = "parity/quant.rs"]
mod quant;
#[path = "parity/sampling.rs"]
mod sampling;
#[path = "parity/sinks.rs"]
mod sinks;
#[path = "parity/torch_ref.rs"]
mod torch_ref;
#[path = "parity/tp.rs"]
mod tp;
#[path = "parity/tuning.rs"]
mod tuning;

use harness::*;
use kiln::backend::cpu::CpuBackend;
use kiln::backend::{Activation, Backend, KvShape};
use kiln::model::spec::Llama3Scaling;
use kiln::model::{ModelSpec, RopeLayout, RopeSpec};
use rand::RngExt;

fn spec(n_heads: usize, n_kv: usize, hd: usize, rope: RopeSpec) -> ModelSpec {
    ModelSpec {
        arch: "llama".into(),
        hidden: n_heads * hd,
        intermediate: 32,
        n_layers: 1,
        n_heads,
        n_kv_heads: n_kv,
        head_dim: hd,
        vocab_size: 64,
        max_position: 1 << 15,
        rms_eps: 1e-5,
        rope,
        tied_embeddings: false,
        qkv_bias: false,
        variant: Default::default(),
    }
}

fn rope(dim: usize, layout: RopeLayout) -> RopeSpec {
    RopeSpec {
        theta: 10000.0,
        dim,
        layout,
        llama3: None,
        freq_factors: None,
        attn_factor: 1.0,
    }
}

/// Llama-3.x rope: theta 500000, head size 128, frequency scaling of factor 8.
fn llama3_rope() -> RopeSpec {
    RopeSpec {
        theta: 500000.0,
        llama3: Some(Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192.0,
        }),
        ..rope(128, RopeLayout::Half)
    }
}

fn embed_and_gather<B: TestBackend>(b: &mut B) {
    let mut rng = rng("embed_and_gather");
    let mut cpu = CpuBackend::new();
    let (vocab, h) = (300, 40);
    let table = random(&mut rng, vocab * h, 1.0);
    let (tw, cw) = (
        weight(b, vec![vocab, h], &table),
        weight(&mut cpu, vec![vocab, h], &table),
    );
    let shape = TINY_KV;
    b.alloc_kv(&shape).unwrap();
    cpu.alloc_kv(&shape).unwrap();
    let tables = block_tables(&mut rng, &[7, 3, 3], 4, 8);
    let mut ids: Vec<u32> = (0..9).map(|_| rng.random_range(0..vocab as u32)).collect();
    // At least one token inside the shard's part below (rows 100..220) and one outside it
    // (nine random ids all fell on one side about once in a hundred runs).
    (ids[0], ids[8]) = (150, 250);
    let seqs = [
        (5, 7, tables[0].clone()),
        (1, 3, tables[1].clone()),
        (3, 3, tables[2].clone()),
    ];
    let p = plan(&seqs, 4, |i| ids[i]);
    let (bb, cb) = (b.prepare(&p).unwrap(), cpu.prepare(&p).unwrap());
    let mut out = poisoned(b, 9, h);
    let mut cout = cpu.alloc(9, h).unwrap();
    b.embed(&tw, 0, vocab, &bb, &mut out).unwrap();
    cpu.embed(&cw, 0, vocab, &cb, &mut cout).unwrap();
    let want = cpu.to_host(&cout, 9).unwrap();
    assert_close(
        &format!("{} embed", b.label()),
        &b.to_host(&out, 9).unwrap(),
        &want,
        b.tol(),
    );
    // A tensor-parallel shard's part of the vocabulary, rows 100..220: its own tokens'
    // rows, zero rows for the others (the all-reduce after it adds them).
    let part = weight(b, vec![120, h], &table[100 * h..220 * h]);
    let mut pout = poisoned(b, 9, h);
    b.embed(&part, 100, vocab, &bb, &mut pout).unwrap();
    let masked: Vec<f32> = (0..9 * h)
        .map(|i| match ids[i / h] {
            100..220 => want[i],
            _ => 0.0,
        })
        .collect();
    assert!(
        ids.iter().any(|&i| (100..220).contains(&i))
            && ids.iter().any(|&i| !(100..220).contains(&i)),
        "the ids should fall both inside and outside the part: {ids:?}"
    );
    assert_close(
        &format!("{} embed of rows 100..220", b.label()),
        &b.to_host(&pout, 9).unwrap(),
        &masked,
        b.tol(),
    );
    let mut g = poisoned(b, 3, h);
    let mut cg = cpu.alloc(3, h).unwrap();
    b.gather_rows(&out, &bb, &mut g).unwrap();
    cpu.gather_rows(&cout, &cb, &mut cg).unwrap();
    let want = cpu.to_host(&cg, 3).unwrap();
    assert_close(
        &format!("{} gather_rows", b.label()),
        &b.to_host(&g, 3).unwrap(),
        &want,
        b.tol(),
    );
    let bad = plan(&[(1, 1, tables[1].clone())], 4, |_| vocab as u32);
    let bb = b.prepare(&bad).unwrap();
    assert!(
        b.embed(&tw, 0, vocab, &bb, &mut out).is_err(),
        "{}: out-of-vocab token accepted",
        b.label()
    );
}
parity_test!(embed_and_gather_rows, embed_and_gather);

fn norms<B: TestBackend>(b: &mut B) {
    let mut rng = rng("norms");
    let mut cpu = CpuBackend::new();
    // Widths of whole 16-byte chunks take the vector kernels (20000: more chunks than the
    // threads keep in registers), 1003 the scalar ones.
    for (n, h) in [
        (1, 8),
        (7, 64),
        (33, 1000),
        (3, 4096),
        (2, 20000),
        (5, 1003),
    ] {
        let (x, r, w) = (
            random(&mut rng, n * h, 2.0),
            random(&mut rng, n * h, 2.0),
            random(&mut rng, h, 1.5),
        );
        let (bw, cw) = (weight(b, vec![h], &w), weight(&mut cpu, vec![h], &w));
        let bx = tensor(b, n, h, &x);
        let cx = tensor(&mut cpu, n, h, &x);
        let mut out = poisoned(b, n, h);
        let mut cout = cpu.alloc(n, h).unwrap();
        b.rms_norm(&bx, &bw, 1e-5, n, &mut out).unwrap();
        cpu.rms_norm(&cx, &cw, 1e-5, n, &mut cout).unwrap();
        let what = format!("{} rms_norm {n}x{h}", b.label());
        assert_close(
            &what,
            &b.to_host(&out, n).unwrap(),
            &cpu.to_host(&cout, n).unwrap(),
            b.tol(),
        );

        let mut br = tensor(b, n, h, &r);
        let mut cr = tensor(&mut cpu, n, h, &r);
        let mut out = poisoned(b, n, h);
        b.add_rms_norm(&bx, &mut br, &bw, 1e-5, n, &mut out)
            .unwrap();
        cpu.add_rms_norm(&cx, &mut cr, &cw, 1e-5, n, &mut cout)
            .unwrap();
        let what = format!("{} add_rms_norm {n}x{h}", b.label());
        assert_close(
            &what,
            &b.to_host(&out, n).unwrap(),
            &cpu.to_host(&cout, n).unwrap(),
            b.tol(),
        );
        assert_close(
            &format!("{what} residual"),
            &b.to_host(&br, n).unwrap(),
            &cpu.to_host(&cr, n).unwrap(),
            b.tol(),
        );
    }
}
parity_test!(rms_norm_and_fused_add, norms);

fn matmuls<B: TestBackend>(b: &mut B) {
    let mut rng = rng("matmuls");
    let mut cpu = CpuBackend::new();
    for (n, k, m, with_bias) in [
        (1, 64, 172, false),
        (7, 172, 64, true),
        (33, 512, 1000, false),
        (5, 4096, 256, true),
        (64, 96, 80, false),
        // One or two rows stream over the weight (kernels/gemv.cu): odd row counts (tails
        // of the rows-per-warp pairing), bias, a width that is no whole 16-byte chunk in
        // bf16 (the BLAS then) but is in f32.
        (2, 4096, 301, true),
        (1, 4100, 129, true),
        (2, 14336, 64, false),
        (1, 8, 3, false),
    ] {
        let (x, w, bias) = (
            random(&mut rng, n * k, 1.0),
            random(&mut rng, m * k, 1.0),
            random(&mut rng, m, 1.0),
        );
        let (bw, cw) = (weight(b, vec![m, k], &w), weight(&mut cpu, vec![m, k], &w));
        let (bb, cb) = (weight(b, vec![m], &bias), weight(&mut cpu, vec![m], &bias));
        let bx = tensor(b, n + 3, k, &[x.clone(), vec![0.5; 3 * k]].concat());
        let cx = tensor(&mut cpu, n, k, &x);
        let mut out = poisoned(b, n + 3, m);
        let mut cout = cpu.alloc(n, m).unwrap();
        b.matmul(&bx, &bw, with_bias.then_some(&bb), n, &mut out)
            .unwrap();
        cpu.matmul(&cx, &cw, with_bias.then_some(&cb), n, &mut cout)
            .unwrap();
        let what = format!("{} matmul {n}x{k}x{m} bias={with_bias}", b.label());
        assert_rows_only(
            &what,
            &b.to_host(&out, n + 3).unwrap(),
            &cpu.to_host(&cout, n).unwrap(),
            b.tol(),
        );
    }
}
parity_test!(matmul_against_weights, matmuls);

fn ropes<B: TestBackend>(b: &mut B) {
    let mut rng = rng("ropes");
    let mut cpu = CpuBackend::new();
    let cases = [
        spec(8, 4, 8, rope(8, RopeLayout::Interleaved)),
        spec(4, 2, 64, rope(64, RopeLayout::Half)),
        spec(8, 2, 128, llama3_rope()),
        spec(2, 1, 96, rope(32, RopeLayout::Interleaved)),
    ];
    for s in cases {
        let ctx = [8000u32, 5, 300];
        let tables = block_tables(&mut rng, &ctx, 16, 600);
        let shape = KvShape {
            num_layers: 1,
            num_blocks: 600,
            block_size: 16,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
        };
        b.alloc_kv(&shape).unwrap();
        cpu.alloc_kv(&shape).unwrap();
        let seqs = [
            (3, ctx[0], tables[0].clone()),
            (5, ctx[1], tables[1].clone()),
            (1, ctx[2], tables[2].clone()),
        ];
        let p = plan(&seqs, 16, |_| 0);
        let (bb, cb) = (b.prepare(&p).unwrap(), cpu.prepare(&p).unwrap());
        let x = random(&mut rng, 9 * s.qkv_dim(), 1.0);
        let mut bx = tensor(b, 9, s.qkv_dim(), &x);
        let mut cx = tensor(&mut cpu, 9, s.qkv_dim(), &b.quantize(&x));
        b.rope(&mut bx, &bb, &s.attn_shape(), &s.rope).unwrap();
        cpu.rope(&mut cx, &cb, &s.attn_shape(), &s.rope).unwrap();
        let what = format!(
            "{} rope hd={} dim={} {:?}",
            b.label(),
            s.head_dim,
            s.rope.dim,
            s.rope.layout
        );
        assert_close(
            &what,
            &b.to_host(&bx, 9).unwrap(),
            &cpu.to_host(&cx, 9).unwrap(),
            b.tol(),
        );
    }
}
parity_test!(rope_both_layouts_and_llama3, ropes);

/// Rope with the cache write in one pass (the GPU's fused `rope_kv`) against the CPU's rope
/// then write_kv: the rotated qkv, then attention over the written cache (every position of
/// the prefilled sequences) shows the cache holds the same K and V.
fn rope_kv<B: TestBackend>(b: &mut B) {
    let mut rng = rng("rope_kv");
    let mut cpu = CpuBackend::new();
    let cases = [
        spec(8, 2, 128, llama3_rope()),
        spec(2, 1, 96, rope(32, RopeLayout::Interleaved)),
        spec(8, 4, 8, rope(8, RopeLayout::Interleaved)),
        // Heads of no whole 16-byte chunk: the element-wise cache copy.
        spec(4, 1, 6, rope(6, RopeLayout::Half)),
    ];
    for s in cases {
        let ctx = [37u32, 5, 300];
        let tables = block_tables(&mut rng, &ctx, 16, 40);
        let shape = KvShape {
            num_layers: 2,
            num_blocks: 40,
            block_size: 16,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
        };
        let mut bkv = b.alloc_kv(&shape).unwrap();
        let mut ckv = cpu.alloc_kv(&shape).unwrap();
        let seqs: Vec<_> = ctx
            .iter()
            .zip(&tables)
            .map(|(&n, t)| (n, n, t.clone()))
            .collect();
        let p = plan(&seqs, 16, |_| 0);
        let t = p.num_tokens();
        let (bb, cb) = (b.prepare(&p).unwrap(), cpu.prepare(&p).unwrap());
        let x = b.quantize(&random(&mut rng, t * s.qkv_dim(), 1.0));
        let mut bx = tensor(b, t, s.qkv_dim(), &x);
        let mut cx = tensor(&mut cpu, t, s.qkv_dim(), &x);
        b.rope_write_kv(&mut bx, &mut bkv, 1, &bb, &s.attn_shape(), &s.rope)
            .unwrap();
        cpu.rope(&mut cx, &cb, &s.attn_shape(), &s.rope).unwrap();
        cpu.write_kv(&mut ckv, 1, &cx, &cb, &s.attn_shape())
            .unwrap();
        let what = format!(
            "{} rope_write_kv hd={} {:?}",
            b.label(),
            s.head_dim,
            s.rope.layout
        );
        assert_close(
            &what,
            &b.to_host(&bx, t).unwrap(),
            &cpu.to_host(&cx, t).unwrap(),
            b.tol(),
        );
        let mut out = poisoned(b, t, s.q_dim());
        let mut cout = cpu.alloc(t, s.q_dim()).unwrap();
        b.attention(&bx, &bkv, 1, &bb, &s.attn_shape(), None, &mut out)
            .unwrap();
        cpu.attention(&cx, &ckv, 1, &cb, &s.attn_shape(), None, &mut cout)
            .unwrap();
        assert_close(
            &format!("{what}: attention over the written cache"),
            &b.to_host(&out, t).unwrap(),
            &cpu.to_host(&cout, t).unwrap(),
            b.tol(),
        );
    }
}
parity_test!(rope_write_kv_fused, rope_kv);

fn silu<B: TestBackend>(b: &mut B) {
    let mut rng = rng("silu");
    let mut cpu = CpuBackend::new();
    for (n, f) in [(1, 172), (9, 1000), (2, 14336)] {
        let gu = random(&mut rng, n * 2 * f, 6.0);
        let bg = tensor(b, n, 2 * f, &gu);
        let cg = tensor(&mut cpu, n, 2 * f, &gu);
        let mut out = poisoned(b, n, f);
        let mut cout = cpu.alloc(n, f).unwrap();
        b.glu(Activation::Silu, &bg, n, &mut out).unwrap();
        cpu.glu(Activation::Silu, &cg, n, &mut cout).unwrap();
        let what = format!("{} silu_mul {n}x{f}", b.label());
        assert_close(
            &what,
            &b.to_host(&out, n).unwrap(),
            &cpu.to_host(&cout, n).unwrap(),
            b.tol(),
        );
    }
}
parity_test!(silu_mul, silu);

/// The FFN's gate/up matmul with SiLU-mul (fused for one or two rows) against the CPU's
/// separate matmul and silu_mul.
fn matmul_silu<B: TestBackend>(b: &mut B) {
    let mut rng = rng("matmul_silu");
    let mut cpu = CpuBackend::new();
    for (n, k, f) in [(1, 64, 172), (2, 4096, 1000), (3, 512, 96), (1, 4100, 33)] {
        let (x, w) = (
            random(&mut rng, n * k, 1.0),
            random(&mut rng, 2 * f * k, 1.0),
        );
        // The reference sees the inputs as the backend stores them.
        let (bw, cw) = (
            weight(b, vec![2 * f, k], &w),
            weight(&mut cpu, vec![2 * f, k], &b.quantize(&w)),
        );
        let bx = tensor(b, n + 2, k, &[x.clone(), vec![0.5; 2 * k]].concat());
        let cx = tensor(&mut cpu, n, k, &b.quantize(&x));
        let mut gu = poisoned(b, n + 2, 2 * f);
        let mut out = poisoned(b, n + 2, f);
        let mut cgu = cpu.alloc(n, 2 * f).unwrap();
        let mut cout = cpu.alloc(n, f).unwrap();
        b.matmul_glu(Activation::Silu, &bx, &bw, n, &mut gu, &mut out)
            .unwrap();
        cpu.matmul(&cx, &cw, None, n, &mut cgu).unwrap();
        cpu.glu(Activation::Silu, &cgu, n, &mut cout).unwrap();
        let what = format!("{} matmul_silu_mul {n}x{k}x{f}", b.label());
        assert_rows_only(
            &what,
            &b.to_host(&out, n + 2).unwrap(),
            &cpu.to_host(&cout, n).unwrap(),
            b.tol(),
        );
    }
}
parity_test!(matmul_silu_mul, matmul_silu);

/// One attention scenario: heads, KV heads, head size, block size, per sequence
/// (new tokens, context after the step), and the layer's window, soft cap and scale.
struct AttnCase {
    heads: (usize, usize),
    hd: usize,
    block_size: u32,
    seqs: Vec<(u32, u32)>,
    scores: Scores,
}

/// How an attention layer forms its scores ([`kiln::backend::AttnShape`]'s last fields).
#[derive(Debug, Clone, Copy, Default)]
struct Scores {
    window: Option<usize>,
    softcap: Option<f32>,
    scale: Option<f32>,
}

/// An attention case's setup: the spec of `heads` (q, kv) of size `hd`, KV pools of two
/// layers on `b` and `cpu` whose layer 1 holds every position of each sequence's context
/// (`seqs`: (query tokens, context)), written through `write_kv` from the same random values,
/// and the plan of the step over them (prefill chunks and decode tokens); returns (spec, `b`'s
/// pool, the CPU's pool, the step's plan).
fn attention_rig<B: TestBackend>(
    b: &mut B,
    cpu: &mut CpuBackend,
    heads: (usize, usize),
    hd: usize,
    block_size: u32,
    seqs: &[(u32, u32)],
    rng: &mut rand_chacha::ChaCha8Rng,
) -> (
    ModelSpec,
    B::Kv,
    kiln::backend::cpu::CpuKv,
    kiln::backend::BatchPlan,
) {
    let s = spec(heads.0, heads.1, hd, rope(hd, RopeLayout::Half));
    let ctx: Vec<u32> = seqs.iter().map(|x| x.1).collect();
    let need: usize = ctx.iter().map(|&x| x.div_ceil(block_size) as usize).sum();
    let num_blocks = need + need / 2 + 3;
    let tables = block_tables(rng, &ctx, block_size, num_blocks);
    let shape = KvShape {
        num_layers: 2,
        num_blocks,
        block_size: block_size as usize,
        n_kv_heads: s.n_kv_heads,
        head_dim: hd,
    };
    let mut bkv = b.alloc_kv(&shape).unwrap();
    let mut ckv = cpu.alloc_kv(&shape).unwrap();
    // Fill every cached position of layer 1 through write_kv.
    let fill: Vec<_> = ctx
        .iter()
        .zip(&tables)
        .map(|(&n, t)| (n, n, t.clone()))
        .collect();
    let fp = plan(&fill, block_size, |_| 0);
    let rows = fp.num_tokens();
    let kvdata = b.quantize(&random(rng, rows * s.qkv_dim(), 1.0));
    let (bb, cb) = (b.prepare(&fp).unwrap(), cpu.prepare(&fp).unwrap());
    let bq = tensor(b, rows, s.qkv_dim(), &kvdata);
    let cq = tensor(cpu, rows, s.qkv_dim(), &kvdata);
    b.write_kv(&mut bkv, 1, &bq, &bb, &s.attn_shape()).unwrap();
    cpu.write_kv(&mut ckv, 1, &cq, &cb, &s.attn_shape())
        .unwrap();
    // The step: prefill chunks and decode tokens over those contexts.
    let step: Vec<_> = seqs
        .iter()
        .zip(&tables)
        .map(|(&(q, n), t)| (q, n, t.clone()))
        .collect();
    (s, bkv, ckv, plan(&step, block_size, |_| 0))
}

fn attention_case<B: TestBackend>(b: &mut B, c: &AttnCase, rng: &mut rand_chacha::ChaCha8Rng) {
    let mut cpu = CpuBackend::new();
    let (s, bkv, ckv, sp) = attention_rig(b, &mut cpu, c.heads, c.hd, c.block_size, &c.seqs, rng);
    let t = sp.num_tokens();
    let q = b.quantize(&random(rng, t * s.qkv_dim(), 1.0));
    let (bb, cb) = (b.prepare(&sp).unwrap(), cpu.prepare(&sp).unwrap());
    let bq = tensor(b, t, s.qkv_dim(), &q);
    let cq = tensor(&mut cpu, t, s.qkv_dim(), &q);
    let mut out = poisoned(b, t, s.q_dim());
    let mut cout = cpu.alloc(t, s.q_dim()).unwrap();
    let ashape = kiln::backend::AttnShape {
        window: c.scores.window,
        softcap: c.scores.softcap,
        scale: c.scores.scale,
        ..s.attn_shape()
    };
    b.attention(&bq, &bkv, 1, &bb, &ashape, None, &mut out)
        .unwrap();
    cpu.attention(&cq, &ckv, 1, &cb, &ashape, None, &mut cout)
        .unwrap();
    let what = format!(
        "{} attention heads {:?} hd {} bs {} seqs {:?} {:?}",
        b.label(),
        c.heads,
        c.hd,
        c.block_size,
        c.seqs,
        c.scores
    );
    assert_close(
        &what,
        &b.to_host(&out, t).unwrap(),
        &cpu.to_host(&cout, t).unwrap(),
        b.tol(),
    );
}

/// `n` decode rows with contexts from 1 to a few thousand positions.
fn decode_rows(n: u32) -> Vec<(u32, u32)> {
    (0..n)
        .map(|i| (1, 1 + (i * 997 + i * i * 31) % 3500))
        .collect()
}

fn attentions<B: TestBackend>(b: &mut B) {
    let mut rng = rng("attentions");
    let case = |heads, hd, block_size, seqs: &[(u32, u32)]| AttnCase {
        heads,
        hd,
        block_size,
        seqs: seqs.to_vec(),
        scores: Scores::default(),
    };
    let cases = [
        case((8, 4), 8, 4, &[(5, 9), (1, 20), (1, 1)]),
        case((4, 4), 64, 16, &[(1, 8000), (17, 40), (1, 300)]),
        case((16, 4), 128, 16, &[(33, 1100), (1, 2048), (1, 5), (7, 7)]),
        case((16, 2), 128, 16, &[(1, 4097)]),
        case((8, 2), 80, 16, &[(3, 300), (1, 77)]),
        case((4, 1), 96, 8, &[(2, 50), (20, 20)]),
        case((8, 8), 256, 16, &[(1, 1000), (9, 9)]),
        case((6, 2), 4, 4, &[(4, 4), (1, 30)]),
        case(
            (32, 8),
            128,
            16,
            &[(1, 512), (1, 700), (1, 1500), (1, 3000)],
        ),
        // Prefill items of many query vectors (the tensor-core variant in bf16 on NVIDIA):
        // a chunk after cached context next to decode rows, GQA 4 and 8, head sizes 128
        // and 64, G = 2 (one m16 tile per item), a long decode row split into parts.
        case((32, 8), 128, 16, &[(150, 1400), (1, 900), (64, 64)]),
        case((16, 2), 64, 16, &[(70, 200), (1, 3000), (5, 5)]),
        case((8, 4), 128, 16, &[(45, 45), (1, 77)]),
        // Steps that fill a wave of the tensor-core variant's blocks on an H100 (items of 32
        // rows, `TC_ROWS_PER_ITEM`): GQA 4 (a pass of 128 query vectors per item, after
        // cached context, its last item 16 rows) and one query head per KV head.
        case((64, 16), 128, 16, &[(560, 600), (1, 300)]),
        case((32, 32), 64, 16, &[(300, 300)]),
        // Decode steps (every item at most 8 query vectors: the thread-group decode variant):
        // many single rows (no split), GQA 4 and 8, head sizes 128 and 64, long rows split
        // into parts, two-row items (8 vectors, per-vector causal limits), block size 8.
        case((32, 8), 128, 16, &decode_rows(40)),
        case((32, 4), 128, 16, &[(1, 3000), (1, 700), (1, 1)]),
        case((16, 4), 64, 16, &[(1, 5000), (1, 130), (1, 2)]),
        case((8, 1), 64, 16, &decode_rows(24)),
        case((4, 4), 64, 8, &[(1, 2500), (1, 33)]),
        case((16, 4), 128, 16, &[(2, 300), (1, 50), (2, 2)]),
        case((8, 4), 128, 16, &[(3, 1000), (1, 9)]),
        // Block sizes where a decode step (32 positions at head size 128) is not whole
        // blocks (12: each stream still reads one block per step) or a stream's positions
        // straddle blocks (6: one table entry per position).
        case((32, 8), 128, 12, &decode_rows(12)),
        case((16, 4), 128, 6, &[(1, 700), (1, 61), (2, 300)]),
    ];
    for c in &cases {
        attention_case(b, c, &mut rng);
    }
}
parity_test!(attention_paged_varlen_gqa, attentions);

/// Attention right after start-up of a GQA-4 model, while the decode variant's pass of 8
/// query vectors and the tensor-core variant still compile (a start waits for the pass of
/// one row only: `Class::Later` in kernels.rs; `alloc_kv` starts them, and only a step loads
/// them): steps pack items of one row for the decode variant meanwhile (prompts of hundreds
/// of rows included), and items of two rows take the tensor-core variant once it is loaded
/// before the pass of 8; long contexts split into parts. Against the CPU.
#[cfg(feature = "cuda")]
#[test]
fn attention_before_its_larger_decode_passes_compiled() {
    use kiln::backend::cuda::{CudaOptions, DType};
    let Some(mut b) = cuda_opened(CudaOptions {
        dtype: DType::Bf16,
        needs: kiln::backend::ModelNeeds {
            moe: false,
            weight_types: Some(vec![kiln::backend::quant::GgmlType::F32]),
            head_dims: Some(vec![128, 64]),
            gqa_group: Some(4),
            ..Default::default()
        },
        ..gpu_options()
    }) else {
        return;
    };
    let mut rng = rng("attention_before_passes");
    let case = |heads, hd, seqs: &[(u32, u32)]| AttnCase {
        heads,
        hd,
        block_size: 16,
        seqs: seqs.to_vec(),
        scores: Scores::default(),
    };
    for c in [
        case((16, 4), 128, &[(2, 300), (1, 50), (2, 2)]),
        case((32, 8), 128, &[(2, 3000), (1, 700), (2, 9)]),
        case((16, 4), 64, &[(2, 5000), (1, 130), (1, 1)]),
        case((16, 4), 128, &[(1, 3000), (1, 2)]),
        case((32, 8), 128, &[(300, 300), (45, 1000), (1, 20)]),
        case((16, 4), 64, &[(200, 260), (3, 3)]),
    ] {
        attention_case(&mut b, &c, &mut rng);
    }
}
