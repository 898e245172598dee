//! The Lark grammar (llguidance's dialect) that makes a reply exactly a tool call in the
//! model's format, each call's arguments fitting its function's `parameters` schema.

use super::format::ToolFormat;
use crate::tokenizer::chat::TemplateTool;

/// A JSON Schema for one call object: `name` (that function's, first) and the arguments
/// member (`parameters` for Llama 3, else `arguments`) with the function's schema. Written as
/// text so that `name` comes first whatever the JSON map order. Compact, like the
/// structured-output JSON: free whitespace would let a weak model pad forever.
fn call_schema(format: ToolFormat, tool: &TemplateTool) -> String {
    let key = match format {
        ToolFormat::Llama3Json => "parameters",
        ToolFormat::Hermes | ToolFormat::Mistral | ToolFormat::Harmony => "arguments",
    };
    let name = serde_json::Value::from(tool.name.as_str());
    let params = rebase_refs(&tool.parameters, &format!("/properties/{key}"));
    format!(
        "{{\"type\": \"object\", \"properties\": {{\"name\": {{\"const\": {name}}}, \"{key}\": {params}}}, \"required\": [\"name\", \"{key}\"], \"additionalProperties\": false, \"x-guidance\": {{\"whitespace_flexible\": false}}}}",
    )
}

/// `params` with every local `$ref` (`#`, `#/$defs/A`, `#/definitions/A`, ...) pointing into
/// it from `at` (where it sits in the call object): the call object is the root its refs are
/// resolved against. What Pydantic writes (`#/$defs/A`) would otherwise name a definition the
/// call object lacks. Values of `const`, `enum`, `default` and `examples` are data, not
/// schemas, and are left alone. Iterative: a deep schema cannot overflow this thread.
fn rebase_refs(params: &serde_json::Value, at: &str) -> serde_json::Value {
    use serde_json::Value;
    let mut out = params.clone();
    let mut stack: Vec<&mut Value> = vec![&mut out];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                for (k, child) in m.iter_mut() {
                    match (k.as_str(), child) {
                        ("$ref", Value::String(r)) if r.starts_with('#') => {
                            *r = format!("#{at}{}", &r[1..]);
                        }
                        ("const" | "enum" | "default" | "examples", _) => {}
                        (_, child) => stack.push(child),
                    }
                }
            }
            Value::Array(a) => stack.extend(a.iter_mut()),
            _ => {}
        }
    }
    out
}

/// How the grammar writes a marker such as `<tool_call>`: a quoted string, or the special
/// token's id (`<[151657]>`) when the vocabulary has the marker as one special token, so the
/// model emits that token, as it was trained to, rather than spelling the text.
pub(crate) fn marker(text: &str, special_id: Option<u32>) -> String {
    match special_id {
        Some(id) => format!("<[{id}]>"),
        None => serde_json::Value::from(text).to_string(),
    }
}

/// The grammar: one call of any of `tools` (or, with `parallel`, one or more). `mark` writes
/// a format marker (see [`marker`]).
///
/// - Hermes: `<tool_call>\n{call}\n</tool_call>`, calls separated by `\n`.
/// - Llama 3: `{call}`, calls separated by `; `.
/// - Mistral: `[TOOL_CALLS][{call}, {call}]`.
pub(super) fn tool_calls(
    format: ToolFormat,
    tools: &[&TemplateTool],
    parallel: bool,
    mark: &dyn Fn(&str) -> String,
) -> String {
    let hermes = format!(
        "{} \"\\n\" fn \"\\n\" {}",
        mark("<tool_call>"),
        mark("</tool_call>")
    );
    let mistral = mark("[TOOL_CALLS]");
    let (start, call) = match (format, parallel) {
        (ToolFormat::Hermes, false) => ("call".to_string(), hermes),
        (ToolFormat::Hermes, true) => ("call (\"\\n\" call)*".to_string(), hermes),
        (ToolFormat::Llama3Json, false) => ("call".to_string(), "fn".to_string()),
        (ToolFormat::Llama3Json, true) => ("call (\"; \" call)*".to_string(), "fn".to_string()),
        (ToolFormat::Mistral, false) => (format!("{mistral} \"[\" call \"]\""), "fn".to_string()),
        (ToolFormat::Mistral, true) => (
            format!("{mistral} \"[\" call (\", \" call)* \"]\""),
            "fn".to_string(),
        ),
        (ToolFormat::Harmony, _) => return harmony_call(tools, mark),
    };
    let mut g = format!("start: {start}\ncall: {call}\nfn: ");
    let names: Vec<String> = (0..tools.len()).map(|i| format!("fn_{i}")).collect();
    g.push_str(&names.join(" | "));
    g.push('\n');
    for (name, tool) in names.iter().zip(tools) {
        g.push_str(&format!("{name}: %json {}\n", call_schema(format, tool)));
    }
    g
}

