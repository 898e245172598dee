//! A tolerant scanner of one JSON object that may still be arriving: where its top-level
//! `name` and arguments values are, and where the object ends.

/// What is known of a JSON object so far (byte offsets into the scanned text).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ObjectScan {
    /// The `name` member's value, once it is a complete JSON string.
    pub name: Option<String>,
    /// Start of the arguments member's value, and its end once complete.
    pub args: Option<(usize, Option<usize>)>,
    /// Just past the closing `}`.
    pub end: Option<usize>,
    /// The text is not (the beginning of) a JSON object: the offset of the first bad byte.
    pub invalid: Option<usize>,
    /// A member other than `name` and the arguments has begun (the object may be content).
    pub foreign: bool,
}

/// Whether a key (or the start of one, `partial`) can be `name` or an arguments member.
fn call_key(key: &str, args_keys: &[&str], partial: bool) -> bool {
    let known = std::iter::once(&"name").chain(args_keys);
    match partial {
        true => known.into_iter().any(|k| k.starts_with(key)),
        false => known.into_iter().any(|k| *k == key),
    }
}

/// Where a value that starts at `i` ends: `Some(end)`, `None` if the text stops first;
/// `Err(())` if it is not a JSON value.
fn value_end(b: &[u8], i: usize) -> Result<Option<usize>, ()> {
    match b.get(i) {
        None => Ok(None),
        Some(b'"') => Ok(string_end(b, i)),
        Some(b'{') | Some(b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => match string_end(b, j) {
                        Some(e) => {
                            j = e;
                            continue;
                        }
                        None => return Ok(None),
                    },
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(Some(j + 1));
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Ok(None)
        }
        Some(c) if c.is_ascii_alphanumeric() || *c == b'-' => {
            let len = b[i..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.'))
                .count();
            Ok((i + len < b.len()).then_some(i + len))
        }
        Some(_) => Err(()),
    }
}

/// Just past the closing quote of the string that starts at `i`.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Scans `text`, which starts with `{`; `args_keys` name the arguments member.
pub(super) fn scan_object(text: &str, args_keys: &[&str]) -> ObjectScan {
    let b = text.as_bytes();
    let mut out = ObjectScan::default();
    let mut i = 1;
    let mut first = true;
    loop {
        i = skip_ws(b, i);
        match b.get(i) {
            None => return out,
            Some(b'}') if first => {
                out.end = Some(i + 1);
                return out;
            }
            Some(b'"') => {}
            Some(_) => {
                out.invalid = Some(i);
                return out;
            }
        }
        let Some(key_end) = string_end(b, i) else {
            out.foreign |= !call_key(&text[i + 1..], args_keys, true);
            return out;
        };
        let key: Option<String> = serde_json::from_str(&text[i..key_end]).ok();
        out.foreign |= !key
            .as_deref()
            .is_some_and(|k| call_key(k, args_keys, false));
        i = skip_ws(b, key_end);
        match b.get(i) {
            None => return out,
            Some(b':') => i = skip_ws(b, i + 1),
            Some(_) => {
                out.invalid = Some(i);
                return out;
            }
        }
        let start = i;
        let end = match value_end(b, start) {
            Err(()) => {
                out.invalid = Some(start);
                return out;
            }
            Ok(end) => end,
        };
        match key.as_deref() {
            Some("name") => {
                if let Some(e) = end {
                    out.name = serde_json::from_str::<String>(&text[start..e]).ok();
                }
            }
            Some(k) if args_keys.contains(&k) && start < b.len() => {
                out.args = Some((start, end));
            }
            _ => {}
        }
        let Some(end) = end else {
            return out;
        };
        i = skip_ws(b, end);
        match b.get(i) {
            None => return out,
            Some(b',') => i += 1,
            Some(b'}') => {
                out.end = Some(i + 1);
                return out;
            }
            Some(_) => {
                out.invalid = Some(i);
                return out;
            }
        }
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &[&str] = &["arguments", "parameters"];

    #[test]
    fn complete_object() {
        let t = r#"{"name": "f", "arguments": {"a": "}", "b": [1, {"c": 2}]}} tail"#;
        let s = scan_object(t, KEYS);
        assert_eq!(s.name.as_deref(), Some("f"));
        let (a, e) = s.args.unwrap();
        assert_eq!(&t[a..e.unwrap()], r#"{"a": "}", "b": [1, {"c": 2}]}"#);
        assert_eq!(&t[s.end.unwrap()..], " tail");
        assert_eq!(s.invalid, None);
    }

    #[test]
    fn partial_objects() {
        let s = scan_object(r#"{"name": "get_wea"#, KEYS);
        assert_eq!((s.name, s.args, s.end, s.invalid), (None, None, None, None));
        let t = r#"{"parameters": {"x": 1"#;
        let s = scan_object(t, KEYS);
        assert_eq!(s.args, Some((15, None)));
        assert!(s.name.is_none() && s.end.is_none());
        let s = scan_object(r#"{"name": "f", "n": 12"#, KEYS);
        assert_eq!(s.name.as_deref(), Some("f"));
        assert!(s.end.is_none() && s.invalid.is_none(), "a number may go on");
    }

    #[test]
    fn members_other_than_a_calls_are_foreign() {
        for t in [
            r#"{"na"#,
            r#"{"name": "f", "argu"#,
            r#"{"parameters": {"x": 1"#,
            "{",
        ] {
            assert!(!scan_object(t, KEYS).foreign, "{t}");
        }
        for t in [r#"{"answer": 4"#, r#"{"ans"#, r#"{"name": "f", "x"#] {
            assert!(scan_object(t, KEYS).foreign, "{t}");
        }
    }

    #[test]
    fn not_an_object() {
        assert_eq!(scan_object("{x", KEYS).invalid, Some(1));
        assert_eq!(scan_object(r#"{"a" 1}"#, KEYS).invalid, Some(5));
        assert_eq!(scan_object(r#"{"a": 1 2}"#, KEYS).invalid, Some(8));
        assert_eq!(scan_object("{}", KEYS).end, Some(2));
    }
}
