//! `POST /v1/completions`: prompts in, text completions out (one JSON body or SSE chunks).

use std::ops::Range;
use std::sync::Arc;

use actix_web::web::{Bytes, Data};
use actix_web::{HttpResponse, post};
use serde::Serialize;

use super::errors::ApiError;
use super::extract::ApiJson;
use super::generation::{self, ChoiceOutput, MergedStream};
use super::logprobs::{CompletionLogprobsJson, EchoedPrompt, TokenTexts, json_response};
use super::sse::{self, ChunkWriter, data_frame};
use super::state::{AppState, Ready};
use super::types::{
    CompletionChoice, CompletionChunk, CompletionLogprobs, CompletionRequest, CompletionResponse,
    ErrorResponse, PromptInput, PromptTokensDetails, UsageInfo,
};
use super::{ResponseMeta, blocking, structured, validate};
use crate::config::LimitsConfig;
use crate::engine::{FinishReason, GenerateRequest, TokenInfo, Usage};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

/// Default `max_tokens` of the completions API.
const DEFAULT_MAX_TOKENS: usize = 16;

/// A prompt as sent: text to tokenize or ids to use as they are.
enum PromptSource {
    Text(String),
    Ids(Vec<u32>),
}

/// A tokenized prompt, with its text when it is to be echoed and, echoed with logprobs, the
/// char offset of each of its tokens in that text.
struct Prompt {
    ids: Vec<u32>,
    echo: Option<String>,
    offsets: Option<Arc<[usize]>>,
}

/// What a choice echoes: the prompt's text, its first token (whose logprob is `null`) and
/// its tokens' offsets in the text (when echoed with logprobs).
#[derive(Clone)]
struct Echo {
    text: String,
    first: u32,
    offsets: Option<Arc<[usize]>>,
}

/// The char offset in the echoed `text` at which each of `ids` begins: streaming detokenization
/// (no special tokens, as the echo of an id prompt) counts the text before each token, capped
/// at the text's length. `None` for a prompt the context cannot hold (it is refused anyway).
fn token_offsets(
    tok: &Tokenizer,
    ids: &[u32],
    text: &str,
    context: usize,
) -> Result<Option<Arc<[usize]>>, ApiError> {
    if ids.len() >= context {
        return Ok(None);
    }
    let len = text.chars().count();
    let mut decoder = IncrementalDecoder::new(tok, true);
    let mut at = 0;
    let mut offsets = Vec::with_capacity(ids.len());
    for &id in ids {
        offsets.push(at.min(len));
        let piece = decoder
            .push(id)
            .map_err(|e| ApiError::from_tokenizer("prompt", e))?;
        at += piece.chars().count();
    }
    Ok(Some(offsets.into()))
}

fn sources(prompt: PromptInput, limits: &LimitsConfig) -> Result<Vec<PromptSource>, ApiError> {
    let list = match prompt {
        PromptInput::Text(t) => vec![PromptSource::Text(t)],
        PromptInput::Texts(v) => v.into_iter().map(PromptSource::Text).collect(),
        PromptInput::Tokens(ids) => vec![PromptSource::Ids(ids)],
        PromptInput::TokenLists(v) => v.into_iter().map(PromptSource::Ids).collect(),
    };
    if list.is_empty() {
        return Err(ApiError::invalid("prompt", "`prompt` must not be empty"));
    }
    if list.len() > limits.max_prompts {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "at most {} prompts per request, got {}",
                limits.max_prompts,
                list.len()
            ),
        ));
    }
    let empty = |s: &PromptSource| match s {
        PromptSource::Text(t) => t.is_empty(),
        PromptSource::Ids(ids) => ids.is_empty(),
    };
    if list.iter().any(empty) {
        return Err(ApiError::invalid("prompt", "prompts must not be empty"));
    }
    Ok(list)
}

