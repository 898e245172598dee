//! Parity of the mixture-of-experts FFN (`Backend::moe_ffn`) against a naive per-token
//! reference written here (f64, experts looped token by token): batches in which every
//! expert gets a token, in which most get none, exact router ties (lowest index wins),
//! both weightings (renormalised top-k and raw softmax probabilities), Qwen2-MoE's shared
//! expert under its sigmoid gate, and experts in every quantized type Kiln reads.

use kiln::backend::{Backend, MoeAct, MoeExperts, MoeShape, SharedExpert};
use rand_chacha::ChaCha8Rng;

use crate::harness::*;
use crate::parity_test;

/// A shared expert's host weights: gate rows over up rows, down, the gate's row.
type SharedHost = (Vec<f32>, Vec<f32>, Vec<f32>);

/// `out[t] = sum over the top-k experts of softmax(logits[t]) of w * down(silu(gate x) * up x)`,
/// plus `sigmoid(x . g) * down_s(silu(gate_s x) * up_s x)` with a shared expert.
fn reference(
    x: &[f32],
    logits: &[f32],
    (gate, up, down): (&[f32], &[f32], &[f32]),
    shared: Option<&SharedHost>,
    s: &MoeShape,
    h: usize,
) -> Vec<f32> {
    let (ne, f, n) = (s.n_expert, s.expert_ff, x.len() / h);
    let mut out = vec![0.0f32; n * h];
    for t in 0..n {
        let l: Vec<f64> = logits[t * ne..(t + 1) * ne]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = l.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = p.iter().sum();
        let mut order: Vec<usize> = (0..ne).collect();
        // Stable: equal probabilities keep the lower index first.
        order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
        let top = &order[..s.top_k];
        let total: f64 = top.iter().map(|&e| p[e] / sum).sum();
        let xt = &x[t * h..(t + 1) * h];
        for &e in top {
            let w = if s.norm_topk {
                p[e] / sum / total
            } else {
                p[e] / sum
            };
            let dot = |m: &[f32], row: usize, v: &[f32]| -> f64 {
                let r = &m[row * v.len()..(row + 1) * v.len()];
                r.iter().zip(v).map(|(a, b)| *a as f64 * *b as f64).sum()
            };
            let act: Vec<f32> = (0..f)
                .map(|j| {
                    let g = dot(gate, e * f + j, xt);
                    (g / (1.0 + (-g).exp()) * dot(up, e * f + j, xt)) as f32
                })
                .collect();
            for i in 0..h {
                out[t * h + i] += (w * dot(down, e * h + i, &act)) as f32;
            }
        }
        if let Some((gu, dn, g)) = shared {
            let sf = s.shared_ff;
            let dot = |m: &[f32], row: usize, v: &[f32]| -> f64 {
                let r = &m[row * v.len()..(row + 1) * v.len()];
                r.iter().zip(v).map(|(a, b)| *a as f64 * *b as f64).sum()
            };
            let act: Vec<f32> = (0..sf)
                .map(|j| {
                    let a = dot(gu, j, xt);
                    (a / (1.0 + (-a).exp()) * dot(gu, sf + j, xt)) as f32
                })
                .collect();
            let sig = 1.0 / (1.0 + (-dot(g, 0, xt)).exp());
            for i in 0..h {
                out[t * h + i] += (sig * dot(dn, i, &act)) as f32;
            }
        }
    }
    out
}

