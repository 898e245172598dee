//! The ROCm backend where no AMD GPU is present (CI), with the `rocm` feature:
//! - hipRTC compiles every kernel compile unit, exactly as a ROCm lane compiles it at start
//!   (same text, same options from `Hip::compile_options`), for gfx90a (CDNA2, wave64), and
//!   every whole source for gfx1030 (RDNA2, wave32), in both storage types, into AMDGPU code
//!   objects defining every entry point the backend loads. hipRTC needs no device: the
//!   target is an option.
//! - Without a device, `Hip::available`, `GpuBackend::<Hip>::new` and an engine on
//!   `rocm:0` fail with a clear error instead of panicking; a tensor-parallel lane on
//!   `rocm:0` without RCCL is refused at start naming `librccl`.
//!
//! Without the feature, `rocm:0` reports that the backend is not compiled in.

use kiln::engine::{Device, Engine, EngineConfig};
use kiln::model::{LoadFormat, ModelFiles};

fn files() -> ModelFiles {
    ModelFiles::open(&kiln::config::default_model_path(), LoadFormat::Gguf).unwrap()
}

/// The error an engine on `rocm:0` starts with, or `None` if it starts.
fn rocm_engine_error() -> Option<String> {
    let dev: Device = "rocm:0".parse().unwrap();
    Engine::start(files(), &[dev], EngineConfig::default())
        .err()
        .map(|e| e.to_string())
}

#[cfg(not(feature = "rocm"))]
#[test]
fn rocm_device_without_the_feature_is_not_compiled() {
    let e = rocm_engine_error().expect("a rocm lane cannot start without the rocm feature");
    assert!(
        e.contains("'rocm' is not compiled into this build"),
        "unclear error: {e}"
    );
}

#[cfg(feature = "rocm")]
mod rocm {
    use std::path::Path;

    use kiln::backend::gpu::runtime::{DeviceInfo, Runtime};
    use kiln::backend::rocm::{DType, Hip, RocmBackend, RocmOptions, kernels};

    /// Whether this machine exposes the ROCm compute interface at all.
    fn has_kfd() -> bool {
        Path::new("/dev/kfd").exists()
    }

    #[test]
    fn without_a_device_rocm_fails_cleanly() {
        let opts = RocmOptions {
            kernel_cache: None,
            ..RocmOptions::default()
        };
        match Hip::available() {
            Ok(()) => {
                // A real AMD GPU: the backend must come up.
                RocmBackend::new(0, opts).expect("a ROCm device is visible, so rocm:0 starts");
            }
            Err(e) => {
                let e = e.to_string();
                if !has_kfd() {
                    assert!(
                        e.contains("no ROCm device is visible") && e.contains("/dev/kfd"),
                        "unclear error without /dev/kfd: {e}"
                    );
                }
                let b = RocmBackend::new(0, opts)
                    .err()
                    .expect("no device: new must fail");
                assert!(b.to_string().contains(&e), "backend error {b} lost '{e}'");
                let engine = super::rocm_engine_error().expect("no device: the engine must fail");
                assert!(engine.contains(&e), "engine error {engine} lost '{e}'");
            }
        }
    }

    /// A tensor-parallel ROCm lane starts only with RCCL and its GPUs: without librccl (CI)
    /// it is refused at start naming the library, without the GPUs naming them; no shard
    /// waits for the others.
    #[test]
    fn a_tensor_parallel_rocm_lane_needs_rccl_and_its_gpus() {
        use kiln::backend::rocm::collectives_available;
        let cfg = super::EngineConfig {
            tensor_parallel_size: 2,
            kv_blocks: Some(64),
            ..Default::default()
        };
        let dev: super::Device = "rocm:0".parse().unwrap();
        let started = super::Engine::start(super::files(), &[dev], cfg);
        match collectives_available() {
            Err(why) => {
                assert!(why.contains("librccl"), "{why}");
                let e = started.err().expect("no RCCL: the lane must not start");
                let e = e.to_string();
                assert!(
                    e.contains(&why) && e.contains("tensor-parallel group of 2 on ROCm"),
                    "{e}"
                );
            }
            Ok(()) if RocmBackend::device_count() < 2 => {
                let e = started
                    .err()
                    .expect("fewer than 2 GPUs: the lane must not start");
                let e = e.to_string();
                assert!(e.contains("needs ROCm devices [0, 1]"), "{e}");
            }
            Ok(()) => {
                started.expect("RCCL and 2 AMD GPUs: the TP 2 lane starts");
            }
        }
    }

    /// ELF `e_machine` of AMDGPU code objects.
    const EM_AMDGPU: u16 = 224;
    /// `e_flags` (`hsa/amd_hsa_elf.h`, code object v4): `EF_AMDGPU_MACH_AMDGCN_GFX90A` (0x3f)
    /// | `FEATURE_XNACK_OFF_V4` (0x200) | `FEATURE_SRAMECC_ON_V4` (0xc00).
    const GFX90A_SRAMECC_ON_XNACK_OFF: u32 = 0xe3f;
    /// `EF_AMDGPU_MACH_AMDGCN_GFX1030`; RDNA2 supports neither feature.
    const GFX1030: u32 = 0x036;

