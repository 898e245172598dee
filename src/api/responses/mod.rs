//! OpenAI's Responses API: `POST /v1/responses` (through the chat pipeline: template, tool
//! grammar and parsers, reasoning parser, `text.format` as a constraint), its typed stream
//! events, and the stored responses (`GET`, `input_items`, `DELETE`, `cancel`) kept in an
//! SQLite file ([`store`]) so `previous_response_id` survives a restart.

mod convert;
mod items;
mod run;
mod state;
pub mod store;
pub mod types;

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::{Data, Path, Query};
use actix_web::{HttpResponse, delete, get, post};
use serde::Deserialize;
use serde_json::json;

use super::chat::{prepared_constraint, render_prompt, reply_parsing};
use super::errors::ApiError;
use super::extract::ApiJson;
use super::generation::{self, MergedStream};
use super::state::{AppState, Ready};
use super::structured::{self, StructuredFields};
use super::types::{ErrorResponse, SamplingFields};
use super::{blocking, sse, validate};
use crate::engine::{FinishReason, GenerateRequest};
use crate::tokenizer::chat::{ChatMessage, TemplateTool};
use run::Run;
pub use state::{Responses, Running};
use store::Store;
use types::{InputItemList, Item, ResponseDeleted, ResponseObject, ResponsesRequest};

