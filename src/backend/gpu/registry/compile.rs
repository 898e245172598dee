//! How one unit compiles: the compiler options and cache salts, its thread at the lowest
//! CPU priority, and the disk cache (`backend::kernel_cache`) in front of the compiler.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::units::Unit;
use crate::backend::gpu::runtime::{DeviceInfo, Runtime};
use crate::backend::tuning::{GpuTuning, NvrtcSplit};
use crate::backend::{BackendError, DType, kernel_cache};

/// The compiler options and cache salts, for the core units and for the others
/// ([`core_options`]), the cache folder every unit of one backend shares, and the tuning
/// that reaches the compile threads (kernel folder, priority).
pub(super) struct CompileJob {
    opts: Vec<String>,
    salt: String,
    core_opts: Vec<String>,
    core_salt: String,
    dir: Option<PathBuf>,
    /// [`GpuTuning::kernel_dir`]: replacement kernel texts.
    pub(super) kernel_dir: Option<PathBuf>,
    /// [`GpuTuning::nvrtc_nice`]: the core units' CPU priority.
    nice: u8,
}

/// The options a start's core units compile with: the others' without NVRTC's split compile
/// (`--split-compile`, cuda_rt.rs: one unit's kernels optimized on threads of their own),
/// unless [`GpuTuning::nvrtc_split`] is set (`KILN_NVRTC_SPLIT`). The core units compile
/// all at once, more units than the machine has cores, and one thread each was ready
/// sooner: H100 (16 cores), Q4_K_M Llama-3-8B, an empty cache: kernels ready 1.51-1.60 s
/// after load against 1.48-1.87 s with `--split-compile=0` (first answer 2.04-2.12 s
/// against 2.17-2.54 s). The units that compile later, a few at a time, keep it
/// (`qmma.q4k`: 2.8-3.4 s against 6.4-7.4 s).
pub(super) fn core_options(opts: &[String], split: NvrtcSplit) -> Vec<String> {
    if split != NvrtcSplit::Auto {
        return opts.to_vec();
    }
    opts.iter()
        .filter(|o| !o.starts_with("--split-compile"))
        .cloned()
        .collect()
}

impl CompileJob {
    /// The options of every unit for the device `info` describes, storage type `dt`, and
    /// the cache folder `dir`.
    pub(super) fn new<R: Runtime>(
        info: &DeviceInfo,
        dt: DType,
        dir: Option<&Path>,
        tuning: &GpuTuning,
    ) -> CompileJob {
        let opts = compile_options::<R>(info, dt, tuning);
        let salt_of = |opts: &[String]| {
            format!(
                "{} {opts:?} {} driver {} {}",
                R::NAME,
                info.arch,
                info.driver_version,
                R::compiler_version()
            )
        };
        let core_opts = core_options(&opts, tuning.nvrtc_split);
        CompileJob {
            salt: salt_of(&opts),
            core_salt: salt_of(&core_opts),
            opts,
            core_opts,
            dir: dir.map(Path::to_path_buf),
            kernel_dir: tuning.kernel_dir.clone(),
            nice: tuning.nvrtc_nice,
        }
    }

    /// Compiles (or reads from the cache) `unit` on a thread of its own at the lowest CPU
    /// priority, logging how it went; `core`: with the core units' options.
    pub(super) fn spawn<R: Runtime>(
        self: Arc<Self>,
        unit: Unit,
        core: bool,
    ) -> Result<JoinHandle<Result<Compiled, BackendError>>, BackendError> {
        std::thread::Builder::new()
            .name(format!("kiln-nvrtc-{}", unit.name()))
            .spawn(move || {
                compile_priority(core.then_some(self.nice));
                let (opts, salt) = if core {
                    (&self.core_opts, &self.core_salt)
                } else {
                    (&self.opts, &self.salt)
                };
                let c =
                    cached_compile::<R>(unit, opts, salt, self.dir.as_deref(), &self.kernel_dir);
                if let Ok(c) = &c {
                    tracing::info!(
                        backend = R::NAME,
                        source = unit.name(),
                        cached = c.cached,
                        secs = c.secs,
                        bytes = c.image.len(),
                        "kernel source compiled"
                    );
                }
                c
            })
            .map_err(|e| compile_err::<R>(format!("cannot start a compile thread: {e}")))
    }
}

/// A source's code object and how it was made.
pub(super) struct Compiled {
    pub(super) image: Vec<u8>,
    /// Read from the kernel cache rather than compiled.
    cached: bool,
    /// Seconds the compile (or the cache read) took on its thread.
    secs: f64,
}

/// Lowers the calling thread's CPU priority to the least (Linux; elsewhere nothing), so the
/// compiles take the cores the weight upload leaves (with NVRTC's split-compile threads, a
/// cold start ran ~40 compile threads, and the upload on the lane's thread fell from 2.7 to
/// 0.7 GB/s on an H100 machine's 16 cores). `core_nice` ([`GpuTuning::nvrtc_nice`],
/// `KILN_NVRTC_NICE`, 0-19) gives a start's core units that nice instead, for measurements:
/// the upload's staging now fills every core for the first ~0.5 s of a start, and at nice
/// 19 the core units barely progress meanwhile (H100, Q4_K_M Llama-3-8B, an empty cache:
/// the smallest units finish only as the upload ends, and the longest, ~1 s of one core,
/// ends the wait ~1.5 s after load).
fn compile_priority(core_nice: Option<u8>) {
    let nice = core_nice.map_or(19, |n| i32::from(n).clamp(0, 19));
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread's own id; a failure leaves the priority.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

/// The compiler options of every kernel source for `info`'s device and storage type `dt`.
pub fn compile_options<R: Runtime>(
    info: &DeviceInfo,
    dt: DType,
    tuning: &GpuTuning,
) -> Vec<String> {
    let mut opts = R::compile_options(info, tuning);
    opts.push(format!("-DKILN_DTYPE_{}", dt.suffix().to_uppercase()));
    opts
}

pub(super) fn compile_err<R: Runtime>(message: String) -> BackendError {
    BackendError::Device {
        op: R::COMPILER,
        message,
    }
}

/// FNV-1a, 64 bits: stable across builds, unlike the std hasher.
fn fnv64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Compiles `unit` (its texts replaced from `kernel_dir` where set), or reads its image from
/// the disk cache under `dir` (checked; a file failing the check is recompiled and
/// overwritten: `backend::kernel_cache`).
fn cached_compile<R: Runtime>(
    unit: Unit,
    opts: &[String],
    salt: &str,
    dir: Option<&Path>,
    kernel_dir: &Option<PathBuf>,
) -> Result<Compiled, BackendError> {
    let t0 = Instant::now();
    let text = unit.text(kernel_dir.as_deref());
    let key = format!("{:016x}", fnv64(&[text.as_bytes(), salt.as_bytes()]));
    let path: Option<PathBuf> =
        dir.map(|d| d.join(format!("{}-{}-{key}.bin", R::NAME, unit.name())));
    let (image, cached) = kernel_cache::load_or_compile(path.as_deref(), &key, || {
        R::compile(&text, &unit.name(), opts).map_err(|e| compile_err::<R>(e.to_string()))
    })?;
    Ok(Compiled {
        image,
        cached,
        secs: t0.elapsed().as_secs_f64(),
    })
}
