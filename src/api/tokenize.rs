//! `POST /tokenize` and `POST /detokenize`, run on the blocking pool, and vLLM's
//! `GET /tokenizer_info` (what lm-eval's remote tokenizer reads).

use actix_web::web::Data;
use actix_web::{HttpResponse, get, post};

use super::blocking;
use super::chat::{messages, prompt_ids};
use super::errors::ApiError;
use super::extract::ApiJson;
use super::state::AppState;
use super::types::{
    DetokenizeRequest, DetokenizeResponse, ErrorResponse, TokenizeRequest, TokenizeResponse,
    TokenizerInfo,
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

/// The tokenizer's configuration as vLLM's `/tokenizer_info` gives it (the keys of a
/// `tokenizer_config.json`): its special tokens, whether BOS is added, the context and the chat
/// template chat requests are rendered with.
#[utoipa::path(
    get,
    path = "/tokenizer_info",
    tag = "kiln",
    responses(
        (status = 200, description = "The tokenizer's configuration", body = TokenizerInfo),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
        (status = 503, description = "Not ready", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[get("/tokenizer_info")]
pub async fn tokenizer_info(state: Data<AppState>) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    let tok = &ready.tokenizer;
    let piece = |id: Option<u32>| id.and_then(|id| tok.id_to_piece(id));
    let eos_id = tok.eos_ids().first().copied();
    let hf = tok.hf();
    let pad = hf.get_padding().map(|p| p.pad_token.clone());
    Ok(HttpResponse::Ok().json(TokenizerInfo {
        tokenizer_class: "PreTrainedTokenizerFast".into(),
        bos_token: piece(tok.bos_id()),
        bos_token_id: tok.bos_id(),
        eos_token: piece(eos_id),
        eos_token_id: eos_id,
        pad_token_id: pad.as_deref().and_then(|p| tok.token_to_id(p)),
        pad_token: pad,
        unk_token: unk_token(hf.get_model()),
        add_bos_token: tok.add_bos_default(),
        add_eos_token: false,
        model_max_length: ready.client.max_model_len(),
        vocab_size: tok.vocab_size(),
        chat_template: ready.template.source().to_string(),
    }))
}

/// The unknown token of the vocabulary's model, if it has one.
fn unk_token(model: &tokenizers::ModelWrapper) -> Option<String> {
    use tokenizers::ModelWrapper as M;
    match model {
        M::BPE(m) => m.unk_token.clone(),
        M::WordPiece(m) => Some(m.unk_token.clone()),
        M::WordLevel(m) => Some(m.unk_token.clone()),
        M::Unigram(_) => None,
    }
}
