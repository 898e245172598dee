//! `POST /v1/chat/completions`: messages rendered with the chat template, replies out.

use std::sync::Arc;

use actix_web::web::{Bytes, Data};
use actix_web::{HttpResponse, post};

use super::completions::usage_info;
use super::errors::ApiError;
use super::extract::ApiJson;
use super::generation::{self, ChoiceOutput, MergedStream};
use super::logprobs::TokenTexts;
use super::sse::{self, ChunkWriter, data_frame};
use super::state::{AppState, Ready};
use super::types::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatLogprobs, ChatMessageIn, ChatMessageOut, ContentPart,
    ErrorResponse, MessageContent, UsageInfo,
};
use super::{ResponseMeta, blocking, structured, validate};
use crate::config::LimitsConfig;
use crate::engine::{FinishReason, GenerateRequest, TokenInfo, Usage};
use crate::tokenizer::chat::ChatMessage;

/// Messages as the template sees them: known roles, content flattened to text.
pub fn messages(
    input: &[ChatMessageIn],
    limits: &LimitsConfig,
) -> Result<Vec<ChatMessage>, ApiError> {
    if input.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    if input.len() > limits.max_messages {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "at most {} messages per request, got {}",
                limits.max_messages,
                input.len()
            ),
        ));
    }
    input
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect()
}

/// Message `i`, its role checked and its content flattened.
fn message(i: usize, m: &ChatMessageIn) -> Result<ChatMessage, ApiError> {
    let role = match m.role.as_str() {
        "system" | "developer" => "system",
        "user" => "user",
        "assistant" => "assistant",
        other => {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!("unsupported role {other:?} (expected system, user or assistant)"),
            ));
        }
    };
    let content = match &m.content {
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => parts_text(i, parts)?,
        None if role == "assistant" => String::new(),
        None => {
            return Err(ApiError::invalid(
                format!("messages[{i}].content"),
                "`content` is required",
            ));
        }
    };
    Ok(ChatMessage::new(role, content))
}

/// Text parts joined by newlines; any other part type is a 400 naming it.
fn parts_text(i: usize, parts: &[ContentPart]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        match (p.kind.as_str(), &p.text) {
            ("text", Some(t)) => texts.push(t.as_str()),
            ("text", None) => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].content[{j}].text"),
                    "a text part needs `text`",
                ));
            }
            (other, _) => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].content[{j}].type"),
                    format!("unsupported content part type {other:?} (only \"text\")"),
                ));
            }
        }
    }
    Ok(texts.join("\n"))
}

/// Renders and tokenizes the conversation on the blocking pool.
pub async fn prompt_ids(
    ready: &Ready,
    msgs: Vec<ChatMessage>,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ApiError> {
    let (template, tok) = (ready.template.clone(), ready.tokenizer.clone());
    blocking(move || {
        let text = template.render(&msgs, add_generation_prompt)?;
        tok.encode(&text, false)
            .map_err(|e| ApiError::from_tokenizer("messages", e))
    })
    .await
}

fn check_unsupported(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid("tools", "tool calling is not supported"));
    }
    Ok(())
}

/// The `top_logprobs` to ask the engine for, if `logprobs` is on.
fn chat_logprobs(
    req: &ChatCompletionRequest,
    limits: &LimitsConfig,
) -> Result<Option<usize>, ApiError> {
    match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (true, top) => Ok(Some(validate::logprobs_count(
            "top_logprobs",
            top.unwrap_or(0),
            limits,
        )?)),
        (false, Some(t)) if t > 0 => Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        )),
        (false, _) => Ok(None),
    }
}

