//! The incremental tool-call parser shared by every format: text that may begin tool markup
//! is held back, each call comes out as its name first and then pieces of its arguments, and
//! markup that turns out not to be a call is given back as content. Parsing a whole reply is
//! one `push` and `finish`, so a stream always adds up to the non-streamed result.

use super::format::{Piece, ToolFormat};
use super::scan::scan_object;
use super::syntax::Syntax;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Plain text, watching for a marker.
    Content,
    /// After a marker, a list opener or a separator: blanks, then `{` (or `[`).
    Open,
    /// Inside a call object (the buffer starts with `{`).
    Object,
    /// After a call: blanks, then a closer, a separator or other text.
    After,
}

/// The call being parsed.
#[derive(Debug)]
struct Call {
    /// Bytes of the arguments value sent so far.
    sent: usize,
}

/// Parses one choice's reply text as it arrives.
#[derive(Debug)]
pub struct ToolParser {
    format: ToolFormat,
    syntax: &'static Syntax,
    buf: String,
    state: State,
    /// Nothing but blanks seen yet.
    at_start: bool,
    /// Drop blanks before the next content (after a call).
    trim_lead: bool,
    in_list: bool,
    /// The markup being read began with the format's lead character at the reply's start,
    /// not with a marker nor after a call (so it may be JSON content).
    lead_only: bool,
    /// Markup consumed since the marker that no call has claimed yet.
    pending: String,
    call: Option<Call>,
    calls: usize,
}

/// The end of the text that can go out as content now: before any suffix that may begin a
/// marker, and before trailing blanks (which are dropped when a marker follows).
pub(super) fn hold_point(text: &str, markers: &[&str]) -> usize {
    let mut k = text.len();
    for (i, _) in text.char_indices() {
        let tail = &text[i..];
        if markers.iter().any(|m| m.starts_with(tail)) {
            k = i;
            break;
        }
    }
    text[..k].trim_end().len()
}

/// The end of `text` without a suffix that may begin a marker (and the blanks before it).
fn before_marker_prefix(text: &str, markers: &[&str]) -> usize {
    let start = text
        .char_indices()
        .find(|&(i, _)| markers.iter().any(|m| m.starts_with(&text[i..])));
    match start {
        Some((i, _)) => text[..i].trim_end().len(),
        None => text.len(),
    }
}

/// The first full marker in `text`: its position and length.
fn find_marker(text: &str, markers: &[&str]) -> Option<(usize, usize)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|p| (p, m.len())))
        .min()
}

fn push_content(out: &mut Vec<Piece>, text: &str) {
    if !text.is_empty() {
        out.push(Piece::Content(text.to_string()));
    }
}

