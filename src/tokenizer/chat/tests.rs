//! Chat templates: rendering, tools, reasoning switches and the limits templates run within.

use super::*;

#[test]
fn reasoning_effort_reaches_the_template() {
    let source = "{{ reasoning_effort | default('unset') }}:{{ messages[0].content }}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let msgs = [ChatMessage::new("user", "Hi")];
    assert_eq!(t.render_effort(&msgs, &[], true, "low").unwrap(), "low:Hi");
    assert_eq!(t.render(&msgs, true).unwrap(), "unset:Hi");
}

#[test]
fn enable_thinking_is_defined_only_when_given() {
    let source = "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}\
        {% if enable_thinking is not defined %}undefined{% endif %}{{ messages[0].content }}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let msgs = [ChatMessage::new("user", "Hi")];
    let r = |on| t.render_thinking(&msgs, &[], true, on).unwrap();
    assert_eq!(r(None), "undefinedHi");
    assert_eq!(t.render(&msgs, true).unwrap(), "undefinedHi");
    assert_eq!(r(Some(false)), "<think></think>Hi");
    assert_eq!(r(Some(true)), "Hi");
}

fn conv() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello"),
        ChatMessage::new("user", "Tell a story"),
    ]
}

#[test]
fn default_template_renders_turns() {
    let t = ChatTemplate::default_for("<s>", "</s>").unwrap();
    let s = t.render(&conv(), true).unwrap();
    assert_eq!(
        s,
        "<s>Be brief.\n\nUser: Hi\nAssistant: Hello</s>\nUser: Tell a story\nAssistant:"
    );
    let s = t.render(&conv()[..2], false).unwrap();
    assert_eq!(s, "<s>Be brief.\n\nUser: Hi\n");
}

#[test]
fn hf_style_template_with_python_methods_and_trim_blocks() {
    let src = "{% for m in messages %}\n<|{{ m.role }}|>{{ m['content'].strip() }}\n{% endfor %}\n{% if add_generation_prompt %}<|assistant|>{% endif %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let s = t
        .render(&[ChatMessage::new("user", "  x  ")], true)
        .unwrap();
    assert_eq!(s, "<|user|>x\n<|assistant|>");
}

#[test]
fn raise_exception_reports_its_message() {
    let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}ok";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let err = t
        .render(&[ChatMessage::new("assistant", "x")], true)
        .unwrap_err();
    assert!(err.to_string().contains("roles must alternate"), "{err}");
    assert!(
        ChatTemplate::default_for("", "")
            .unwrap()
            .render(&[ChatMessage::new("narrator", "x")], true)
            .is_err()
    );
}

#[test]
fn bad_template_is_a_syntax_error() {
    assert!(matches!(
        ChatTemplate::new("{% for %}", "", ""),
        Err(ChatTemplateError::Syntax(_))
    ));
}

fn weather_tool() -> TemplateTool {
    TemplateTool {
        name: "get_weather".into(),
        description: Some("Weather now".into()),
        parameters: serde_json::json!({"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }
}

/// A system prompt, a question, the assistant's call and the tool's answer.
fn tool_conv(id: &str) -> Vec<ChatMessage> {
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = vec![TemplateToolCall {
        id: id.into(),
        name: "get_weather".into(),
        arguments: serde_json::json!({"city": "Paris"}),
    }];
    let mut result = ChatMessage::new("tool", "18 C");
    result.tool_call_id = Some(id.into());
    vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Weather in Paris?"),
        call,
        result,
    ]
}

fn render_file(file: &str, id: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates");
    let src = std::fs::read_to_string(dir.join(file)).unwrap();
    let t = ChatTemplate::new(&src, "<s>", "</s>").unwrap();
    t.render_with_tools(&tool_conv(id), &[weather_tool()], true)
        .unwrap()
}

#[test]
fn default_template_renders_tools_and_tool_turns() {
    let t = ChatTemplate::default_for("<s>", "</s>").unwrap();
    let s = t
        .render_with_tools(&tool_conv("call_1"), &[weather_tool()], true)
        .unwrap();
    assert_eq!(
        s,
        "<s>You can call these functions. To call one, answer with <tool_call>{\"name\": \
         <function name>, \"arguments\": <arguments as a JSON object>}</tool_call>.\n\
         {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \
         \"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \
         \"required\": [\"city\"]}}}\n\nBe brief.\n\nUser: Weather in Paris?\n\
         Assistant: <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\
         </tool_call></s>\nTool (call_1): 18 C\nAssistant:"
    );
    assert_eq!(
        t.render_with_tools(&conv(), &[], true).unwrap(),
        t.render(&conv(), true).unwrap(),
        "no tools: the plain rendering"
    );
}

#[test]
fn llama31_template_with_tools() {
    let s = render_file("llama31.jinja", "call_1");
    let tool_json = "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"Weather now\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}";
    assert!(
        s.starts_with("<s><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nBe brief.<|eot_id|>"),
        "{s}"
    );
    assert!(
        s.contains(&format!(
            "Do not use variables.\n\n{tool_json}\n\nWeather in Paris?<|eot_id|>"
        )),
        "{s}"
    );
    assert!(
        s.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>\
                     <|start_header_id|>ipython<|end_header_id|>\n\n\"18 C\"<|eot_id|>\
                     <|start_header_id|>assistant<|end_header_id|>\n\n"),
        "{s}"
    );
}

