//! The GPU backend's switches: every kernel-variant choice that can be changed for a
//! measurement or a workaround, as one typed value with its defaults. Filled once by
//! `config` (`[engine.gpu_tuning]` < `KILN_*` environment < `--gpu-tuning KEY=VALUE`) and
//! carried to the backend in [`super::GpuOptions`]; nothing below `config` reads the
//! environment, so two backends with different tuning can live in one process.

use std::path::PathBuf;

use serde::Deserialize;

/// A choice that defaults to the backend's own rule (by type, shape and device) and can be
/// forced either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Choice {
    /// The backend's rule.
    #[default]
    Auto,
    /// Never (`0`).
    Never,
    /// Everywhere it can run (`all`).
    All,
}

impl Choice {
    /// The forced value, or `rule` under [`Choice::Auto`].
    pub fn or(self, rule: bool) -> bool {
        match self {
            Choice::Auto => rule,
            Choice::Never => false,
            Choice::All => true,
        }
    }

    fn parse(v: &str) -> Result<Choice, String> {
        match v {
            "auto" | "" => Ok(Choice::Auto),
            "0" | "off" | "never" | "false" => Ok(Choice::Never),
            "all" => Ok(Choice::All),
            _ => Err(format!("`{v}`: expected auto, 0 or all")),
        }
    }
}

/// Programmatic dependent launch (NVIDIA sm_90+, CUDA 12.3+): which launches of a kernel
/// that waits for its predecessor ask for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pdl {
    /// Eager launches and graphs of small steps (the measured best).
    #[default]
    Auto,
    /// Eager launches and every graph.
    Graphs,
    /// Eager launches only.
    Eager,
    /// Never.
    Off,
}

/// NVRTC's threads per compile unit (`--split-compile`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NvrtcSplit {
    /// One per CPU for the units compiled after start-up, one each for the core units
    /// (which compile side by side).
    #[default]
    Auto,
    /// One thread for every unit.
    Off,
    /// At most this many threads for every unit.
    #[serde(untagged)]
    Threads(u32),
}

/// Every switch of the GPU backend. The defaults are what Kiln measured best; the others
/// exist for A/B measurements and tests of the variants.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuTuning {
    /// `KILN_QMMA_GLU`: a gate/up pair on the tensor-core tiles takes the matmul fused with
    /// SiLU-mul (`qmmaglu_*`); off: the stacked launch and `silu_mul`.
    pub qmma_glu: bool,
    /// `KILN_QMMA8`: which quantized batches take the 8-bit tiles (auto: Q8_0; `all`: every
    /// type and mix; `0`: none).
    pub qmma8: Choice,
    /// `KILN_QMMA_WIDE`: the 64-row tile in blocks of 128 columns (auto: where the plain
    /// blocks would leave SMs idle; `all`: every 64-row launch; `0`: never).
    pub qmma_wide: Choice,
    /// `KILN_QMMA_NORM`: a batch's residual matmul reduces its split-K parts, adds the
    /// residual and applies the next RMSNorm in one launch.
    pub qmma_norm: bool,
    /// `KILN_QDOT_NORM`: a one-row decode matmul leaves its residual norm to the quantized
    /// matmul that reads it.
    pub qdot_norm: bool,
    /// `KILN_QKV_ROPE`: a quantized qkv matmul ropes q and k and writes the KV cache itself.
    pub qkv_rope: bool,
    /// `KILN_ATTN_FUSE`: the decode attention merges its split-K parts itself (no
    /// `attn_combine` launch).
    pub attn_fuse: bool,
    /// `KILN_ATTN_MIN_SPLIT`: shortest context segment of a split-K attention part (a
    /// multiple of 64).
    pub attn_min_split: u32,
    /// `KILN_PDL`: programmatic dependent launch (`auto`, `graphs`, `eager`, `off`).
    pub pdl: Pdl,
    /// `KILN_UPLOAD_PINNED`: large weight uploads stage through page-locked memory (off:
    /// pageable memory).
    pub upload_pinned: bool,
    /// `KILN_NVRTC_SPLIT`: NVRTC threads per compile unit (`auto`, `off`, or a number).
    pub nvrtc_split: NvrtcSplit,
    /// `KILN_NVRTC_NICE`: CPU priority (0-19) of the compiles start-up waits for (the
    /// others always run at 19).
    pub nvrtc_nice: u8,
    /// `KILN_KERNEL_DIR`: a folder whose files (named as in `kernels/`) replace the
    /// built-in kernel sources (kernel work on a machine without a Rust toolchain).
    pub kernel_dir: Option<PathBuf>,
}

