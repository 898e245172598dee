//! Structured output on the wire: OpenAI's `response_format` and vLLM's `guided_*` /
//! `structured_outputs` fields, turned into one engine [`Constraint`] and compiled before
//! anything is queued (a constraint that does not compile is a 400 naming its field).

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::ToSchema;

use super::errors::ApiError;
use crate::engine::{Constraint, EngineClient};

/// OpenAI `response_format`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text (no constraint).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON that fits `json_schema.schema`.
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// The schema of a `json_schema` response format.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct JsonSchemaFormat {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON Schema (objects, arrays, enums, `required`, `$ref`/`$defs`, string patterns
    /// and formats, numeric bounds...). Absent: any JSON object.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
    /// Accepted; the output always fits the schema.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`: at most one field set.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct StructuredOutputs {
    /// A JSON Schema (an object, or its JSON text).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub json: Option<Value>,
    /// A regular expression the whole output matches.
    #[serde(default)]
    pub regex: Option<String>,
    /// The output is exactly one of these strings.
    #[serde(default)]
    pub choice: Option<Vec<String>>,
    /// A Lark grammar (llguidance's dialect).
    #[serde(default)]
    pub grammar: Option<String>,
    /// `true`: any JSON object.
    #[serde(default)]
    pub json_object: Option<bool>,
}

// Each field is kept as the JSON sent and typed by `parse`: serde loses a field's path inside a
// flattened struct, and a wrong-typed field must still be a 400 naming it.
/// The structured-output fields chat and completion requests share: at most one may constrain
/// the output.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct StructuredFields {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema",
    /// "json_schema": {"name", "schema", "strict"}}`: the output is JSON (fitting the schema).
    #[serde(default)]
    #[schema(value_type = Option<ResponseFormat>)]
    pub response_format: Option<Value>,
    /// vLLM: the output fits this JSON Schema (an object, or its JSON text).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub guided_json: Option<Value>,
    /// vLLM: the output matches this regular expression.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub guided_regex: Option<Value>,
    /// vLLM: the output is exactly one of these strings.
    #[serde(default)]
    #[schema(value_type = Option<Vec<String>>)]
    pub guided_choice: Option<Value>,
    /// vLLM: the output follows this Lark grammar (llguidance's dialect).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub guided_grammar: Option<Value>,
    /// vLLM: one structured-output constraint (`json`, `regex`, `choice`, `grammar` or
    /// `json_object`).
    #[serde(default)]
    #[schema(value_type = Option<StructuredOutputs>)]
    pub structured_outputs: Option<Value>,
}

/// `v` as a `T`; a wrong type is a 400 naming `param` (and the path inside it).
fn typed<T: DeserializeOwned>(param: &'static str, v: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.path().to_string();
        let param = match inner.as_str() {
            "." => param.to_string(),
            i if i.starts_with('[') => format!("{param}{i}"),
            i => format!("{param}.{i}"),
        };
        let message = format!("invalid `{param}`: {}", e.inner());
        ApiError::invalid_with_code(Some(param), message, "invalid_type")
    })
}

/// The field's value unless absent or null.
fn sent(v: &Option<Value>) -> Option<&Value> {
    v.as_ref().filter(|v| !v.is_null())
}

/// The constraint `f` asks for and the field that asked (`None`: free text). More than one
/// constraint is a 400 naming the second.
pub fn parse(f: &StructuredFields) -> Result<Option<(Constraint, &'static str)>, ApiError> {
    let mut found: Vec<(Constraint, &'static str)> = Vec::new();
    if let Some(v) = sent(&f.response_format) {
        let rf: ResponseFormat = serde_json::from_value(v.clone())
            .map_err(|e| ApiError::invalid("response_format", e.to_string()))?;
        match rf {
            ResponseFormat::Text => {}
            ResponseFormat::JsonObject => found.push((Constraint::JsonObject, "response_format")),
            ResponseFormat::JsonSchema { json_schema } => {
                let c = match json_schema.schema {
                    None => Constraint::JsonObject,
                    Some(s) => schema("response_format", &s)?,
                };
                found.push((c, "response_format"));
            }
        }
    }
    if let Some(v) = sent(&f.guided_json) {
        found.push((schema("guided_json", v)?, "guided_json"));
    }
    if let Some(v) = sent(&f.guided_regex) {
        found.push((Constraint::Regex(typed("guided_regex", v)?), "guided_regex"));
    }
    if let Some(v) = sent(&f.guided_choice) {
        found.push((
            Constraint::Choice(typed("guided_choice", v)?),
            "guided_choice",
        ));
    }
    if let Some(v) = sent(&f.guided_grammar) {
        found.push((
            Constraint::Lark(typed("guided_grammar", v)?),
            "guided_grammar",
        ));
    }
    if let Some(v) = sent(&f.structured_outputs) {
        structured_outputs(&typed("structured_outputs", v)?, &mut found)?;
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::invalid(
            found[1].1,
            format!(
                "`{}` and `{}` both constrain the output; set only one",
                found[0].1, found[1].1
            ),
        )),
    }
}