#[test]
fn qwen25_template_with_tools() {
    let s = render_file("qwen25.jinja", "call_1");
    assert_eq!(
        s,
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
         {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", \
         \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n\
         </tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n\
         </tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n\
         <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn mistral_template_with_tools() {
    let s = render_file("mistral_v3.jinja", "abcDEF123");
    assert_eq!(
        s,
        "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \
         \"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \
         \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST] Weather in Paris?[/INST]\
         [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcDEF123\"}]</s>\
         [TOOL_RESULTS] {\"content\": 18 C, \"call_id\": \"abcDEF123\"}[/TOOL_RESULTS]"
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates");
    let src = std::fs::read_to_string(dir.join("mistral_v3.jinja")).unwrap();
    let t = ChatTemplate::new(&src, "<s>", "</s>").unwrap();
    let err = t
        .render_with_tools(&tool_conv("call_123456789"), &[], true)
        .unwrap_err();
    assert!(err.to_string().contains("length 9"), "{err}");
}

#[test]
fn tojson_matches_python() {
    let env_src = "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ [] | tojson(indent=2) }}|{{ 'é\"<' | tojson }}";
    let t = ChatTemplate::new(env_src, "", "").unwrap();
    let env = &t.env;
    let out = env
        .render_str(
            env_src,
            minijinja::context! { x => json_value(&serde_json::json!({"b": [1, 2.5, true, null], "a": {}})) },
        )
        .unwrap();
    assert_eq!(
        out,
        "{\"b\": [1, 2.5, true, null], \"a\": {}}|{\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"a\": {}\n}|[]|\"é\\\"<\""
    );
}

#[test]
fn dates() {
    assert_eq!(civil_from_days(0), (1970, 1, 1));
    assert_eq!(civil_from_days(19_723), (2024, 1, 1));
    assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    assert!(strftime_now("%d %b %Y".into()).len() >= 10);
}

/// Renders `src` over one user message, timing it.
fn render_bomb(src: &str) -> (Result<String, ChatTemplateError>, std::time::Duration) {
    let t = ChatTemplate::new(src, "", "").unwrap();
    let start = std::time::Instant::now();
    let out = t.render(&[ChatMessage::new("user", "x")], true);
    (out, start.elapsed())
}

#[test]
fn a_looping_template_runs_out_of_fuel() {
    let src =
        "{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
    let (out, took) = render_bomb(src);
    match out {
        Err(ChatTemplateError::Limit(m)) => assert!(m.contains("instruction limit"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(took.as_secs() < 10, "{took:?}");
}

#[test]
fn a_string_doubling_template_stops_at_the_output_cap() {
    let src = "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{{ ns.s }}{% set ns.s = ns.s ~ ns.s %}{% endfor %}";
    let (out, took) = render_bomb(src);
    match out {
        Err(ChatTemplateError::Limit(m)) => assert!(m.contains("output limit"), "{m}"),
        other => panic!("{:?}", other.map(|s| s.len())),
    }
    assert!(took.as_secs() < 10, "{took:?}");
}

#[test]
fn endless_recursion_stops_at_the_recursion_limit() {
    for src in [
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    ] {
        match render_bomb(src).0 {
            Err(ChatTemplateError::Limit(m)) => assert!(m.contains("recursion limit"), "{m}"),
            other => panic!("{src}: {other:?}"),
        }
    }
}

#[test]
fn the_shipped_templates_render_a_long_conversation_within_the_limits() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates");
    let mut conv = Vec::new();
    for i in 0..512 {
        conv.push(ChatMessage::new("user", format!("question {i}")));
        conv.push(ChatMessage::new("assistant", format!("answer {i}")));
    }
    conv.push(ChatMessage::new("user", "last"));
    for file in ["llama31.jinja", "qwen25.jinja", "mistral_v3.jinja"] {
        let src = std::fs::read_to_string(dir.join(file)).unwrap();
        let t = ChatTemplate::new(&src, "<s>", "</s>").unwrap();
        let out = t.render_with_tools(&conv, &[weather_tool()], true);
        assert!(out.is_ok(), "{file}: {out:?}");
    }
}
