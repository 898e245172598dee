//! Tool calling and reasoning output: the request's `tools` checked, the constraint that
//! forces a call, and the parsers that turn a reply's tool markup into `tool_calls` and its
//! `<think>` text into `reasoning_content`, whole or as it streams.
//!
//! Formats, one file each: [`llama3_json`] (`{"name": ..., "parameters": ...}`),
//! [`hermes`] (`<tool_call>{...}</tool_call>`, Qwen2.5/Qwen3), [`mistral`]
//! (`[TOOL_CALLS][{...}]`) and [`harmony`] (gpt-oss's channels: reasoning, answer and calls).

mod format;
mod grammar;
pub mod harmony;
pub mod hermes;
pub mod llama3_json;
pub mod mistral;
pub mod output;
mod parser;
mod reasoning;
mod request;
mod scan;
mod syntax;

pub use format::{Piece, ToolFormat};
pub use parser::ToolParser;
pub use reasoning::ReasoningParser;
pub use request::{ToolChoiceMode, ToolRequest};

use crate::engine::FinishReason;

/// What to look for in replies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParseOptions {
    /// Parse tool calls in this format.
    pub tools: Option<ToolFormat>,
    /// Split off `<think>` reasoning.
    pub reasoning: bool,
    /// The prompt ends inside the thinking (its template opened `<think>`).
    pub starts_thinking: bool,
    /// `parallel_tool_calls: false`: only the first call is kept, later ones are dropped.
    pub single_call: bool,
    /// The reply is harmony messages (gpt-oss): their channels give reasoning, content and,
    /// with `tools` set to [`ToolFormat::Harmony`], calls; `reasoning` is not used.
    pub harmony: bool,
}

/// One choice's reply parser: reasoning first, then tool calls in the answer. With nothing
/// to look for, text passes through untouched.
#[derive(Debug)]
pub struct ChoiceParser {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolParser>,
    harmony: Option<harmony::HarmonyParser>,
    single_call: bool,
}

impl ChoiceParser {
    /// A parser for `opts`.
    pub fn new(opts: ParseOptions) -> Self {
        let harmony = opts.harmony || opts.tools == Some(ToolFormat::Harmony);
        Self {
            reasoning: (opts.reasoning && !harmony)
                .then(|| ReasoningParser::new(opts.starts_thinking)),
            tools: opts.tools.filter(|_| !harmony).map(ToolParser::new),
            harmony: harmony
                .then(|| harmony::HarmonyParser::new(opts.tools == Some(ToolFormat::Harmony))),
            single_call: opts.single_call,
        }
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        match &self.harmony {
            Some(h) => h.calls(),
            None => self.tools.as_ref().map_or(0, ToolParser::calls),
        }
    }

    /// Feeds reply text; returns what can be told apart so far.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.run(text, None)
    }

    /// The reply ended on its own: the rest.
    pub fn finish(&mut self) -> Vec<Piece> {
        self.finish_on(FinishReason::Stop)
    }

    /// The reply ended for `reason`: the rest. A reply cut short (`Length`, `Abort`) keeps no
    /// tool markup a call had begun (see [`ToolParser::finish`]).
    pub fn finish_on(&mut self, reason: FinishReason) -> Vec<Piece> {
        self.run("", Some(reason != FinishReason::Stop))
    }

    /// `end`: the reply ended here, cut short or not.
    fn run(&mut self, text: &str, end: Option<bool>) -> Vec<Piece> {
        let last = end.is_some();
        let mut out = Vec::new();
        if let Some(h) = &mut self.harmony {
            h.push(text, &mut out);
            if let Some(cut) = end {
                h.finish(cut, &mut out);
            }
            return self.keep_calls(out);
        }
        let answer = match &mut self.reasoning {
            Some(r) => {
                let (mut thought, mut answer) = (String::new(), String::new());
                r.push(text, &mut thought, &mut answer);
                if last {
                    r.finish(&mut thought, &mut answer);
                }
                if !thought.is_empty() {
                    out.push(Piece::Reasoning(thought));
                }
                answer
            }
            None => text.to_string(),
        };
        match &mut self.tools {
            Some(t) => {
                t.push(&answer, &mut out);
                if let Some(cut) = end {
                    t.finish(cut, &mut out);
                }
            }
            None if !answer.is_empty() => out.push(Piece::Content(answer)),
            None => {}
        }
        self.keep_calls(out)
    }

    /// `out` without the calls after the first when only one is kept.
    fn keep_calls(&self, mut out: Vec<Piece>) -> Vec<Piece> {
        if self.single_call {
            out.retain(|p| {
                !matches!(p, Piece::CallStart { index, .. } | Piece::Args { index, .. } if *index > 0)
            });
        }
        out
    }
}

/// A whole reply parsed: content, reasoning and calls (`(id, name, arguments)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedReply {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<(String, String, String)>,
}