/// Tokenizes text prompts (BOS as the model wants) and decodes id prompts to be echoed;
/// with `offsets` (echo with logprobs), finds where each echoed token begins.
fn encode(
    tok: &Tokenizer,
    sources: Vec<PromptSource>,
    (echo, offsets): (bool, bool),
    context: usize,
) -> Result<Vec<Prompt>, ApiError> {
    sources
        .into_iter()
        .map(|s| {
            let (ids, echo) = match s {
                PromptSource::Text(t) => {
                    let ids = tok
                        .encode_within(&t, tok.add_bos_default(), context)
                        .map_err(|e| ApiError::from_tokenizer("prompt", e))?;
                    (ids, echo.then_some(t))
                }
                PromptSource::Ids(ids) => {
                    let echo = if echo {
                        Some(
                            tok.decode(&ids, true)
                                .map_err(|e| ApiError::from_tokenizer("prompt", e))?,
                        )
                    } else {
                        None
                    };
                    (ids, echo)
                }
            };
            let offsets = match &echo {
                Some(text) if offsets => token_offsets(tok, &ids, text, context)?,
                _ => None,
            };
            Ok(Prompt { ids, echo, offsets })
        })
        .collect()
}

/// Create a completion for one or more prompts.
#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "openai",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion; with `stream: true` an SSE stream of `CompletionChunk` frames ending with `data: [DONE]`", body = CompletionResponse),
        (status = 400, description = "Invalid request", body = ErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 413, description = "Body too large", body = ErrorResponse),
        (status = 429, description = "Overloaded; see Retry-After", body = ErrorResponse),
        (status = 503, description = "Not ready", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[post("/v1/completions")]
pub async fn completions(
    state: Data<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    ready.check_model(req.model.as_deref())?;
    let plan = Plan::new(&req, ready, &state.config.limits)?;
    let constraint = structured::constraint(&ready.client, req.structured()).await?;
    let srcs = sources(req.prompt, &state.config.limits)?;
    let (tok, echo) = (ready.tokenizer.clone(), plan.echo);
    let offsets = plan.v.params.prompt_logprobs.is_some();
    let context = ready.client.max_model_len();
    let prompts = blocking(move || encode(&tok, srcs, (echo, offsets), context)).await?;
    let n = plan.v.n;
    // Every prompt is checked before any is queued.
    let mut valid = Vec::with_capacity(prompts.len());
    let mut echoes: Vec<Option<Echo>> = Vec::with_capacity(prompts.len() * n);
    for p in prompts {
        let first = p.ids.first().copied().unwrap_or(0);
        let offsets = p.offsets;
        let echo = p.echo.map(|text| Echo {
            text,
            first,
            offsets,
        });
        echoes.extend(std::iter::repeat_n(echo, n));
        valid.push(ready.client.validate(GenerateRequest {
            prompt_ids: p.ids,
            prompt_param: "prompt",
            params: plan.v.params.clone(),
            max_tokens: Some(plan.max_tokens),
            stop: plan.v.stop.clone(),
            n,
            priority: 0,
            constraint: constraint.clone(),
        })?);
    }
    let streams = valid
        .into_iter()
        .map(|v| ready.client.submit_valid(v))
        .collect::<Result<Vec<_>, _>>()?;
    let generated = MergedStream::new(streams, n, state.clone());
    let meta = ResponseMeta::served("cmpl", ready);
    let texts = ready.token_texts.clone();
    let logprobs = plan.v.params.logprobs.is_some();
    if plan.stream {
        let writer = CompletionWriter::new(meta, texts, echoes, logprobs, plan.include_usage);
        return Ok(sse::response(generated, writer, state.keep_alive()));
    }
    let (mut outputs, usage) = generation::collect(generated).await?;
    let texts = logprobs.then_some(&*texts);
    Ok(json_response(&body(
        meta,
        &mut outputs,
        &mut echoes,
        usage,
        texts,
    )))
}

/// The non-streamed response: the JSON of a [`CompletionResponse`], its logprobs written
/// straight from the tokens ([`CompletionLogprobsJson`]) rather than built as strings first.
#[derive(Serialize)]
struct CompletionBody<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    system_fingerprint: String,
    choices: Vec<ChoiceBody<'a>>,
    usage: UsageInfo,
}

/// A [`CompletionChoice`] of a [`CompletionBody`].
#[derive(Serialize)]
struct ChoiceBody<'a> {
    index: usize,
    text: String,
    logprobs: Option<CompletionLogprobsJson<'a>>,
    finish_reason: Option<&'static str>,
}