/// Runs one case on `b` and checks it against [`reference`].
/// `Backend::moe_ffn_add_rms_norm` on the `n` rows of `x` (overwritten with the normed rows)
/// against `want`, the FFN's expected output: the residual (a random row batch, one poisoned
/// row after it that must stay untouched) becomes `residual + want` and `x` its RMSNorm
/// times a random weight (f64 here).
#[allow(clippy::too_many_arguments)]
fn check_add_norm<B: TestBackend>(
    b: &mut B,
    rng: &mut ChaCha8Rng,
    what: &str,
    x: &mut B::Tensor,
    logits: &B::Tensor,
    experts: MoeExperts<'_, B::Weight>,
    s: &MoeShape,
    (n, h): (usize, usize),
    want: &[f32],
    tol: f64,
) {
    let eps = 1e-6;
    let r0 = b.quantize(&random(rng, n * h, 1.0));
    let nw = b.quantize(&random(rng, h, 1.0));
    let mut rdata = r0.clone();
    rdata.extend(std::iter::repeat_n(f32::NAN, h));
    let mut resid = tensor(b, n + 1, h, &rdata);
    let mut delta = b.alloc(n, h).unwrap();
    let w = weight(b, vec![h], &nw);
    b.moe_ffn_add_rms_norm(x, logits, experts, s, n, &mut delta, &mut resid, &w, eps)
        .unwrap_or_else(|e| panic!("{what} + add_rms_norm: {e}"));
    let sum: Vec<f32> = r0.iter().zip(want).map(|(r, d)| r + d).collect();
    let mut normed = vec![0.0f32; n * h];
    for t in 0..n {
        let row = &sum[t * h..(t + 1) * h];
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for i in 0..h {
            normed[t * h + i] = (row[i] as f64 * inv * nw[i] as f64) as f32;
        }
    }
    let label = format!("{} moe_ffn_add_rms_norm {what}", b.label());
    let got = b.to_host(&resid, n + 1).unwrap();
    assert_rows_only(&format!("{label} (residual)"), &got, &sum, tol);
    let got = b.to_host(x, n).unwrap();
    assert_close(&format!("{label} (normed)"), &got, &normed, tol);
}

fn case<B: TestBackend>(
    b: &mut B,
    rng: &mut ChaCha8Rng,
    what: &str,
    s: MoeShape,
    h: usize,
    logits: Vec<f32>,
) {
    let (ne, f) = (s.n_expert, s.expert_ff);
    let n = logits.len() / ne;
    let q = |b: &B, v: Vec<f32>| b.quantize(&v);
    let x = q(b, random(rng, n * h, 1.0));
    let logits = q(b, logits);
    let gate = q(b, random(rng, ne * f * h, 0.3));
    let up = q(b, random(rng, ne * f * h, 0.3));
    let down = q(b, random(rng, ne * h * f, 0.3));
    let sf = s.shared_ff;
    let shared = (sf > 0).then(|| {
        (
            q(b, random(rng, 2 * sf * h, 0.3)),
            q(b, random(rng, h * sf, 0.3)),
            q(b, random(rng, h, 0.5)),
        )
    });
    let want = reference(&x, &logits, (&gate, &up, &down), shared.as_ref(), &s, h);
    let (mut bx, bl) = (tensor(b, n, h, &x), tensor(b, n, ne, &logits));
    let wg = weight(b, vec![ne * f, h], &gate);
    let wu = weight(b, vec![ne * f, h], &up);
    let wd = weight(b, vec![ne * h, f], &down);
    let ws = shared.as_ref().map(|(gu, dn, g)| {
        (
            weight(b, vec![2 * sf, h], gu),
            weight(b, vec![h, sf], dn),
            weight(b, vec![h], g),
        )
    });
    let mut out = poisoned(b, n + 1, h);
    let experts = || MoeExperts {
        gate: &wg,
        up: &wu,
        down: &wd,
        shared: ws.as_ref().map(|(gate_up, down, gate)| SharedExpert {
            gate_up,
            down,
            gate,
        }),
        bias: None,
    };
    b.moe_ffn(&bx, &bl, experts(), &s, n, &mut out)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = b.to_host(&out, n + 1).unwrap();
    assert_rows_only(
        &format!("{} moe_ffn {what}", b.label()),
        &got,
        &want,
        b.tol(),
    );
    // The same FFN straight into the next norm (a GPU fuses the sum with it where the layer
    // has no shared expert).
    let tol = b.tol();
    check_add_norm(
        b,
        rng,
        what,
        &mut bx,
        &bl,
        experts(),
        &s,
        (n, h),
        &want,
        tol,
    );
}

