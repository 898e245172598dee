//! The harmony format (gpt-oss) end to end: the real gpt-oss chat template rendered by Kiln
//! against openai-harmony's rendering, Kiln's parse of replies harmony's encoder wrote against
//! harmony's own parse, and a server whose vocabulary has the harmony special tokens
//! (`llama-2-tiny-random.gguf`, random weights, the tokens patched in, the gpt-oss template):
//! `reasoning_effort`, reasoning and answer streamed as they parse whole, `tool_choice`
//! required and named, a tool-call round trip, and the same through the `openai` SDK
//! (`tests/harmony_sdk.py`).
//!
//! The references are PyPI's `openai-harmony` and `bpe-openai` (the o200k vocabulary that
//! harmony loads, written by `scripts/o200k_files.py`); the tests that need them skip, saying
//! so, where python cannot import them, and fail where `KILN_REQUIRE_HARMONY=1` (CI) is set.

mod api_support;
mod markup_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use api_support::*;
use kiln::api::tools::{ParseOptions, ParsedReply, ToolFormat};
use kiln::tokenizer::Tokenizer;
use kiln::tokenizer::chat::{ChatMessage, ChatTemplate, TemplateTool, TemplateToolCall};
use markup_support::{fixture, write_patched_tokenizer};
use serde_json::{Value, json};

/// The harmony tokens and the ids they take over in the patched Llama-2 vocabulary.
const HARMONY: [(u32, &str); 7] = [
    (31980, "<|start|>"),
    (31981, "<|channel|>"),
    (31982, "<|message|>"),
    (31983, "<|end|>"),
    (31984, "<|return|>"),
    (31985, "<|call|>"),
    (31986, "<|constrain|>"),
];

fn id(text: &str) -> u32 {
    HARMONY
        .iter()
        .find(|(_, t)| *t == text)
        .expect("a harmony token")
        .0
}

fn template_source() -> String {
    let path = kiln::config::project_root()
        .join("../shared/models/chat-templates/openai-gpt-oss-120b.jinja");
    std::fs::read_to_string(&path).expect("the gpt-oss chat template")
}

fn template() -> ChatTemplate {
    ChatTemplate::new(&template_source(), "<|startoftext|>", "<|return|>").expect("compiles")
}