impl Responses {
    /// The store, opened (and checked) on the first call; 503 naming the file when it
    /// cannot be opened.
    async fn store(state: &Data<AppState>) -> Result<Arc<Store>, ApiError> {
        let s = state.clone();
        let opened = blocking(move || {
            let r = &s.responses;
            let result = r.store.get_or_init(|| {
                let path = r
                    .config
                    .resolved_store_path()
                    .ok_or("no `responses.store_path` and neither XDG_DATA_HOME nor HOME is set")?;
                Store::open(&path, &r.config)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            });
            Ok(result.clone())
        })
        .await?;
        opened.map_err(|message| {
            tracing::error!(%message, "the responses store cannot be opened");
            ApiError::Unavailable {
                message,
                code: "store_unavailable",
            }
        })
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound {
        what: "Response",
        id: id.to_string(),
        param: "response_id",
    }
}

/// The stored response `id`.
async fn stored(state: &Data<AppState>, id: &str) -> Result<store::Stored, ApiError> {
    let store = Responses::store(state).await?;
    let key = id.to_string();
    blocking(move || {
        store
            .get(&key)
            .map_err(|e| ApiError::Internal(e.to_string()))
    })
    .await?
    .ok_or_else(|| not_found(id))
}

/// The conversation before this request: the chain of `previous_response_id`, oldest first,
/// each response's input then output (at most `limits.max_messages` responses back).
async fn history(state: &Data<AppState>, previous: Option<&str>) -> Result<Vec<Item>, ApiError> {
    let mut chain = Vec::new();
    let mut next = previous.map(str::to_string);
    while let Some(id) = next {
        if chain.len() >= state.config.limits.max_messages {
            return Err(ApiError::invalid(
                "previous_response_id",
                "the chain of previous responses is too long",
            ));
        }
        let s = stored(state, &id).await.map_err(|e| match e {
            ApiError::NotFound { what, id, .. } => ApiError::NotFound {
                what,
                id,
                param: "previous_response_id",
            },
            e => e,
        })?;
        next = s.response.previous_response_id.clone();
        chain.push(s);
    }
    let mut items = Vec::new();
    for s in chain.into_iter().rev() {
        items.extend(s.input);
        items.extend(s.response.output);
    }
    Ok(items)
}

/// The response object before any output: the request's fields echoed.
fn shell(req: &ResponsesRequest, ready: &Ready, effort: Option<&str>) -> ResponseObject {
    let format = req
        .text
        .as_ref()
        .and_then(|t| t.get("format"))
        .filter(|f| !f.is_null())
        .cloned()
        .unwrap_or_else(|| json!({"type": "text"}));
    ResponseObject {
        id: convert::new_id("resp"),
        object: "response".into(),
        created_at: super::clock::unix_now(),
        status: "in_progress".into(),
        error: None,
        incomplete_details: None,
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        model: ready.model_name.clone(),
        output: Vec::new(),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        previous_response_id: req.previous_response_id.clone(),
        reasoning: json!({"effort": effort, "summary": null}),
        store: req.store.unwrap_or(true),
        temperature: req.temperature.unwrap_or(1.0),
        text: json!({"format": format}),
        tool_choice: req
            .tool_choice
            .clone()
            .filter(|c| !c.is_null())
            .unwrap_or_else(|| json!("auto")),
        tools: req.tools.clone().unwrap_or_default(),
        top_p: req.top_p.unwrap_or(1.0),
        truncation: "disabled".into(),
        background: false,
        usage: None,
        user: req.user.clone(),
        metadata: req
            .metadata
            .clone()
            .filter(|m| !m.is_null())
            .unwrap_or_else(|| json!({})),
    }
}

/// `reasoning.effort` is honoured where the chat template reads `reasoning_effort`.
fn check_effort(ready: &Ready, effort: Option<&str>, has_tools: bool) -> Result<(), ApiError> {
    match effort {
        Some(e)
            if !ready
                .template_for(has_tools)
                .source()
                .contains("reasoning_effort") =>
        {
            Err(ApiError::invalid(
                "reasoning.effort",
                format!(
                    "`reasoning.effort` {e:?} cannot be honoured: this model's chat template has no `reasoning_effort`"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// [`render_prompt`] with `reasoning_effort` set for the template.
async fn render_effort(
    ready: &Ready,
    msgs: Vec<ChatMessage>,
    tools: Vec<TemplateTool>,
    effort: String,
) -> Result<(Vec<u32>, bool), ApiError> {
    let template = ready.template_for(!tools.is_empty()).clone();
    let tok = ready.tokenizer.clone();
    let context = ready.client.max_model_len();
    blocking(move || {
        let text = template.render_effort(&msgs, &tools, true, &effort)?;
        let thinking = text.trim_end().ends_with("<think>");
        let ids = tok
            .encode_within(&text, false, context)
            .map_err(|e| ApiError::from_tokenizer("input", e))?;
        Ok((ids, thinking))
    })
    .await
}

/// The engine request of a Responses request, checked; with the run that will take its output.
async fn prepare(
    state: &Data<AppState>,
    ready: &Ready,
    req: &ResponsesRequest,
) -> Result<(GenerateRequest, Run), ApiError> {
    ready.check_model(req.model.as_deref())?;
    let limits = &state.config.limits;
    let effort = convert::reasoning_effort(req)?;
    let fields = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        ..SamplingFields::default()
    };
    let v = validate::sampling(&fields, limits, ready.client.spec().vocab_size, None)?;
    let max_tokens = match req.max_output_tokens {
        Some(m) => Some(validate::max_tokens("max_output_tokens", Some(m), 1)?),
        None => None,
    };
    let tools = convert::tools(req)?;
    check_effort(ready, effort.as_deref(), !tools.template_tools().is_empty())?;
    let format = StructuredFields {
        response_format: convert::response_format(req)?,
        ..StructuredFields::default()
    };
    let format = structured::parse(&format)
        .map_err(rename_format)?
        .map(|(c, _)| (c, "text.format"));
    let input = convert::input_items(req)?;
    if input.is_empty() && req.previous_response_id.is_none() {
        return Err(ApiError::invalid("input", "`input` must not be empty"));
    }
    let mut items = history(state, req.previous_response_id.as_deref()).await?;
    items.extend(input.iter().cloned());
    if items.len() > limits.max_messages {
        return Err(ApiError::invalid(
            "input",
            format!(
                "at most {} items per conversation, got {}",
                limits.max_messages,
                items.len()
            ),
        ));
    }
    let msgs = convert::messages(req.instructions.as_deref(), &items);
    let template_tools = tools.template_tools().to_vec();
    let (ids, thinking) = match effort.clone() {
        None => render_prompt(ready, msgs, template_tools, true).await?,
        Some(e) => render_effort(ready, msgs, template_tools, e).await?,
    };
    let (parse, tool_constraint) = reply_parsing(state, ready, &tools, thinking);
    let constraint = prepared_constraint(&ready.client, format, tool_constraint, parse)
        .await
        .map_err(rename_format)?;
    let shell = shell(req, ready, effort.as_deref());
    let store = match shell.store {
        true => Some(Responses::store(state).await?),
        false => None,
    };
    let prompt_tokens = ids.len();
    let gen_req = GenerateRequest {
        prompt_ids: ids,
        prompt_param: "input",
        params: v.params,
        max_tokens,
        stop: v.stop,
        n: 1,
        priority: 0,
        constraint,
    };
    let tok = ready.tokenizer.clone();
    let (run, _) = Run::start(
        state.clone(),
        shell,
        input,
        prompt_tokens,
        parse,
        tok,
        store,
    );
    Ok((gen_req, run))
}

/// A `response_format` error as the `text.format` error it is.
fn rename_format(e: ApiError) -> ApiError {
    match e {
        ApiError::InvalidRequest {
            param: Some(p),
            message,
            code,
        } if p.starts_with("response_format") => ApiError::InvalidRequest {
            param: Some(p.replacen("response_format", "text.format", 1)),
            message: message.replace("response_format", "text.format"),
            code,
        },
        e => e,
    }
}

/// Create a response (OpenAI's Responses API).
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response; with `stream: true` an SSE stream of `event: <type>` / `data: {...}` frames from `response.created` to `response.completed` (or `response.incomplete`)", body = ResponseObject),
        (status = 400, description = "Invalid request or an unsupported field (named in `param`)", body = ErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
        (status = 404, description = "Unknown model or `previous_response_id`", body = ErrorResponse),
        (status = 429, description = "Overloaded; see Retry-After", body = ErrorResponse),
        (status = 503, description = "Not ready, or the store cannot be opened", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[post("/v1/responses")]
pub async fn create_response(
    state: Data<AppState>,
    ApiJson(req): ApiJson<ResponsesRequest>,
) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    let (gen_req, mut run) = prepare(&state, ready, &req).await?;
    let cancel = state
        .responses
        .running
        .get(&run.shell.id)
        .map(|r| r.cancel.clone())
        .unwrap_or_default();
    let stream = ready.client.submit(gen_req)?;
    let generated = MergedStream::new(vec![stream], 1, state.clone()).with_cancel(cancel);
    if req.stream.unwrap_or(false) {
        let writer = run::ResponsesWriter::new(run);
        return Ok(sse::response(generated, writer, state.keep_alive()));
    }
    let (outputs, usage) = generation::collect(generated).await?;
    let out = outputs.into_iter().next().unwrap_or_default();
    run.push(&out.text);
    run.finish(out.finish.unwrap_or(FinishReason::Stop));
    Ok(HttpResponse::Ok().json(run.complete(usage)))
}

/// Get a stored response (or an in-flight one, `in_progress`).
#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}",
    tag = "openai",
    params(("response_id" = String, Path, description = "`resp_...`")),
    responses(
        (status = 200, description = "The response", body = ResponseObject),
        (status = 404, description = "No such response (never stored, deleted or expired)", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[get("/v1/responses/{response_id}")]
pub async fn get_response(
    state: Data<AppState>,
    id: Path<String>,
) -> Result<HttpResponse, ApiError> {
    if let Some(r) = state.responses.running.get(id.as_str()) {
        return Ok(HttpResponse::Ok().json(&r.snapshot));
    }
    Ok(HttpResponse::Ok().json(stored(&state, &id).await?.response))
}

/// Delete a stored response.
#[utoipa::path(
    delete,
    path = "/v1/responses/{response_id}",
    tag = "openai",
    params(("response_id" = String, Path, description = "`resp_...`")),
    responses(
        (status = 200, description = "Deleted", body = ResponseDeleted),
        (status = 404, description = "No such response", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[delete("/v1/responses/{response_id}")]
pub async fn delete_response(
    state: Data<AppState>,
    id: Path<String>,
) -> Result<HttpResponse, ApiError> {
    let store = Responses::store(&state).await?;
    let key = id.clone();
    let deleted = blocking(move || {
        store
            .delete(&key)
            .map_err(|e| ApiError::Internal(e.to_string()))
    })
    .await?;
    if !deleted {
        return Err(not_found(&id));
    }
    Ok(HttpResponse::Ok().json(ResponseDeleted {
        id: id.into_inner(),
        object: "response".into(),
        deleted: true,
    }))
}

/// Cancel an in-flight response: its engine request is aborted and it ends `cancelled`.
#[utoipa::path(
    post,
    path = "/v1/responses/{response_id}/cancel",
    tag = "openai",
    params(("response_id" = String, Path, description = "`resp_...`")),
    responses(
        (status = 200, description = "The response as it ended (`status: cancelled`)", body = ResponseObject),
        (status = 400, description = "The response is no longer in flight", body = ErrorResponse),
        (status = 404, description = "No such response", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[post("/v1/responses/{response_id}/cancel")]
pub async fn cancel_response(
    state: Data<AppState>,
    id: Path<String>,
) -> Result<HttpResponse, ApiError> {
    let running = state
        .responses
        .running
        .get(id.as_str())
        .map(|r| (r.cancel.clone(), r.done.clone(), r.snapshot.clone()));
    let Some((cancel, mut done, snapshot)) = running else {
        stored(&state, &id).await?;
        return Err(ApiError::invalid_with_code(
            Some("response_id".into()),
            "only an in-flight response can be cancelled",
            "response_not_cancellable",
        ));
    };
    cancel.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(30), done.wait_for(Option::is_some)).await;
    let r = match ended {
        Ok(Ok(r)) => r.clone().unwrap_or(snapshot),
        _ => ResponseObject {
            status: "cancelled".into(),
            ..snapshot
        },
    };
    Ok(HttpResponse::Ok().json(r))
}

/// `limit`, `order` and `after` of `input_items`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    /// 1 to 100 (default 20).
    pub limit: Option<usize>,
    /// `asc` or `desc` (default).
    pub order: Option<String>,
    /// List the items after this item id.
    pub after: Option<String>,
}

/// The input items of a stored response (its own, not those of the responses it continued).
#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}/input_items",
    tag = "openai",
    params(("response_id" = String, Path, description = "`resp_...`"), ListQuery),
    responses(
        (status = 200, description = "The items", body = InputItemList),
        (status = 400, description = "Bad `limit`, `order` or `after`", body = ErrorResponse),
        (status = 404, description = "No such response", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[get("/v1/responses/{response_id}/input_items")]
pub async fn input_items(
    state: Data<AppState>,
    id: Path<String>,
    q: Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid("limit", "`limit` is 1 to 100"));
    }
    let mut items = stored(&state, &id).await?.input;
    match q.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(_) => return Err(ApiError::invalid("order", "`order` is asc or desc")),
    }
    if let Some(after) = &q.after {
        let Some(at) = items.iter().position(|i| i.id() == after) else {
            return Err(ApiError::invalid(
                "after",
                "`after` names no item of this response",
            ));
        };
        items.drain(..=at);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    Ok(HttpResponse::Ok().json(InputItemList {
        object: "list".into(),
        first_id: items.first().map(|i| i.id().to_string()),
        last_id: items.last().map(|i| i.id().to_string()),
        data: items,
        has_more,
    }))
}