fn moe<B: TestBackend>(b: &mut B) {
    let mut rng = rng("moe_ffn");
    let shape = |n_expert, top_k, expert_ff, norm_topk| MoeShape {
        n_expert,
        top_k,
        expert_ff,
        norm_topk,
        shared_ff: 0,
        act: MoeAct::Silu,
    };
    // Every expert chosen: row t prefers experts t and t + 1 (mod 8) by a wide margin.
    let (n, ne) = (19, 8);
    let mut l = random(&mut rng, n * ne, 0.5);
    for t in 0..n {
        l[t * ne + t % ne] += 6.0;
        l[t * ne + (t + 1) % ne] += 4.0;
    }
    case(
        b,
        &mut rng,
        "all experts used",
        shape(8, 2, 48, true),
        64,
        l,
    );
    // Most experts idle: every row prefers experts 5 and 2.
    let mut l = random(&mut rng, 7 * ne, 0.5);
    for t in 0..7 {
        l[t * ne + 5] += 6.0;
        l[t * ne + 2] += 3.0;
    }
    case(
        b,
        &mut rng,
        "six experts idle",
        shape(8, 2, 40, true),
        32,
        l,
    );
    // One decode row, raw softmax weights (Qwen3-MoE's norm_topk_prob false).
    let l = random(&mut rng, 16, 3.0);
    case(
        b,
        &mut rng,
        "one row, unnormalised",
        shape(16, 4, 32, false),
        96,
        l,
    );
    // Exact ties: equal logits pick the lowest indices.
    let mut l = vec![1.0; 3 * 6];
    l[6 + 4] = 2.0;
    case(b, &mut rng, "ties", shape(6, 3, 24, true), 32, l);
    // Qwen3-MoE's router shape: top 8 of 128 (four experts per lane of a 32-wide warp, most
    // experts idle at 3 rows, a few with more than one tile at 70). A GPU's `moe_prep` takes
    // 3 rows (24 assignments) in one warp, 5 rows (40) in its whole block.
    for n in [3, 5, 70] {
        let l = random(&mut rng, n * 128, 2.0);
        case(
            b,
            &mut rng,
            &format!("128 experts top 8, {n} rows"),
            shape(128, 8, 32, true),
            64,
            l,
        );
    }
    // Mixtral's shape class, top 1 and a wide batch.
    let l = random(&mut rng, 67 * 4, 4.0);
    case(b, &mut rng, "67 rows top 1", shape(4, 1, 56, false), 48, l);
    // Qwen2-MoE: top 4 of 8 unnormalised plus a shared expert, a batch and one row.
    let shared = MoeShape {
        shared_ff: 40,
        act: MoeAct::Silu,
        ..shape(8, 4, 24, false)
    };
    for n in [13, 1] {
        let l = random(&mut rng, n * 8, 2.0);
        case(
            b,
            &mut rng,
            &format!("shared expert {n} rows"),
            shared,
            64,
            l,
        );
    }
}
parity_test!(moe_ffn_grouped_experts, moe);

