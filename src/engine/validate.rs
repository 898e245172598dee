//! The one hand-off into the engine (TGI's `ValidGenerateRequest`): every limit of a request
//! is checked here, once, and only a [`ValidRequest`] can be submitted. Client counts are
//! checked, never wrapped.

use tokio::sync::mpsc;

use super::constraint::Grammar;
use super::request::{LaneEvent, LaneRequest, Limits};
use super::{EmbedRequest, EngineError, GenerateRequest};
use crate::model::Pooling;
use crate::sampling::SamplingParams;

/// Most choices one request may ask for.
pub const MAX_CHOICES: usize = 256;

/// What a request is checked against.
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    pub vocab_size: usize,
    /// The context: prompt plus output may not exceed it.
    pub max_len: usize,
    /// Tokens of the largest lane's KV pool: no sequence can hold more.
    pub pool_tokens: usize,
    /// End-of-sequence ids, added to the stop ids unless the request ignores EOS.
    pub eos_ids: Vec<u32>,
}

/// A request that passed every check; its fields can be set only by [`validate`].
#[derive(Debug, Clone)]
pub struct ValidRequest {
    prompt_ids: Vec<u32>,
    params: SamplingParams,
    seed: u64,
    limits: Limits,
    stop_strings: Vec<String>,
    n: usize,
    priority: i32,
    grammar: Option<Grammar>,
    /// An embedding's pooling (`None`: a generation).
    pooling: Option<Pooling>,
}

impl ValidRequest {
    /// Number of choices.
    pub fn n(&self) -> usize {
        self.n
    }
    pub fn prompt_ids(&self) -> &[u32] {
        &self.prompt_ids
    }
    /// Tokens to generate per choice at most (an absent `max_tokens` resolved to the room
    /// the context leaves).
    pub fn max_tokens(&self) -> usize {
        self.limits.max_tokens
    }
    /// Whether this is an embedding input (pooled, nothing sampled).
    pub fn is_embedding(&self) -> bool {
        self.pooling.is_some()
    }
    /// Stop strings, for the output processor (text-based, so they are not the lane's).
    pub(crate) fn take_stop_strings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.stop_strings)
    }
    /// The lane's view: the prompt, what the choices share, and the priority.
    pub(crate) fn into_lane(self, events: mpsc::Sender<LaneEvent>) -> (Vec<u32>, LaneRequest, i32) {
        let request = LaneRequest::new(self.params, self.seed, self.limits, self.n, events)
            .with_grammar(self.grammar)
            .with_pooling(self.pooling);
        (self.prompt_ids, request, self.priority)
    }
}

fn invalid(param: &'static str, message: String) -> EngineError {
    EngineError::InvalidRequest {
        param: Some(param),
        message,
    }
}

/// A prompt of `p` tokens (in the request's `what`, e.g. `messages`) with `max_tokens` that
/// does not fit a context of `max_len`, in OpenAI's words (clients such as litellm match
/// "maximum context length" to raise their context-window error).
fn too_long(
    param: &'static str,
    what: &'static str,
    p: usize,
    max_tokens: Option<usize>,
    max_len: usize,
) -> EngineError {
    let message = match max_tokens {
        Some(m) => format!(
            "This model's maximum context length is {max_len} tokens. However, you requested {} tokens ({p} in the {what}, {m} in the completion). Please reduce the length of the {what} or completion.",
            p.saturating_add(m)
        ),
        None => format!(
            "This model's maximum context length is {max_len} tokens. However, your {what} resulted in {p} tokens. Please reduce the length of the {what}."
        ),
    };
    EngineError::ContextLength { param, message }
}

/// Checks `req` against `b`: a non-empty prompt of in-vocabulary ids that leaves room in the
/// context, 1 to [`MAX_CHOICES`] choices, and a `max_tokens` whose sum with the prompt fits
/// both the context and the KV pool. An absent `max_tokens` means the rest of that room;
/// `max_tokens` 0 computes the prompt only (for its prompt logprobs) and ends with `Length`.
/// `grammar` is `req.constraint` compiled (the caller compiles it, with the tokenizer's trie).
pub(crate) fn validate(
    req: GenerateRequest,
    b: &Bounds,
    grammar: Option<Grammar>,
) -> Result<ValidRequest, EngineError> {
    let p = req.prompt_ids.len();
    if p == 0 {
        return Err(invalid("prompt", "the prompt is empty".into()));
    }
    if let Some(t) = req.prompt_ids.iter().find(|&&t| t as usize >= b.vocab_size) {
        return Err(invalid(
            "prompt",
            format!(
                "token id {t} is out of range (vocabulary of {})",
                b.vocab_size
            ),
        ));
    }
    if req.n == 0 || req.n > MAX_CHOICES {
        return Err(invalid(
            "n",
            format!("n must be between 1 and {MAX_CHOICES}"),
        ));
    }
    let max_len = b.max_len;
    if p >= max_len {
        return Err(too_long(
            req.prompt_param,
            req.prompt_param,
            p,
            req.max_tokens,
            max_len,
        ));
    }
    let max_tokens = match req.max_tokens {
        Some(m) => checked_max_tokens(p, m, b, req.prompt_param)?,
        None => {
            let room = max_len.min(b.pool_tokens);
            if p >= room {
                return Err(invalid(
                    req.prompt_param,
                    format!(
                        "the prompt is {p} tokens; the context holds {room} with room to reply"
                    ),
                ));
            }
            room - p
        }
    };
    let mut stop_ids = req.stop.token_ids;
    if !req.stop.ignore_eos {
        stop_ids.extend_from_slice(&b.eos_ids);
    }
    let seed = req.params.seed.unwrap_or_else(rand::random);
    Ok(ValidRequest {
        prompt_ids: req.prompt_ids,
        params: req.params,
        seed,
        limits: Limits {
            max_tokens,
            max_len,
            stop_ids,
        },
        stop_strings: req.stop.strings,
        n: req.n,
        priority: req.priority,
        grammar,
        pooling: None,
    })
}

