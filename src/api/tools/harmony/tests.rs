//! The harmony parser on replies as gpt-oss writes them (the reply starts after the prompt's
//! `<|start|>assistant`; the engine leaves out the `<|return|>` or `<|call|>` that stopped
//! it), whole and split at every byte.

use serde_json::json;

use super::super::test_support::*;
use super::super::{ParseOptions, ParsedReply, ToolFormat};
use super::*;
use crate::engine::FinishReason;

fn with_tools() -> ParseOptions {
    ParseOptions {
        tools: Some(ToolFormat::Harmony),
        harmony: true,
        ..ParseOptions::default()
    }
}

fn no_tools() -> ParseOptions {
    ParseOptions {
        harmony: true,
        ..ParseOptions::default()
    }
}

fn texts(r: &ParsedReply) -> (&str, &str) {
    (r.reasoning.as_str(), r.content.as_str())
}

#[test]
fn analysis_then_final() {
    let text = "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";
    let r = parse_every_split(no_tools(), text);
    assert_eq!(texts(&r), ("User asks 2+2. Answer 4.", "2 + 2 = 4."));
    assert!(r.calls.is_empty());
    // The stop token kept in the text (`ignore_eos`, or a stop id the client named) ends it too.
    let r = parse_every_split(no_tools(), &format!("{text}<|return|>"));
    assert_eq!(texts(&r), ("User asks 2+2. Answer 4.", "2 + 2 = 4."));
    // Blanks and newlines inside the messages are the model's own.
    let r = parse_every_split(
        no_tools(),
        "<|channel|>analysis<|message|> a\n b \n<|end|><|start|>assistant<|channel|>final<|message|>\n x  ",
    );
    assert_eq!(texts(&r), (" a\n b \n", "\n x  "));
}

#[test]
fn a_call_after_analysis_both_header_orders() {
    for header in [
        "<|channel|>commentary to=functions.get_weather <|constrain|>json",
        " to=functions.get_weather<|channel|>commentary json",
        "<|channel|>commentary to=functions.get_weather json",
    ] {
        let text = format!(
            "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant{header}<|message|>{{\"city\": \"Paris\"}}"
        );
        let r = parse_every_split(with_tools(), &text);
        assert_eq!(texts(&r), ("Need the weather.", ""), "{header}");
        assert_eq!(
            calls(&r),
            [("get_weather".to_string(), json!({"city": "Paris"}))]
        );
        assert_eq!(
            r.calls[0].2, "{\"city\": \"Paris\"}",
            "the message's own text"
        );
        assert!(r.calls[0].0.starts_with("call_"));
    }
    // The first message may be the call itself (the prompt wrote `<|start|>assistant`).
    let r = parse_every_split(
        with_tools(),
        " to=functions.f<|channel|>commentary json<|message|>{}<|call|>",
    );
    assert_eq!(calls(&r), [("f".to_string(), json!({}))]);
}

#[test]
fn preambles_are_content_and_calls_are_counted() {
    let text = "<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant<|channel|>commentary to=functions.a <|constrain|>json<|message|>{\"x\": 1}<|call|><|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"y\": [2]}<|call|>";
    let r = parse_every_split(with_tools(), text);
    assert_eq!(texts(&r), ("", "Checking both."));
    assert_eq!(
        calls(&r),
        [
            ("a".to_string(), json!({"x": 1})),
            ("b".to_string(), json!({"y": [2]}))
        ]
    );
    let mut p = ChoiceParserFor::new(with_tools());
    p.push(text);
    assert_eq!(p.0.calls(), 2);
}

/// A thin wrapper so the count of calls can be read mid-stream.
struct ChoiceParserFor(super::super::ChoiceParser);

impl ChoiceParserFor {
    fn new(opts: ParseOptions) -> Self {
        Self(super::super::ChoiceParser::new(opts))
    }
    fn push(&mut self, text: &str) {
        self.0.push(text);
        self.0.finish();
    }
}

