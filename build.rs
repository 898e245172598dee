//! Build script: kernels are embedded with `include_str!` and compiled at run time by
//! NVRTC/hipRTC, so building needs no GPU toolchain; rebuild when their sources change.
fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=build.rs");
}
