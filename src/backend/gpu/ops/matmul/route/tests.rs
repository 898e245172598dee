//! The routing table: for each row count, weight type, device and compile state, the
//! path a matmul takes (printed, and asserted against the rules written out below).

use super::*;
use crate::backend::gpu::runtime::DeviceInfo;

struct P(Option<QType>, usize, usize);

impl PartFacts for P {
    fn q(&self) -> Option<QType> {
        self.0
    }
    fn row0(&self) -> usize {
        self.1
    }
    fn rows(&self) -> usize {
        self.2
    }
}

const K: usize = 4096;
/// Room of the dequant scratch: a 4096 x 4096 bf16 weight and more.
const ROOM: usize = 64 << 20;

/// The weights of the table: one type in one part of 4096 rows, the Q4_K_M qkv (Q4_K q
/// and k, a Q6_K v), or a dense bf16 matrix.
fn weights() -> Vec<(&'static str, Vec<P>)> {
    let one = |q| vec![P(Some(q), 0, K)];
    vec![
        ("q4_0", one(QType::Q4_0)),
        ("q4_k", one(QType::Q4K)),
        ("q5_k", one(QType::Q5K)),
        ("q6_k", one(QType::Q6K)),
        ("q8_0", one(QType::Q8_0)),
        ("mxfp4", one(QType::Mxfp4)),
        (
            "q4_k+q6_k",
            vec![
                P(Some(QType::Q4K), 0, K),
                P(Some(QType::Q4K), K, 1024),
                P(Some(QType::Q6K), K + 1024, 1024),
            ],
        ),
        ("bf16", vec![P(None, 0, K)]),
    ]
}

fn caps(arch: &str, sms: usize, warp: usize) -> Caps {
    let runtime = if arch.starts_with("sm_") {
        "cuda"
    } else {
        "rocm"
    };
    let info = DeviceInfo {
        name: arch.into(),
        arch: arch.into(),
        sm_count: sms,
        warp_size: warp,
        driver_version: 12040,
    };
    Caps::of(&info, runtime, DType::Bf16, &GpuTuning::default())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    Loaded,
    /// The 8-bit decode kernels above one row and the fused norms still compile.
    Rows8Pending,
    /// The tiles still compile.
    QmmaPending,
}

fn pending(s: State) -> impl Fn(Unit) -> bool {
    move |u: Unit| match s {
        State::Loaded => false,
        State::Rows8Pending => {
            u.src == Source::Qgemv && matches!(u.part, Part::Rows(..) | Part::Norm(_))
        }
        State::QmmaPending => u.src == Source::Qmma,
    }
}

fn operands(n: usize, parts: &[P]) -> Operands<'_, P> {
    Operands {
        n,
        x_cols: K,
        w_rows: parts.iter().map(|p| p.2).sum(),
        w_cols: K,
        parts,
        x_aligned: true,
        w_aligned: true,
    }
}

/// Today's routing, written out: dense weights stream 1-2 rows and take the BLAS
/// beyond; quantized 1-8 rows take the 8-bit decode kernels (any device; above one row
/// only once those units loaded, else the tiles take 2-8 rows), 9-256 rows the tiles
/// on a warp of 32 (the 8-bit tiles for Q8_0 on NVIDIA sm_80+), everything else
/// dequantizes for the BLAS.
fn expected(name: &str, arch: &str, warp: usize, s: State, n: usize) -> MatmulPath {
    if name == "bf16" {
        return match n {
            1 | 2 => MatmulPath::Gemv { rows: n as u32 },
            _ => MatmulPath::Blas,
        };
    }
    let decode = match s {
        State::Rows8Pending => n == 1,
        _ => n <= 8,
    };
    if decode {
        return MatmulPath::Qdot { rows: n as u32 };
    }
    let tiles = warp == 32 && n <= QMMA_MAX_ROWS && s != State::QmmaPending;
    if !tiles {
        return MatmulPath::DequantBlas;
    }
    let tile = if n <= 16 {
        16
    } else if n <= 32 {
        32
    } else {
        64
    };
    let x8 = name == "q8_0" && (arch == "sm_90");
    MatmulPath::Qmma { tile, x8 }
}