/// `m` if the prompt of `p` tokens plus `m` fit the context and the KV pool.
fn checked_max_tokens(
    p: usize,
    m: usize,
    b: &Bounds,
    what: &'static str,
) -> Result<usize, EngineError> {
    let max_len = b.max_len;
    let Some(total) = p.checked_add(m).filter(|&t| t <= max_len) else {
        return Err(too_long("max_tokens", what, p, Some(m), max_len));
    };
    if total > b.pool_tokens {
        return Err(invalid(
            "max_tokens",
            format!(
                "{total} tokens do not fit the KV cache of {} tokens",
                b.pool_tokens
            ),
        ));
    }
    Ok(m)
}

/// Checks an embedding input against `b`: a non-empty prompt of in-vocabulary ids that fits
/// the context (it may fill it: nothing is generated) and the KV pool. The request computes
/// its prompt, pools its hidden rows by `pooling` and samples nothing.
pub(crate) fn validate_embed(
    req: EmbedRequest,
    b: &Bounds,
    pooling: Pooling,
) -> Result<ValidRequest, EngineError> {
    let (p, param) = (req.prompt_ids.len(), req.prompt_param);
    if p == 0 {
        return Err(invalid(param, "the input is empty".into()));
    }
    if let Some(t) = req.prompt_ids.iter().find(|&&t| t as usize >= b.vocab_size) {
        return Err(invalid(
            param,
            format!(
                "token id {t} is out of range (vocabulary of {})",
                b.vocab_size
            ),
        ));
    }
    if p > b.max_len {
        return Err(EngineError::ContextLength {
            param,
            message: format!(
                "This model's maximum context length is {} tokens. However, your input resulted in {p} tokens. Please reduce the length of the input.",
                b.max_len
            ),
        });
    }
    if p > b.pool_tokens {
        return Err(invalid(
            param,
            format!(
                "{p} tokens do not fit the KV cache of {} tokens",
                b.pool_tokens
            ),
        ));
    }
    Ok(ValidRequest {
        prompt_ids: req.prompt_ids,
        params: SamplingParams::greedy(),
        seed: 0,
        limits: Limits {
            max_tokens: 0,
            max_len: b.max_len,
            stop_ids: Vec::new(),
        },
        stop_strings: Vec::new(),
        n: 1,
        priority: 0,
        grammar: None,
        pooling: Some(pooling),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            vocab_size: 512,
            max_len: 2048,
            pool_tokens: 1024,
            eos_ids: vec![2],
        }
    }

    fn param(r: Result<ValidRequest, EngineError>) -> Option<&'static str> {
        match r {
            Err(EngineError::InvalidRequest { param, .. }) => param,
            Err(EngineError::ContextLength { param, .. }) => Some(param),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn client_counts_never_wrap() {
        for m in [usize::MAX, usize::MAX - 1, 1021, 2047] {
            let r = validate(
                GenerateRequest::greedy(vec![1, 2, 3, 4], m),
                &bounds(),
                None,
            );
            assert_eq!(param(r), Some("max_tokens"), "{m}");
        }
        let ok = validate(
            GenerateRequest::greedy(vec![1, 2, 3, 4], 1020),
            &bounds(),
            None,
        )
        .unwrap();
        assert_eq!(ok.max_tokens(), 1020);
    }

    /// OpenAI's words, which litellm and others match: the context, the tokens asked for,
    /// and how they split between the prompt's field and the completion.
    #[test]
    fn context_overflow_reads_as_openai_writes_it() {
        let mut req = GenerateRequest::greedy(vec![1; 2000], 100);
        req.prompt_param = "messages";
        let e = validate(req.clone(), &bounds(), None).unwrap_err();
        assert!(
            matches!(
                e,
                EngineError::ContextLength {
                    param: "max_tokens",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2000 in the messages, 100 in the completion). Please reduce the length of the messages or completion."
        );
        req.prompt_ids = vec![1; 2048];
        req.max_tokens = None;
        let e = validate(req, &bounds(), None).unwrap_err();
        assert!(
            matches!(
                e,
                EngineError::ContextLength {
                    param: "messages",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "This model's maximum context length is 2048 tokens. However, your messages resulted in 2048 tokens. Please reduce the length of the messages."
        );
    }

    #[test]
    fn absent_max_tokens_is_the_room_left() {
        let mut req = GenerateRequest::greedy(vec![1; 24], 1);
        req.max_tokens = None;
        let v = validate(req.clone(), &bounds(), None).unwrap();
        assert_eq!(v.max_tokens(), 1000, "the pool is smaller than the context");
        req.prompt_ids = vec![1; 1024];
        req.prompt_param = "messages";
        assert_eq!(param(validate(req, &bounds(), None)), Some("messages"));
    }
}
