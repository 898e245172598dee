//! Llama 3.1/3.2 JSON calls: the reply is `{"name": ..., "parameters": {...}}` (after
//! `<|python_tag|>` when special tokens are shown), several separated by `;`.
//! Its syntax is [`super::syntax::LLAMA3_JSON`]; this file holds its tests on recorded outputs.

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::test_support::*;
    use super::super::{ParseOptions, ToolFormat};

    fn opts() -> ParseOptions {
        ParseOptions {
            tools: Some(ToolFormat::Llama3Json),
            ..ParseOptions::default()
        }
    }

    #[test]
    fn llama31_call() {
        // Recorded from Llama-3.1-8B-Instruct.
        let text = "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}}";
        let r = parse_every_split(opts(), text);
        assert_eq!(r.content, "");
        assert_eq!(
            calls(&r),
            [(
                "get_current_conditions".into(),
                json!({"location": "San Francisco, CA", "unit": "Fahrenheit"})
            )]
        );
    }

    #[test]
    fn python_tag_and_several_calls() {
        let text = "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": 1}}; {\"name\": \"b\", \"arguments\": {\"s\": \"x;y\"}}";
        let r = parse_every_split(opts(), text);
        assert_eq!(
            calls(&r),
            [
                ("a".into(), json!({"n": 1})),
                ("b".into(), json!({"s": "x;y"}))
            ]
        );
        assert_eq!(r.content, "");
    }

    #[test]
    fn text_and_json_content_stay_content() {
        for text in [
            "It is sunny in {city}.",
            "{\"answer\": 42}",
            "  {not json at all",
        ] {
            let r = parse_every_split(opts(), text);
            assert_eq!(r.content, text, "{text:?}");
            assert!(r.calls.is_empty());
        }
    }
}
