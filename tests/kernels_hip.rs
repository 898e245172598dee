//! Every kernel source of the typed kernel enum is compiled ahead of time for AMD by
//! `scripts/compile_kernels_hip.sh` (run in CI with Debian's hipcc), straight from
//! `kernels/`: the bytes NVRTC compiles are the bytes hipcc compiles.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `.cu` files named by the compile registry's source enum (`Source::file` and its
/// `include_str!`s).
fn enum_sources() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("src/backend/gpu/registry/units.rs"))
        .expect("src/backend/gpu/registry/units.rs");
    // Every `<name>.cu"` literal: `Source::file`'s names and the `include_str!` paths.
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    for (at, _) in text.match_indices(".cu\"") {
        let start = (0..at)
            .rev()
            .find(|&i| !(b[i].is_ascii_alphanumeric() || b[i] == b'_'))
            .map_or(0, |i| i + 1);
        if start < at {
            out.insert(format!("{}.cu", &text[start..at]));
        }
    }
    out
}

fn script_sources() -> BTreeSet<String> {
    let out = Command::new("bash")
        .arg(root().join("scripts/compile_kernels_hip.sh"))
        .arg("--list")
        .output()
        .expect("run scripts/compile_kernels_hip.sh --list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn every_enum_kernel_source_is_compiled_for_amd() {
    let enum_srcs = enum_sources();
    assert!(
        enum_srcs.len() >= 7,
        "kernel enum sources not found: {enum_srcs:?}"
    );
    let script = script_sources();
    let missing: Vec<_> = enum_srcs.difference(&script).collect();
    assert!(
        missing.is_empty(),
        "kernel sources of the enum not compiled by scripts/compile_kernels_hip.sh: {missing:?} \
         (it compiles {script:?})"
    );
    for s in &enum_srcs {
        assert!(
            root().join("kernels").join(s).is_file(),
            "kernels/{s} missing"
        );
    }
}

/// The script compiles exactly the text the backend compiles whole: for every source, the
/// same every-part define, prelude, shared headers and kernel text, with the same `#line`
/// markers.
#[cfg(any(feature = "cuda", feature = "rocm"))]
#[test]
fn script_compile_units_are_the_backends() {
    use kiln::backend::gpu::{DType, kernels};

    let dir = std::env::temp_dir().join(format!("kiln-hip-units-{}", std::process::id()));
    let out = Command::new("bash")
        .arg(root().join("scripts/compile_kernels_hip.sh"))
        .arg("--units")
        .arg(&dir)
        .output()
        .expect("run scripts/compile_kernels_hip.sh --units");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sources = kernels::sources(DType::Bf16);
    assert!(sources.len() >= 10, "{} sources", sources.len());
    for (file, text, _) in &sources {
        let unit = dir.join(file.replace(".cu", ".hip"));
        let script =
            std::fs::read_to_string(&unit).unwrap_or_else(|e| panic!("{}: {e}", unit.display()));
        assert!(
            script == *text,
            "scripts/compile_kernels_hip.sh builds {file} differently from the backend"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