/// The response of `outputs` (their texts and the echoes' are moved into it), with logprobs
/// when `texts` is given.
fn body<'a>(
    meta: ResponseMeta,
    outputs: &'a mut [ChoiceOutput],
    echoes: &'a mut [Option<Echo>],
    usage: Usage,
    texts: Option<&'a TokenTexts>,
) -> CompletionBody<'a> {
    let choices = outputs
        .iter_mut()
        .zip(echoes.iter_mut())
        .enumerate()
        .map(|(index, (out, echo))| choice(index, out, echo.as_mut(), texts))
        .collect();
    CompletionBody {
        id: meta.id,
        object: "text_completion",
        created: meta.created,
        model: meta.model,
        system_fingerprint: meta.fingerprint,
        choices,
        usage: usage_info(usage),
    }
}

/// Everything about a completions request except its prompts, validated.
struct Plan {
    v: validate::Validated,
    max_tokens: usize,
    echo: bool,
    stream: bool,
    include_usage: bool,
}

impl Plan {
    fn new(
        req: &CompletionRequest,
        ready: &Ready,
        limits: &LimitsConfig,
    ) -> Result<Self, ApiError> {
        if req.suffix.is_some() {
            return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
        }
        let logprobs = req
            .logprobs
            .map(|n| validate::logprobs_count("logprobs", n, limits))
            .transpose()?;
        let echo = req.echo.unwrap_or(false);
        let vocab = ready.client.spec().vocab_size;
        let mut v = validate::sampling(&req.sampling(), limits, vocab, logprobs)?;
        // Echoed with logprobs: the prompt's tokens get theirs too (prompt logprobs).
        if echo {
            v.params.prompt_logprobs = logprobs;
        }
        // `max_tokens` 0 with `echo` scores the prompt: it is returned alone (as vLLM does).
        let max_tokens = match req.max_tokens {
            Some(0) if echo => 0,
            m => validate::max_tokens("max_tokens", m, DEFAULT_MAX_TOKENS)?,
        };
        Ok(Self {
            v,
            max_tokens,
            echo,
            stream: req.stream.unwrap_or(false),
            include_usage: req
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        })
    }
}

/// One non-streamed choice: the echoed prompt, the text, and logprobs when asked (an
/// echoed prompt's first, then the completion's).
fn choice<'a>(
    index: usize,
    out: &'a mut ChoiceOutput,
    mut echo: Option<&'a mut Echo>,
    texts: Option<&'a TokenTexts>,
) -> ChoiceBody<'a> {
    // The generated tokens begin after the echoed text.
    let offset = echo.as_ref().map_or(0, |e| e.text.chars().count());
    let generated = std::mem::take(&mut out.text);
    let text = match echo.as_deref_mut() {
        Some(e) => std::mem::take(&mut e.text) + &generated,
        None => generated,
    };
    let (out, echo): (&'a ChoiceOutput, Option<&'a Echo>) = (out, echo.map(|e| &*e));
    let logprobs = texts.map(|texts| {
        let prompt = match (echo, &out.prompt) {
            (Some(e), Some(rest)) => Some(EchoedPrompt {
                first: e.first,
                rest,
                offsets: e.offsets.as_deref(),
            }),
            _ => None,
        };
        CompletionLogprobsJson::new(texts, prompt, &out.tokens, offset)
    });
    ChoiceBody {
        index,
        text,
        logprobs,
        finish_reason: out.finish.map(FinishReason::as_str),
    }
}

/// Wire usage from engine usage.
pub fn usage_info(u: Usage) -> UsageInfo {
    UsageInfo {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details: Some(PromptTokensDetails {
            cached_tokens: u.cached_tokens,
        }),
    }
}

/// Completion stream chunks.
struct CompletionWriter {
    meta: ResponseMeta,
    texts: Arc<TokenTexts>,
    /// What each choice echoes, until it is sent: at once, or with logprobs once the
    /// prompt's logprobs arrive (before any token of the choice).
    echoes: Vec<Option<Echo>>,
    /// Char offset of the next token of each choice (for `text_offset`).
    offsets: Vec<usize>,
    logprobs: bool,
    include_usage: bool,
}