impl ToolParser {
    /// A parser for `format`.
    pub fn new(format: ToolFormat) -> Self {
        Self {
            format,
            syntax: format.syntax(),
            buf: String::new(),
            state: State::Content,
            at_start: true,
            trim_lead: false,
            in_list: false,
            lead_only: false,
            pending: String::new(),
            call: None,
            calls: 0,
        }
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds reply text; what can be told apart goes to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    /// The reply ended: what is still held goes out as content, but never the markup of a
    /// call: a call's closer begun after it is dropped, and when the reply was `cut` (by
    /// `max_tokens`, or aborted) so is a call that had begun: a held marker prefix
    /// (`<tool_ca`, `[TOOL_CA`), a marker with no object yet, or an object without its name
    /// (after a marker or a call, or at the reply's start holding only call members). A reply
    /// that ended on its own gives such text back: it was not a call.
    pub fn finish(&mut self, cut: bool, out: &mut Vec<Piece>) {
        while self.step(out) {}
        let rest = std::mem::take(&mut self.buf);
        let markup = std::mem::take(&mut self.pending) + &rest;
        let keep = match self.state {
            State::Content if cut => &rest[..before_marker_prefix(&rest, self.syntax.markers)],
            State::Content => &rest,
            State::Object if self.call.is_some() => "",
            State::After => "",
            State::Object if cut && self.lead_only => {
                match scan_object(&rest, self.syntax.args_keys).foreign {
                    true => &markup,
                    false => "",
                }
            }
            _ if cut => "",
            _ => &markup,
        };
        push_content(out, if self.calls > 0 { keep.trim() } else { keep });
        self.call = None;
        self.lead_only = false;
        self.state = State::Content;
    }

    /// One move of the state machine; false when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.state {
            State::Content => self.content(out),
            State::Open => self.open(out),
            State::Object => self.object(out),
            State::After => self.after(),
        }
    }

    fn content(&mut self, out: &mut Vec<Piece>) -> bool {
        let markers = self.syntax.markers;
        if self.trim_lead {
            let blank = self.buf.len() - self.buf.trim_start().len();
            self.buf.drain(..blank);
            if self.buf.is_empty() {
                return false;
            }
            self.trim_lead = false;
        }
        if self.at_start {
            let rest = self.buf.trim_start();
            if rest.is_empty()
                || markers
                    .iter()
                    .any(|m| m.len() > rest.len() && m.starts_with(rest))
            {
                return false;
            }
            self.at_start = false;
            if let Some(lead) = self.syntax.lead
                && rest.starts_with(lead)
                && !markers.iter().any(|m| rest.starts_with(m))
            {
                let blank = self.buf.len() - rest.len();
                self.pending = self.buf.drain(..blank).collect();
                self.state = State::Open;
                self.lead_only = true;
                return true;
            }
        }
        if let Some((pos, len)) = find_marker(&self.buf, markers) {
            let before = self.buf[..pos].trim_end().len();
            push_content(out, &self.buf[..before]);
            // Kept (blanks included) in case the markup turns out not to be a call.
            self.pending = self.buf[before..pos + len].to_string();
            self.buf.drain(..pos + len);
            self.state = State::Open;
            self.lead_only = false;
            return true;
        }
        let k = hold_point(&self.buf, markers);
        push_content(out, &self.buf[..k]);
        self.buf.drain(..k);
        false
    }

    /// Markup that is not a call after all: back to content, the markup included.
    fn give_back(&mut self, out: &mut Vec<Piece>) -> bool {
        push_content(out, &std::mem::take(&mut self.pending));
        self.in_list = false;
        self.state = State::Content;
        true
    }

    fn open(&mut self, out: &mut Vec<Piece>) -> bool {
        let blank = self.buf.len() - self.buf.trim_start().len();
        let Some(c) = self.buf[blank..].chars().next() else {
            return false;
        };
        if c == '{' || (c == '[' && self.syntax.list && !self.in_list) {
            self.pending
                .extend(self.buf.drain(..blank + usize::from(c == '[')));
            if c == '[' {
                self.in_list = true;
            } else {
                self.state = State::Object;
            }
            return true;
        }
        self.give_back(out)
    }

    fn object(&mut self, out: &mut Vec<Piece>) -> bool {
        let scan = scan_object(&self.buf, self.syntax.args_keys);
        if self.call.is_none()
            && let Some(name) = scan.name.filter(|n| !n.is_empty())
        {
            let index = self.calls;
            self.calls += 1;
            self.pending.clear();
            self.call = Some(Call { sent: 0 });
            out.push(Piece::CallStart {
                index,
                id: self.format.new_id(),
                name,
            });
        }
        let index = self.calls.wrapping_sub(1);
        if let Some(call) = &mut self.call
            && let Some((start, end)) = scan.args
        {
            let value = &self.buf[start..];
            if value.starts_with(['{', '[']) {
                let stop = end.unwrap_or(self.buf.len());
                if stop > start + call.sent {
                    let text = self.buf[start + call.sent..stop].to_string();
                    call.sent = stop - start;
                    out.push(Piece::Args { index, text });
                }
            } else if let Some(end) = end
                && call.sent == 0
            {
                // Arguments written as a JSON string holding the JSON text, or a scalar.
                let raw = &self.buf[start..end];
                let text = serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.into());
                call.sent = end - start;
                out.push(Piece::Args { index, text });
            }
        }
        if let Some(bad) = scan.invalid {
            let bad = bad.max(1);
            if self.call.take().is_some() {
                // A broken call: its text is dropped, what follows is content.
                self.buf.drain(..bad);
                self.state = State::Content;
                self.trim_lead = true;
                return true;
            }
            self.pending.extend(self.buf.drain(..bad));
            return self.give_back(out);
        }
        let Some(end) = scan.end else {
            return false;
        };
        match self.call.take() {
            Some(call) => {
                if call.sent == 0 && scan.args.is_none() {
                    out.push(Piece::Args {
                        index,
                        text: "{}".into(),
                    });
                }
                self.buf.drain(..end);
                self.state = State::After;
            }
            None => {
                self.pending.extend(self.buf.drain(..end));
                self.give_back(out);
            }
        }
        true
    }

    fn after(&mut self) -> bool {
        let rest = self.buf.trim_start();
        let Some(c) = rest.chars().next() else {
            return false;
        };
        let blank = self.buf.len() - rest.len();
        let mut next = State::Content;
        let mut take = 0;
        if let Some(close) = self.syntax.close {
            if rest.starts_with(close) {
                take = close.len();
            } else if close.starts_with(rest) {
                return false;
            }
        } else if self.in_list {
            match c {
                ',' => (take, next) = (1, State::Open),
                ']' => take = 1,
                _ => {}
            }
        } else if Some(c) == self.syntax.separator {
            (take, next) = (1, State::Open);
        } else if c == '{' && self.syntax.separator.is_some() {
            next = State::Open;
        }
        self.buf.drain(..blank + take);
        self.lead_only = false;
        if next == State::Content {
            self.in_list = false;
            self.trim_lead = true;
        }
        self.state = next;
        true
    }
}