fn structured_outputs(
    so: &StructuredOutputs,
    found: &mut Vec<(Constraint, &'static str)>,
) -> Result<(), ApiError> {
    if let Some(v) = &so.json {
        found.push((
            schema("structured_outputs.json", v)?,
            "structured_outputs.json",
        ));
    }
    if let Some(r) = &so.regex {
        found.push((Constraint::Regex(r.clone()), "structured_outputs.regex"));
    }
    if let Some(c) = &so.choice {
        found.push((Constraint::Choice(c.clone()), "structured_outputs.choice"));
    }
    if let Some(g) = &so.grammar {
        found.push((Constraint::Lark(g.clone()), "structured_outputs.grammar"));
    }
    if so.json_object == Some(true) {
        found.push((Constraint::JsonObject, "structured_outputs.json_object"));
    }
    Ok(())
}

/// A JSON Schema given as an object (or `true`/`false`), or as its JSON text.
fn schema(param: &'static str, v: &Value) -> Result<Constraint, ApiError> {
    let text = match v {
        Value::Object(_) | Value::Bool(_) => v.to_string(),
        Value::String(s) => s.clone(),
        _ => {
            return Err(ApiError::invalid(
                param,
                "a JSON Schema must be an object (or its JSON text)",
            ));
        }
    };
    Ok(Constraint::JsonSchema(text))
}

/// [`parse`], then the constraint compiled on the engine's compile threads (the engine caches
/// it for the request that follows); a constraint that does not compile, is past a limit or
/// takes too long is a 400 naming its field.
pub async fn constraint(
    client: &EngineClient,
    f: &StructuredFields,
) -> Result<Option<Constraint>, ApiError> {
    let Some((c, param)) = parse(f)? else {
        return Ok(None);
    };
    client.prepare_constraint(&c, param).await?;
    Ok(Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(r: Result<Option<(Constraint, &'static str)>, ApiError>) -> String {
        match r {
            Err(ApiError::InvalidRequest { param: Some(p), .. }) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_field_maps_to_its_constraint() {
        let schema = json!({"type": "object"});
        let none = StructuredFields::default();
        assert_eq!(parse(&none).unwrap(), None);
        let cases = [
            (json!({"response_format": {"type": "text"}}), None),
            (
                json!({"response_format": {"type": "json_object"}}),
                Some((Constraint::JsonObject, "response_format")),
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
                Some((
                    Constraint::JsonSchema(schema.to_string()),
                    "response_format",
                )),
            ),
            (
                json!({"guided_json": "{\"type\":\"integer\"}"}),
                Some((
                    Constraint::JsonSchema("{\"type\":\"integer\"}".into()),
                    "guided_json",
                )),
            ),
            (
                json!({"guided_choice": ["a"]}),
                Some((Constraint::Choice(vec!["a".into()]), "guided_choice")),
            ),
            (
                json!({"guided_regex": null, "structured_outputs": {"regex": "[a-z]+", "choice": null}}),
                Some((
                    Constraint::Regex("[a-z]+".into()),
                    "structured_outputs.regex",
                )),
            ),
        ];
        for (body, want) in cases {
            let f: StructuredFields = serde_json::from_value(body.clone()).unwrap();
            assert_eq!(parse(&f).unwrap(), want, "{body}");
        }
    }

    fn fields(body: serde_json::Value) -> StructuredFields {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn two_constraints_or_a_bad_format_are_400() {
        let f = fields(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}));
        assert_eq!(param(parse(&f)), "guided_regex");
        for bad in [
            json!({"type": "xml"}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            json!("json"),
        ] {
            let f = fields(json!({ "response_format": bad }));
            assert_eq!(param(parse(&f)), "response_format", "{bad}");
        }
        assert_eq!(
            param(parse(&fields(json!({"guided_json": 5})))),
            "guided_json"
        );
    }

    #[test]
    fn a_wrong_typed_field_is_400_naming_it() {
        for (body, want) in [
            (json!({"guided_regex": 5}), "guided_regex"),
            (json!({"guided_choice": "a"}), "guided_choice"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice[1]"),
            (json!({"guided_grammar": {}}), "guided_grammar"),
            (json!({"structured_outputs": "regex"}), "structured_outputs"),
            (
                json!({"structured_outputs": {"regex": 5}}),
                "structured_outputs.regex",
            ),
        ] {
            match parse(&fields(body.clone())) {
                Err(ApiError::InvalidRequest {
                    param: Some(p),
                    message,
                    code: "invalid_type",
                }) => {
                    assert_eq!(p, want, "{body}");
                    assert!(message.contains(want), "{message}");
                }
                other => panic!("{body}: {other:?}"),
            }
        }
    }
}
