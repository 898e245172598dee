//! What a constraint may ask of the compiler before it is compiled: its size and its depth.
//!
//! llguidance compiles JSON Schemas and Lark grammars by recursion: every level of nesting,
//! every `$ref` followed and every rule that names the next costs the compiling thread stack
//! (a few KiB each). A chain of 300 `$ref`s overflowed a 2 MiB stack and aborted the
//! process. [`depth`] measures the longest such chain without recursing itself (an explicit
//! stack, memoized, cycles cut), and the compile threads' stack is sized for the limit
//! with a wide margin ([`super::pool::STACK_BYTES`]).

use std::collections::HashMap;

use serde_json::Value;

/// Bounds on compiling constraints (config `[engine.grammar]`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrammarConfig {
    /// Threads that compile constraints (off the tokenizing pool); each has a large stack.
    pub threads: usize,
    /// Compiles waiting for a thread at most; past it a constrained request gets a 429.
    pub queue: usize,
    /// A compile still running after this many seconds fails its request with a 400.
    pub timeout_s: f64,
    /// Deepest chain of nesting levels, `$ref`s followed and rules naming rules.
    pub max_depth: usize,
    /// Largest constraint text (a schema, regex or grammar) in bytes.
    pub max_bytes: usize,
    /// Memory the cache of compiled grammars may hold (measured as the compile allocated it).
    pub cache_bytes: usize,
}

impl Default for GrammarConfig {
    fn default() -> Self {
        Self {
            threads: 2,
            queue: 64,
            timeout_s: 10.0,
            max_depth: 256,
            max_bytes: 2 << 20,
            cache_bytes: 256 << 20,
        }
    }
}

impl GrammarConfig {
    /// `Err(key, why)` when a value cannot work.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.threads == 0 || self.queue == 0 {
            return Err((
                "engine.grammar.threads",
                "threads and queue must be positive".into(),
            ));
        }
        if self.max_depth == 0 || self.max_depth > MAX_DEPTH_LIMIT {
            return Err((
                "engine.grammar.max_depth",
                format!("max_depth must be between 1 and {MAX_DEPTH_LIMIT}"),
            ));
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err((
                "engine.grammar.timeout_s",
                "must be a positive number".into(),
            ));
        }
        Ok(())
    }
}

/// The largest `max_depth` the compile threads' stack is sized for.
pub const MAX_DEPTH_LIMIT: usize = 4096;

/// `Err(message)` naming the limit when a constraint of `bytes` and `depth` is larger or
/// deeper than `cfg` allows.
pub fn within(bytes: usize, depth: usize, cfg: &GrammarConfig) -> Result<(), String> {
    if bytes > cfg.max_bytes {
        return Err(format!(
            "the constraint is {bytes} bytes; the limit is {} (engine.grammar.max_bytes)",
            cfg.max_bytes
        ));
    }
    if depth > cfg.max_depth {
        return Err(format!(
            "the constraint nests {depth} levels deep (nesting, `$ref`s and rules that name \
             rules); the limit is {} (engine.grammar.max_depth)",
            cfg.max_depth
        ));
    }
    Ok(())
}

/// [`json_depth`] of a schema's text.
pub fn schema_depth(text: &str) -> Result<usize, String> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| format!("the schema is not valid JSON: {e}"))?;
    Ok(json_depth(&v))
}

/// The longest chain of nested values and local `$ref`s followed in a JSON Schema. A `$ref`
/// that leads back into the chain (a recursive schema) ends it: llguidance names the
/// definition before it descends.
pub fn json_depth(root: &Value) -> usize {
    let key = |v: &Value| v as *const Value as usize;
    longest_chain([root], key, |v| json_children(root, v), |_| 0)
}

/// The containers inside `v` and the target of its local `$ref` (resolved in `root`).
fn json_children<'a>(root: &'a Value, v: &'a Value) -> Vec<&'a Value> {
    let nested = |c: &&Value| c.is_object() || c.is_array();
    match v {
        Value::Object(m) => {
            let mut out: Vec<&Value> = m.values().filter(nested).collect();
            if let Some(target) = m
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix('#'))
                .and_then(|p| root.pointer(p))
            {
                out.push(target);
            }
            out
        }
        Value::Array(a) => a.iter().filter(nested).collect(),
        _ => Vec::new(),
    }
}

