//! `POST /v1/chat/completions`: messages rendered with the chat template, replies out.

use std::sync::Arc;

use actix_web::web::{Bytes, Data};
use actix_web::{HttpResponse, post};
use serde::Serialize;

use super::completions::usage_info;
use super::errors::ApiError;
use super::extract::ApiJson;
use super::generation::{self, ChoiceOutput, MergedStream};
use super::logprobs::{ChatLogprobsJson, TokenTexts, json_response};
use super::sse::{self, ChunkWriter, data_frame};
use super::state::{AppState, Ready};
use super::tools::{ChoiceParser, ParseOptions, ParsedReply, ToolFormat, ToolRequest, output};
use super::types::{
    ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatDelta,
    ChatLogprobs, ChatMessageIn, ChatMessageOut, ContentPart, ErrorResponse, MessageContent,
    ToolCall, UsageInfo,
};
use super::{ResponseMeta, blocking, structured, validate};
use crate::config::LimitsConfig;
use crate::engine::{FinishReason, GenerateRequest, TokenInfo, Usage};
use crate::tokenizer::chat::{ChatMessage, TemplateTool, TemplateToolCall};

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
        "tool" => "tool",
        other => {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!("unsupported role {other:?} (expected system, user, assistant or tool)"),
            ));
        }
    };
    let has_calls = m.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
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
    let mut out = ChatMessage::new(role, content);
    out.name = m.name.clone();
    match &m.reasoning_content {
        Some(_) if role != "assistant" => {
            return Err(ApiError::invalid(
                format!("messages[{i}].reasoning_content"),
                "only assistant messages have `reasoning_content`",
            ));
        }
        Some(r) if !r.is_empty() => out.thinking = Some(r.clone()),
        _ => {}
    }
    if has_calls && role != "assistant" {
        return Err(ApiError::invalid(
            format!("messages[{i}].tool_calls"),
            "only assistant messages have `tool_calls`",
        ));
    }
    if let Some(calls) = &m.tool_calls {
        out.tool_calls = calls
            .iter()
            .enumerate()
            .map(|(j, c)| tool_call(i, j, c))
            .collect::<Result<_, _>>()?;
    }
    if role == "tool" {
        match &m.tool_call_id {
            Some(id) if !id.is_empty() => out.tool_call_id = Some(id.clone()),
            _ => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].tool_call_id"),
                    "a tool message needs `tool_call_id`",
                ));
            }
        }
    }
    Ok(out)
}

/// Call `j` of message `i` as the template sees it (arguments parsed when they are JSON).
fn tool_call(i: usize, j: usize, c: &ToolCall) -> Result<TemplateToolCall, ApiError> {
    if c.kind != "function" {
        return Err(ApiError::invalid(
            format!("messages[{i}].tool_calls[{j}].type"),
            format!(
                "unsupported tool call type {:?} (only \"function\")",
                c.kind
            ),
        ));
    }
    if c.function.name.is_empty() {
        return Err(ApiError::invalid(
            format!("messages[{i}].tool_calls[{j}].function.name"),
            "a tool call needs a function name",
        ));
    }
    let arguments = serde_json::from_str(&c.function.arguments)
        .unwrap_or_else(|_| serde_json::Value::String(c.function.arguments.clone()));
    Ok(TemplateToolCall {
        id: c.id.clone(),
        name: c.function.name.clone(),
        arguments,
    })
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
    Ok(
        render_prompt(ready, msgs, Vec::new(), add_generation_prompt)
            .await?
            .0,
    )
}

/// Renders the conversation with `tools` and tokenizes it on the blocking pool; also says
/// whether the prompt ends inside an opened `<think>` (the reply starts with reasoning).
pub async fn render_prompt(
    ready: &Ready,
    msgs: Vec<ChatMessage>,
    tools: Vec<TemplateTool>,
    add_generation_prompt: bool,
) -> Result<(Vec<u32>, bool), ApiError> {
    render_prompt_effort(ready, msgs, tools, add_generation_prompt, None).await
}

/// The `reasoning_effort` OpenAI's chat API takes (`minimal` and `none` have no meaning for
/// the templates that read it).
const EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// The request's `reasoning_effort`, checked: one of [`EFFORTS`], and only where the chat
/// template reads `reasoning_effort` (else it could not be honoured: a 400 naming it).
fn reasoning_effort(
    req: &ChatCompletionRequest,
    ready: &Ready,
    has_tools: bool,
) -> Result<Option<String>, ApiError> {
    let Some(e) = &req.reasoning_effort else {
        return Ok(None);
    };
    if !EFFORTS.contains(&e.as_str()) {
        return Err(ApiError::invalid(
            "reasoning_effort",
            format!("unsupported reasoning_effort {e:?} (expected one of {EFFORTS:?})"),
        ));
    }
    if !ready
        .template_for(has_tools)
        .source()
        .contains("reasoning_effort")
    {
        return Err(ApiError::invalid(
            "reasoning_effort",
            format!(
                "`reasoning_effort` {e:?} cannot be honoured: this model's chat template has no `reasoning_effort`"
            ),
        ));
    }
    Ok(Some(e.clone()))
}