fn python() -> String {
    std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Python when it has the references; `None` (after saying so) when it does not, a panic
/// when `KILN_REQUIRE_HARMONY=1`.
fn python_with_harmony() -> Option<String> {
    let ok = Command::new(python())
        .args(["-c", "import openai_harmony, bpe_openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(python());
    }
    if std::env::var("KILN_REQUIRE_HARMONY").is_ok_and(|v| v == "1") {
        panic!("KILN_REQUIRE_HARMONY=1 but python cannot import openai_harmony and bpe_openai");
    }
    eprintln!(
        "SKIPPED: python cannot import openai_harmony and bpe_openai (pip install openai-harmony bpe-openai)"
    );
    None
}

/// A folder with `o200k_base.tiktoken` (for harmony) and o200k_harmony's `tokenizer.json`,
/// written once per test binary by `scripts/o200k_files.py`.
fn o200k_dir(python: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("kiln-harmony-{}", std::process::id()));
        let script = kiln::config::project_root().join("scripts/o200k_files.py");
        for only in ["tiktoken", "tokenizer.json"] {
            let out = Command::new(python)
                .arg(&script)
                .arg(&dir)
                .args(["--only", only])
                .output()
                .expect("run o200k_files.py");
            assert!(
                out.status.success(),
                "o200k_files.py --only {only}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    })
}

/// `tests/harmony_ref.py COMMAND` on `input`: its JSON answer.
fn harmony_ref(python: &str, command: &str, input: &Value) -> Value {
    use std::io::Write;
    let script = kiln::config::project_root().join("tests/harmony_ref.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(command)
        .env("TIKTOKEN_ENCODINGS_BASE", o200k_dir(python))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run harmony_ref.py");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "harmony_ref.py {command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from harmony_ref.py")
}

fn weather() -> TemplateTool {
    TemplateTool {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: json!({"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}),
    }
}

/// Today as Kiln's templates write it (the template's `Current date`).
fn today() -> String {
    let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", "", "").unwrap();
    t.render(&[ChatMessage::new("user", "")], false).unwrap()
}

/// One conversation for both renderers: Kiln's messages, effort and tools, and the same
/// conversation in harmony's terms.
struct Case {
    msgs: Vec<ChatMessage>,
    tools: Vec<TemplateTool>,
    effort: Option<&'static str>,
    harmony: Value,
    /// Where the template's convention differs from harmony's: (harmony's text, the
    /// template's).
    differs: Vec<(&'static str, &'static str)>,
}

fn cases() -> Vec<Case> {
    let date = today();
    let w = weather();
    let w_json = json!({"name": w.name, "description": w.description, "parameters": w.parameters});
    let mut call = ChatMessage::new("assistant", "");
    call.thinking = Some("Need the weather.".into());
    call.tool_calls = vec![TemplateToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: json!({"city": "Paris", "days": 2}),
    }];
    let mut result = ChatMessage::new("tool", "Sunny, 21 C");
    result.tool_call_id = Some("call_1".into());
    vec![
        Case {
            msgs: vec![ChatMessage::new("user", "Hi")],
            tools: vec![],
            effort: None,
            harmony: json!({"date": date, "messages": [{"role": "user", "content": "Hi"}]}),
            differs: vec![],
        },
        Case {
            msgs: vec![
                ChatMessage::new("system", "Answer in French."),
                ChatMessage::new("user", "Hi"),
                ChatMessage::new("assistant", "Bonjour !"),
                ChatMessage::new("user", "And now?"),
            ],
            tools: vec![],
            effort: Some("low"),
            harmony: json!({"date": date, "effort": "low", "instructions": "Answer in French.",
                "messages": [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "channel": "final", "content": "Bonjour !"},
                    {"role": "user", "content": "And now?"}]}),
            // Instructions without tools: the template ends them with a blank line.
            differs: vec![("Answer in French.<|end|>", "Answer in French.\n\n<|end|>")],
        },
        Case {
            msgs: vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Weather in Paris for 2 days?"),
                call,
                result,
            ],
            tools: vec![w],
            effort: Some("high"),
            harmony: json!({"date": date, "effort": "high", "instructions": "Be brief.",
                "tools": [w_json],
                "messages": [{"role": "user", "content": "Weather in Paris for 2 days?"},
                    {"role": "assistant", "channel": "analysis", "content": "Need the weather."},
                    {"role": "assistant", "channel": "commentary", "recipient": "functions.get_weather",
                     "content_type": "json", "content": "{\"city\": \"Paris\", \"days\": 2}"},
                    {"role": "tool", "name": "functions.get_weather", "channel": "commentary",
                     "content": "Sunny, 21 C"}]}),
            // The template writes a tool's result as a JSON string (`tojson`).
            differs: vec![(
                "<|message|>Sunny, 21 C<|end|>",
                "<|message|>\"Sunny, 21 C\"<|end|>",
            )],
        },
    ]
}

/// Kiln's rendering of the real gpt-oss template equals openai-harmony's, but for two
/// conventions where they differ: the template writes a tool's result as a JSON string
/// (`"Sunny, 21 C"`, `tojson`), harmony as it stands; and it ends developer instructions
/// with a blank line when no tools follow, harmony does not. The template is what gpt-oss
/// was trained on, so Kiln keeps it.
#[test]
fn the_template_renders_as_openai_harmony_does() {
    let Some(python) = python_with_harmony() else {
        return;
    };
    let cases = cases();
    let input = Value::from(cases.iter().map(|c| c.harmony.clone()).collect::<Vec<_>>());
    let want = harmony_ref(&python, "render", &input);
    let t = template();
    for (case, want) in cases.iter().zip(want.as_array().unwrap()) {
        let kiln = match case.effort {
            Some(e) => t.render_effort(&case.msgs, &case.tools, true, e),
            None => t.render_with_tools(&case.msgs, &case.tools, true),
        }
        .unwrap();
        let mut want = want["text"].as_str().unwrap().to_string();
        for (theirs, template) in &case.differs {
            assert!(want.contains(theirs), "{want}");
            want = want.replace(theirs, template);
        }
        assert_eq!(kiln, want);
    }
}

/// Replies as harmony's encoder writes them (token ids of o200k_harmony), decoded by Kiln's
/// o200k tokenizer with special tokens skipped (the harmony markup is kept) and without the
/// final `<|return|>`/`<|call|>` (the engine stops on it), parse as harmony parses them.
#[test]
fn replies_parse_as_openai_harmony_parses_them() {
    let Some(python) = python_with_harmony() else {
        return;
    };
    let call = |name: &str, args: &str| {
        json!({"channel": "commentary", "recipient": format!("functions.{name}"),
               "content_type": "<|constrain|>json", "content": args})
    };
    let replies = json!([
        [{"channel": "analysis", "content": "The user greets. Reply."},
         {"channel": "final", "content": "Hello! How can I help?"}],
        [{"channel": "final", "content": " spaced\n\nlines "}],
        [{"channel": "analysis", "content": "Need weather."},
         call("get_weather", "{\"city\":\"Paris\",\"days\":2}")],
        [{"channel": "analysis", "content": "First."},
         {"channel": "commentary", "content": "Let me check."},
         call("get.time-zone_2", "{\"zone\": \"UTC\"}")],
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>",
        "<|channel|>analysis<|message|>Just think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
    ]);
    let want = harmony_ref(&python, "parse", &replies);
    let dir = o200k_dir(&python);
    let tok = Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .expect("o200k_harmony tokenizer.json");
    let opts = ParseOptions {
        tools: Some(ToolFormat::Harmony),
        harmony: true,
        ..ParseOptions::default()
    };
    for want in want.as_array().unwrap() {
        let mut ids: Vec<u32> = want["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let last = ids.pop().unwrap();
        assert!(tok.eos_ids().contains(&last), "{last} ends generation");
        let text = tok.decode(&ids, true).unwrap();
        let got = ParsedReply::parse(opts, &text);
        let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
        for m in want["messages"].as_array().unwrap() {
            let text = m["text"].as_str().unwrap();
            match (m["channel"].as_str(), m["recipient"].as_str()) {
                (_, Some(r)) => calls.push((r["functions.".len()..].to_string(), text.to_string())),
                (Some("analysis"), None) => reasoning.push_str(text),
                _ => content.push_str(text),
            }
        }
        let got_calls: Vec<(String, String)> = got
            .calls
            .iter()
            .map(|c| (c.1.clone(), c.2.clone()))
            .collect();
        assert_eq!(
            (got.reasoning.as_str(), got.content.as_str(), got_calls),
            (reasoning.as_str(), content.as_str(), calls),
            "{text:?}"
        );
    }
}

/// `llama-2-tiny-random.gguf` with [`HARMONY`] as special added tokens and the gpt-oss
/// template (EOS `<|return|>`, as gpt-oss ships it).
fn harmony_tokenizer() -> Tokenizer {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let config = json!({"bos_token": "<s>", "eos_token": "<|return|>",
                            "chat_template": template_source()});
        write_patched_tokenizer(&HARMONY, "harmony", &config)
    });
    Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .expect("patched tokenizer")
}

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let mut files = fixture();
        files.tokenizer = Some(harmony_tokenizer());
        let mut cfg = test_config();
        cfg.server.api_keys = vec!["sk-kiln-test".into()];
        start_with(files, cfg)
    })
}

