//! Kernel identity and loading: a typed enum of kernels mapped to their source file and
//! entry point, compiled by NVRTC for the present device at lane start, cached on disk by
//! (source hash, arch, driver, NVRTC version), and loaded once into a set the backend owns.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_int};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};

use super::DType;
use super::device::{Device, dev_err};
use crate::backend::BackendError;

const PRELUDE: &str = include_str!("../../../kernels/prelude.cuh");

/// A kernel source file under `kernels/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Embed,
    Norm,
    Rope,
    Kv,
    Activation,
    Attention,
    Sample,
}

impl Source {
    const ALL: [Source; 7] = [
        Source::Embed,
        Source::Norm,
        Source::Rope,
        Source::Kv,
        Source::Activation,
        Source::Attention,
        Source::Sample,
    ];

    fn file(self) -> &'static str {
        match self {
            Source::Embed => "embed.cu",
            Source::Norm => "norm.cu",
            Source::Rope => "rope.cu",
            Source::Kv => "kv.cu",
            Source::Activation => "activation.cu",
            Source::Attention => "attention.cu",
            Source::Sample => "sample.cu",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Source::Embed => include_str!("../../../kernels/embed.cu"),
            Source::Norm => include_str!("../../../kernels/norm.cu"),
            Source::Rope => include_str!("../../../kernels/rope.cu"),
            Source::Kv => include_str!("../../../kernels/kv.cu"),
            Source::Activation => include_str!("../../../kernels/activation.cu"),
            Source::Attention => include_str!("../../../kernels/attention.cu"),
            Source::Sample => include_str!("../../../kernels/sample.cu"),
        }
    }
}

/// Head sizes with a dedicated attention instantiation; `Any` takes any size up to 256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnHead {
    D64,
    D80,
    D96,
    D128,
    D256,
    Any,
}

impl AttnHead {
    /// Largest head size the generic variant handles.
    pub const MAX_ANY: usize = 256;

    pub fn for_head_dim(d: usize) -> AttnHead {
        match d {
            64 => AttnHead::D64,
            80 => AttnHead::D80,
            96 => AttnHead::D96,
            128 => AttnHead::D128,
            256 => AttnHead::D256,
            _ => AttnHead::Any,
        }
    }
    /// Query vectors per pass the variant is instantiated for, largest last.
    pub fn group_sizes(self) -> &'static [u32] {
        &[1, 4, 8]
    }
    fn tag(self) -> &'static str {
        match self {
            AttnHead::D64 => "64",
            AttnHead::D80 => "80",
            AttnHead::D96 => "96",
            AttnHead::D128 => "128",
            AttnHead::D256 => "256",
            AttnHead::Any => "any",
        }
    }
}

/// Every kernel the backend launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    Embed,
    GatherRows,
    RmsNorm,
    AddRmsNorm,
    Rope,
    WriteKv,
    SiluMul,
    AddBias,
    /// Paged attention for a head size, `qv` query vectors per pass.
    Attention {
        head: AttnHead,
        qv: u32,
    },
    AttnCombine,
    SamplePrep,
    SampleTopN,
    SamplePenalty,
    SamplePick,
}

impl Kernel {
    /// All kernels, in load order.
    pub fn all() -> Vec<Kernel> {
        let mut v = vec![
            Kernel::Embed,
            Kernel::GatherRows,
            Kernel::RmsNorm,
            Kernel::AddRmsNorm,
            Kernel::Rope,
            Kernel::WriteKv,
            Kernel::SiluMul,
            Kernel::AddBias,
            Kernel::AttnCombine,
            Kernel::SamplePrep,
            Kernel::SampleTopN,
            Kernel::SamplePenalty,
            Kernel::SamplePick,
        ];
        for head in [
            AttnHead::D64,
            AttnHead::D80,
            AttnHead::D96,
            AttnHead::D128,
            AttnHead::D256,
            AttnHead::Any,
        ] {
            v.extend(
                head.group_sizes()
                    .iter()
                    .map(|&qv| Kernel::Attention { head, qv }),
            );
        }
        v
    }