/// [`render_prompt`] with `reasoning_effort` set for the template when given.
pub async fn render_prompt_effort(
    ready: &Ready,
    msgs: Vec<ChatMessage>,
    tools: Vec<TemplateTool>,
    add_generation_prompt: bool,
    effort: Option<String>,
) -> Result<(Vec<u32>, bool), ApiError> {
    let template = ready.template_for(!tools.is_empty()).clone();
    let tok = ready.tokenizer.clone();
    let context = ready.client.max_model_len();
    blocking(move || {
        let text = match &effort {
            Some(e) => template.render_effort(&msgs, &tools, add_generation_prompt, e)?,
            None => template.render_with_tools(&msgs, &tools, add_generation_prompt)?,
        };
        let thinking = text.trim_end().ends_with("<think>");
        let ids = tok
            .encode_within(&text, false, context)
            .map_err(|e| ApiError::from_tokenizer("messages", e))?;
        Ok((ids, thinking))
    })
    .await
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
    let logprobs = chat_logprobs(&req, limits)?;
    let v = validate::sampling(
        &req.sampling(),
        limits,
        ready.client.spec().vocab_size,
        logprobs,
    )?;
    let max_tokens = max_reply_tokens(&req)?;
    let tools = ToolRequest::from_request(&req)?;
    let effort = reasoning_effort(&req, ready, !tools.template_tools().is_empty())?;
    let format = structured::parse(req.structured())?;
    let msgs = messages(&req.messages, limits)?;
    let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
    let template_tools = tools.template_tools().to_vec();
    let (ids, thinking) =
        render_prompt_effort(ready, msgs, template_tools, add_generation_prompt, effort).await?;
    let (parse, tool_constraint) = reply_parsing(&state, ready, &tools, thinking);
    let constraint = prepared_constraint(&ready.client, format, tool_constraint, parse).await?;
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
    let meta = ResponseMeta::served("chatcmpl", ready);
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
            parsers: (0..v.n).map(|_| ChoiceParser::new(parse)).collect(),
        };
        return Ok(sse::response(generated, writer, state.keep_alive()));
    }
    let (outputs, usage) = generation::collect(generated).await?;
    let texts = logprobs.map(|_| &*texts);
    Ok(json_response(&reply(meta, &outputs, usage, texts, parse)))
}

/// How replies are parsed (tool calls, reasoning) and the constraint that forces a call.
pub(crate) fn reply_parsing(
    state: &AppState,
    ready: &Ready,
    tools: &ToolRequest,
    starts_thinking: bool,
) -> (ParseOptions, Option<crate::engine::Constraint>) {
    let model = &state.config.model;
    let template = ready.template_for(!tools.template_tools().is_empty());
    let format = ToolFormat::pick(model.tool_call_parser, template.source());
    let harmony = format == ToolFormat::Harmony;
    let parse = ParseOptions {
        tools: tools.parses_calls().then_some(format),
        reasoning: model.reasoning_parser.is_some() && !harmony,
        starts_thinking,
        single_call: !tools.parallel,
        harmony,
    };
    (parse, tools.constraint(format, &ready.tokenizer))
}

/// The request's one constraint: its `response_format` (or vLLM field), or the tool-call
/// grammar of `tool_choice` "required" / a named function, compiled before anything is
/// queued (a 400 naming `tools` when the functions' schemas do not compile). Both at once
/// is a 400: the reply cannot be a tool call and free JSON at the same time.
pub(crate) async fn one_constraint(
    client: &crate::engine::EngineClient,
    format: Option<crate::engine::Constraint>,
    tools: Option<crate::engine::Constraint>,
) -> Result<Option<crate::engine::Constraint>, ApiError> {
    match (format, tools) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "response_format",
            "`response_format` cannot be combined with `tool_choice` \"required\" or a named function",
        )),
        (None, Some(c)) => {
            client.prepare_constraint(&c, "tools").await?;
            Ok(Some(c))
        }
        (format, None) => Ok(format),
    }
}