async fn chat(body: &Value) -> (u16, Value) {
    let c = client()
        .post(format!("{}/v1/chat/completions", server().base))
        .bearer_auth("sk-kiln-test")
        .json(body)
        .send()
        .await
        .expect("send");
    let status = c.status().as_u16();
    (status, c.json().await.unwrap_or(Value::Null))
}

/// A streamed chat: reasoning, content and calls (name, arguments) put together, and the
/// finish reason.
async fn chat_stream(body: &Value) -> (String, String, Vec<(String, String)>, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let res = client()
        .post(format!("{}/v1/chat/completions", server().base))
        .bearer_auth("sk-kiln-test")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(res.status().as_u16(), 200);
    let raw = res.text().await.unwrap();
    let (mut reasoning, mut content, mut calls, mut finish) = (
        String::new(),
        String::new(),
        Vec::<(String, String)>::new(),
        String::new(),
    );
    for frame in raw.split("\n\n").filter_map(|f| f.strip_prefix("data: ")) {
        if frame == "[DONE]" {
            continue;
        }
        let c: Value = serde_json::from_str(frame).unwrap();
        let choice = &c["choices"][0];
        let d = &choice["delta"];
        reasoning += d["reasoning_content"].as_str().unwrap_or_default();
        content += d["content"].as_str().unwrap_or_default();
        for t in d["tool_calls"].as_array().into_iter().flatten() {
            let i = t["index"].as_u64().unwrap() as usize;
            if let Some(name) = t["function"]["name"].as_str() {
                assert_eq!(i, calls.len(), "a call's name comes first, once");
                calls.push((name.to_string(), String::new()));
            }
            calls[i].1 += t["function"]["arguments"].as_str().unwrap_or_default();
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (reasoning, content, calls, finish)
}

const MODEL: &str = "llama-2-tiny-random.gguf";

/// A guided grammar that makes the random model write a harmony reply: an analysis message,
/// then the final one.
fn two_channels() -> String {
    format!(
        "start: <[{c}]> \"analysis\" <[{m}]> /[a-z]{{2,6}}( [a-z]{{2,6}}){{1,3}}/ <[{e}]> <[{s}]> \"assistant\" <[{c}]> \"final\" <[{m}]> /[A-Z][a-z]{{2,6}}( [a-z]{{2,6}}){{1,3}}\\./",
        c = id("<|channel|>"),
        m = id("<|message|>"),
        e = id("<|end|>"),
        s = id("<|start|>")
    )
}

fn no_markup(text: &str) {
    assert!(!text.contains("<|"), "markup in {text:?}");
}

#[tokio::test]
async fn reasoning_and_answer_split_and_stream_as_they_parse() {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 60, "temperature": 0, "reasoning_effort": "low",
        "guided_grammar": two_channels()});
    let (status, res) = chat(&body).await;
    assert_eq!(status, 200, "{res}");
    let choice = &res["choices"][0];
    let msg = &choice["message"];
    let reasoning = msg["reasoning_content"]
        .as_str()
        .expect("reasoning_content");
    let content = msg["content"].as_str().expect("content");
    assert!(
        reasoning.split(' ').count() >= 2 && content.ends_with('.'),
        "{msg}"
    );
    no_markup(reasoning);
    no_markup(content);
    assert_eq!(choice["finish_reason"], "stop", "{res}");
    assert!(msg.get("tool_calls").is_none_or(Value::is_null));
    let (r, c, calls, finish) = chat_stream(&body).await;
    assert_eq!((r.as_str(), c.as_str()), (reasoning, content));
    assert!(calls.is_empty() && finish == "stop");
    // The prompt is the template's with `Reasoning: low`.
    let tok = harmony_tokenizer();
    let text = template()
        .render_effort(&[ChatMessage::new("user", "Hi")], &[], true, "low")
        .unwrap();
    assert!(text.contains("Reasoning: low"));
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(res["usage"]["prompt_tokens"], ids.len());
    let medium = template()
        .render(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    assert!(medium.contains("Reasoning: medium"));
}

#[tokio::test]
async fn reasoning_effort_is_checked() {
    for effort in [json!("minimal"), json!("none"), json!("extreme")] {
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1, "reasoning_effort": effort});
        let (status, res) = chat(&body).await;
        assert_error(
            status,
            &res,
            400,
            "invalid_request_error",
            Some("reasoning_effort"),
        );
    }
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1, "reasoning_effort": 3});
    let (status, res) = chat(&body).await;
    assert_eq!(status, 400, "{res}");
    // A template that does not read `reasoning_effort` cannot honour it.
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
        "reasoning_effort": "high"});
    let (status, _, res) = post(&shared().base, "/v1/chat/completions", &body).await;
    assert_error(
        status,
        &res,
        400,
        "invalid_request_error",
        Some("reasoning_effort"),
    );
    // `reasoning_content` belongs to assistant messages.
    let body = json!({"model": MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": "Hi", "reasoning_content": "x"}]});
    let (status, res) = chat(&body).await;
    assert_error(
        status,
        &res,
        400,
        "invalid_request_error",
        Some("messages[0].reasoning_content"),
    );
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"], "additionalProperties": false}}})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_time", "description": "The time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": false}}})
}