#[test]
fn malformed_replies_give_no_calls() {
    // Arguments that are not a JSON object: the text is content, no call.
    let r = parse_every_split(
        with_tools(),
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ",
    );
    assert_eq!((r.content.as_str(), r.calls.len()), ("{\"a\": ", 0));
    let r = parse_every_split(
        with_tools(),
        "<|channel|>commentary to=functions.f json<|message|>[1, 2]",
    );
    assert_eq!((r.content.as_str(), r.calls.len()), ("[1, 2]", 0));
    // A recipient that is not a function: content (analysis stays reasoning).
    let r = parse_every_split(
        with_tools(),
        "<|channel|>analysis to=python<|message|>print(1)<|end|><|start|>assistant to=browser.search<|channel|>commentary json<|message|>{\"q\": 1}",
    );
    assert_eq!(texts(&r), ("print(1)", "{\"q\": 1}"));
    assert!(r.calls.is_empty());
    // Text outside any message is content; a later message still parses.
    let r = parse_every_split(
        with_tools(),
        "Hello there<|start|>assistant<|channel|>final<|message|> again",
    );
    assert_eq!(texts(&r), ("", "Hello there again"));
    let r = parse_every_split(no_tools(), "plain text\nwith lines");
    assert_eq!(texts(&r), ("", "plain text\nwith lines"));
    // A channel that never closes: what came is its channel's.
    let r = parse_every_split(
        no_tools(),
        "<|channel|>analysis<|message|>thinking on and on",
    );
    assert_eq!(texts(&r), ("thinking on and on", ""));
    // A header that never reaches `<|message|>`: content when the reply ended on its own.
    let r = parse_every_split(no_tools(), "<|channel|>final");
    assert_eq!(texts(&r), ("", "<|channel|>final"));
    // A message the model wrote as another author (a tool's answer) is dropped.
    let r = parse_every_split(
        with_tools(),
        "<|start|>functions.f to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|><|start|>assistant<|channel|>final<|message|>ok",
    );
    assert_eq!(texts(&r), ("", "ok"));
    // Without tools in the request a call is content.
    let r = parse_every_split(
        no_tools(),
        "<|channel|>commentary to=functions.f json<|message|>{}",
    );
    assert_eq!((r.content.as_str(), r.calls.len()), ("{}", 0));
    // A header past its bound is text.
    let long = format!("<|channel|>{}<|message|>x", "a".repeat(300));
    let r = parse_every_split(no_tools(), &long);
    assert_eq!(texts(&r), ("", long.as_str()));
}

#[test]
fn a_cut_reply_keeps_no_half_call() {
    let text = "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"city\": \"Paris\"}";
    for (i, _) in text.char_indices().skip(1) {
        let r = parse_every_split_on(with_tools(), &text[..i], FinishReason::Length);
        assert!(r.calls.is_empty(), "cut at {i}");
        assert!(r.content.is_empty(), "cut at {i}: content {:?}", r.content);
        assert!("Need it.".starts_with(&r.reasoning), "cut at {i}");
    }
    let r = parse_every_split_on(with_tools(), text, FinishReason::Stop);
    assert_eq!(r.calls.len(), 1);
}

#[test]
fn headers() {
    let h = parse_header("<|start|>assistant to=functions.get_weather<|channel|>commentary json");
    assert_eq!(h.role.as_deref(), Some("assistant"));
    assert_eq!(h.channel.as_deref(), Some("commentary"));
    assert_eq!(h.recipient.as_deref(), Some("functions.get_weather"));
    let h = parse_header("<|channel|>final");
    assert_eq!(
        (h.role, h.channel.as_deref(), h.recipient),
        (None, Some("final"), None)
    );
    assert_eq!(function_name("functions.a.b-c_1"), Some("a.b-c_1"));
    assert_eq!(function_name("functions."), None);
    assert_eq!(function_name("python"), None);
}

#[test]
fn single_call_keeps_the_first() {
    let call = |n: &str| {
        format!(
            "<|start|>assistant<|channel|>commentary to=functions.{n} json<|message|>{{}}<|call|>"
        )
    };
    let opts = ParseOptions {
        single_call: true,
        ..with_tools()
    };
    let r = parse_every_split(opts, &format!("{}{}", call("a"), call("b")));
    assert_eq!(calls(&r), [("a".to_string(), json!({}))]);
}