/// The longest chain from any of `roots` over `children`, each node counting
/// `1 + weight(node)`, memoized by `key`; a child already on the chain (a cycle) adds
/// nothing. Iterative: a deep input cannot overflow this thread.
fn longest_chain<'a, T: ?Sized + 'a>(
    roots: impl IntoIterator<Item = &'a T>,
    key: impl Fn(&T) -> usize,
    children: impl Fn(&'a T) -> Vec<&'a T>,
    weight: impl Fn(&T) -> usize,
) -> usize {
    // None: on the current chain; Some(d): done.
    let mut memo: HashMap<usize, Option<usize>> = HashMap::new();
    let mut best = 0;
    for root in roots {
        let mut stack: Vec<(&'a T, Option<Vec<&'a T>>)> = vec![(root, None)];
        while let Some((v, kids)) = stack.pop() {
            match kids {
                None => {
                    if memo.contains_key(&key(v)) {
                        continue;
                    }
                    memo.insert(key(v), None);
                    let kids = children(v);
                    stack.push((v, Some(kids.clone())));
                    stack.extend(kids.into_iter().map(|k| (k, None)));
                }
                Some(kids) => {
                    let below = kids
                        .iter()
                        .filter_map(|k| memo.get(&key(k)).copied().flatten())
                        .max()
                        .unwrap_or(0);
                    memo.insert(key(v), Some(below + 1 + weight(v)));
                }
            }
        }
        best = best.max(memo.get(&key(root)).copied().flatten().unwrap_or(1));
    }
    best.max(1)
}

/// One Lark rule or terminal: its name, the names its body uses, how deep its parentheses
/// and brackets nest, and the depth of the `%json` schemas inside it.
#[derive(Debug, Default)]
struct Rule {
    uses: Vec<String>,
    nesting: usize,
    json: usize,
}

/// The longest chain of rules naming rules in a Lark grammar, each counted with its own
/// bracket nesting and `%json` schemas.
pub fn lark_depth(text: &str) -> Result<usize, String> {
    let rules = lark_rules(text)?;
    let names: Vec<&String> = rules.keys().collect();
    let index: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let ids: Vec<usize> = (0..names.len()).collect();
    let children = |i: &usize| -> Vec<&usize> {
        rules[names[*i]]
            .uses
            .iter()
            .filter_map(|u| index.get(u.as_str()).map(|&j| &ids[j]))
            .collect()
    };
    let weight = |i: &usize| {
        let r = &rules[names[*i]];
        r.nesting + r.json
    };
    Ok(longest_chain(&ids, |i| *i, children, weight))
}

/// The rules of a Lark grammar, read loosely: a definition is a name at the start of a line
/// (after `?` or `!`, before an optional `.priority`) followed by `:`; its body runs to the
/// next definition. Strings, regexes, comments and `<[id]>` tokens are skipped; a `%json`
/// schema is measured with [`json_depth`].
fn lark_rules(text: &str) -> Result<HashMap<String, Rule>, String> {
    let mut rules: HashMap<String, Rule> = HashMap::new();
    let mut current = String::new();
    let bytes = text.as_bytes();
    let (mut i, mut depth, mut line_start) = (0usize, 0usize, true);
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'\n' => {
                line_start = true;
                i += 1;
                continue;
            }
            b' ' | b'\t' | b'\r' => {
                i += 1;
                continue;
            }
            _ => {}
        }
        let at_line_start = std::mem::replace(&mut line_start, false);
        match b {
            b'/' if bytes.get(i + 1) == Some(&b'/') => i = skip_to_eol(bytes, i),
            b'"' | b'/' => i = skip_quoted(bytes, i),
            b'<' if bytes.get(i + 1) == Some(&b'[') => {
                i = bytes[i..]
                    .iter()
                    .position(|&c| c == b'>')
                    .map_or(bytes.len(), |p| i + p + 1);
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                let r = rules.entry(current.clone()).or_default();
                r.nesting = r.nesting.max(depth);
                i += 1;
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'%' if text[i..].starts_with("%json") => {
                let rest = &text[i + 5..];
                let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
                let v = it
                    .next()
                    .ok_or("`%json` without a schema")?
                    .map_err(|e| format!("the `%json` schema is not valid JSON: {e}"))?;
                let r = rules.entry(current.clone()).or_default();
                r.json = r.json.max(json_depth(&v));
                i += 5 + it.byte_offset();
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b'?' || c == b'!' || c == b'@' => {
                let start = i + usize::from(matches!(c, b'?' | b'!' | b'@'));
                let mut end = start;
                while end < bytes.len()
                    && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_')
                {
                    end += 1;
                }
                let name = &text[start..end];
                let mut after = end;
                if bytes.get(after) == Some(&b'.') {
                    after += 1;
                    while after < bytes.len() && bytes[after].is_ascii_digit() {
                        after += 1;
                    }
                }
                while after < bytes.len() && matches!(bytes[after], b' ' | b'\t') {
                    after += 1;
                }
                if at_line_start && c != b'@' && bytes.get(after) == Some(&b':') && !name.is_empty()
                {
                    current = name.to_string();
                    rules.entry(current.clone()).or_default();
                    depth = 0;
                    i = after + 1;
                } else {
                    if !name.is_empty() {
                        rules
                            .entry(current.clone())
                            .or_default()
                            .uses
                            .push(name.to_string());
                    }
                    i = end.max(i + 1);
                }
            }
            _ => i += 1,
        }
    }
    Ok(rules)
}

fn skip_to_eol(bytes: &[u8], i: usize) -> usize {
    bytes[i..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(bytes.len(), |p| i + p)
}

/// Past the string or regex opened by `bytes[i]` (backslash escapes honoured; in a regex,
/// a `/` inside a character class does not end it).
fn skip_quoted(bytes: &[u8], i: usize) -> usize {
    let quote = bytes[i];
    let (mut j, mut class) = (i + 1, false);
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'\n' => return j,
            b'[' if quote == b'/' => {
                class = true;
                j += 1;
            }
            b']' if class => {
                class = false;
                j += 1;
            }
            c if c == quote && !class => return j + 1,
            _ => j += 1,
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `n` definitions, each a `$ref` to the next (what overflowed the stack at 300).
    pub(crate) fn ref_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = if i + 1 < n {
                json!({"anyOf": [{"$ref": format!("#/$defs/d{}", i + 1)}, {"type": "null"}]})
            } else {
                json!({"type": "integer"})
            };
            defs.insert(format!("d{i}"), next);
        }
        json!({"$ref": "#/$defs/d0", "$defs": defs})
    }

    #[test]
    fn json_depth_follows_refs_and_cuts_cycles() {
        assert_eq!(json_depth(&json!({"type": "integer"})), 1);
        let nested = json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}});
        assert_eq!(json_depth(&nested), 5);
        let d100 = json_depth(&ref_chain(100));
        let d200 = json_depth(&ref_chain(200));
        assert!(d100 >= 100 && d200 >= 200 && d200 > d100, "{d100} {d200}");
        // A recursive schema (a tree) is shallow: the cycle ends the chain.
        let tree = json!({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}});
        assert!(json_depth(&tree) < 12, "{}", json_depth(&tree));
        // A million-level chain is measured without touching this thread's stack.
        assert!(json_depth(&ref_chain(20_000)) > 20_000);
    }

    #[test]
    fn lark_depth_counts_rule_chains_nesting_and_json() {
        let flat = "start: a | b\na: \"x\" /[0-9]+/\nb: \"(((\" a";
        assert!(
            lark_depth(flat).unwrap() <= 4,
            "{}",
            lark_depth(flat).unwrap()
        );
        let chain: String = (0..500)
            .map(|i| format!("r{i}: r{} \"x\"\n", i + 1))
            .collect();
        let chain = format!("start: r0\n{chain}r500: \"end\"\n");
        assert!(lark_depth(&chain).unwrap() > 500);
        let parens = format!("start: {}\"x\"{}", "(".repeat(300), ")".repeat(300));
        assert!(lark_depth(&parens).unwrap() > 300);
        let json = format!("start: %json {}", ref_chain(50));
        assert!(lark_depth(&json).unwrap() > 50);
        // Cycles (ordinary recursive grammars) are shallow.
        let rec = "start: expr\nexpr: term (\"+\" term)*\nterm: NUMBER | \"(\" expr \")\"\nNUMBER: /[0-9]+/";
        assert!(lark_depth(rec).unwrap() < 10);
        // Strings and comments hide what looks like rules or brackets.
        let quoted = "start: \"a: ((((\" // b: ((((\n";
        assert!(lark_depth(quoted).unwrap() <= 2);
    }

    #[test]
    fn within_names_the_limit() {
        let cfg = GrammarConfig::default();
        let deep = schema_depth(&ref_chain(1000).to_string()).unwrap();
        let e = within(10, deep, &cfg).unwrap_err();
        assert!(e.contains("engine.grammar.max_depth"), "{e}");
        let e = within(cfg.max_bytes + 1, 1, &cfg).unwrap_err();
        assert!(e.contains("engine.grammar.max_bytes"), "{e}");
        let ok = schema_depth(&ref_chain(40).to_string()).unwrap();
        assert_eq!(within(cfg.max_bytes, ok, &cfg), Ok(()));
        assert!(schema_depth("{not json").is_err());
    }
}