/// Quantized experts, each kind one stacked `[n_expert * rows, cols]` matrix in the file's
/// type (as a 3-D GGUF `ffn_*_exps` tensor arrives), against the same experts dequantized to
/// f32 on the CPU. The CPU's own quantized path multiplies 8-bit activations, hence its
/// looser tolerance; a GPU in f32 dequantizes in registers and accumulates in f32, in bf16
/// it multiplies 8-bit activations (blocks of 32) by dp4a. A GPU also runs Qwen3-30B-A3B's
/// expert shape (hidden 2048, expert width 768: 32 lanes per gate/up column, 16 per Q6_K
/// down column) at 1 row (most experts idle), 5 and 40 (several tiles per expert), and 64
/// experts top 8 at 70 rows (the dp4a tiles' bucket of 8 slots; 11 rows of 4 experts take
/// bucket 4's second pass). Up to 8 rows one `moe_prep` block routes and quantizes x (1, 5
/// and 8 rows here, up to 32 assignments one warp of it routing and aligning, 8 rows all 32
/// lanes; 11 rows take the separate route, align and `quantize_x` launches), and at 1 row the
/// down tiles quantize their activations themselves (`moe8_down_self_*`).
fn moe_quant<B: TestBackend>(b: &mut B) {
    use kiln::backend::HostTensor;
    use kiln::backend::cpu::CpuBackend;
    use kiln::backend::quant::GgmlType;
    let mut rng = rng("moe_ffn_quant");
    let mut reference = CpuBackend::with_f32_weights();
    let mut shapes = vec![(4, 2, 256, 256, vec![11, 1, 40])];
    if b.label() != "cpu" {
        shapes.push((8, 4, 768, 2048, vec![1, 5, 8, 40]));
        shapes.push((64, 8, 256, 256, vec![70]));
    }
    // The CPU's 8-bit activations (one scale per 256, as llama.cpp's Q8_K) are quantized twice
    // here, before gate/up and before down: over 1,000 seeds the worst case (one row of Q6_K/Q5_K
    // experts) reached 3.8e-2, median 1.6e-2 (with weights of zero mean: `random_blocks`). A
    // wrong expert or dequantization is off by order 1.
    let tol = if b.label() == "cpu" {
        7e-2
    } else {
        b.tol().max(1e-4)
    };
    fn experts<W>(w: &[W]) -> MoeExperts<'_, W> {
        MoeExperts {
            gate: &w[0],
            up: &w[1],
            down: &w[2],
            shared: None,
            bias: None,
        }
    }
    let types = [
        (GgmlType::Q8_0, GgmlType::Q8_0),
        (GgmlType::Q4_0, GgmlType::Q6K),
        (GgmlType::Q4K, GgmlType::Q6K),
        (GgmlType::Q5K, GgmlType::Q4K),
        (GgmlType::Q6K, GgmlType::Q5K),
    ];
    for ((tgu, td), (ne, top_k, f, h, rows)) in types
        .into_iter()
        .flat_map(|t| shapes.iter().map(move |sh| (t, sh.clone())))
    {
        // The wide shape in the types of a Q4_K_M and a Q8_0 file only.
        if h > 256 && !matches!(tgu, GgmlType::Q4K | GgmlType::Q8_0) {
            continue;
        }
        let s = MoeShape {
            n_expert: ne,
            top_k,
            expert_ff: f,
            norm_topk: true,
            shared_ff: 0,
            act: MoeAct::Silu,
        };
        let mut mk = |ty, rows, cols| {
            HostTensor::raw(
                vec![rows, cols],
                ty,
                random_blocks(&mut rng, ty, rows, cols),
            )
            .unwrap()
        };
        let host = [mk(tgu, ne * f, h), mk(tgu, ne * f, h), mk(td, ne * h, f)];
        let bw: Vec<_> = host
            .iter()
            .map(|w| b.upload_weight(w.clone()).expect("upload"))
            .collect();
        let rw: Vec<_> = host
            .iter()
            .map(|w| reference.upload_weight(w.clone()).unwrap())
            .collect();
        for &n in &rows {
            let x = b.quantize(&random(&mut rng, n * h, 1.0));
            let l = b.quantize(&random(&mut rng, n * ne, 2.0));
            let (mut bx, bl) = (tensor(b, n, h, &x), tensor(b, n, ne, &l));
            let mut out = poisoned(b, n + 1, h);
            let what = format!(
                "{} moe_ffn {tgu}/{td} experts {ne}x{f}x{h}, {n} rows",
                b.label()
            );
            b.moe_ffn(&bx, &bl, experts(&bw), &s, n, &mut out)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let (rx, rl) = (
                tensor(&mut reference, n, h, &x),
                tensor(&mut reference, n, ne, &l),
            );
            let mut rout = reference.alloc(n, h).unwrap();
            reference
                .moe_ffn(&rx, &rl, experts(&rw), &s, n, &mut rout)
                .unwrap();
            let want = reference.to_host(&rout, n).unwrap();
            assert_rows_only(&what, &b.to_host(&out, n + 1).unwrap(), &want, tol);
            let ex = experts(&bw);
            check_add_norm(b, &mut rng, &what, &mut bx, &bl, ex, &s, (n, h), &want, tol);
        }
    }
}
parity_test!(moe_ffn_quantized_experts, moe_quant);

