//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`. The
//! request is converted into Kiln's chat pipeline (template, tool grammar and parsers,
//! reasoning parser); the reply comes back as Anthropic content blocks, whole or as its
//! stream events. Errors on these routes are in Anthropic's shape ([`errors::rewrite`]).

mod blocks;
mod convert;
pub mod errors;
mod stream;
pub mod types;

use actix_web::web::Data;
use actix_web::{HttpResponse, post};

use super::chat::{after_reasoning, one_constraint, reply_parsing};
use super::errors::ApiError;
use super::extract::ApiJson;
use super::generation::{self, MergedStream};
use super::state::{AppState, Ready};
use super::tools::{ChoiceParser, ToolRequest};
use super::{ResponseMeta, blocking, sse};
use crate::engine::{FinishReason, GenerateRequest};
use crate::tokenizer::chat::TemplateTool;
use blocks::{Assembler, stop_reason};
use convert::Conversation;
use stream::MessagesWriter;
use types::{AnthropicErrorResponse, CountTokensResponse, MessagesRequest, MessagesResponse};

pub use errors::{is_route, rewrite};
pub use stream::cut_ending;

/// A rendered prompt: its ids and whether it ends inside an opened `<think>`.
struct Prompt {
    ids: Vec<u32>,
    thinking: bool,
}

/// Renders the conversation (a prefill appended after the generation prompt; the template's
/// `enable_thinking` set from the request's `thinking`) and tokenizes it on the blocking pool.
async fn render(
    ready: &Ready,
    conv: Conversation,
    tools: Vec<TemplateTool>,
    thinking: Option<bool>,
) -> Result<Prompt, ApiError> {
    let template = ready.template_for(!tools.is_empty()).clone();
    let tok = ready.tokenizer.clone();
    let context = ready.client.max_model_len();
    blocking(move || {
        let mut text = template.render_thinking(&conv.messages, &tools, true, thinking)?;
        if let Some(p) = &conv.prefill {
            text.push_str(p);
        }
        let thinking = text.trim_end().ends_with("<think>");
        let ids = tok
            .encode_within(&text, false, context)
            .map_err(|e| ApiError::from_tokenizer("messages", e))?;
        Ok(Prompt { ids, thinking })
    })
    .await
}

/// The request's conversation and tools, checked and rendered.
async fn prompt(
    state: &AppState,
    ready: &Ready,
    req: &MessagesRequest,
    thinking: Option<bool>,
) -> Result<(Prompt, ToolRequest), ApiError> {
    ready.check_model(req.model.as_deref())?;
    let tools = convert::tools(req)?;
    let conv = convert::conversation(req, &state.config.limits)?;
    let prompt = render(ready, conv, tools.template_tools().to_vec(), thinking).await?;
    Ok((prompt, tools))
}

/// Create a message (Anthropic's Messages API).
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "anthropic",
    request_body = MessagesRequest,
    params(
        ("anthropic-version" = Option<String>, Header, description = "Accepted; any version"),
    ),
    responses(
        (status = 200, description = "The reply; with `stream: true` an SSE stream of `event: <type>` / `data: <MessageStreamEvent>` frames from `message_start` to `message_stop`", body = MessagesResponse),
        (status = 400, description = "Invalid request (e.g. `max_tokens` missing, an image block)", body = AnthropicErrorResponse),
        (status = 401, description = "Missing or wrong API key (`x-api-key` or `Authorization: Bearer`)", body = AnthropicErrorResponse),
        (status = 404, description = "Unknown model", body = AnthropicErrorResponse),
        (status = 413, description = "Body too large", body = AnthropicErrorResponse),
        (status = 429, description = "Too many requests waiting; see Retry-After", body = AnthropicErrorResponse),
        (status = 529, description = "Overloaded or not ready", body = AnthropicErrorResponse),
    ),
    security(("api_key" = []), ("bearer" = []))
)]
#[post("/v1/messages")]
pub async fn create_message(
    state: Data<AppState>,
    ApiJson(req): ApiJson<MessagesRequest>,
) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::invalid_with_code(
            Some("max_tokens".into()),
            "missing required parameter `max_tokens`",
            "missing_required_parameter",
        ));
    };
    let max_tokens = super::validate::max_tokens("max_tokens", Some(max_tokens), 1)?;
    let thinking = convert::thinking(&req, Some(max_tokens))?;
    let v = convert::sampling(&req, &state.config.limits, ready.client.spec().vocab_size)?;
    let (prompt, tools) = prompt(&state, ready, &req, thinking).await?;
    let (mut parse, tool_constraint) = reply_parsing(&state, ready, &tools, prompt.thinking);
    parse.reasoning |= thinking == Some(true);
    let constraint = one_constraint(&ready.client, None, tool_constraint)
        .await?
        .map(|c| after_reasoning(c, parse));
    let prompt_tokens = prompt.ids.len();
    let stops = v.stop.strings.clone();
    let stream = ready.client.submit(GenerateRequest {
        prompt_ids: prompt.ids,
        prompt_param: "messages",
        params: v.params,
        max_tokens: Some(max_tokens),
        stop: v.stop,
        n: 1,
        priority: 0,
        constraint,
    })?;
    let generated = MergedStream::new(vec![stream], 1, state.clone());
    let meta = ResponseMeta::new("msg", &ready.model_name);
    let meta = ResponseMeta {
        id: meta.id.replacen("msg-", "msg_", 1),
        ..meta
    };
    let tok = ready.tokenizer.clone();
    if req.stream.unwrap_or(false) {
        let writer = MessagesWriter::new(meta, prompt_tokens, parse, tok, stops);
        return Ok(sse::response(generated, writer, state.keep_alive()));
    }
    let (outputs, usage) = generation::collect(generated).await?;
    let out = outputs.into_iter().next().unwrap_or_default();
    let reason = out.finish.unwrap_or(FinishReason::Stop);
    let mut blocks = Assembler::default();
    let mut parser = ChoiceParser::new(parse);
    blocks.push(parser.push(&out.text));
    blocks.push(parser.finish_on(reason));
    blocks.close();
    let ids: Vec<u32> = out.tokens.iter().map(|t| t.id).collect();
    let full = tok.decode(&ids, true).unwrap_or_default();
    let (stop, sequence) = stop_reason(reason, blocks.calls(), &stops, &full);
    let mut reply = stream::message(&meta, stream::usage(usage));
    reply.content = blocks.blocks();
    reply.stop_reason = Some(stop);
    reply.stop_sequence = sequence;
    Ok(HttpResponse::Ok().json(reply))
}

/// Count the prompt tokens of a Messages request (`max_tokens` not needed).
#[utoipa::path(
    post,
    path = "/v1/messages/count_tokens",
    tag = "anthropic",
    request_body = MessagesRequest,
    params(
        ("anthropic-version" = Option<String>, Header, description = "Accepted; any version"),
    ),
    responses(
        (status = 200, description = "The prompt's token count, tools and system included", body = CountTokensResponse),
        (status = 400, description = "Invalid request", body = AnthropicErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = AnthropicErrorResponse),
        (status = 404, description = "Unknown model", body = AnthropicErrorResponse),
    ),
    security(("api_key" = []), ("bearer" = []))
)]
#[post("/v1/messages/count_tokens")]
pub async fn count_tokens(
    state: Data<AppState>,
    ApiJson(req): ApiJson<MessagesRequest>,
) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    let thinking = convert::thinking(&req, None)?;
    let (prompt, _) = prompt(&state, ready, &req, thinking).await?;
    Ok(HttpResponse::Ok().json(CountTokensResponse {
        input_tokens: prompt.ids.len(),
    }))
}
