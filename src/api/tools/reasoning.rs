//! The `think` reasoning parser: text between `<think>` and `</think>` (Qwen3, DeepSeek-R1)
//! is the reasoning, the rest the answer. Held back across splits like the tool parser.

use super::parser::hold_point;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Blanks so far: is there an opening `<think>`?
    Start,
    Thinking,
    /// The answer; `lead` drops the blanks right after `</think>`.
    Answer {
        lead: bool,
    },
}

/// Splits one choice's reply into reasoning and answer text.
#[derive(Debug)]
pub struct ReasoningParser {
    state: State,
    buf: String,
    /// Some reasoning went out (blanks before it are dropped).
    said: bool,
}

impl ReasoningParser {
    /// `thinking`: the prompt already opened the thinking (it ends with `<think>`).
    pub fn new(thinking: bool) -> Self {
        Self {
            state: if thinking {
                State::Thinking
            } else {
                State::Start
            },
            buf: String::new(),
            said: false,
        }
    }

    /// Feeds text; reasoning goes to `reasoning`, answer text to `answer`.
    pub fn push(&mut self, text: &str, reasoning: &mut String, answer: &mut String) {
        self.buf.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let rest = self.buf.trim_start();
                    if rest.is_empty() || (OPEN.starts_with(rest) && rest != OPEN) {
                        return;
                    }
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.buf = after.to_string();
                        self.state = State::Thinking;
                    } else {
                        self.state = State::Answer { lead: false };
                    }
                }
                State::Thinking => {
                    if !self.said {
                        let blank = self.buf.len() - self.buf.trim_start().len();
                        self.buf.drain(..blank);
                    }
                    let (k, closed) = match self.buf.find(CLOSE) {
                        Some(p) => (p, true),
                        None => (hold_point(&self.buf, &[CLOSE]), false),
                    };
                    let text = self.buf[..k].trim_end();
                    self.said |= !text.is_empty();
                    reasoning.push_str(text);
                    if !closed {
                        self.buf.drain(..k);
                        return;
                    }
                    self.buf.drain(..k + CLOSE.len());
                    self.state = State::Answer { lead: true };
                }
                State::Answer { lead } => {
                    let text = if lead {
                        self.buf.trim_start()
                    } else {
                        &self.buf
                    };
                    if text.is_empty() {
                        self.buf.clear();
                        return;
                    }
                    answer.push_str(text);
                    self.buf.clear();
                    self.state = State::Answer { lead: false };
                    return;
                }
            }
        }
    }

    /// The reply ended: thinking that never closed is all reasoning.
    pub fn finish(&mut self, reasoning: &mut String, answer: &mut String) {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Start => answer.push_str(&rest),
            State::Thinking => reasoning.push_str(rest.trim()),
            // (`rest` holds only what `push` kept back: blanks and a partial `</think>`.)
            State::Answer { .. } => {}
        }
    }
}