impl Default for GpuTuning {
    fn default() -> Self {
        Self {
            qmma_glu: true,
            qmma8: Choice::Auto,
            qmma_wide: Choice::Auto,
            qmma_norm: true,
            qdot_norm: true,
            qkv_rope: true,
            attn_fuse: true,
            attn_min_split: 64,
            pdl: Pdl::Auto,
            upload_pinned: true,
            nvrtc_split: NvrtcSplit::Auto,
            nvrtc_nice: 19,
            kernel_dir: None,
        }
    }
}

/// Each switch: its key (`[engine.gpu_tuning]`, `--gpu-tuning KEY=VALUE`) and its
/// environment variable.
pub const KEYS: [(&str, &str); 13] = [
    ("qmma_glu", "KILN_QMMA_GLU"),
    ("qmma8", "KILN_QMMA8"),
    ("qmma_wide", "KILN_QMMA_WIDE"),
    ("qmma_norm", "KILN_QMMA_NORM"),
    ("qdot_norm", "KILN_QDOT_NORM"),
    ("qkv_rope", "KILN_QKV_ROPE"),
    ("attn_fuse", "KILN_ATTN_FUSE"),
    ("attn_min_split", "KILN_ATTN_MIN_SPLIT"),
    ("pdl", "KILN_PDL"),
    ("upload_pinned", "KILN_UPLOAD_PINNED"),
    ("nvrtc_split", "KILN_NVRTC_SPLIT"),
    ("nvrtc_nice", "KILN_NVRTC_NICE"),
    ("kernel_dir", "KILN_KERNEL_DIR"),
];

fn flag(v: &str) -> Result<bool, String> {
    match v {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err(format!("`{v}`: expected 1 or 0")),
    }
}

impl GpuTuning {
    /// Sets switch `key` (one of [`KEYS`]) from its text form, as the environment and
    /// `--gpu-tuning` write it.
    pub fn set(&mut self, key: &str, v: &str) -> Result<(), String> {
        let v = v.trim();
        match key {
            "qmma_glu" => self.qmma_glu = flag(v)?,
            "qmma8" => self.qmma8 = Choice::parse(v)?,
            "qmma_wide" => self.qmma_wide = Choice::parse(v)?,
            "qmma_norm" => self.qmma_norm = flag(v)?,
            "qdot_norm" => self.qdot_norm = flag(v)?,
            "qkv_rope" => self.qkv_rope = flag(v)?,
            "attn_fuse" => self.attn_fuse = flag(v)?,
            "attn_min_split" => {
                self.attn_min_split = v.parse().map_err(|_| format!("`{v}`: expected a number"))?
            }
            "pdl" => {
                self.pdl = match v {
                    "auto" | "1" | "on" => Pdl::Auto,
                    "graphs" => Pdl::Graphs,
                    "eager" => Pdl::Eager,
                    "0" | "off" => Pdl::Off,
                    _ => return Err(format!("`{v}`: expected auto, graphs, eager or off")),
                }
            }
            "upload_pinned" => self.upload_pinned = flag(v)?,
            "nvrtc_split" => {
                self.nvrtc_split = match v {
                    "auto" => NvrtcSplit::Auto,
                    "off" => NvrtcSplit::Off,
                    n => NvrtcSplit::Threads(
                        n.parse()
                            .map_err(|_| format!("`{v}`: expected auto, off or a number"))?,
                    ),
                }
            }
            "nvrtc_nice" => {
                self.nvrtc_nice = v.parse().map_err(|_| format!("`{v}`: expected 0 to 19"))?
            }
            "kernel_dir" => self.kernel_dir = (!v.is_empty()).then(|| PathBuf::from(v)),
            _ => {
                let keys: Vec<&str> = KEYS.iter().map(|k| k.0).collect();
                return Err(format!(
                    "unknown switch `{key}` (one of {})",
                    keys.join(", ")
                ));
            }
        }
        self.check()
    }