    /// The op name used in errors and metrics.
    pub fn op(self) -> &'static str {
        match self {
            Kernel::Embed => "embed",
            Kernel::GatherRows => "gather_rows",
            Kernel::RmsNorm => "rms_norm",
            Kernel::AddRmsNorm => "add_rms_norm",
            Kernel::Rope => "rope",
            Kernel::WriteKv => "write_kv",
            Kernel::SiluMul => "silu_mul",
            Kernel::AddBias => "add_bias",
            Kernel::Attention { .. } => "attention",
            Kernel::AttnCombine => "attn_combine",
            Kernel::SamplePrep => "sample_prep",
            Kernel::SampleTopN => "sample_topn",
            Kernel::SamplePenalty => "sample_penalty",
            Kernel::SamplePick => "sample_pick",
        }
    }

    fn source(self) -> Source {
        match self {
            Kernel::Embed | Kernel::GatherRows => Source::Embed,
            Kernel::RmsNorm | Kernel::AddRmsNorm => Source::Norm,
            Kernel::Rope => Source::Rope,
            Kernel::WriteKv => Source::Kv,
            Kernel::SiluMul | Kernel::AddBias => Source::Activation,
            Kernel::Attention { .. } | Kernel::AttnCombine => Source::Attention,
            Kernel::SamplePrep
            | Kernel::SampleTopN
            | Kernel::SamplePenalty
            | Kernel::SamplePick => Source::Sample,
        }
    }

    /// Entry point name for storage type `dt`.
    fn entry(self, dt: DType) -> String {
        let d = dt.suffix();
        match self {
            Kernel::Attention { head, qv } => format!("attn_{d}_d{}_q{qv}", head.tag()),
            Kernel::SampleTopN | Kernel::SamplePenalty => self.op().to_string(),
            _ => format!("{}_{d}", self.op()),
        }
    }
}

/// The loaded kernels of one backend. Modules stay loaded as long as this lives.
pub struct Kernels {
    funcs: HashMap<Kernel, CudaFunction>,
    _modules: Vec<Arc<CudaModule>>,
}

impl Kernels {
    /// Compiles (or reads from `cache_dir`) every source for `dev` and loads every kernel.
    /// A missing entry point is a startup error naming its op.
    pub fn load(
        dev: &Device,
        dt: DType,
        cache_dir: Option<&Path>,
    ) -> Result<Kernels, BackendError> {
        let opts = vec![
            format!("--gpu-architecture=sm_{}{}", dev.arch.0, dev.arch.1),
            format!("-DKILN_WARP_SIZE={}", dev.warp_size),
            format!("-DKILN_DTYPE_{}", dt.suffix().to_uppercase()),
            "--std=c++17".to_string(),
        ];
        let salt = format!(
            "{opts:?} driver {} nvrtc {:?}",
            dev.driver_version,
            nvrtc_version()
        );
        let images: Vec<Result<Vec<u8>, BackendError>> = std::thread::scope(|s| {
            let handles: Vec<_> = Source::ALL
                .iter()
                .map(|&src| {
                    let (opts, salt) = (&opts, &salt);
                    s.spawn(move || cached_compile(src, opts, salt, cache_dir))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(nvrtc_err("NVRTC compile thread panicked".into())))
                })
                .collect()
        });
        let mut modules = HashMap::new();
        for (src, image) in Source::ALL.iter().zip(images) {
            let module = dev
                .ctx
                .load_module(Ptx::from_binary(image?))
                .map_err(dev_err("load_module"))?;
            modules.insert(*src, module);
        }
        let mut funcs = HashMap::new();
        for k in Kernel::all() {
            let f = modules[&k.source()]
                .load_function(&k.entry(dt))
                .map_err(|_| BackendError::Unsupported {
                    backend: "cuda",
                    op: k.op(),
                    dtype: format!(
                        "{dt:?} (entry point {} missing in {})",
                        k.entry(dt),
                        k.source().file()
                    ),
                })?;
            funcs.insert(k, f);
        }
        Ok(Kernels {
            funcs,
            _modules: modules.into_values().collect(),
        })
    }

    /// Compiler resource use of every kernel: (kernel, registers per thread, local
    /// (spill) bytes per thread, static shared bytes per block).
    pub fn resources(&self) -> Vec<(Kernel, i32, i32, i32)> {
        let mut v: Vec<_> = self
            .funcs
            .iter()
            .map(|(k, f)| {
                let regs = f.num_regs().unwrap_or(-1);
                let local = f.local_size_bytes().unwrap_or(-1);
                let shared = f.shared_size_bytes().unwrap_or(-1);
                (*k, regs, local, shared)
            })
            .collect();
        v.sort_by_key(|r| format!("{:?}", r.0));
        v
    }

    /// The loaded function of `k`.
    pub fn get(&self, k: Kernel) -> Result<&CudaFunction, BackendError> {
        self.funcs.get(&k).ok_or(BackendError::Unsupported {
            backend: "cuda",
            op: k.op(),
            dtype: "any".into(),
        })
    }
}

