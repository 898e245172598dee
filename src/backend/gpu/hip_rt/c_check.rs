//! Test-only: the hand-written HIP and RCCL bindings checked against the C headers. A C
//! program is generated from the Rust side (values and sizes as `_Static_assert`s, every RCCL
//! entry point as a function pointer of the Rust signature initialized from the header's
//! symbol) and compiled with `cc -Werror`, so a wrong enum value, struct size or argument
//! list fails to compile. Needs the HIP headers (Debian's libamdhip64-dev) and, for RCCL,
//! `rccl/rccl.h` (librccl-dev; `KILN_RCCL_INCLUDE` names a directory holding it); without
//! them the checks are skipped, unless `KILN_REQUIRE_RCCL_HEADER=1` (CI sets it once it has
//! the headers).

use std::path::{Path, PathBuf};

/// The directory holding `rel` among `KILN_RCCL_INCLUDE`, `/usr/include` and ROCm's include
/// directory (`$ROCM_PATH`, default `/opt/rocm`).
fn include_dir(rel: &str) -> Option<PathBuf> {
    let rocm = std::env::var("ROCM_PATH").unwrap_or_else(|_| "/opt/rocm".into());
    std::env::var_os("KILN_RCCL_INCLUDE")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            PathBuf::from("/usr/include"),
            Path::new(&rocm).join("include"),
        ])
        .find(|d| d.join(rel).is_file())
}

/// Skips (returns `None`) where a header is missing, unless CI requires the headers.
fn require(rel: &str) -> Option<PathBuf> {
    let dir = include_dir(rel);
    if dir.is_none() {
        eprintln!("SKIPPED: {rel} not found (install libamdhip64-dev / librccl-dev)");
        if std::env::var("KILN_REQUIRE_RCCL_HEADER").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_RCCL_HEADER=1 but {rel} is missing");
        }
    }
    dir
}

/// The C program: `header`, one static assertion per fact, then the declarations.
fn program(header: &str, facts: &[String], declarations: &[String]) -> String {
    let mut c = format!("#include <stddef.h>\n#include <{header}>\n");
    for f in facts {
        c += &format!("_Static_assert({f}, \"{f}\");\n");
    }
    for d in declarations {
        c += &format!("{d}\n");
    }
    c + "int main(void) { return 0; }\n"
}

/// Compiles `source` with `cc -Werror` against `includes`; the compiler's complaint if any.
fn compile(name: &str, source: &str, includes: &[PathBuf]) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("kiln-c-check-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join(format!("{name}.c"));
    std::fs::write(&file, source).map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-std=c11", "-Wall", "-Werror", "-fsyntax-only"])
        .arg("-D__HIP_PLATFORM_AMD__");
    for i in includes {
        cmd.arg("-I").arg(i);
    }
    let out = cmd.arg(&file).output().map_err(|e| format!("cc: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{}\n--- {name}.c ---\n{source}",
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;

    use super::super::c_types::CFn;
    use super::super::rccl::{CommHandle, DataType, HipStream, NcclResult};
    use super::*;

    #[test]
    fn hip_ffi_values_match_the_header() {
        let Some(hip) = require("hip/hip_runtime_api.h") else {
            return;
        };
        let c = program("hip/hip_runtime_api.h", &super::super::ffi::c_facts(), &[]);
        compile("hip_ffi", &c, &[hip]).unwrap();
    }

    #[test]
    fn rccl_declarations_match_the_header() {
        let (Some(hip), Some(rccl)) = (require("hip/hip_runtime.h"), require("rccl/rccl.h")) else {
            return;
        };
        let decls = super::super::rccl::c_declarations();
        assert_eq!(decls.len(), 7, "{decls:?}");
        let c = program("rccl/rccl.h", &super::super::rccl::c_facts(), &decls);
        compile("rccl", &c, &[rccl, hip]).unwrap();
    }

    /// The check itself: a wrong value, size or signature does not compile.
    #[test]
    fn the_check_rejects_a_wrong_value_and_a_wrong_signature() {
        let (Some(hip), Some(rccl)) = (require("hip/hip_runtime.h"), require("rccl/rccl.h")) else {
            return;
        };
        let inc = [rccl, hip];
        let wrong_value = program("rccl/rccl.h", &["ncclBfloat16 == 8".into()], &[]);
        assert!(compile("wrong_value", &wrong_value, &inc).is_err());
        let wrong_size = program("rccl/rccl.h", &["sizeof(ncclUniqueId) == 64".into()], &[]);
        assert!(compile("wrong_size", &wrong_size, &inc).is_err());
        // ncclAllGather's arguments with ncclAllReduce's symbol.
        type AllGather = unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            DataType,
            CommHandle,
            HipStream,
        ) -> NcclResult;
        let wrong_fn = program(
            "rccl/rccl.h",
            &[],
            &[AllGather::declare("f", "ncclAllReduce")],
        );
        assert!(compile("wrong_fn", &wrong_fn, &inc).is_err());
        let right_fn = program(
            "rccl/rccl.h",
            &[],
            &[AllGather::declare("f", "ncclAllGather")],
        );
        compile("right_fn", &right_fn, &inc).unwrap();
    }
}
