//! Every kernel's argument struct against the parameter list its source declares.

use super::{ArgKind, params, takers};
use crate::backend::DType;
use crate::backend::gpu::kernels::Kernel;

/// One `extern "C"` definition: its name with `##` pastes (`attn_##N##_d##DN##_q##QV`), the
/// parameters of the enclosing `#define` (empty outside one), and its parameter list.
#[derive(Debug)]
struct Entry {
    name: Vec<String>,
    macro_params: Vec<String>,
    params: Vec<String>,
}

/// The text between the `(` at `open` and its matching `)`, and the index after it.
fn balanced(text: &str, open: usize) -> (&str, usize) {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return (&text[open + 1..open + i], open + i + 1);
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses at byte {open}");
}

/// Splits `s` on top-level commas, whitespace and line continuations trimmed.
fn split_list(s: &str) -> Vec<String> {
    s.replace("\\\n", " ")
        .split(',')
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect()
}

/// The parameters of the last `#define NAME(...)` before `at`.
fn enclosing_macro(text: &str, at: usize) -> Vec<String> {
    let Some(def) = text[..at].rfind("#define ") else {
        return Vec::new();
    };
    let line_end = text[def..].find('\n').map_or(text.len(), |e| def + e);
    match text[def..line_end].find('(') {
        Some(p) if !text[def + 8..def + p].contains(' ') => split_list(balanced(text, def + p).0),
        _ => Vec::new(),
    }
}

/// Every `extern "C" __global__` definition of `text`.
fn entries(text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for (at, m) in text.match_indices("extern \"C\"") {
        let mut i = at + m.len();
        // Words up to the name: `__global__ void`, and attributes with arguments
        // (`__launch_bounds__(...)`, `KILN_DEC_BOUNDS(...)`) skipped whole.
        let name = loop {
            let rest = &text[i..];
            let skip = rest.len() - rest.trim_start_matches([' ', '\n', '\\']).len();
            i += skip;
            let word_len = text[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '#'))
                .expect("a definition");
            let word = &text[i..i + word_len];
            i += word_len;
            let after = text[i..].trim_start_matches([' ', '\n', '\\']);
            if after.starts_with('(') {
                let open = text.len() - after.len();
                if word == "__launch_bounds__" || word.starts_with("KILN_") {
                    i = balanced(text, open).1;
                    continue;
                }
                i = open;
                break word;
            }
        };
        out.push(Entry {
            name: name.split("##").map(|s| s.trim().to_string()).collect(),
            macro_params: enclosing_macro(text, at),
            params: split_list(balanced(text, i).0),
        });
    }
    out
}

/// Whether `name` is an expansion of the pasted pieces: macro parameters stand for
/// alphanumeric runs (`f32`, `128`, `any`), anything else for itself.
fn name_matches(pieces: &[String], macro_params: &[String], name: &str) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return name.is_empty();
    };
    if !macro_params.contains(first) {
        return name
            .strip_prefix(first.as_str())
            .is_some_and(|n| name_matches(rest, macro_params, n));
    }
    let run = name
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(name.len());
    (1..=run).any(|len| name_matches(rest, macro_params, &name[len..]))
}

/// (name, kind) of one declared parameter (`const TT *qkv`, `int cols`, `u64 total`).
fn param(decl: &str) -> (String, ArgKind) {
    let name_at = decl
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let (ty, name) = decl.split_at(name_at);
    let words: Vec<&str> = ty
        .split(|c: char| c.is_whitespace() || c == '*')
        .filter(|w| !w.is_empty() && *w != "const" && *w != "__restrict__")
        .collect();
    let kind = if ty.contains('*') {
        ArgKind::Ptr
    } else {
        match words.as_slice() {
            ["int"] => ArgKind::I32,
            ["u64"] | ["size_t"] => ArgKind::U64,
            ["float"] => ArgKind::F32,
            _ => panic!("parameter `{decl}`: no argument kind for its type"),
        }
    };
    (name.to_string(), kind)
}

#[test]
fn every_kernel_struct_matches_the_kernel_signature() {
    let mut checked = 0;
    for dt in [DType::F32, DType::Bf16] {
        for k in Kernel::all() {
            assert_eq!(takers(k), 1, "{k:?}: argument structs");
            if !k.available(dt) {
                continue;
            }
            let want = params(k).unwrap_or_else(|| panic!("{k:?} has no argument struct"));
            let text = k.source().full_text(None);
            let entry = k.entry(dt);
            let found: Vec<Entry> = entries(&text)
                .into_iter()
                .filter(|e| name_matches(&e.name, &e.macro_params, &entry))
                .collect();
            assert_eq!(found.len(), 1, "{entry}: definitions {found:?}");
            // Names compare in lower case: Rust fields are snake case (`V` is `v`).
            let got: Vec<(String, ArgKind)> = found[0]
                .params
                .iter()
                .map(|p| param(p))
                .map(|(n, k)| (n.to_lowercase(), k))
                .collect();
            let want: Vec<(String, ArgKind)> =
                want.iter().map(|&(n, k)| (n.to_string(), k)).collect();
            assert_eq!(got, want, "{entry} ({k:?}): source vs argument struct");
            checked += 1;
        }
    }
    // Both storage types of every kernel (53 each when this was written).
    assert!(checked >= 2 * 50, "{checked} kernels checked");
}

#[test]
fn the_parser_reads_pasted_names_and_attributes() {
    let text = "#define M(N, T, D)   \\\n    extern \"C\" __global__ void __launch_bounds__(4 * \
                WARP) k_##N##_d##D(const T *a, int b, \\\n u64 c, float d) {}\n";
    let e = entries(text);
    assert_eq!(e.len(), 1);
    assert!(name_matches(&e[0].name, &e[0].macro_params, "k_bf16_d128"));
    assert!(!name_matches(
        &e[0].name,
        &e[0].macro_params,
        "k_bf16_x_d128"
    ));
    assert!(!name_matches(
        &e[0].name,
        &e[0].macro_params,
        "k_bf16_d128_tc"
    ));
    let p: Vec<_> = e[0].params.iter().map(|p| param(p)).collect();
    let want = [
        ("a", ArgKind::Ptr),
        ("b", ArgKind::I32),
        ("c", ArgKind::U64),
        ("d", ArgKind::F32),
    ];
    assert_eq!(
        p,
        want.map(|(n, k)| (n.to_string(), k)),
        "parsed {:?}",
        e[0].params
    );
}
