//! Build script: kernels are embedded with `include_str!` and compiled at run time by
//! NVRTC/hipRTC, so building needs no GPU toolchain; rebuild when their sources change.
//! With the `rocm` feature, links the HIP runtime (`libamdhip64`, Debian's libamdhip64-dev
//! or a ROCm install under `$ROCM_PATH`, default `/opt/rocm`); hipRTC and rocBLAS are
//! loaded at run time.
fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ROCM_PATH");
    if std::env::var_os("CARGO_FEATURE_ROCM").is_some() {
        let root = std::env::var("ROCM_PATH").unwrap_or_else(|_| "/opt/rocm".into());
        let lib = std::path::Path::new(&root).join("lib");
        if lib.is_dir() {
            println!("cargo:rustc-link-search=native={}", lib.display());
            // ROCm's own lib directory is not always on the loader path: record it (this
            // also lets hipRTC and rocBLAS be found there by dlopen).
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
        }
        println!("cargo:rustc-link-lib=dylib=amdhip64");
    }
}
