//! Mistral calls (v3 tokenizer, Mistral-7B-Instruct-v0.3, Mixtral, Mistral-Nemo):
//! `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`. `[TOOL_CALLS]` is a control token,
//! so a reply decoded without special tokens starts at the list.
//! Its syntax is [`super::syntax::MISTRAL`]; this file holds its tests on recorded outputs.

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::test_support::*;
    use super::super::{ParseOptions, ToolFormat};

    fn opts() -> ParseOptions {
        ParseOptions {
            tools: Some(ToolFormat::Mistral),
            ..ParseOptions::default()
        }
    }

    #[test]
    fn mistral_v03_calls() {
        // Recorded from Mistral-7B-Instruct-v0.3.
        let text = "[TOOL_CALLS] [{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\", \"format\": \"celsius\"}}, {\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Dallas, TX\", \"format\": \"fahrenheit\"}}]";
        let r = parse_every_split(opts(), text);
        assert_eq!(r.content, "");
        assert_eq!(
            calls(&r),
            [
                (
                    "get_current_weather".into(),
                    json!({"location": "Paris, France", "format": "celsius"})
                ),
                (
                    "get_current_weather".into(),
                    json!({"location": "Dallas, TX", "format": "fahrenheit"})
                )
            ]
        );
        assert!(r.calls.iter().all(|c| c.0.len() == 9));
    }

    #[test]
    fn without_the_control_token() {
        let r = parse_every_split(opts(), " [{\"name\": \"f\", \"arguments\": {}}]");
        assert_eq!(calls(&r), [("f".into(), json!({}))]);
        let r = parse_every_split(
            opts(),
            "[TOOL_CALLS]{\"name\": \"g\", \"arguments\": {\"a\": [1]}}",
        );
        assert_eq!(calls(&r), [("g".into(), json!({"a": [1]}))]);
    }

    #[test]
    fn text_stays_content() {
        for text in ["[1, 2, 3] are numbers", "[TOOL] x", "Hi [TOOL_CALLS] nope"] {
            let r = parse_every_split(opts(), text);
            assert_eq!(r.content, text, "{text:?}");
            assert!(r.calls.is_empty());
        }
    }
}
