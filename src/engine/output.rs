//! Per-request output processing, off the lane: incremental detokenization, stop strings
//! (text that may begin one is held back until resolved), usage and timings.
//!
//! Stop strings live here, not in the scheduler's `update`: they match text, which only
//! exists after detokenization (a stop string may span tokens or end inside one), as in
//! vLLM v1's frontend output processor. A match aborts the choice in the lane.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::request::LaneEvent;
use super::{FinishReason, RequestTimings, StreamEvent, TokenInfo, Usage};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

struct Choice {
    decoder: Option<IncrementalDecoder>,
    /// Text not yet emitted because it may begin a stop string.
    held: String,
    tokens: Vec<TokenInfo>,
    done: bool,
    last_token: Option<Instant>,
}

/// Turns lane events into stream events for one request.
pub(crate) struct OutputProcessor {
    choices: Vec<Choice>,
    stop_strings: Vec<String>,
    usage: Usage,
    timings: RequestTimings,
    submitted: Instant,
    pub out: VecDeque<StreamEvent>,
    finished: bool,
    /// Prompt logprobs received so far (sent on as one event once complete).
    prompt: Vec<TokenInfo>,
}

/// Byte length of the longest suffix of `text` that is a proper prefix of some stop string.
fn held_suffix_len(text: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for stop in stops {
        let max = stop.len().saturating_sub(1).min(text.len());
        for len in (best + 1..=max).rev() {
            let start = text.len() - len;
            if text.is_char_boundary(start) && stop.starts_with(&text[start..]) {
                best = len;
                break;
            }
        }
    }
    best
}

impl OutputProcessor {
    pub fn new(
        tokenizer: Option<&Arc<Tokenizer>>,
        prompt: &[u32],
        n: usize,
        stop_strings: Vec<String>,
    ) -> Self {
        let choices = (0..n)
            .map(|_| Choice {
                decoder: tokenizer.map(|t| IncrementalDecoder::with_prompt(t, prompt, true)),
                held: String::new(),
                tokens: Vec::new(),
                done: false,
                last_token: None,
            })
            .collect();
        Self {
            choices,
            stop_strings: stop_strings.into_iter().filter(|s| !s.is_empty()).collect(),
            usage: Usage {
                prompt_tokens: prompt.len(),
                completion_tokens: 0,
                cached_tokens: 0,
            },
            timings: RequestTimings::default(),
            submitted: Instant::now(),
            out: VecDeque::new(),
            finished: false,
            prompt: Vec::new(),
        }
    }

    /// True once `Done` or `Error` has been queued.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Processes one lane event. Returns choices that ended early by a stop string (the
    /// lane should stop computing them).
    pub fn push(&mut self, ev: LaneEvent) -> Option<usize> {
        match ev {
            LaneEvent::Scheduled { at, cached_tokens } => {
                self.timings.queue = at.saturating_duration_since(self.submitted);
                self.usage.cached_tokens = cached_tokens;
                None
            }
            LaneEvent::Failed(e) => {
                self.out.push_back(StreamEvent::Error(e));
                self.finished = true;
                None
            }
            LaneEvent::Token {
                choice,
                info,
                finish,
                stop_token,
            } => self.token(choice, info, finish, stop_token),
            LaneEvent::PromptLogprobs { tokens, complete } => {
                self.prompt.extend(tokens);
                if complete {
                    self.out.push_back(StreamEvent::PromptLogprobs {
                        choices: 0..self.choices.len(),
                        tokens: std::mem::take(&mut self.prompt).into(),
                    });
                }
                None
            }
            // Embeddings are read by their own handle, never through this processor.
            LaneEvent::Embedding { .. } => None,
            LaneEvent::Finish { choice, reason } => {
                if self.choices.get(choice).is_some_and(|c| !c.done) {
                    self.end_choice(choice, reason, Instant::now());
                }
                None
            }
        }
    }

    fn token(
        &mut self,
        idx: usize,
        info: TokenInfo,
        finish: Option<FinishReason>,
        stop_token: bool,
    ) -> Option<usize> {
        let now = Instant::now();
        let stops = &self.stop_strings;
        let c = self.choices.get_mut(idx)?;
        if c.done {
            return None;
        }
        self.usage.completion_tokens += 1;
        match c.last_token {
            None if self.timings.ttft.is_zero() => self.timings.ttft = now - self.submitted,
            Some(prev) => self.timings.inter_token.push(now - prev),
            None => {}
        }
        c.last_token = Some(now);
        let is_stop_token = stop_token && finish == Some(FinishReason::Stop);
        if !is_stop_token && let Some(d) = c.decoder.as_mut() {
            c.held.push_str(&d.push(info.id).unwrap_or_default());
        }
        c.tokens.push(info);
        let mut stopped_early = None;
        let mut finish = finish;
        if let Some(pos) = stops.iter().filter_map(|s| c.held.find(s.as_str())).min() {
            c.held.truncate(pos);
            finish = Some(FinishReason::Stop);
            stopped_early = Some(idx);
        } else if finish.is_some() {
            if let Some(d) = c.decoder.as_mut()
                && !is_stop_token
            {
                c.held.push_str(&d.finish());
            }
        } else {
            let keep = held_suffix_len(&c.held, stops);
            let emit: String = c.held[..c.held.len() - keep].to_string();
            c.held.drain(..emit.len());
            if !emit.is_empty() {
                let tokens = std::mem::take(&mut c.tokens);
                self.out.push_back(StreamEvent::Delta {
                    choice: idx,
                    text: emit,
                    tokens,
                });
            }
            return None;
        }
        self.end_choice(idx, finish.expect("finish set above"), now);
        stopped_early
    }

    /// Flushes choice `idx`'s held text and tokens and ends it; `Done` after the last one.
    fn end_choice(&mut self, idx: usize, reason: FinishReason, now: Instant) {
        let c = &mut self.choices[idx];
        let text = std::mem::take(&mut c.held);
        let tokens = std::mem::take(&mut c.tokens);
        if !text.is_empty() || !tokens.is_empty() {
            self.out.push_back(StreamEvent::Delta {
                choice: idx,
                text,
                tokens,
            });
        }
        c.done = true;
        self.out.push_back(StreamEvent::Finish {
            choice: idx,
            reason,
        });
        if self.choices.iter().all(|c| c.done) {
            self.timings.e2e = now - self.submitted;
            let timings = std::mem::take(&mut self.timings);
            self.out.push_back(StreamEvent::Done {
                usage: self.usage,
                timings,
            });
            self.finished = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_possible_stop_prefixes() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(held_suffix_len("hello E", &stops), 1);
        assert_eq!(held_suffix_len("hello EN", &stops), 2);
        assert_eq!(held_suffix_len("hello\n", &stops), 1);
        assert_eq!(held_suffix_len("hello", &stops), 0);
        assert_eq!(held_suffix_len("héé", &["é!".to_string()]), 2);
    }
}