impl ParsedReply {
    /// Adds pieces (streamed deltas accumulate the same way).
    pub fn extend(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match p {
                Piece::Content(t) => self.content.push_str(&t),
                Piece::Reasoning(t) => self.reasoning.push_str(&t),
                Piece::CallStart { id, name, .. } => self.calls.push((id, name, String::new())),
                Piece::Args { index, text } => {
                    if let Some(c) = self.calls.get_mut(index) {
                        c.2.push_str(&text);
                    }
                }
            }
        }
    }

    /// `text`, a reply that ended on its own, parsed in one go.
    pub fn parse(opts: ParseOptions, text: &str) -> Self {
        Self::parse_ended(opts, text, FinishReason::Stop)
    }

    /// `text`, a reply that ended for `reason`, parsed in one go.
    pub fn parse_ended(opts: ParseOptions, text: &str, reason: FinishReason) -> Self {
        let mut p = ChoiceParser::new(opts);
        let mut reply = Self::default();
        reply.extend(p.push(text));
        reply.extend(p.finish_on(reason));
        reply
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// `text` parsed whole, then streamed split at every byte boundary (and one piece per
    /// character): every way must give the same reply, ids aside.
    pub fn parse_every_split(opts: ParseOptions, text: &str) -> ParsedReply {
        parse_every_split_on(opts, text, FinishReason::Stop)
    }

    /// [`parse_every_split`] of a reply that ended for `reason`.
    pub fn parse_every_split_on(
        opts: ParseOptions,
        text: &str,
        reason: FinishReason,
    ) -> ParsedReply {
        let strip = |mut r: ParsedReply| {
            r.calls.iter_mut().for_each(|c| c.0.clear());
            r
        };
        let whole = ParsedReply::parse_ended(opts, text, reason);
        for (i, _) in text.char_indices().skip(1) {
            let mut p = ChoiceParser::new(opts);
            let mut r = ParsedReply::default();
            r.extend(p.push(&text[..i]));
            r.extend(p.push(&text[i..]));
            r.extend(p.finish_on(reason));
            assert_eq!(strip(r), strip(whole.clone()), "split at {i} of {text:?}");
        }
        let mut p = ChoiceParser::new(opts);
        let mut r = ParsedReply::default();
        let mut names_first = true;
        for c in text.chars() {
            for piece in p.push(c.encode_utf8(&mut [0; 4])) {
                if let Piece::Args { index, .. } = &piece {
                    names_first &= r.calls.len() > *index;
                }
                r.extend(vec![piece]);
            }
        }
        r.extend(p.finish_on(reason));
        assert!(names_first, "a call's name comes before its arguments");
        assert_eq!(strip(r), strip(whole.clone()), "char by char: {text:?}");
        whole
    }

    /// The calls as `(name, arguments)`, arguments parsed as JSON.
    pub fn calls(r: &ParsedReply) -> Vec<(String, serde_json::Value)> {
        r.calls
            .iter()
            .map(|(id, name, args)| {
                assert!(!id.is_empty());
                let args = serde_json::from_str(args)
                    .unwrap_or_else(|e| panic!("arguments {args:?} are not JSON: {e}"));
                (name.clone(), args)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use crate::config::ToolCallParser;

    fn think() -> ParseOptions {
        ParseOptions {
            reasoning: true,
            ..ParseOptions::default()
        }
    }

    #[test]
    fn reasoning_is_split_off() {
        let r = parse_every_split(think(), "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.");
        assert_eq!(r.reasoning, "Let me see: 2+2.");
        assert_eq!(r.content, "It is 4.");
        let r = parse_every_split(think(), "Just an answer <think> here");
        assert_eq!(
            (r.reasoning.as_str(), r.content.as_str()),
            ("", "Just an answer <think> here")
        );
        let r = parse_every_split(think(), "<think>cut off mid tho");
        assert_eq!(
            (r.reasoning.as_str(), r.content.as_str()),
            ("cut off mid tho", "")
        );
    }

    #[test]
    fn prompt_opened_thinking() {
        let opts = ParseOptions {
            starts_thinking: true,
            ..think()
        };
        let r = parse_every_split(opts, "Hmm, hello.\n</think>\n\nHello!");
        assert_eq!(
            (r.reasoning.as_str(), r.content.as_str()),
            ("Hmm, hello.", "Hello!")
        );
    }

    #[test]
    fn single_call_keeps_only_the_first() {
        let call = |city: &str| {
            format!(
                "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>"
            )
        };
        let text = format!("{}\n{}", call("Paris"), call("Oslo"));
        let opts = ParseOptions {
            tools: Some(ToolFormat::Hermes),
            ..ParseOptions::default()
        };
        assert_eq!(parse_every_split(opts, &text).calls.len(), 2);
        let single = ParseOptions {
            single_call: true,
            ..opts
        };
        let r = parse_every_split(single, &text);
        assert_eq!(
            calls(&r),
            vec![(
                "get_weather".to_string(),
                serde_json::json!({"city": "Paris"})
            )]
        );
    }

    #[test]
    fn reasoning_then_a_tool_call() {
        let opts = ParseOptions {
            tools: Some(ToolFormat::Hermes),
            ..think()
        };
        let text = "<think>\nNeed the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let r = parse_every_split(opts, text);
        assert_eq!(r.reasoning, "Need the weather.");
        assert_eq!(r.content, "");
        assert_eq!(
            calls(&r),
            [(
                "get_weather".to_string(),
                serde_json::json!({"city": "Paris"})
            )]
        );
    }

    /// A call cut by `max_tokens` anywhere leaves no markup in the content, streamed or
    /// whole, in every format: only the text before the markup (or part of it, blanks aside)
    /// is content.
    #[test]
    fn a_cut_call_leaks_no_markup() {
        let args = "\"arguments\": {\"city\": \"Paris\"}";
        let call = format!("{{\"name\": \"get_weather\", {args}}}");
        let llama = call.replace("arguments", "parameters");
        let cases = [
            (
                ToolFormat::Hermes,
                "Sure.",
                format!("Sure.\n<tool_call>\n{call}\n</tool_call>"),
            ),
            (
                ToolFormat::Hermes,
                "",
                format!("<tool_call>\n{call}\n</tool_call>\n<tool_call>\n{call}\n</tool_call>"),
            ),
            (
                ToolFormat::Llama3Json,
                "",
                format!("<|python_tag|>{llama}; {llama}"),
            ),
            (ToolFormat::Llama3Json, "", llama.clone()),
            (
                ToolFormat::Mistral,
                "",
                format!("[TOOL_CALLS] [{call}, {call}]"),
            ),
            (ToolFormat::Mistral, "", format!(" [{call}]")),
            (
                ToolFormat::Mistral,
                "Hi.",
                format!("Hi. [TOOL_CALLS]{call}"),
            ),
        ];
        for (format, lead, text) in cases {
            let opts = ParseOptions {
                tools: Some(format),
                ..ParseOptions::default()
            };
            for (i, _) in text.char_indices().skip(1) {
                let cut = &text[..i];
                let r = parse_every_split_on(opts, cut, FinishReason::Length);
                assert!(
                    lead.starts_with(r.content.trim_end()),
                    "{format:?} cut at {i}: content {:?} of {cut:?}",
                    r.content
                );
            }
        }
        // Cut or not, a call's closer begun after it is markup.
        let opts = ParseOptions {
            tools: Some(ToolFormat::Hermes),
            ..ParseOptions::default()
        };
        let r = parse_every_split(opts, &format!("<tool_call>{call}</tool_ca"));
        assert_eq!((r.content.as_str(), r.calls.len()), ("", 1));
        // Ended on its own, markup that never became a call is content (it was not one).
        let r = parse_every_split(opts, "<tool_call>\n{\"na");
        assert_eq!(r.content, "<tool_call>\n{\"na");
        // Cut, JSON at the reply's start with other members is content, not a call.
        let opts = ParseOptions {
            tools: Some(ToolFormat::Llama3Json),
            ..ParseOptions::default()
        };
        let r = parse_every_split_on(opts, "{\"answer\": 4", FinishReason::Length);
        assert_eq!(r.content, "{\"answer\": 4");
        let r = parse_every_split_on(opts, "The answer is 4", FinishReason::Length);
        assert_eq!(r.content, "The answer is 4");
    }

    #[test]
    fn nothing_to_parse_passes_text_through() {
        let mut p = ChoiceParser::new(ParseOptions::default());
        assert_eq!(
            p.push("  a <tool_call> "),
            [Piece::Content("  a <tool_call> ".into())]
        );
        assert!(p.finish().is_empty());
    }

    #[test]
    fn format_from_template_or_config() {
        assert_eq!(
            ToolFormat::pick(None, "x [TOOL_CALLS] y"),
            ToolFormat::Mistral
        );
        assert_eq!(ToolFormat::pick(None, "<tool_call>"), ToolFormat::Hermes);
        assert_eq!(
            ToolFormat::pick(None, "<|python_tag|>"),
            ToolFormat::Llama3Json
        );
        assert_eq!(ToolFormat::pick(None, "plain"), ToolFormat::Hermes);
        assert_eq!(
            ToolFormat::pick(Some(ToolCallParser::Mistral), "<tool_call>"),
            ToolFormat::Mistral
        );
        let id = ToolFormat::Hermes.new_id();
        assert!(id.starts_with("call_") && id.len() == 29, "{id}");
        assert_eq!(ToolFormat::Mistral.new_id().len(), 9);
    }
}
