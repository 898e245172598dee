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
        ToolFormat::Hermes | ToolFormat::Mistral => "arguments",
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
