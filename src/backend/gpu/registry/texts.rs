//! The exact text the runtime compiler sees for each compile unit: the host defines every
//! part tag a split source uses (the unit's own 1, the others 0), so `prelude.cuh` has no
//! defaults; and the listings of units and whole sources that the device-free compile
//! checks take (`tests/hiprtc.rs`, `tests/kernels_hip.rs`).

use std::collections::HashMap;
use std::path::Path;

use super::units::{ALL_PARTS, Source, Unit};
use crate::backend::DType;
use crate::backend::gpu::kernels::Kernel;

/// The part tags of `src`'s units (of every storage type), in kernel order: what each unit's
/// text defines, as 1 (its own) or 0. Empty for a source that is not split.
pub(super) fn part_tags(src: Source) -> Vec<String> {
    let mut tags: Vec<String> = Vec::new();
    for k in Kernel::all() {
        let u = k.unit();
        if let (true, Some(t)) = (u.src == src, u.part.tag())
            && !tags.contains(&t)
        {
            tags.push(t);
        }
    }
    tags
}

impl Unit {
    /// The text the runtime compiler sees: for a part, `KILN_PARTS` and every part tag of
    /// the source defined (its own 1, the others 0), then the source's text (`dir`: see
    /// [`Source::full_text`]).
    pub(crate) fn text(self, dir: Option<&Path>) -> String {
        match self.part.tag() {
            None => self.src.full_text(dir),
            Some(own) => {
                let mut text = String::from("#define KILN_PARTS 1\n");
                for t in part_tags(self.src) {
                    let on = u8::from(t == own);
                    text.push_str(&format!("#define KILN_PART_{t} {on}\n"));
                }
                text + &self.src.full_text(dir)
            }
        }
    }
}

/// Every kernel source with entry points for storage type `dt` (a source with none, such as
/// the bf16-only tensor-core matmul in f32, is left out), compiled whole (every part in:
/// `KILN_ALL_PARTS`): (file name, full text, entry points). For checks that run the
/// compiler without a device (`tests/hiprtc.rs`); `scripts/compile_kernels_hip.sh` builds
/// the same texts (`tests/kernels_hip.rs`).
pub fn sources(dt: DType) -> Vec<(&'static str, String, Vec<String>)> {
    Source::ALL
        .iter()
        .filter_map(|&src| {
            let entries: Vec<String> = Kernel::all()
                .into_iter()
                .filter(|k| k.source() == src && k.available(dt))
                .map(|k| k.entry(dt))
                .collect();
            let text = format!("{ALL_PARTS}{}", src.full_text(None));
            (!entries.is_empty()).then(|| (src.file(), text, entries))
        })
        .collect()
}

/// Every compile unit with entry points for storage type `dt`, exactly as
/// [`super::Kernels::load`] compiles it (a split source once per part): (unit name, text,
/// entry points). For checks that run the compiler without a device (`tests/hiprtc.rs`).
pub fn units(dt: DType) -> Vec<(String, String, Vec<String>)> {
    let mut by_unit: HashMap<Unit, Vec<String>> = HashMap::new();
    for k in Kernel::all().into_iter().filter(|k| k.available(dt)) {
        by_unit.entry(k.unit()).or_default().push(k.entry(dt));
    }
    let mut v: Vec<_> = by_unit
        .into_iter()
        .map(|(u, entries)| (u.name(), u.text(None), entries))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}
