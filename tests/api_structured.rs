//! Structured output: constrained decoding in the engine and the `response_format` /
//! `guided_*` / `structured_outputs` API, on `llama-2-tiny-random.gguf` (random weights and
//! the full Llama-2 vocabulary: its free output is gibberish, so output that fits a
//! constraint proves the constraint held).

mod api_support;

use std::sync::OnceLock;

use futures_util::future::join_all;
use kiln::engine::{
    Constraint, Device, Engine, EngineClient, EngineError, FinishReason, GenerateRequest,
    StreamEvent,
};
use kiln::model::{LoadFormat, ModelFiles};
use serde_json::{Value, json};

fn files() -> ModelFiles {
    let path = kiln::config::resolve_path(std::path::Path::new(
        "../shared/models/llama-2-tiny-random.gguf",
    ));
    ModelFiles::open(&path, LoadFormat::Gguf).expect("fixture")
}

/// One engine on the fixture, shared by the engine-level tests of this binary.
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let cfg = api_support::test_config().engine;
        Engine::start(files(), &[Device::Cpu], cfg).expect("engine")
    })
}

fn prompt(client: &EngineClient, text: &str) -> Vec<u32> {
    client.tokenizer().unwrap().encode(text, true).unwrap()
}

/// Text, token ids and finish reason of each choice.
async fn run(client: &EngineClient, req: GenerateRequest) -> Vec<(String, Vec<u32>, FinishReason)> {
    let n = req.n;
    let mut out = vec![(String::new(), Vec::new(), FinishReason::Abort); n];
    let mut stream = client.submit(req).expect("submit");
    while let Some(ev) = stream.next_event().await {
        match ev {
            StreamEvent::Delta {
                choice,
                text,
                tokens,
            } => {
                out[choice].0.push_str(&text);
                out[choice].1.extend(tokens.iter().map(|t| t.id));
            }
            StreamEvent::Finish { choice, reason } => out[choice].2 = reason,
            StreamEvent::Done { .. } => {}
            StreamEvent::Error(e) => panic!("request failed: {e}"),
        }
    }
    out
}

fn constrained(client: &EngineClient, text: &str, c: Constraint, max: usize) -> GenerateRequest {
    let mut r = GenerateRequest::greedy(prompt(client, text), max);
    r.constraint = Some(c);
    r
}

/// A schema whose every output is short: nested object, array, enum, bounded integers.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    "city": {"enum": ["Oslo", "Lima"]}
                },
                "required": ["zip", "city"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "role", "tags", "address"],
        "additionalProperties": false
    })
}

/// The fixed person schema, checked by hand (keys, types, bounds, enums, pattern).
fn check_person(v: &Value) {
    let o = v.as_object().expect("an object");
    assert_eq!(o.len(), 5, "{v}");
    assert!(o["name"].as_str().unwrap().chars().count() <= 8, "{v}");
    let age = o["age"].as_i64().expect("integer age");
    assert!((0..=120).contains(&age), "{v}");
    assert!(["admin", "user", "guest"].contains(&o["role"].as_str().unwrap()));
    let tags = o["tags"].as_array().unwrap();
    assert!(tags.len() <= 3 && tags.iter().all(Value::is_boolean), "{v}");
    let a = o["address"].as_object().unwrap();
    assert_eq!(a.len(), 2, "{v}");
    let zip = a["zip"].as_str().unwrap();
    assert!(
        zip.len() == 5 && zip.bytes().all(|b| b.is_ascii_digit()),
        "{v}"
    );
    assert!(
        ["Oslo", "Lima"].contains(&a["city"].as_str().unwrap()),
        "{v}"
    );
}

#[tokio::test]
async fn engine_json_schema_output_fits() {
    let client = engine().client();
    let c = Constraint::JsonSchema(person_schema().to_string());
    let mut req = constrained(&client, "Describe a person:", c, 200);
    req.n = 3;
    req.params.temperature = 1.0;
    req.params.seed = Some(5);
    for (text, _, finish) in run(&client, req).await {
        assert_eq!(finish, FinishReason::Stop, "{text}");
        check_person(&serde_json::from_str(&text).expect("JSON"));
    }
}

#[tokio::test]
async fn engine_regex_and_choice_hold() {
    let client = engine().client();
    let rx = constrained(
        &client,
        "A date:",
        Constraint::Regex(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]".into()),
        40,
    );
    let (text, _, finish) = run(&client, rx).await.remove(0);
    assert_eq!(finish, FinishReason::Stop);
    let b = text.as_bytes();
    assert_eq!(b.len(), 10, "{text:?}");
    assert!(
        text.starts_with("20") && b[4] == b'-' && b[7] == b'-',
        "{text:?}"
    );
    let options = vec!["red pepper".to_string(), "green".into(), "blue moon".into()];
    let mut req = constrained(
        &client,
        "A colour:",
        Constraint::Choice(options.clone()),
        40,
    );
    req.n = 4;
    req.params.temperature = 1.5;
    for (text, _, finish) in run(&client, req).await {
        assert_eq!(finish, FinishReason::Stop);
        assert!(options.contains(&text), "{text:?}");
    }
}

#[tokio::test]
async fn engine_free_neighbours_are_unchanged() {
    let client = engine().client();
    let free: Vec<GenerateRequest> = ["Once upon a time", "The weather today", "fn main() {"]
        .iter()
        .map(|t| {
            let mut r = GenerateRequest::greedy(prompt(&client, t), 24);
            r.stop.ignore_eos = true;
            r
        })
        .collect();
    let mut solo = Vec::new();
    for r in &free {
        solo.push(run(&client, r.clone()).await.remove(0).1);
    }
    let json = Constraint::JsonSchema(person_schema().to_string());
    let mut all: Vec<GenerateRequest> = free.clone();
    for i in 0..6 {
        let c = if i % 2 == 0 {
            json.clone()
        } else {
            Constraint::JsonObject
        };
        all.insert(i % 4, constrained(&client, "JSON please:", c, 60));
    }
    let outs = join_all(all.into_iter().map(|r| {
        let client = client.clone();
        async move { run(&client, r).await.remove(0) }
    }))
    .await;
    let mut free_outs = Vec::new();
    for (i, o) in outs.into_iter().enumerate() {
        // The constrained ones were inserted at 0, 1, 2, 3, 0, 1: the free ones end up last.
        if i >= 6 {
            free_outs.push(o.1);
        } else if o.2 == FinishReason::Stop {
            serde_json::from_str::<Value>(&o.0).expect("constrained output is JSON");
        }
    }
    assert_eq!(
        free_outs, solo,
        "free greedy output changed by constrained neighbours"
    );
}

#[tokio::test]
async fn engine_bad_constraint_is_invalid_before_queueing() {
    let client = engine().client();
    let req = constrained(&client, "x", Constraint::Regex("(unclosed".into()), 4);
    match client.submit(req) {
        Err(EngineError::InvalidRequest { param, message }) => {
            assert_eq!(param, Some("response_format"));
            assert!(message.contains("compile"), "{message}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("queued"),
    }
    let c = Constraint::JsonSchema("{\"type\": 5}".into());
    let e = client.check_constraint(&c, "guided_json").unwrap_err();
    assert!(matches!(
        e,
        EngineError::InvalidRequest {
            param: Some("guided_json"),
            ..
        }
    ));
}