    /// Compiles every source for `arch` (as a device reports it) in storage type `dt`, in
    /// parallel as `Kernels::load` does, and checks each code object: an AMDGPU ELF whose
    /// `e_flags` (target `EF_AMDGPU_MACH_*` in the low byte, xnack/sramecc feature bits
    /// above) are `flags`, defining every entry point of `dt` and none of the other type.
    /// `units`: each compile unit exactly as the backend compiles it (a large source once
    /// per weight type or head size), each defining its own entry points and no other
    /// unit's; else each whole source (every part; half the compiles, so one target each).
    fn compile_all(arch: &str, warp: usize, flags: u32, dt: DType, units: bool) {
        let list = |dt| match units {
            true => kernels::units(dt),
            false => kernels::sources(dt)
                .into_iter()
                .map(|(f, t, e)| (f.to_string(), t, e))
                .collect(),
        };
        let info = DeviceInfo {
            name: format!("(none: hipRTC only, {arch})"),
            arch: arch.to_string(),
            sm_count: 1,
            warp_size: warp,
            driver_version: 0,
        };
        let mut opts =
            kernels::compile_options::<Hip>(&info, dt, &kiln::backend::GpuTuning::default());
        assert!(opts.contains(&format!("--offload-arch={arch}")), "{opts:?}");
        // The backend's options, then -O0 (the last -O wins): what this checks (hipRTC's
        // front end with its implicit includes, each unit's defines, the target's code object
        // and its entry points) does not depend on the optimizer, and the optimized code of
        // every source for both targets is hipcc's stage of CI (scripts/compile_kernels_hip.sh,
        // the same LLVM, -O3 -Werror). At -O3 these four compiles took 1,052 s of CI's 2 cores.
        assert!(opts.iter().any(|o| o == "-O3"), "{opts:?}");
        opts.push("-O0".to_string());
        let sources = list(dt);
        let other = if dt == DType::F32 {
            DType::Bf16
        } else {
            DType::F32
        };
        let other_type: Vec<String> = list(other).into_iter().flat_map(|(_, _, e)| e).collect();
        let start = std::time::Instant::now();
        let images: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = sources
                .iter()
                .map(|(file, text, _)| {
                    let opts = &opts;
                    s.spawn(move || (Hip::compile(text, file, opts), start.elapsed()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let failures: Vec<String> = sources
            .iter()
            .zip(images)
            .filter_map(|((file, _, entries), (image, took))| {
                let problems = match image {
                    Ok(image) => {
                        eprintln!(
                            "hiprtc {arch} {dt:?} {file}: {} bytes, done at {:.1}s",
                            image.len(),
                            took.as_secs_f64()
                        );
                        let other_units = sources
                            .iter()
                            .filter(|(f, _, _)| f != file)
                            .flat_map(|(_, _, e)| e.iter().cloned());
                        let others: Vec<String> =
                            other_type.iter().cloned().chain(other_units).collect();
                        check_image(&image, flags, entries, &others)
                    }
                    Err(e) => vec![e.to_string()],
                };
                (!problems.is_empty())
                    .then(|| format!("hipRTC {arch} {dt:?} {file}:\n{}", problems.join("\n")))
            })
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// What is wrong with one code object (nothing: empty).
    fn check_image(image: &[u8], flags: u32, entries: &[String], other: &[String]) -> Vec<String> {
        if image.len() < 52 || !image.starts_with(b"\x7fELF") {
            return vec![format!("not an ELF ({} bytes)", image.len())];
        }
        let mut problems = Vec::new();
        let machine = u16::from_le_bytes([image[18], image[19]]);
        if machine != EM_AMDGPU {
            problems.push(format!("e_machine {machine}: not an AMDGPU code object"));
        }
        let e_flags = u32::from_le_bytes([image[48], image[49], image[50], image[51]]);
        if e_flags & 0xfff != flags {
            problems.push(format!("e_flags {e_flags:#x}: built for another target"));
        }
        if entries.is_empty() {
            problems.push("no entry points expected: wrong source list".into());
        }
        // Each kernel has a kernel descriptor symbol `<name>.kd` in the string table.
        let mut kds = std::collections::HashSet::new();
        for (at, _) in image.windows(4).enumerate().filter(|(_, w)| w == b".kd\0") {
            let start = image[..at]
                .iter()
                .rposition(|&b| b == 0)
                .map_or(0, |i| i + 1);
            kds.insert(String::from_utf8_lossy(&image[start..at]).into_owned());
        }
        for e in entries.iter().filter(|e| !kds.contains(*e)) {
            problems.push(format!("kernel {e} missing"));
        }
        for e in other
            .iter()
            .filter(|e| !entries.contains(e) && kds.contains(*e))
        {
            problems.push(format!(
                "{e} built here: it belongs to another unit or the other storage type"
            ));
        }
        problems
    }

    #[test]
    fn hiprtc_compiles_every_kernel_gfx90a_f32() {
        compile_all(
            "gfx90a:sramecc+:xnack-",
            64,
            GFX90A_SRAMECC_ON_XNACK_OFF,
            DType::F32,
            true,
        );
    }

    #[test]
    fn hiprtc_compiles_every_kernel_gfx90a_bf16() {
        compile_all(
            "gfx90a:sramecc+:xnack-",
            64,
            GFX90A_SRAMECC_ON_XNACK_OFF,
            DType::Bf16,
            true,
        );
    }

    #[test]
    fn hiprtc_compiles_every_kernel_gfx1030_f32() {
        compile_all("gfx1030", 32, GFX1030, DType::F32, false);
    }

    #[test]
    fn hiprtc_compiles_every_kernel_gfx1030_bf16() {
        compile_all("gfx1030", 32, GFX1030, DType::Bf16, false);
    }

    #[test]
    fn hiprtc_reports_compile_errors_with_the_log() {
        let opts = vec!["--offload-arch=gfx90a".to_string()];
        let e = Hip::compile("this is not C++;", "broken.cu", &opts)
            .expect_err("garbage must not compile")
            .to_string();
        assert!(
            e.contains("broken.cu") && e.contains("hiprtcCompileProgram") && e.contains("error"),
            "{e}"
        );
        assert!(Hip::compiler_version().starts_with("hiprtc "));
    }
}