/// `tool_choice` required and named: the reply is one harmony call (an analysis may come
/// first; the bias on `<|end|>` keeps the random model's analysis short), parsed into
/// `tool_calls` with `finish_reason` `tool_calls`, streamed as it parses whole.
#[tokio::test]
async fn tool_choice_makes_a_harmony_call() {
    let bias = json!({id("<|end|>").to_string(): 30});
    for (choice, name) in [
        (json!("required"), None),
        (
            json!({"type": "function", "function": {"name": "get_time"}}),
            Some("get_time"),
        ),
    ] {
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [weather_tool(), time_tool()], "tool_choice": choice, "max_tokens": 120,
            "temperature": 0, "logit_bias": bias});
        let (status, res) = chat(&body).await;
        assert_eq!(status, 200, "{res}");
        let c = &res["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{res}");
        let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
        assert_eq!(calls.len(), 1, "{res}");
        let f = &calls[0]["function"];
        let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).expect("JSON");
        match f["name"].as_str().unwrap() {
            "get_weather" => assert!(name.is_none() && args["city"].is_string(), "{args}"),
            "get_time" => assert!(["UTC", "CET"].contains(&args["zone"].as_str().unwrap())),
            other => panic!("called {other}"),
        }
        if let Some(n) = name {
            assert_eq!(f["name"], n);
        }
        assert!(c["message"]["content"].is_null(), "{res}");
        let reasoning = c["message"]["reasoning_content"]
            .as_str()
            .unwrap_or_default();
        no_markup(reasoning);
        let (r, content, streamed, finish) = chat_stream(&body).await;
        assert_eq!(
            (r.as_str(), content.as_str(), finish.as_str()),
            (reasoning, "", "tool_calls")
        );
        let whole: Vec<(String, String)> = calls
            .iter()
            .map(|c| {
                let f = &c["function"];
                (
                    f["name"].as_str().unwrap().into(),
                    f["arguments"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert_eq!(streamed, whole);
    }
}

/// A conversation with an earlier call (its reasoning as `reasoning_content`) and the tool's
/// result: the prompt is the template's rendering of it, the reasoning included as the
/// template's `thinking` (it renders the analysis before the call).
#[tokio::test]
async fn a_tool_round_trip_renders_the_call_its_reasoning_and_the_result() {
    let turns = |reasoning: Option<&str>| {
        json!([{"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "reasoning_content": reasoning,
             "tool_calls": [{"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}])
    };
    let tool = weather_tool();
    let tools = [TemplateTool {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: tool["function"]["parameters"].clone(),
    }];
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = vec![TemplateToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: json!({"city": "Paris"}),
    }];
    let mut result = ChatMessage::new("tool", "Sunny");
    result.tool_call_id = Some("call_1".into());
    let tok = harmony_tokenizer();
    for reasoning in [None, Some("Need the weather.")] {
        call.thinking = reasoning.map(str::to_string);
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Weather in Paris?"),
            call.clone(),
            result.clone(),
        ];
        let text = template().render_with_tools(&msgs, &tools, true).unwrap();
        let want = "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"Sunny\"<|end|><|start|>assistant";
        assert_eq!(text.ends_with(want), reasoning.is_some(), "{text}");
        assert!(text.contains("# Instructions\n\nBe brief.") && text.contains("type get_weather"));
        let body = json!({"model": MODEL, "messages": turns(reasoning), "tools": [weather_tool()],
            "max_tokens": 4, "temperature": 0});
        let (status, res) = chat(&body).await;
        assert_eq!(status, 200, "{res}");
        let ids = tok.encode(&text, false).unwrap();
        assert_eq!(res["usage"]["prompt_tokens"], ids.len(), "{reasoning:?}");
    }
}

/// The harmony checks through the real `openai` SDK (`tests/harmony_sdk.py`).
#[tokio::test]
async fn openai_python_sdk_harmony() {
    let python = python();
    let ok = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var("KILN_REQUIRE_OPENAI_SDK").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_OPENAI_SDK=1 but the openai package is missing");
        }
        eprintln!("SKIPPED: python3 cannot import openai (pip install openai to run this test)");
        return;
    }
    let script = kiln::config::project_root().join("tests/harmony_sdk.py");
    let ids = json!({"end": id("<|end|>"), "start": id("<|start|>"),
        "channel": id("<|channel|>"), "message": id("<|message|>")});
    let args = [
        server().base.clone(),
        "sk-kiln-test".into(),
        MODEL.into(),
        ids.to_string(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args(args)
            .output()
            .expect("run python")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains(" passed, 0 failed"),
        "harmony SDK suite failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `/v1/responses` on the same path: a reasoning item before a function call is rendered as
/// that turn's `thinking` (the analysis before the call).
#[tokio::test]
async fn responses_reasoning_items_render_before_the_call() {
    let input = |reasoning: bool| {
        let mut items =
            vec![json!({"type": "message", "role": "user", "content": "Weather in Paris?"})];
        if reasoning {
            items.push(json!({"type": "reasoning", "summary": [],
                "content": [{"type": "reasoning_text", "text": "Need the weather."}]}));
        }
        items.push(
            json!({"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": "{\"city\": \"Paris\"}"}),
        );
        items.push(json!({"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}));
        items
    };
    let tool = weather_tool();
    let f = &tool["function"];
    let tools = [TemplateTool {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: f["parameters"].clone(),
    }];
    let tok = harmony_tokenizer();
    for reasoning in [false, true] {
        let mut call = ChatMessage::new("assistant", "");
        call.thinking = reasoning.then(|| "Need the weather.".to_string());
        call.tool_calls = vec![TemplateToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}),
        }];
        let mut result = ChatMessage::new("tool", "Sunny");
        result.tool_call_id = Some("call_1".into());
        let msgs = [ChatMessage::new("user", "Weather in Paris?"), call, result];
        let text = template().render_with_tools(&msgs, &tools, true).unwrap();
        assert_eq!(
            text.contains("<|channel|>analysis<|message|>Need the weather.<|end|>"),
            reasoning
        );
        let body = json!({"model": MODEL, "input": input(reasoning), "store": false,
            "max_output_tokens": 4, "temperature": 0,
            "tools": [{"type": "function", "name": "get_weather", "description": f["description"],
                       "parameters": f["parameters"]}]});
        let res = client()
            .post(format!("{}/v1/responses", server().base))
            .bearer_auth("sk-kiln-test")
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(res.status().as_u16(), 200);
        let res: Value = res.json().await.unwrap();
        let ids = tok.encode(&text, false).unwrap();
        assert_eq!(
            res["usage"]["input_tokens"],
            ids.len(),
            "reasoning {reasoning}: {res}"
        );
    }
}
