//! What the device can do, parsed once when the backend opens it: vendor, architecture,
//! warp size, SM count and the features kernels and routes choose by (tensor cores for the
//! storage type, 8-bit tensor-core tiles, programmatic dependent launch).
//!
//! Every op family asks [`Caps`] instead of parsing `DeviceInfo::arch` or comparing the
//! runtime's name (matmul, moe and rope too: `self.caps.int8_mma` for the tiles'
//! tensor cores, `self.caps.warp` for the warp size).

use super::runtime::DeviceInfo;
use crate::backend::DType;
use crate::backend::tuning::{GpuTuning, Pdl};

/// The GPU's maker, from the runtime's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Vendor {
    Nvidia,
    Amd,
}

/// The device's capabilities for one backend (its storage type and tuning included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Caps {
    pub vendor: Vendor,
    /// `90` for `sm_90` and `sm_90a`; 0 for anything else (AMD targets).
    pub sm: u32,
    /// Threads per warp / wavefront: 32 on NVIDIA and RDNA, 64 on CDNA.
    pub warp: usize,
    /// Streaming multiprocessors / compute units (steers split-K).
    pub sms: usize,
    /// Attention may use the bf16 tensor-core kernels (`mma.sync`: NVIDIA sm_80 or newer,
    /// bf16 storage; f32 storage keeps the CUDA-core kernels, the parity reference).
    pub mma: bool,
    /// The tiled matmuls run on tensor cores (`KILN_QMMA_TC` in `kernels/qmma.cuh`, 8-bit
    /// tiles included): NVIDIA sm_80 or newer.
    pub int8_mma: bool,
    /// Programmatic dependent launch is available (NVIDIA sm_90+, a CUDA 12.3+ driver,
    /// whose graph capture keeps the programmatic edges) and not switched off
    /// ([`GpuTuning::pdl`]).
    pub pdl: bool,
}

/// `90` for `sm_90`, `90` for `sm_90a`; 0 for anything else (AMD targets).
fn sm_version(arch: &str) -> u32 {
    arch.strip_prefix("sm_")
        .map(|v| v.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Whether device `info` supports programmatic dependent launch (sm_90+, a driver of CUDA
/// 12.3+); the runtime's and the tuning's part are [`Caps::pdl`]'s.
pub(super) fn pdl_hardware(info: &DeviceInfo) -> bool {
    sm_version(&info.arch) >= 90 && info.driver_version >= 12030
}

impl Caps {
    /// The capabilities of device `info` under runtime `runtime` (`R::NAME`: `cuda`,
    /// `rocm`) for storage type `dt`.
    pub fn of(info: &DeviceInfo, runtime: &str, dt: DType, tuning: &GpuTuning) -> Caps {
        let vendor = match runtime {
            "cuda" => Vendor::Nvidia,
            _ => Vendor::Amd,
        };
        let sm = match vendor {
            Vendor::Nvidia => sm_version(&info.arch),
            Vendor::Amd => 0,
        };
        let nvidia80 = vendor == Vendor::Nvidia && sm >= 80;
        Caps {
            vendor,
            sm,
            warp: info.warp_size,
            sms: info.sm_count,
            mma: nvidia80 && dt == DType::Bf16,
            int8_mma: nvidia80,
            pdl: vendor == Vendor::Nvidia && pdl_hardware(info) && tuning.pdl != Pdl::Off,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(arch: &str, warp: usize, driver: i32) -> DeviceInfo {
        DeviceInfo {
            name: "test".into(),
            arch: arch.into(),
            sm_count: 132,
            warp_size: warp,
            driver_version: driver,
        }
    }

    #[test]
    fn caps_follow_the_architecture_the_dtype_and_the_tuning() {
        let t = GpuTuning::default();
        assert_eq!(sm_version("sm_90a"), 90);
        assert_eq!(sm_version("gfx90a"), 0);
        let h100 = Caps::of(&info("sm_90", 32, 12040), "cuda", DType::Bf16, &t);
        assert_eq!(
            (h100.vendor, h100.sm, h100.warp, h100.sms),
            (Vendor::Nvidia, 90, 32, 132)
        );
        assert!(h100.mma && h100.int8_mma && h100.pdl);
        let f32 = Caps::of(&info("sm_90", 32, 12040), "cuda", DType::F32, &t);
        assert!(!f32.mma && f32.int8_mma);
        let old_driver = Caps::of(&info("sm_90", 32, 12020), "cuda", DType::Bf16, &t);
        assert!(!old_driver.pdl);
        let a100 = Caps::of(&info("sm_80", 32, 12040), "cuda", DType::Bf16, &t);
        assert!(a100.mma && !a100.pdl);
        let t4 = Caps::of(&info("sm_75", 32, 12040), "cuda", DType::Bf16, &t);
        assert!(!t4.mma && !t4.int8_mma);
        let off = GpuTuning {
            pdl: Pdl::Off,
            ..GpuTuning::default()
        };
        assert!(!Caps::of(&info("sm_90", 32, 12040), "cuda", DType::Bf16, &off).pdl);
        let mi = Caps::of(&info("gfx90a", 64, 60000), "rocm", DType::Bf16, &t);
        assert_eq!((mi.vendor, mi.sm, mi.warp), (Vendor::Amd, 0, 64));
        assert!(!mi.mma && !mi.int8_mma && !mi.pdl);
    }
}