/// gpt-oss's experts against the CPU backend: per-expert gate/up biases before the clamped
/// SwiGLU (`g = min(g, limit)`, `u = clamp(u, -limit, limit)`, `g * sigmoid(alpha g) * (u +
/// 1)`) and down biases before the routing weight, with limits the products pass often (2 on
/// products of spread ~1.6, and gpt-oss's 7 on gate rows 4x wider), in float experts (the
/// dense tiles) and quantized ones (Q8_0 at widths that are not whole 128-column tiles, Q4_K
/// at widths that are): 1 row (`moe_prep`, the self-quantizing down tiles), 16 and 64 rows
/// (route + align; at 64 rows of 8 experts top 4 the tensor-core tiles where the widths
/// allow) and a 300-row prefill, each also into the fused `moe_ffn_add_rms_norm`. The
/// reference's own result without the clamp and without the biases must differ from it, so
/// a backend that skipped either would fail.
fn moe_gptoss<B: TestBackend>(b: &mut B) {
    use kiln::backend::cpu::CpuBackend;
    use kiln::backend::quant::GgmlType;
    use kiln::backend::{HostTensor, MoeBias};
    let mut rng = rng("moe_ffn_gptoss");
    let mut cpu = CpuBackend::with_f32_weights();
    let gpu = b.label() != "cpu";
    let rows: &[usize] = if gpu { &[1, 16, 64, 300] } else { &[1, 16] };
    // (gate/up and down types, None: float; experts, top k, expert width, hidden, gate
    // scale, limit)
    let kinds = [
        (None, 8, 4, 96, 128, 0.3, 2.0),
        (None, 8, 4, 128, 128, 1.2, 7.0),
        (
            Some((GgmlType::Q8_0, GgmlType::Q8_0)),
            8,
            4,
            192,
            384,
            0.3,
            2.0,
        ),
        (
            Some((GgmlType::Q4K, GgmlType::Q4K)),
            8,
            4,
            256,
            256,
            0.3,
            2.0,
        ),
    ];
    for (types, ne, top_k, f, h, gscale, limit) in kinds {
        let s = MoeShape {
            n_expert: ne,
            top_k,
            expert_ff: f,
            norm_topk: true,
            shared_ff: 0,
            act: MoeAct::ClampedSwiglu {
                alpha: 1.702,
                limit,
            },
        };
        let mut mk = |ty: Option<GgmlType>, r, c, scale| match ty {
            Some(ty) => HostTensor::raw(vec![r, c], ty, random_blocks(&mut rng, ty, r, c)).unwrap(),
            None => HostTensor::new(vec![r, c], b.quantize(&random(&mut rng, r * c, scale))),
        };
        let (tgu, td) = types.map_or((None, None), |(g, d)| (Some(g), Some(d)));
        let host = [
            mk(tgu, ne * f, h, gscale),
            mk(tgu, ne * f, h, 0.3),
            mk(td, ne * h, f, 0.3),
            mk(None, ne, f, 1.0),
            mk(None, ne, f, 1.0),
            mk(None, ne, h, 0.5),
        ];
        let bw: Vec<_> = host
            .iter()
            .map(|w| b.upload_weight(w.clone()).expect("upload"))
            .collect();
        let cw: Vec<_> = host
            .iter()
            .map(|w| cpu.upload_weight(w.clone()).unwrap())
            .collect();
        fn experts<W>(w: &[W], bias: bool) -> MoeExperts<'_, W> {
            MoeExperts {
                gate: &w[0],
                up: &w[1],
                down: &w[2],
                shared: None,
                bias: bias.then(|| MoeBias {
                    gate: &w[3],
                    up: &w[4],
                    down: &w[5],
                }),
            }
        }
        // As moe_quant: the CPU's own quantized experts multiply 8-bit activations.
        let tol = match (types.is_some(), gpu) {
            (true, false) => 7e-2,
            (true, true) => b.tol().max(1e-4),
            (false, _) => b.tol(),
        };
        for &n in rows {
            let x = b.quantize(&random(&mut rng, n * h, 1.0));
            let l = b.quantize(&random(&mut rng, n * ne, 2.0));
            let what = format!(
                "{} moe_ffn gpt-oss {types:?} experts {ne}x{f}x{h} limit {limit}, {n} rows",
                b.label()
            );
            let (cx, cl) = (tensor(&mut cpu, n, h, &x), tensor(&mut cpu, n, ne, &l));
            let mut reference = |s: &MoeShape, bias: bool| {
                let mut out = cpu.alloc(n, h).unwrap();
                cpu.moe_ffn(&cx, &cl, experts(&cw, bias), s, n, &mut out)
                    .unwrap_or_else(|e| panic!("{what} (cpu): {e}"));
                cpu.to_host(&out, n).unwrap()
            };
            let want = reference(&s, true);
            // The clamp and the biases both matter here.
            let unclamped = MoeShape {
                act: MoeAct::ClampedSwiglu {
                    alpha: 1.702,
                    limit: 1e30,
                },
                ..s
            };
            for (other, why) in [
                (reference(&unclamped, true), "without the clamp"),
                (reference(&s, false), "without the biases"),
            ] {
                let (mut num, mut den) = (0.0f64, 0.0f64);
                for (o, w) in other.iter().zip(&want) {
                    num += (*o as f64 - *w as f64).powi(2);
                    den += (*w as f64).powi(2);
                }
                let moved = (num / den.max(1e-30)).sqrt();
                assert!(
                    moved > 3.0 * tol,
                    "{what}: the reference {why} differs by only {moved:.3e}"
                );
            }
            let (mut bx, bl) = (tensor(b, n, h, &x), tensor(b, n, ne, &l));
            let mut out = poisoned(b, n + 1, h);
            b.moe_ffn(&bx, &bl, experts(&bw, true), &s, n, &mut out)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_rows_only(&what, &b.to_host(&out, n + 1).unwrap(), &want, tol);
            let ex = experts(&bw, true);
            check_add_norm(b, &mut rng, &what, &mut bx, &bl, ex, &s, (n, h), &want, tol);
        }
    }
}
parity_test!(moe_ffn_gptoss_experts, moe_gptoss);