/// The request's one constraint as [`one_constraint`] picks it (`format` with the field that
/// asked for it), held after the reasoning ([`after_reasoning`]), compiled on the engine's
/// compile threads before anything is queued: a 400 naming that field (or `tools`) when it
/// does not compile, is past a limit, or takes too long.
pub(crate) async fn prepared_constraint(
    client: &crate::engine::EngineClient,
    format: Option<(crate::engine::Constraint, &'static str)>,
    tools: Option<crate::engine::Constraint>,
    parse: ParseOptions,
) -> Result<Option<crate::engine::Constraint>, ApiError> {
    let (c, param) = match (format, tools) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "response_format",
                "`response_format` cannot be combined with `tool_choice` \"required\" or a named function",
            ));
        }
        (None, Some(c)) => (c, "tools"),
        (Some((c, param)), None) => (c, param),
        (None, None) => return Ok(None),
    };
    let c = after_reasoning(c, parse);
    client.prepare_constraint(&c, param).await?;
    Ok(Some(c))
}

/// With a reasoning parser, the constraint holds for the answer only: the thinking before
/// `</think>` stays free (the prompt may already have opened it).
pub(crate) fn after_reasoning(
    c: crate::engine::Constraint,
    parse: ParseOptions,
) -> crate::engine::Constraint {
    if !parse.reasoning {
        return c;
    }
    crate::engine::Constraint::AfterReasoning {
        opened: parse.starts_thinking,
        answer: Box::new(c),
    }
}

/// The OpenAI finish reason: `tool_calls` when a reply that stopped on its own made calls.
fn finish_reason(reason: FinishReason, calls: usize) -> String {
    match reason {
        FinishReason::Stop if calls > 0 => "tool_calls".into(),
        r => r.as_str().to_string(),
    }
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

/// The non-streamed response: the JSON of a [`ChatCompletionResponse`], its logprobs
/// written straight from the tokens ([`ChatLogprobsJson`]) rather than built as strings first.
#[derive(Serialize)]
struct ChatBody<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    system_fingerprint: String,
    choices: Vec<ChatChoiceBody<'a>>,
    usage: UsageInfo,
}

/// A [`ChatChoice`](super::types::ChatChoice) of a [`ChatBody`].
#[derive(Serialize)]
struct ChatChoiceBody<'a> {
    index: usize,
    message: ChatMessageOut,
    logprobs: Option<ChatLogprobsJson<'a>>,
    finish_reason: Option<String>,
}

/// The non-streamed response of `outputs`, with logprobs when `texts` is given.
fn reply<'a>(
    meta: ResponseMeta,
    outputs: &'a [ChoiceOutput],
    usage: Usage,
    texts: Option<&'a TokenTexts>,
    parse: ParseOptions,
) -> ChatBody<'a> {
    let choices = outputs
        .iter()
        .enumerate()
        .map(|(index, out)| {
            let end = out.finish.unwrap_or(FinishReason::Stop);
            let parsed = ParsedReply::parse_ended(parse, &out.text, end);
            let calls = parsed.calls.len();
            ChatChoiceBody {
                index,
                logprobs: texts.map(|t| ChatLogprobsJson::new(t, &out.tokens)),
                message: output::message(parsed),
                finish_reason: out.finish.map(|r| finish_reason(r, calls)),
            }
        })
        .collect();
    ChatBody {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        system_fingerprint: meta.fingerprint,
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
    /// One per choice: tool calls and reasoning split from the text.
    parsers: Vec<ChoiceParser>,
}

impl ChatWriter {
    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<UsageInfo>) -> Bytes {
        data_frame(&ChatCompletionChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk".into(),
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
        delta: ChatDelta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<String>,
    ) -> Bytes {
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: finish,
        };
        self.chunk(vec![choice], None)
    }

    /// One chunk per delta (logprobs ride on the first), concatenated into one body piece.
    fn frames(
        &self,
        index: usize,
        deltas: Vec<ChatDelta>,
        mut logprobs: Option<ChatLogprobs>,
    ) -> Option<Bytes> {
        let mut out = Vec::new();
        for delta in deltas {
            out.extend_from_slice(&self.one(index, delta, logprobs.take(), None));
        }
        if let Some(lp) = logprobs {
            let delta = ChatDelta {
                content: Some(String::new()),
                ..ChatDelta::default()
            };
            out.extend_from_slice(&self.one(index, delta, Some(lp), None));
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }
}

impl ChunkWriter for ChatWriter {
    fn begin(&mut self) -> Vec<Bytes> {
        (0..self.n)
            .map(|i| {
                let delta = ChatDelta {
                    role: Some("assistant".into()),
                    content: Some(String::new()),
                    ..ChatDelta::default()
                };
                self.one(i, delta, None, None)
            })
            .collect()
    }