/// Harmony's grammar: one call (the model's `<|call|>` ends its turn), as gpt-oss writes it:
/// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{arguments}`, the
/// arguments fitting the function's schema, then the end of the reply (`<|call|>` is an
/// end-of-generation token). An analysis message may come first, its text free up to
/// `<|end|>`, when `<|end|>` is a special token (ordinary text cannot spell it then).
fn harmony_call(tools: &[&TemplateTool], mark: &dyn Fn(&str) -> String) -> String {
    use super::harmony::{CHANNEL, CONSTRAIN, END, MESSAGE, START};
    let end = mark(END);
    let (start, analysis) = match end.starts_with("<[") {
        true => (
            "start: analysis? call\n",
            format!(
                "analysis: {} \"analysis\" {} /(?s:.*)/ {end} {} \"assistant\"\n",
                mark(CHANNEL),
                mark(MESSAGE),
                mark(START)
            ),
        ),
        false => ("start: call\n", String::new()),
    };
    let names: Vec<String> = (0..tools.len()).map(|i| format!("fn_{i}")).collect();
    let mut g = format!("{start}{analysis}call: {}\n", names.join(" | "));
    for (i, tool) in tools.iter().enumerate() {
        let head = serde_json::Value::from(format!("commentary to=functions.{} ", tool.name));
        g.push_str(&format!(
            "fn_{i}: {} {head} {} \"json\" {} args_{i}\n",
            mark(CHANNEL),
            mark(CONSTRAIN),
            mark(MESSAGE)
        ));
        let mut schema = tool.parameters.clone();
        if let Some(m) = schema.as_object_mut() {
            m.entry("x-guidance")
                .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
        }
        g.push_str(&format!("args_{i}: %json {schema}\n"));
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> TemplateTool {
        TemplateTool {
            name: "get_weather".into(),
            description: None,
            parameters: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        }
    }

    #[test]
    fn hermes_grammar() {
        let w = weather();
        let g = tool_calls(ToolFormat::Hermes, &[&w], false, &|t| marker(t, None));
        assert_eq!(
            g,
            "start: call\ncall: \"<tool_call>\" \"\\n\" fn \"\\n\" \"</tool_call>\"\nfn: fn_0\n\
             fn_0: %json {\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"get_weather\"}, \
             \"arguments\": {\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}, \
             \"required\": [\"name\", \"arguments\"], \"additionalProperties\": false, \"x-guidance\": {\"whitespace_flexible\": false}}\n"
        );
        let schema = g.lines().last().unwrap().trim_start_matches("fn_0: %json ");
        let schema: serde_json::Value = serde_json::from_str(schema).unwrap();
        assert_eq!(schema["properties"]["arguments"]["required"][0], "city");
    }

    #[test]
    fn local_refs_point_into_the_arguments() {
        let params = serde_json::json!({
            "$defs": {"A": {"type": "object", "properties": {"next": {"$ref": "#/$defs/A"}}}},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/A"}, "me": {"$ref": "#"}, "c": {"const": {"$ref": "#/x"}}},
        });
        let out = rebase_refs(&params, "/properties/arguments");
        assert_eq!(
            out["properties"]["a"]["$ref"],
            "#/properties/arguments/$defs/A"
        );
        assert_eq!(
            out["$defs"]["A"]["properties"]["next"]["$ref"],
            "#/properties/arguments/$defs/A"
        );
        assert_eq!(out["properties"]["me"]["$ref"], "#/properties/arguments");
        assert_eq!(
            out["properties"]["c"]["const"]["$ref"], "#/x",
            "data is left alone"
        );
    }

    #[test]
    fn harmony_grammar() {
        let (w, mut v) = (weather(), weather());
        v.name = "v".into();
        let ids = [
            ("<|start|>", 1),
            ("<|channel|>", 2),
            ("<|message|>", 3),
            ("<|end|>", 4),
            ("<|constrain|>", 5),
        ];
        let special = |t: &str| marker(t, ids.iter().find(|(m, _)| *m == t).map(|p| p.1));
        let g = tool_calls(ToolFormat::Harmony, &[&w, &v], true, &special);
        let want = "start: analysis? call\n\
             analysis: <[2]> \"analysis\" <[3]> /(?s:.*)/ <[4]> <[1]> \"assistant\"\n\
             call: fn_0 | fn_1\n\
             fn_0: <[2]> \"commentary to=functions.get_weather \" <[5]> \"json\" <[3]> args_0\n";
        assert!(g.starts_with(want), "{g}");
        assert!(
            g.contains("fn_1: <[2]> \"commentary to=functions.v \""),
            "{g}"
        );
        let schema = g
            .lines()
            .nth(4)
            .unwrap()
            .trim_start_matches("args_0: %json ");
        let schema: serde_json::Value = serde_json::from_str(schema).unwrap();
        assert_eq!(schema["required"][0], "city");
        assert_eq!(schema["x-guidance"]["whitespace_flexible"], false);
        // Without `<|end|>` as a token the analysis cannot be told from text: a call only.
        let g = tool_calls(ToolFormat::Harmony, &[&w], false, &|t| marker(t, None));
        assert!(
            g.starts_with("start: call\ncall: fn_0\nfn_0: \"<|channel|>\""),
            "{g}"
        );
    }

    #[test]
    fn parallel_and_formats() {
        let (w, mut v) = (weather(), weather());
        v.name = "v".into();
        let plain = |t: &str| marker(t, None);
        let g = tool_calls(ToolFormat::Llama3Json, &[&w, &v], true, &plain);
        assert!(
            g.starts_with("start: call (\"; \" call)*\ncall: fn\nfn: fn_0 | fn_1\n"),
            "{g}"
        );
        assert!(g.contains("\"parameters\": {\"type\":\"object\""), "{g}");
        let g = tool_calls(ToolFormat::Mistral, &[&w], false, &plain);
        assert!(
            g.starts_with("start: \"[TOOL_CALLS]\" \"[\" call \"]\"\n"),
            "{g}"
        );
        // A marker that is one special token is written as that token's id.
        let special = |t: &str| marker(t, (t == "[TOOL_CALLS]").then_some(5));
        let g = tool_calls(ToolFormat::Mistral, &[&w], true, &special);
        assert!(
            g.starts_with("start: <[5]> \"[\" call (\", \" call)* \"]\"\n"),
            "{g}"
        );
    }
}
