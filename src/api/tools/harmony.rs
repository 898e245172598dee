//! The harmony format (gpt-oss): the reply after the prompt's `<|start|>assistant` is a
//! sequence of messages, each a header, `<|message|>`, its text and an end marker:
//!
//! ```text
//! <|channel|>analysis<|message|>Need the weather.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
//! <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>
//! ```
//!
//! `analysis` is reasoning, `final` (and `commentary` without a recipient: preambles) is
//! content, and a message to `functions.NAME` (the recipient before or after `<|channel|>`)
//! is a call of NAME whose arguments are the message's text, checked as a JSON object once
//! the message ends (so a call comes out whole: its name, then its arguments in one piece).
//! `<|return|>` and `<|call|>` end the turn; the engine stops on them and leaves them out of
//! the text, so the last message usually ends with the reply.
//!
//! What is not a well-formed message gives no call: text outside any message, a message to
//! another recipient and arguments that are not a JSON object are content; a message of
//! another role (a tool's answer the model wrote itself) is dropped, and so is a call, or
//! the header of one, that `max_tokens` cut.

use super::format::{Piece, ToolFormat};

pub const START: &str = "<|start|>";
pub const CHANNEL: &str = "<|channel|>";
pub const MESSAGE: &str = "<|message|>";
pub const END: &str = "<|end|>";
pub const RETURN: &str = "<|return|>";
pub const CALL: &str = "<|call|>";
pub const CONSTRAIN: &str = "<|constrain|>";

/// Markers that end a message's text: the three end markers, and the two that begin a new
/// header (a message the model did not close).
const BODY_ENDS: &[&str] = &[END, RETURN, CALL, START, CHANNEL];

/// Markers that begin a header.
const HEADER_STARTS: &[&str] = &[START, CHANNEL, "to="];

/// Bytes a header may take before its `<|message|>` (gpt-oss writes well under 100).
const HEADER_MAX: usize = 256;

/// Where a message's text goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Content,
    /// A call of this function: its text is held until the message ends.
    Call(String),
    /// Not the assistant's own words.
    Drop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Reading a header, up to `<|message|>`.
    Header,
    /// Reading a message's text.
    Body(Kind),
    /// Text outside any message: content until a header begins (`true`: the text starts
    /// with the header that failed, whose marker does not count).
    Outside(bool),
}

/// A parsed header: the author's role (`None` when it has no `<|start|>`: the prompt wrote
/// `<|start|>assistant`), the channel and the recipient.
#[derive(Debug, Default, PartialEq, Eq)]
struct Header {
    role: Option<String>,
    channel: Option<String>,
    recipient: Option<String>,
}

/// The word at the start of `s` (up to a blank or a marker) and the rest.
fn word(s: &str) -> (&str, &str) {
    let end = s
        .char_indices()
        .find(|&(i, c)| c.is_whitespace() || s[i..].starts_with("<|"))
        .map_or(s.len(), |(i, _)| i);
    s.split_at(end)
}

/// Reads a header's text (what came before `<|message|>`).
fn parse_header(text: &str) -> Header {
    let mut h = Header::default();
    let mut rest = text.trim_start();
    if let Some(r) = rest.strip_prefix(START) {
        let (role, r) = word(r);
        h.role = Some(role.to_string());
        rest = r;
    }
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return h;
        }
        if let Some(r) = rest.strip_prefix(CHANNEL) {
            let (w, r) = word(r);
            h.channel = Some(w.to_string());
            rest = r;
        } else if let Some(r) = rest.strip_prefix(CONSTRAIN) {
            rest = word(r).1;
        } else if let Some(r) = rest.strip_prefix("to=") {
            let (w, r) = word(r);
            h.recipient = Some(w.to_string());
            rest = r;
        } else if let Some(r) = rest.strip_prefix("<|") {
            // Another marker: skipped whole.
            rest = r.split_once("|>").map_or("", |(_, r)| r);
        } else {
            // A content type (`json`) or another word.
            rest = word(rest).1;
        }
    }
}

/// The function a recipient names (`functions.NAME`), if it is one.
fn function_name(recipient: &str) -> Option<&str> {
    let name = recipient.strip_prefix("functions.")?;
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    ok.then_some(name)
}

/// The first of `markers` in `text`: its position and the marker.
fn find_first(text: &str, markers: &[&'static str]) -> Option<(usize, &'static str)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|p| (p, *m)))
        .min_by_key(|&(p, _)| p)
}

/// The end of the text that can go out now: before a suffix that may begin a marker.
/// Blanks are kept (harmony's text is exact).
fn hold_point(text: &str, markers: &[&str]) -> usize {
    text.char_indices()
        .find(|&(i, _)| markers.iter().any(|m| m.starts_with(&text[i..])))
        .map_or(text.len(), |(i, _)| i)
}

fn push(out: &mut Vec<Piece>, kind: &Kind, text: &str) {
    if text.is_empty() {
        return;
    }
    match kind {
        Kind::Reasoning => out.push(Piece::Reasoning(text.to_string())),
        Kind::Content => out.push(Piece::Content(text.to_string())),
        Kind::Call(_) | Kind::Drop => {}
    }
}