impl CompletionWriter {
    fn new(
        meta: ResponseMeta,
        texts: Arc<TokenTexts>,
        echoes: Vec<Option<Echo>>,
        logprobs: bool,
        include_usage: bool,
    ) -> Self {
        let offsets = echoes
            .iter()
            .map(|e| e.as_ref().map_or(0, |e| e.text.chars().count()))
            .collect();
        Self {
            meta,
            texts,
            echoes,
            offsets,
            logprobs,
            include_usage,
        }
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<UsageInfo>) -> Bytes {
        data_frame(&CompletionChunk {
            id: self.meta.id.clone(),
            object: "text_completion".into(),
            created: self.meta.created,
            model: self.meta.model.clone(),
            system_fingerprint: self.meta.fingerprint.clone(),
            choices,
            usage: if self.include_usage {
                Some(usage)
            } else {
                None
            },
        })
    }

    fn one(
        &self,
        index: usize,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<FinishReason>,
    ) -> Bytes {
        let choice = CompletionChoice {
            index,
            text,
            logprobs,
            finish_reason: finish.map(|r| r.as_str().to_string()),
        };
        self.chunk(vec![choice], None)
    }
}

impl ChunkWriter for CompletionWriter {
    fn begin(&mut self) -> Vec<Bytes> {
        if self.logprobs {
            // Echoes wait for their prompt's logprobs.
            return Vec::new();
        }
        let echoes = std::mem::take(&mut self.echoes);
        echoes
            .into_iter()
            .enumerate()
            .filter_map(|(i, e)| e.map(|e| self.one(i, e.text, None, None)))
            .collect()
    }

    fn prompt_logprobs(&mut self, choices: Range<usize>, tokens: Arc<[TokenInfo]>) -> Vec<Bytes> {
        let mut frames = Vec::new();
        for i in choices {
            let Some(e) = self.echoes.get_mut(i).and_then(Option::take) else {
                continue;
            };
            let mut lp = CompletionLogprobs::default();
            let offsets = e.offsets.as_deref();
            self.texts
                .completion_prompt(e.first, &tokens, offsets, &mut lp);
            frames.push(self.one(i, e.text, Some(lp), None));
        }
        frames
    }

    fn delta(&mut self, index: usize, text: String, tokens: Vec<TokenInfo>) -> Option<Bytes> {
        let logprobs = if self.logprobs && !tokens.is_empty() {
            let mut lp = CompletionLogprobs::default();
            let offset = self.offsets.get(index).copied().unwrap_or(0);
            let next = self.texts.completion(&tokens, offset, &mut lp);
            if let Some(o) = self.offsets.get_mut(index) {
                *o = next;
            }
            Some(lp)
        } else {
            None
        };
        if text.is_empty() && logprobs.is_none() {
            return None;
        }
        Some(self.one(index, text, logprobs, None))
    }

    fn finish(&mut self, index: usize, reason: FinishReason) -> Bytes {
        self.one(index, String::new(), None, Some(reason))
    }

