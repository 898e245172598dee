//! `POST /tokenize` and `POST /detokenize`, run on the blocking pool.

use actix_web::web::Data;
use actix_web::{HttpResponse, post};

use super::blocking;
use super::chat::{messages, prompt_ids};
use super::errors::ApiError;
use super::extract::ApiJson;
use super::state::AppState;
use super::types::{
    DetokenizeRequest, DetokenizeResponse, ErrorResponse, TokenizeRequest, TokenizeResponse,
};

/// Token ids of a prompt, or of chat messages rendered with the chat template.
#[utoipa::path(
    post,
    path = "/tokenize",
    tag = "kiln",
    request_body = TokenizeRequest,
    responses(
        (status = 200, description = "Token ids", body = TokenizeResponse),
        (status = 400, description = "Invalid request", body = ErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[post("/tokenize")]
pub async fn tokenize(
    state: Data<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    ready.check_model(req.model.as_deref())?;
    let tokens = match (req.prompt, req.messages) {
        (Some(prompt), None) => {
            let tok = ready.tokenizer.clone();
            let context = ready.client.max_model_len();
            let bos = req
                .add_special_tokens
                .unwrap_or_else(|| tok.add_bos_default());
            blocking(move || {
                tok.encode_within(&prompt, bos, context)
                    .map_err(|e| ApiError::from_tokenizer("prompt", e))
            })
            .await?
        }
        (None, Some(msgs)) => {
            let msgs = messages(&msgs, &state.config.limits)?;
            prompt_ids(ready, msgs, req.add_generation_prompt.unwrap_or(true)).await?
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give exactly one of `prompt` and `messages`",
            ));
        }
    };
    Ok(HttpResponse::Ok().json(TokenizeResponse {
        count: tokens.len(),
        tokens,
        max_model_len: ready.client.max_model_len(),
    }))
}

/// The text of token ids (special tokens included).
#[utoipa::path(
    post,
    path = "/detokenize",
    tag = "kiln",
    request_body = DetokenizeRequest,
    responses(
        (status = 200, description = "The text", body = DetokenizeResponse),
        (status = 400, description = "Invalid request (e.g. ids outside the vocabulary)", body = ErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[post("/detokenize")]
pub async fn detokenize(
    state: Data<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    ready.check_model(req.model.as_deref())?;
    let tok = ready.tokenizer.clone();
    let tokens = req.tokens;
    let prompt = blocking(move || {
        tok.decode(&tokens, false)
            .map_err(|e| ApiError::from_tokenizer("tokens", e))
    })
    .await?;
    Ok(HttpResponse::Ok().json(DetokenizeResponse { prompt }))
}