#[test]
fn the_matmul_routes_by_rows_type_device_and_compile_state() {
    let tuning = GpuTuning::default();
    let devices = [
        ("sm_90", caps("sm_90", 132, 32)),
        ("sm_75", caps("sm_75", 40, 32)),
        ("gfx90a", caps("gfx90a", 104, 64)),
        ("gfx1030", caps("gfx1030", 60, 32)),
    ];
    let states = [State::Loaded, State::Rows8Pending, State::QmmaPending];
    let mut cases = 0;
    for (arch, c) in &devices {
        for s in states {
            let route = Route {
                dt: DType::Bf16,
                caps: c,
                tuning: &tuning,
                gemv: true,
                room: ROOM,
                pending: pending(s),
            };
            for (name, parts) in weights() {
                for n in [1, 2, 4, 8, 9, 64, 300] {
                    let o = operands(n, &parts);
                    let path = route.matmul(&o);
                    let kernels: Vec<Kernel> = match path {
                        MatmulPath::Qmma { tile, x8 } => part_runs(o.parts)
                            .iter()
                            .map(|r| {
                                let cols = r.slots.iter().map(|(_, p)| p.2).sum();
                                route.qmma_kernel(tile, x8, r.q, r.mix, cols)
                            })
                            .collect(),
                        _ => Vec::new(),
                    };
                    println!("{arch:8} {s:?} {name:10} rows {n:3}: {path:?} {kernels:?}");
                    assert_eq!(
                        path,
                        expected(name, arch, c.warp, s, n),
                        "{arch} {s:?} {name} rows {n}"
                    );
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 4 * 3 * 8 * 7);
}

/// MXFP4 at gpt-oss's width (2880 columns: whole blocks of 32, not whole k-tiles of 128):
/// decode rows take the 8-bit kernels, batches the tiles with a partial last k-tile (another
/// type at that width dequantizes for the BLAS); the bf16 tiles, not the 8-bit ones, unless
/// asked.
#[test]
fn mxfp4_routes_by_its_width() {
    let h100 = caps("sm_90", 132, 32);
    let tuning = GpuTuning::default();
    let route = Route {
        dt: DType::Bf16,
        caps: &h100,
        tuning: &tuning,
        gemv: true,
        room: ROOM,
        pending: pending(State::Loaded),
    };
    let parts = [P(Some(QType::Mxfp4), 0, 2880)];
    let at = |n| Operands {
        n,
        x_cols: 2880,
        w_rows: 2880,
        w_cols: 2880,
        parts: &parts[..],
        x_aligned: true,
        w_aligned: true,
    };
    for (n, want) in [
        (1, MatmulPath::Qdot { rows: 1 }),
        (5, MatmulPath::Qdot { rows: 8 }),
        (
            9,
            MatmulPath::Qmma {
                tile: 16,
                x8: false,
            },
        ),
        (
            256,
            MatmulPath::Qmma {
                tile: 64,
                x8: false,
            },
        ),
        (257, MatmulPath::DequantBlas),
    ] {
        assert_eq!(route.matmul(&at(n)), want, "mxfp4 2880 rows {n}");
    }
    let q4 = [P(Some(QType::Q4_0), 0, 2880)];
    let q4_at = Operands {
        parts: &q4[..],
        ..at(64)
    };
    assert_eq!(route.matmul(&q4_at), MatmulPath::DequantBlas);
    let wide = [P(Some(QType::Mxfp4), 0, K)];
    assert_eq!(
        route.matmul(&operands(64, &wide)),
        MatmulPath::Qmma {
            tile: 64,
            x8: false
        }
    );
    assert_eq!(
        route.qmma_kernel(64, true, QType::Mxfp4, false, K),
        Kernel::Qmma {
            q: QType::Mxfp4,
            rows: 64,
            wide: false
        }
    );
    assert!(route.qmma_glu_takes(QType::Mxfp4));
}

#[test]
fn the_tiles_choose_8_bit_and_wide_kernels_and_the_tuning_overrides() {
    let h100 = caps("sm_90", 132, 32);
    let q8 = [P(Some(QType::Q8_0), 0, K)];
    let mix = [
        P(Some(QType::Q4K), 0, K),
        P(Some(QType::Q4K), K, 1024),
        P(Some(QType::Q6K), K + 1024, 1024),
    ];
    let mut tuning = GpuTuning::default();
    fn route<'a>(c: &'a Caps, t: &'a GpuTuning) -> Route<'a, impl Fn(Unit) -> bool + use<>> {
        Route {
            dt: DType::Bf16,
            caps: c,
            tuning: t,
            gemv: true,
            room: ROOM,
            pending: pending(State::Loaded),
        }
    }
    let r = route(&h100, &tuning);
    // The 8-bit tiles for Q8_0, no wide blocks (4096 columns: 64 wide blocks < 132 / 2
    // SMs... 2 * 32 < 132); a 14336-row gate/up is wide at 64 rows only.
    assert_eq!(
        r.qmma_kernel(64, true, QType::Q8_0, false, K),
        Kernel::Qmma8 {
            q: QType::Q8_0,
            rows: 64
        }
    );
    assert!(!r.qmma_wide(64, K) && r.qmma_wide(64, 2 * 14336) && !r.qmma_wide(32, 2 * 14336));
    assert_eq!(
        r.matmul(&operands(64, &mix)),
        MatmulPath::Qmma {
            tile: 64,
            x8: false
        }
    );
    // No room for x's 8-bit rows: the bf16 tiles.
    let tight = Route {
        room: 1024,
        ..route(&h100, &tuning)
    };
    assert_eq!(
        tight.matmul(&operands(64, &q8)),
        MatmulPath::Qmma {
            tile: 64,
            x8: false
        }
    );
    tuning.qmma8 = crate::backend::tuning::Choice::All;
    assert_eq!(
        route(&h100, &tuning).matmul(&operands(64, &mix)),
        MatmulPath::Qmma { tile: 64, x8: true }
    );
    tuning.qmma8 = crate::backend::tuning::Choice::Never;
    tuning.qmma_wide = crate::backend::tuning::Choice::All;
    let r = route(&h100, &tuning);
    assert_eq!(
        r.matmul(&operands(64, &q8)),
        MatmulPath::Qmma {
            tile: 64,
            x8: false
        }
    );
    assert!(r.qmma_wide(64, K) && !r.qmma_wide(16, K));
}

#[test]
fn the_fused_paths_route_like_their_matmul() {
    let h100 = caps("sm_90", 132, 32);
    let tuning = GpuTuning::default();
    let route = |s| Route {
        dt: DType::Bf16,
        caps: &h100,
        tuning: &tuning,
        gemv: true,
        room: ROOM,
        pending: pending(s),
    };
    let f = 14336;
    let gu = |q| [P(Some(q), 0, f), P(Some(q), f, f)];
    let glu = |s, q, n| {
        let parts = gu(q);
        route(s).glu(&operands(n, &parts), f)
    };
    let (q4k, q8) = (QType::Q4K, QType::Q8_0);
    assert_eq!(
        glu(State::Loaded, q4k, 1),
        GluPath::QdotSilu {
            q: q4k,
            rows: 1,
            takes_norm: true
        }
    );
    assert_eq!(
        glu(State::Rows8Pending, q4k, 1),
        GluPath::QdotSilu {
            q: q4k,
            rows: 1,
            takes_norm: false
        }
    );
    assert_eq!(
        glu(State::Loaded, q4k, 64),
        GluPath::QmmaGlu { q: q4k, tile: 64 }
    );
    // Q8_0 takes the 8-bit tiles, not the fused GLU; the tiles still compiling: unfused.
    assert_eq!(glu(State::Loaded, q8, 64), GluPath::Unfused);
    assert_eq!(glu(State::QmmaPending, q4k, 64), GluPath::Unfused);
    let dense = [P(None, 0, 2 * f)];
    assert_eq!(
        route(State::Loaded).glu(&operands(2, &dense), f),
        GluPath::GemvSilu { rows: 2 }
    );
    // The residual matmul (o_proj / down, 4096 rows) and its norm.
    let down = [P(Some(q4k), 0, K)];
    let nf = |across_ops| NormFacts {
        h: K,
        w_dense: true,
        across_ops,
    };
    let norm = |s, n, across| route(s).add_norm(&operands(n, &down), &nf(across));
    assert_eq!(norm(State::Loaded, 1, true), NormPath::QdotNorm { q: q4k });
    assert_eq!(norm(State::Loaded, 1, false), NormPath::Unfused);
    assert_eq!(norm(State::Rows8Pending, 1, true), NormPath::Unfused);
    assert_eq!(norm(State::Loaded, 16, true), NormPath::Unfused);
    assert_eq!(norm(State::Loaded, 64, true), NormPath::Tiles { tile: 64 });
    let q5k = [P(Some(QType::Q5K), 0, K)];
    let r = route(State::Loaded);
    assert_eq!(r.add_norm(&operands(1, &q5k), &nf(true)), NormPath::Unfused);
    // The qkv's rope: decode rows where the rope turns adjacent pairs, the tiles either way.
    let qkv = [
        P(Some(q4k), 0, K),
        P(Some(q4k), K, 1024),
        P(Some(QType::Q6K), K + 1024, 1024),
    ];
    let rope = |interleaved| RopeFacts {
        qkv_dim: K + 2048,
        head_dim: 128,
        rot_dim: 128,
        interleaved,
    };
    let qr = |n, i| r.qkv_rope(&operands(n, &qkv), &rope(i));
    assert_eq!(qr(1, true), Some(QkvPath::Decode(1)));
    assert_eq!(qr(1, false), None);
    assert_eq!(qr(9, false), Some(QkvPath::Tiles(16)));
    assert_eq!(qr(300, true), None);
}

/// The compile units whose kernels `path` (with `glu` / `norm` fused) launches.
fn units_of<F: Fn(Unit) -> bool>(
    r: &Route<'_, F>,
    o: &Operands<'_, P>,
    path: MatmulPath,
) -> Vec<Unit> {
    let runs = part_runs(o.parts);
    let mut ks = Vec::new();
    match path {
        MatmulPath::Qdot { rows } => {
            for run in &runs {
                let (q, mix) = (run.q, run.mix);
                ks.push(match mix {
                    true => Kernel::QdotMix { q, rows },
                    false => Kernel::Qdot { q, rows },
                });
                if r.qdot_takes_norm(o, rows) {
                    ks.push(match mix {
                        true => Kernel::QdotMixIn { q },
                        false => Kernel::QdotIn { q },
                    });
                }
            }
        }
        MatmulPath::Qgemv { rows } => {
            ks.extend(
                o.parts
                    .iter()
                    .filter_map(|p| p.0)
                    .map(|q| Kernel::Qgemv { q, rows }),
            );
        }
        MatmulPath::Qmma { tile, x8 } => {
            for run in &runs {
                let cols = run.slots.iter().map(|(_, p)| p.2).sum();
                ks.push(r.qmma_kernel(tile, x8, run.q, run.mix, cols));
            }
            ks.push(Kernel::QmmaReduce);
        }
        MatmulPath::DequantBlas => {
            ks.extend(
                o.parts
                    .iter()
                    .filter_map(|p| p.0)
                    .map(|q| Kernel::Dequant { q }),
            );
        }
        MatmulPath::Gemv { .. } | MatmulPath::Blas | MatmulPath::Empty => {}
    }
    ks.into_iter().map(|k| k.unit()).collect()
}

#[test]
fn no_route_waits_on_a_unit_the_planner_may_leave_for_later() {
    // For each compile unit of the matmul sources that `routes_around` lets the planner
    // compile after start-up: while it alone is pending, no route launches a kernel of
    // it (and some route takes another path meanwhile).
    let tuning = GpuTuning::default();
    let h100 = caps("sm_90", 132, 32);
    let mut later: Vec<Unit> = Kernel::all()
        .into_iter()
        .map(|k| k.unit())
        .filter(|&u| routes_around(u))
        .collect();
    later.dedup();
    assert!(later.iter().any(|u| u.src == Source::Qmma));
    assert!(later.iter().any(|u| matches!(u.part, Part::Rows(..))));
    assert!(later.iter().any(|u| matches!(u.part, Part::Norm(_))));
    let mut ws = weights();
    let q4k = Some(QType::Q4K);
    ws.push(("q4_k gate/up", vec![P(q4k, 0, K), P(q4k, K, K)]));
    let mut rerouted = 0;
    for unit in later {
        let route = |only: bool| Route {
            dt: DType::Bf16,
            caps: &h100,
            tuning: &tuning,
            gemv: true,
            room: ROOM,
            pending: move |u: Unit| only && u == unit,
        };
        let r = route(true);
        for (name, parts) in &ws {
            for n in [1, 2, 4, 8, 9, 64, 300] {
                let o = operands(n, parts);
                let matmul = r.matmul(&o);
                let mut used = units_of(&r, &o, matmul);
                match r.glu(&o, K) {
                    GluPath::QdotSilu {
                        q,
                        rows,
                        takes_norm,
                    } => {
                        used.push(Kernel::QdotSilu { q, rows }.unit());
                        if takes_norm {
                            used.push(Kernel::QdotSiluIn { q }.unit());
                        }
                    }
                    GluPath::QgemvSilu { q, rows } => {
                        used.push(Kernel::QgemvSilu { q, rows }.unit())
                    }
                    GluPath::QmmaGlu { q, tile } => {
                        let wide = r.qmma_wide(tile, 2 * K);
                        used.push(
                            Kernel::QmmaGlu {
                                q,
                                rows: tile,
                                wide,
                            }
                            .unit(),
                        );
                        used.push(Kernel::QmmaReduceGlu.unit());
                    }
                    GluPath::GemvSilu { .. } | GluPath::Unfused => {}
                }
                let nf = NormFacts {
                    h: o.w_rows,
                    w_dense: true,
                    across_ops: true,
                };
                match r.add_norm(&o, &nf) {
                    NormPath::QdotNorm { q } => used.push(Kernel::QdotNorm { q }.unit()),
                    NormPath::Tiles { tile } => {
                        used.extend(units_of(&r, &o, MatmulPath::Qmma { tile, x8: false }));
                        used.push(Kernel::QmmaReduceAddNorm.unit());
                    }
                    NormPath::Unfused => {}
                }
                assert!(!used.contains(&unit), "{name} rows {n} waits on {unit:?}");
                rerouted += usize::from(matmul != route(false).matmul(&o));
            }
        }
    }
    assert!(rerouted > 0);
}