    fn usage(&mut self, usage: Usage) -> Option<Bytes> {
        self.include_usage
            .then(|| self.chunk(Vec::new(), Some(usage_info(usage))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::logprobs::testing;

    /// The response as it was built before [`body`]: the wire structs, logprobs as strings.
    fn owned_response(
        meta: ResponseMeta,
        outputs: Vec<ChoiceOutput>,
        echoes: Vec<Option<Echo>>,
        usage: Usage,
        texts: Option<&TokenTexts>,
    ) -> CompletionResponse {
        let choices = outputs
            .into_iter()
            .zip(echoes)
            .enumerate()
            .map(|(index, (out, echo))| {
                let logprobs = texts.map(|texts| {
                    let mut lp = CompletionLogprobs::default();
                    if let (Some(e), Some(prompt)) = (&echo, &out.prompt) {
                        texts.completion_prompt(e.first, prompt, e.offsets.as_deref(), &mut lp);
                    }
                    let offset = echo.as_ref().map_or(0, |e| e.text.chars().count());
                    texts.completion(&out.tokens, offset, &mut lp);
                    lp
                });
                let prefix = echo.map(|e| e.text).unwrap_or_default();
                CompletionChoice {
                    index,
                    text: prefix + &out.text,
                    logprobs,
                    finish_reason: out.finish.map(|r| r.as_str().to_string()),
                }
            })
            .collect();
        CompletionResponse {
            id: meta.id,
            object: "text_completion".into(),
            created: meta.created,
            model: meta.model,
            system_fingerprint: meta.fingerprint,
            choices,
            usage: usage_info(usage),
        }
    }

    fn meta() -> ResponseMeta {
        ResponseMeta {
            fingerprint: "fp_0123456789".into(),
            ..ResponseMeta::new("cmpl", "stories \"260K\"")
        }
    }

    /// A choice of `count` tokens (top `top`), its text theirs.
    fn output(texts: &TokenTexts, count: usize, top: usize, seed: u64) -> ChoiceOutput {
        let tokens = testing::tokens(count, top, 512, seed);
        ChoiceOutput {
            prompt: None,
            text: tokens
                .iter()
                .map(|t| texts.get(t.id).text.clone())
                .collect(),
            tokens,
            finish: Some(FinishReason::Length),
        }
    }

    fn bytes(resp: HttpResponse) -> Bytes {
        actix_web::body::MessageBody::try_into_bytes(resp.into_body()).expect("one body")
    }

    #[test]
    fn body_is_the_json_the_response_structs_were() {
        let texts = testing::texts();
        let prompt: Arc<[TokenInfo]> = testing::tokens(12, 4, 512, 5).into();
        let mut outputs: Vec<ChoiceOutput> = (0..4).map(|i| output(&texts, 30, 5, i)).collect();
        for o in &mut outputs[..2] {
            o.prompt = Some(prompt.clone());
        }
        outputs[2].finish = Some(FinishReason::Stop);
        outputs[3].finish = None;
        let echo = |offsets: Option<Arc<[usize]>>| Echo {
            text: "Once upon a time, é".into(),
            first: 1,
            offsets,
        };
        let offsets: Arc<[usize]> = (0..13).map(|i| i * 2).collect();
        let echoes = vec![Some(echo(Some(offsets))), Some(echo(None)), None, None];
        let usage = Usage {
            prompt_tokens: 13,
            completion_tokens: 120,
            cached_tokens: 4,
        };
        for with_logprobs in [true, false] {
            let texts = with_logprobs.then_some(&*texts);
            let meta = meta();
            let owned = owned_response(meta.clone(), outputs.clone(), echoes.clone(), usage, texts);
            let (mut outs, mut echoes) = (outputs.clone(), echoes.clone());
            let resp = json_response(&body(meta, &mut outs, &mut echoes, usage, texts));
            let want = serde_json::to_string(&owned).expect("json");
            assert_eq!(std::str::from_utf8(&bytes(resp)).expect("utf-8"), want);
        }
    }

    /// n=16, top 20, 2,000 tokens: the response costs about its own size (it cost ~10×
    /// with the wire structs: a `String` per alternative in a `BTreeMap` per token).
    #[test]
    fn a_body_with_logprobs_costs_about_its_size() {
        let texts = testing::texts();
        let outputs: Vec<ChoiceOutput> = (0..16).map(|i| output(&texts, 2000, 20, i)).collect();
        let echoes = vec![None; 16];
        let usage = Usage::default();
        let started = std::time::Instant::now();
        let (owned, before) = crate::alloc::peak(|| {
            let r = owned_response(meta(), outputs.clone(), echoes.clone(), usage, Some(&texts));
            HttpResponse::Ok().json(r)
        });
        let took_before = started.elapsed();
        let (mut outs, mut echoes) = (outputs.clone(), echoes.clone());
        let started = std::time::Instant::now();
        let (resp, after) = crate::alloc::peak(|| {
            json_response(&body(meta(), &mut outs, &mut echoes, usage, Some(&texts)))
        });
        let took = started.elapsed();
        let (owned, body) = (bytes(owned), bytes(resp));
        let held: usize = outputs
            .iter()
            .map(|o| o.tokens.len() * size_of::<TokenInfo>() + o.tokens.len() * 20 * 8)
            .sum();
        println!(
            "completions n=16 top=20 2000 tokens: body {} B; peak before {} B ({:.2}×, {took_before:?}), after {} B ({:.2}×, {took:?}); tokens held {} B",
            body.len(),
            before,
            before as f64 / body.len() as f64,
            after,
            after as f64 / body.len() as f64,
            held,
        );
        assert_eq!(body.len(), owned.len());
        assert!(
            after < body.len() * 3 / 2,
            "{after} B for a {} B body",
            body.len()
        );
    }
}