    /// Rejects values the backend cannot take.
    pub fn check(&self) -> Result<(), String> {
        if self.attn_min_split < 64 || !self.attn_min_split.is_multiple_of(64) {
            return Err(format!(
                "attn_min_split {}: a multiple of 64 is needed",
                self.attn_min_split
            ));
        }
        if self.nvrtc_nice > 19 {
            return Err(format!("nvrtc_nice {}: 0 to 19", self.nvrtc_nice));
        }
        Ok(())
    }

    /// These switches with each environment variable of [`KEYS`] that `var` returns
    /// applied (`config` passes the process environment; tests pass their own).
    pub fn with_env(
        mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<GpuTuning, (&'static str, String)> {
        for (key, env) in KEYS {
            if let Some(v) = var(env) {
                self.set(key, &v).map_err(|m| (env, m))?;
            }
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_parses_and_the_environment_overrides_the_defaults() {
        let env = |k: &str| match k {
            "KILN_QMMA8" => Some("all".to_string()),
            "KILN_QDOT_NORM" => Some("0".to_string()),
            "KILN_PDL" => Some("eager".to_string()),
            "KILN_NVRTC_SPLIT" => Some("4".to_string()),
            "KILN_ATTN_MIN_SPLIT" => Some("128".to_string()),
            _ => None,
        };
        let t = GpuTuning::default().with_env(env).unwrap();
        assert_eq!(t.qmma8, Choice::All);
        assert!(!t.qdot_norm && t.qmma_norm);
        assert_eq!(t.pdl, Pdl::Eager);
        assert_eq!(t.nvrtc_split, NvrtcSplit::Threads(4));
        assert_eq!(t.attn_min_split, 128);
        // Every key has a text form `set` accepts.
        let value = |key: &str| match key {
            "qmma8" | "qmma_wide" => "all",
            "attn_min_split" => "192",
            "pdl" => "graphs",
            "nvrtc_split" => "off",
            "nvrtc_nice" => "5",
            "kernel_dir" => "/tmp/k",
            _ => "0",
        };
        let mut all = GpuTuning::default();
        for (key, _) in KEYS {
            all.set(key, value(key)).unwrap();
        }
        assert_ne!(all, GpuTuning::default());
        assert!(
            all.set("qmma9", "1")
                .unwrap_err()
                .contains("unknown switch")
        );
        assert!(all.set("attn_min_split", "100").is_err());
        let bad = GpuTuning::default().with_env(|k| (k == "KILN_PDL").then(|| "sometimes".into()));
        assert_eq!(bad.unwrap_err().0, "KILN_PDL");
    }

    #[test]
    fn the_config_table_takes_the_same_values() {
        let t: GpuTuning = toml::from_str(
            "qmma8 = \"never\"\nnvrtc_split = 8\npdl = \"graphs\"\nkernel_dir = \"/k\"",
        )
        .unwrap();
        assert_eq!(t.qmma8, Choice::Never);
        assert_eq!(t.nvrtc_split, NvrtcSplit::Threads(8));
        assert_eq!(t.pdl, Pdl::Graphs);
        assert_eq!(t.kernel_dir.as_deref(), Some(std::path::Path::new("/k")));
        assert!(toml::from_str::<GpuTuning>("qmma_glue = false").is_err());
    }
}