/// Expert biases of the wrong shape are refused by name.
fn moe_bias_shape<B: TestBackend>(b: &mut B) {
    use kiln::backend::MoeBias;
    let (ne, f, h, n) = (4, 32, 64, 2);
    let s = MoeShape {
        n_expert: ne,
        top_k: 2,
        expert_ff: f,
        norm_topk: true,
        shared_ff: 0,
        act: MoeAct::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0,
        },
    };
    let mut rng = rng("moe_bias_shape");
    let mut w = |r: usize, c: usize| weight(b, vec![r, c], &random(&mut rng, r * c, 0.3));
    let (wg, wu, wd) = (w(ne * f, h), w(ne * f, h), w(ne * h, f));
    let (bg, bu, bad) = (w(ne, f), w(ne, f), w(ne, f));
    let x = tensor(b, n, h, &vec![0.5; n * h]);
    let l = tensor(b, n, ne, &vec![0.1; n * ne]);
    let mut out = poisoned(b, n, h);
    let experts = MoeExperts {
        gate: &wg,
        up: &wu,
        down: &wd,
        shared: None,
        bias: Some(MoeBias {
            gate: &bg,
            up: &bu,
            down: &bad,
        }),
    };
    let err = b
        .moe_ffn(&x, &l, experts, &s, n, &mut out)
        .expect_err("down biases [4, 32] for hidden 64");
    assert!(
        err.to_string().contains("bias"),
        "{}: the error names the biases: {err}",
        b.label()
    );
}
parity_test!(moe_ffn_bias_of_the_wrong_shape_is_refused, moe_bias_shape);