    fn delta(&mut self, index: usize, text: String, tokens: Vec<TokenInfo>) -> Option<Bytes> {
        let logprobs = (self.logprobs && !tokens.is_empty()).then(|| ChatLogprobs {
            content: Some(self.texts.chat(&tokens)),
        });
        let pieces = match self.parsers.get_mut(index) {
            Some(p) => p.push(&text),
            None => Vec::new(),
        };
        self.frames(index, output::deltas(pieces), logprobs)
    }

    fn finish(&mut self, index: usize, reason: FinishReason) -> Bytes {
        let (pieces, calls) = match self.parsers.get_mut(index) {
            Some(p) => (p.finish_on(reason), p.calls()),
            None => (Vec::new(), 0),
        };
        let last = self.one(
            index,
            ChatDelta::default(),
            None,
            Some(finish_reason(reason, calls)),
        );
        match self.frames(index, output::deltas(pieces), None) {
            Some(rest) => Bytes::from([&rest[..], &last[..]].concat()),
            None => last,
        }
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
    use crate::api::types::{ChatChoice, ChatCompletionResponse};

    /// The response as it was built before [`reply`]: the wire structs, logprobs as strings.
    fn owned_reply(
        meta: ResponseMeta,
        outputs: Vec<ChoiceOutput>,
        usage: Usage,
        texts: Option<&TokenTexts>,
        parse: ParseOptions,
    ) -> ChatCompletionResponse {
        let choices = outputs
            .into_iter()
            .enumerate()
            .map(|(index, out)| {
                let end = out.finish.unwrap_or(FinishReason::Stop);
                let parsed = ParsedReply::parse_ended(parse, &out.text, end);
                let calls = parsed.calls.len();
                ChatChoice {
                    index,
                    logprobs: texts.map(|t| ChatLogprobs {
                        content: Some(t.chat(&out.tokens)),
                    }),
                    message: output::message(parsed),
                    finish_reason: out.finish.map(|r| finish_reason(r, calls)),
                }
            })
            .collect();
        ChatCompletionResponse {
            id: meta.id,
            object: "chat.completion".into(),
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
            ..ResponseMeta::new("chatcmpl", "stories260K")
        }
    }

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
    fn reply_is_the_json_the_response_structs_were() {
        let texts = testing::texts();
        let mut outputs: Vec<ChoiceOutput> = (0..3).map(|i| output(&texts, 25, 4, i)).collect();
        outputs[1].text = "<think>a plan</think>The \"answer\"\n".into();
        outputs[1].finish = Some(FinishReason::Stop);
        outputs[2].finish = None;
        let usage = Usage {
            prompt_tokens: 9,
            completion_tokens: 75,
            cached_tokens: 0,
        };
        let reasoning = ParseOptions {
            reasoning: true,
            ..ParseOptions::default()
        };
        for parse in [ParseOptions::default(), reasoning] {
            for texts in [Some(&*texts), None] {
                let meta = meta();
                let owned = owned_reply(meta.clone(), outputs.clone(), usage, texts, parse);
                let resp = json_response(&reply(meta, &outputs, usage, texts, parse));
                let want = serde_json::to_string(&owned).expect("json");
                assert_eq!(std::str::from_utf8(&bytes(resp)).expect("utf-8"), want);
            }
        }
    }

    /// n=16, top_logprobs 20, 2,000 tokens: the reply costs about its own size.
    #[test]
    fn a_reply_with_logprobs_costs_about_its_size() {
        let texts = testing::texts();
        let outputs: Vec<ChoiceOutput> = (0..16).map(|i| output(&texts, 2000, 20, i)).collect();
        let (usage, parse) = (Usage::default(), ParseOptions::default());
        let started = std::time::Instant::now();
        let (owned, before) = crate::alloc::peak(|| {
            let r = owned_reply(meta(), outputs.clone(), usage, Some(&texts), parse);
            HttpResponse::Ok().json(r)
        });
        let took_before = started.elapsed();
        let started = std::time::Instant::now();
        let (resp, after) = crate::alloc::peak(|| {
            json_response(&reply(meta(), &outputs, usage, Some(&texts), parse))
        });
        let took = started.elapsed();
        let (owned, body) = (bytes(owned), bytes(resp));
        println!(
            "chat n=16 top_logprobs=20 2000 tokens: body {} B; peak before {} B ({:.2}×, {took_before:?}), after {} B ({:.2}×, {took:?})",
            body.len(),
            before,
            before as f64 / body.len() as f64,
            after,
            after as f64 / body.len() as f64,
        );
        assert_eq!(body.len(), owned.len());
        assert!(
            after < body.len() * 3 / 2,
            "{after} B for a {} B body",
            body.len()
        );
    }
}