/// Create a chat completion.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "The reply; with `stream: true` an SSE stream of `ChatCompletionChunk` frames ending with `data: [DONE]`", body = ChatCompletionResponse),
        (status = 400, description = "Invalid request", body = ErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 413, description = "Body too large", body = ErrorResponse),
        (status = 429, description = "Overloaded; see Retry-After", body = ErrorResponse),
        (status = 503, description = "Not ready", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[post("/v1/chat/completions")]
pub async fn chat_completions(
    state: Data<AppState>,
    ApiJson(req): ApiJson<ChatCompletionRequest>,
) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    ready.check_model(req.model.as_deref())?;
    let limits = &state.config.limits;
    check_unsupported(&req)?;
    let logprobs = chat_logprobs(&req, limits)?;
    let v = validate::sampling(
        &req.sampling(),
        limits,
        ready.client.spec().vocab_size,
        logprobs,
    )?;
    let max_tokens = max_reply_tokens(&req)?;
    let constraint = structured::constraint(&ready.client, req.structured()).await?;
    let msgs = messages(&req.messages, limits)?;
    let ids = prompt_ids(ready, msgs, req.add_generation_prompt.unwrap_or(true)).await?;
    let stream = ready.client.submit(GenerateRequest {
        prompt_ids: ids,
        prompt_param: "messages",
        params: v.params,
        max_tokens,
        stop: v.stop,
        n: v.n,
        priority: 0,
        constraint,
    })?;
    let generated = MergedStream::new(vec![stream], v.n, state.clone());
    let meta = ResponseMeta::new("chatcmpl", &ready.model_name);
    let texts = ready.token_texts.clone();
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let writer = ChatWriter {
            meta,
            texts,
            n: v.n,
            logprobs: logprobs.is_some(),
            include_usage,
        };
        return Ok(sse::response(generated, writer, state.keep_alive()));
    }
    let (outputs, usage) = generation::collect(generated).await?;
    let texts = logprobs.map(|_| &*texts);
    Ok(HttpResponse::Ok().json(reply(meta, outputs, usage, texts)))
}

/// `max_completion_tokens` (or `max_tokens`), at least 1; absent means the rest of the room
/// in the context (the engine resolves it).
fn max_reply_tokens(req: &ChatCompletionRequest) -> Result<Option<usize>, ApiError> {
    match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => validate::max_tokens("max_completion_tokens", Some(m), 1).map(Some),
        (None, Some(m)) => validate::max_tokens("max_tokens", Some(m), 1).map(Some),
        (None, None) => Ok(None),
    }
}

/// The non-streamed response.
fn reply(
    meta: ResponseMeta,
    outputs: Vec<ChoiceOutput>,
    usage: Usage,
    texts: Option<&TokenTexts>,
) -> ChatCompletionResponse {
    let choices = outputs
        .into_iter()
        .enumerate()
        .map(|(index, out)| ChatChoice {
            index,
            logprobs: texts.map(|t| ChatLogprobs {
                content: Some(t.chat(&out.tokens)),
            }),
            message: ChatMessageOut {
                role: "assistant".into(),
                content: Some(out.text),
            },
            finish_reason: out.finish.map(|r| r.as_str().to_string()),
        })
        .collect();
    ChatCompletionResponse {
        id: meta.id,
        object: "chat.completion".into(),
        created: meta.created,
        model: meta.model,
        choices,
        usage: usage_info(usage),
    }
}

/// Chat stream chunks.
struct ChatWriter {
    meta: ResponseMeta,
    texts: Arc<TokenTexts>,
    n: usize,
    logprobs: bool,
    include_usage: bool,
}

impl ChatWriter {
    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<UsageInfo>) -> Bytes {
        data_frame(&ChatCompletionChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.meta.created,
            model: self.meta.model.clone(),
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
        delta: ChatDelta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<FinishReason>,
    ) -> Bytes {
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: finish.map(|r| r.as_str().to_string()),
        };
        self.chunk(vec![choice], None)
    }
}

impl ChunkWriter for ChatWriter {
    fn begin(&mut self) -> Vec<Bytes> {
        (0..self.n)
            .map(|i| {
                let delta = ChatDelta {
                    role: Some("assistant".into()),
                    content: Some(String::new()),
                };
                self.one(i, delta, None, None)
            })
            .collect()
    }

    fn delta(&mut self, index: usize, text: String, tokens: Vec<TokenInfo>) -> Option<Bytes> {
        let logprobs = (self.logprobs && !tokens.is_empty()).then(|| ChatLogprobs {
            content: Some(self.texts.chat(&tokens)),
        });
        if text.is_empty() && logprobs.is_none() {
            return None;
        }
        Some(self.one(
            index,
            ChatDelta {
                role: None,
                content: Some(text),
            },
            logprobs,
            None,
        ))
    }

    fn finish(&mut self, index: usize, reason: FinishReason) -> Bytes {
        self.one(index, ChatDelta::default(), None, Some(reason))
    }

    fn usage(&mut self, usage: Usage) -> Option<Bytes> {
        self.include_usage
            .then(|| self.chunk(Vec::new(), Some(usage_info(usage))))
    }
}