/// Parses one choice's harmony reply as it arrives.
#[derive(Debug)]
pub struct HarmonyParser {
    buf: String,
    state: State,
    /// Messages to `functions.NAME` are calls (the request offered tools).
    calls_on: bool,
    /// The text of the call being read.
    args: String,
    calls: usize,
}

impl HarmonyParser {
    /// A parser; `calls_on`: messages to functions are calls (else content).
    pub fn new(calls_on: bool) -> Self {
        Self {
            buf: String::new(),
            state: State::Header,
            calls_on,
            args: String::new(),
            calls: 0,
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds reply text; what can be told apart goes to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    /// The reply ended (`cut` by `max_tokens` or an abort, or on its own): the message being
    /// read ends here. A call ends as a call if its text is a JSON object and the reply was
    /// not cut; a header never finished is content, unless cut.
    pub fn finish(&mut self, cut: bool, out: &mut Vec<Piece>) {
        while self.step(out) {}
        let rest = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Header) {
            State::Header if cut => {}
            State::Header if rest.trim().is_empty() => {}
            State::Header | State::Outside(_) => push(out, &Kind::Content, &rest),
            State::Body(Kind::Call(name)) => {
                self.args.push_str(&rest);
                if !cut {
                    self.end_call(name, out);
                }
                self.args.clear();
            }
            // What is held is a partial marker: text, unless the reply was cut in it.
            State::Body(_) if cut => {}
            State::Body(kind) => push(out, &kind, &rest),
        }
    }

    /// One move; false when more text is needed.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.state.clone() {
            State::Header => self.header(),
            State::Body(kind) => self.body(kind, out),
            State::Outside(skip) => self.outside(skip, out),
        }
    }

    fn header(&mut self) -> bool {
        let lead = self.buf.trim_start();
        if lead.is_empty() {
            return false;
        }
        let found = self.buf.find(MESSAGE);
        // The text surely in the header (a partial `<|message|>` may end the buffer).
        let sure = found.unwrap_or_else(|| hold_point(&self.buf, &[MESSAGE]));
        let text = &self.buf[..sure];
        let lead = text.trim_start();
        let may_start = HEADER_STARTS
            .iter()
            .any(|m| lead.starts_with(m) || m.starts_with(lead));
        let ended = [END, RETURN, CALL].iter().any(|m| text.contains(m));
        if !may_start || ended || lead.contains('\n') || sure > HEADER_MAX {
            self.state = State::Outside(true);
            return true;
        }
        let Some(pos) = found else {
            return false;
        };
        let h = parse_header(text);
        let analysis = h.channel.as_deref() == Some("analysis");
        let kind = match (&h.role, &h.recipient) {
            (Some(role), _) if role != "assistant" => Kind::Drop,
            (_, Some(r)) => match function_name(r) {
                Some(name) if self.calls_on => Kind::Call(name.to_string()),
                _ if analysis => Kind::Reasoning,
                _ => Kind::Content,
            },
            _ if analysis => Kind::Reasoning,
            _ => Kind::Content,
        };
        self.buf.drain(..pos + MESSAGE.len());
        self.state = State::Body(kind);
        true
    }

    fn body(&mut self, kind: Kind, out: &mut Vec<Piece>) -> bool {
        let Some((pos, marker)) = find_first(&self.buf, BODY_ENDS) else {
            let k = hold_point(&self.buf, BODY_ENDS);
            let text: String = self.buf.drain(..k).collect();
            match &kind {
                Kind::Call(_) => self.args.push_str(&text),
                kind => push(out, kind, &text),
            }
            return false;
        };
        let text: String = self.buf.drain(..pos).collect();
        if [END, RETURN, CALL].contains(&marker) {
            self.buf.drain(..marker.len());
        }
        match kind {
            Kind::Call(name) => {
                self.args.push_str(&text);
                self.end_call(name, out);
                self.args.clear();
            }
            kind => push(out, &kind, &text),
        }
        self.state = State::Header;
        true
    }

    fn outside(&mut self, skip: bool, out: &mut Vec<Piece>) -> bool {
        let starts = &[START, CHANNEL];
        let from = match skip {
            true => self.buf.chars().next().map_or(0, char::len_utf8),
            false => 0,
        };
        let rest = &self.buf[from..];
        let (k, found) = match find_first(rest, starts) {
            Some((pos, _)) => (from + pos, true),
            None => (from + hold_point(rest, starts), false),
        };
        let text: String = self.buf.drain(..k).collect();
        push(out, &Kind::Content, &text);
        self.state = match found {
            true => State::Header,
            false => State::Outside(skip && k == 0),
        };
        found
    }

    /// A call's message ended: a call if its text is a JSON object, else content.
    fn end_call(&mut self, name: String, out: &mut Vec<Piece>) {
        let args = self.args.trim();
        let is_object = matches!(
            serde_json::from_str::<serde_json::Value>(args),
            Ok(serde_json::Value::Object(_))
        );
        if !is_object {
            push(out, &Kind::Content, &self.args);
            return;
        }
        let index = self.calls;
        self.calls += 1;
        out.push(Piece::CallStart {
            index,
            id: ToolFormat::Harmony.new_id(),
            name,
        });
        out.push(Piece::Args {
            index,
            text: args.to_string(),
        });
    }
}

#[cfg(test)]
mod tests;
