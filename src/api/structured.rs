//! Structured output on the wire: OpenAI's `response_format` and vLLM's `guided_*` /
//! `structured_outputs` fields, turned into one engine [`Constraint`] and compiled before
//! anything is queued (a constraint that does not compile is a 400 naming its field).

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::blocking;
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

/// The structured-output fields of a request, as sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct StructuredFields<'a> {
    pub response_format: Option<&'a Value>,
    pub guided_json: Option<&'a Value>,
    pub guided_regex: Option<&'a str>,
    pub guided_choice: Option<&'a [String]>,
    pub guided_grammar: Option<&'a str>,
    pub structured_outputs: Option<&'a StructuredOutputs>,
}

/// The constraint `f` asks for and the field that asked (`None`: free text). More than one
/// constraint is a 400 naming the second.
pub fn parse(f: &StructuredFields<'_>) -> Result<Option<(Constraint, &'static str)>, ApiError> {
    let mut found: Vec<(Constraint, &'static str)> = Vec::new();
    if let Some(v) = f.response_format.filter(|v| !v.is_null()) {
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
    if let Some(v) = f.guided_json {
        found.push((schema("guided_json", v)?, "guided_json"));
    }
    if let Some(r) = f.guided_regex {
        found.push((Constraint::Regex(r.to_string()), "guided_regex"));
    }
    if let Some(c) = f.guided_choice {
        found.push((Constraint::Choice(c.to_vec()), "guided_choice"));
    }
    if let Some(g) = f.guided_grammar {
        found.push((Constraint::Lark(g.to_string()), "guided_grammar"));
    }
    if let Some(so) = f.structured_outputs {
        structured_outputs(so, &mut found)?;
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

/// [`parse`], then the constraint compiled on the blocking pool (the engine caches it for the
/// request that follows); a constraint that does not compile is a 400 naming its field.
pub async fn constraint(
    client: &EngineClient,
    f: StructuredFields<'_>,
) -> Result<Option<Constraint>, ApiError> {
    let Some((c, param)) = parse(&f)? else {
        return Ok(None);
    };
    let client = client.clone();
    blocking(move || {
        client.check_constraint(&c, param)?;
        Ok(Some(c))
    })
    .await
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
        let choices = vec!["a".to_string()];
        let rf_text = json!({"type": "text"});
        let text_schema = json!("{\"type\":\"integer\"}");
        let rf_obj = json!({"type": "json_object"});
        let rf_schema = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        let so = StructuredOutputs {
            regex: Some("[a-z]+".into()),
            ..Default::default()
        };
        let none = StructuredFields::default();
        assert_eq!(parse(&none).unwrap(), None);
        let cases: Vec<(StructuredFields<'_>, Option<(Constraint, &str)>)> = vec![
            (
                StructuredFields {
                    response_format: Some(&rf_text),
                    ..none
                },
                None,
            ),
            (
                StructuredFields {
                    response_format: Some(&rf_obj),
                    ..none
                },
                Some((Constraint::JsonObject, "response_format")),
            ),
            (
                StructuredFields {
                    response_format: Some(&rf_schema),
                    ..none
                },
                Some((
                    Constraint::JsonSchema(schema.to_string()),
                    "response_format",
                )),
            ),
            (
                StructuredFields {
                    guided_json: Some(&text_schema),
                    ..none
                },
                Some((
                    Constraint::JsonSchema("{\"type\":\"integer\"}".into()),
                    "guided_json",
                )),
            ),
            (
                StructuredFields {
                    guided_choice: Some(&choices),
                    ..none
                },
                Some((Constraint::Choice(choices.clone()), "guided_choice")),
            ),
            (
                StructuredFields {
                    structured_outputs: Some(&so),
                    ..none
                },
                Some((
                    Constraint::Regex("[a-z]+".into()),
                    "structured_outputs.regex",
                )),
            ),
        ];
        for (f, want) in cases {
            assert_eq!(parse(&f).unwrap(), want, "{f:?}");
        }
    }

    #[test]
    fn two_constraints_or_a_bad_format_are_400() {
        let rf = json!({"type": "json_object"});
        let f = StructuredFields {
            response_format: Some(&rf),
            guided_regex: Some("a"),
            ..Default::default()
        };
        assert_eq!(param(parse(&f)), "guided_regex");
        for bad in [
            json!({"type": "xml"}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            json!("json"),
        ] {
            let f = StructuredFields {
                response_format: Some(&bad),
                ..Default::default()
            };
            assert_eq!(param(parse(&f)), "response_format", "{bad}");
        }
        let f = StructuredFields {
            guided_json: Some(&json!(5)),
            ..Default::default()
        };
        assert_eq!(param(parse(&f)), "guided_json");
    }
}
