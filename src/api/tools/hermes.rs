//! Hermes-style calls (Qwen2.5, Qwen3, Hermes 2/3, Kiln's default template):
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one object per tag,
//! possibly after some text and possibly several.
//! Its syntax is [`super::syntax::HERMES`]; this file holds its tests on recorded outputs.

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::test_support::*;
    use super::super::{ParseOptions, ToolFormat};

    fn opts() -> ParseOptions {
        ParseOptions {
            tools: Some(ToolFormat::Hermes),
            ..ParseOptions::default()
        }
    }

    #[test]
    fn qwen25_single_call() {
        // Recorded from Qwen2.5-7B-Instruct.
        let text = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"unit\": \"celsius\"}}\n</tool_call>";
        let r = parse_every_split(opts(), text);
        assert_eq!(r.content, "");
        assert_eq!(
            calls(&r),
            [(
                "get_current_temperature".into(),
                json!({"location": "San Francisco, CA, USA", "unit": "celsius"})
            )]
        );
        assert_eq!(
            r.calls[0].2, "{\"location\": \"San Francisco, CA, USA\", \"unit\": \"celsius\"}",
            "the arguments' own text"
        );
    }

    #[test]
    fn text_then_two_calls() {
        let text = "Let me check both.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": \"</tool_call>\"}}\n</tool_call>\n<tool_call>\n{\"arguments\": {}, \"name\": \"b\"}\n</tool_call>";
        let r = parse_every_split(opts(), text);
        assert_eq!(r.content, "Let me check both.");
        assert_eq!(
            calls(&r),
            [
                ("a".into(), json!({"x": "</tool_call>"})),
                ("b".into(), json!({}))
            ]
        );
    }

    #[test]
    fn plain_text_and_look_alikes_stay_content() {
        for text in [
            "The weather is fine.  ",
            "Use <tool> tags or <tool_call without a close",
            "<tool_call>not json</tool_call> after",
            "<tool_call>\n{\"no_name\": 1}\n</tool_call>",
        ] {
            let r = parse_every_split(opts(), text);
            assert_eq!(r.content, text, "{text:?}");
            assert!(r.calls.is_empty());
        }
    }

    #[test]
    fn truncated_call_keeps_what_came() {
        let r = parse_every_split(
            opts(),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"ab",
        );
        assert_eq!(r.calls.len(), 1);
        assert_eq!(r.calls[0].2, "{\"q\": \"ab");
        assert_eq!(r.content, "");
    }

    #[test]
    fn arguments_as_a_json_string() {
        let r = parse_every_split(
            opts(),
            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
        );
        assert_eq!(calls(&r), [("f".into(), json!({"a": 1}))]);
    }
}