fn nvrtc_err(message: String) -> BackendError {
    BackendError::Device {
        op: "nvrtc",
        message,
    }
}

fn nvrtc_version() -> (c_int, c_int) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints through valid pointers.
    let _ = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
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

const MAGIC: &[u8] = b"kiln-cubin-v1\n";

fn cached_compile(
    src: Source,
    opts: &[String],
    salt: &str,
    dir: Option<&Path>,
) -> Result<Vec<u8>, BackendError> {
    let text = format!("{PRELUDE}\n#line 1 \"{}\"\n{}", src.file(), src.text());
    let key = format!("{:016x}", fnv64(&[text.as_bytes(), salt.as_bytes()]));
    let path: Option<PathBuf> = dir.map(|d| {
        d.join(format!(
            "{}-{key}.cubin",
            src.file().trim_end_matches(".cu")
        ))
    });
    if let Some(p) = &path
        && let Ok(bytes) = std::fs::read(p)
    {
        let header = [MAGIC, key.as_bytes(), b"\n"].concat();
        if let Some(image) = bytes.strip_prefix(header.as_slice()) {
            return Ok(image.to_vec());
        }
    }
    let image = compile(&text, src.file(), opts)?;
    if let Some(p) = &path {
        store(p, &key, &image);
    }
    Ok(image)
}

/// Writes a cache entry atomically (temp file + rename); failures only cost a recompile.
fn store(path: &Path, key: &str, image: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = path.with_extension(format!("tmp{}-{nonce}", std::process::id()));
    let body = [MAGIC, key.as_bytes(), b"\n", image].concat();
    if std::fs::write(&tmp, body).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn compile(text: &str, name: &str, opts: &[String]) -> Result<Vec<u8>, BackendError> {
    let c_src = CString::new(text).map_err(|_| nvrtc_err(format!("{name}: NUL in source")))?;
    let c_name = CString::new(name).map_err(|_| nvrtc_err(format!("{name}: NUL in name")))?;
    let prog = nvrtc::create_program(&c_src, Some(&c_name))
        .map_err(|e| nvrtc_err(format!("{name}: {e:?}")))?;
    // SAFETY: `prog` was created above and is destroyed exactly once, below; the log and
    // CUBIN buffers are sized by NVRTC's own size queries before being filled.
    unsafe {
        let compiled = nvrtc::compile_program(prog, opts);
        let result = match compiled {
            Ok(()) => cubin(prog).map_err(|e| nvrtc_err(format!("{name}: {e}"))),
            Err(e) => {
                let log = nvrtc::get_program_log(prog)
                    .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                Err(nvrtc_err(format!("{name}: {e:?}\n{log}")))
            }
        };
        let _ = nvrtc::destroy_program(prog);
        result
    }
}

/// # Safety
/// `prog` must be a successfully compiled, live NVRTC program.
unsafe fn cubin(prog: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: per this function's contract; NVRTC writes the size, then exactly that many bytes.
    unsafe {
        nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .map_err(|e| format!("{e:?}"))?;
        let mut buf = vec![0u8; size];
        nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char)
            .result()
            .map_err(|e| format!("{e:?}"))?;
        Ok(buf)
    }
}

/// The default on-disk kernel cache: `$XDG_CACHE_HOME/kiln/kernels`, else `~/.cache/kiln/kernels`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("kiln").join("kernels"))
}
