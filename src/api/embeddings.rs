//! `POST /v1/embeddings`: inputs in, one L2-normalized pooled hidden state each out. Served
//! only with `--embeddings` (`model.embeddings`); each input is prefill-only work queued like
//! any request.

use actix_web::web::Data;
use actix_web::{HttpResponse, post};
use futures_util::future::join_all;

use super::blocking;
use super::errors::ApiError;
use super::extract::ApiJson;
use super::state::AppState;
use super::types::{
    EmbeddingData, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingVector,
    EncodingFormat, ErrorResponse, PromptInput,
};
use crate::engine::{EmbedRequest, normalize};
use crate::tokenizer::Tokenizer;

/// An input as sent: text to tokenize or ids to use as they are.
enum Input {
    Text(String),
    Ids(Vec<u32>),
}

/// The inputs of `input`, each non-empty, at most `max` of them.
fn inputs(input: PromptInput, max: usize) -> Result<Vec<Input>, ApiError> {
    let list = match input {
        PromptInput::Text(t) => vec![Input::Text(t)],
        PromptInput::Texts(v) => v.into_iter().map(Input::Text).collect(),
        PromptInput::Tokens(ids) => vec![Input::Ids(ids)],
        PromptInput::TokenLists(v) => v.into_iter().map(Input::Ids).collect(),
    };
    if list.is_empty() {
        return Err(ApiError::invalid("input", "`input` must not be empty"));
    }
    if list.len() > max {
        return Err(ApiError::invalid(
            "input",
            format!("at most {max} inputs per request, got {}", list.len()),
        ));
    }
    let empty = |i: &Input| match i {
        Input::Text(t) => t.is_empty(),
        Input::Ids(ids) => ids.is_empty(),
    };
    if let Some(i) = list.iter().position(empty) {
        return Err(ApiError::invalid(
            format!("input[{i}]"),
            "inputs must not be empty",
        ));
    }
    Ok(list)
}

/// Tokenizes text inputs as the model's tokenizer does by default, each within `context`
/// tokens: BOS as the model wants, and the EOS its tokenizer appends where it appends one
/// (Qwen3-Embedding's `<|endoftext|>`, unless the text already ends with it). Id inputs are
/// used as they are.
fn encode(tok: &Tokenizer, inputs: Vec<Input>, context: usize) -> Result<Vec<Vec<u32>>, ApiError> {
    let eos = tok.eos_appended();
    let room = context.saturating_sub(usize::from(eos.is_some()));
    inputs
        .into_iter()
        .map(|i| match i {
            Input::Text(t) => {
                let mut ids = tok
                    .encode_within(&t, tok.add_bos_default(), room)
                    .map_err(|e| ApiError::from_tokenizer("input", e))?;
                if let Some(eos) = eos.filter(|&e| ids.last() != Some(&e)) {
                    ids.push(eos);
                }
                Ok(ids)
            }
            Input::Ids(ids) => Ok(ids),
        })
        .collect()
}

/// The standard base64 alphabet.
const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (c.get(1).copied().unwrap_or(0) as u32) << 8
            | c.get(2).copied().unwrap_or(0) as u32;
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            match k <= c.len() {
                true => out.push(B64[(n >> shift & 63) as usize] as char),
                false => out.push('='),
            }
        }
    }
    out
}

/// The vector as sent: its first `dims` values (all without), L2-normalized, in `format`.
fn encoded(mut v: Vec<f32>, dims: Option<usize>, format: EncodingFormat) -> EmbeddingVector {
    if let Some(d) = dims {
        v.truncate(d);
    }
    normalize(&mut v);
    match format {
        EncodingFormat::Float => EmbeddingVector::Float(v),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            EmbeddingVector::Base64(base64(&bytes))
        }
    }
}

/// `dimensions`, checked against the model's hidden size.
fn dimensions(d: Option<u64>, hidden: usize) -> Result<Option<usize>, ApiError> {
    match d {
        None => Ok(None),
        Some(0) => Err(ApiError::invalid(
            "dimensions",
            "`dimensions` must be at least 1",
        )),
        Some(d) if d > hidden as u64 => Err(ApiError::invalid(
            "dimensions",
            format!("`dimensions` {d} is larger than the model's embedding size {hidden}"),
        )),
        Some(d) => Ok(Some(d as usize)),
    }
}

/// Create embeddings (OpenAI-compatible).
#[utoipa::path(
    tag = "openai",
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "One embedding per input, in input order", body = EmbeddingResponse),
        (status = 400, description = "Invalid request, or embeddings not enabled (`--embeddings`)", body = ErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 413, description = "Body too large", body = ErrorResponse),
        (status = 429, description = "Overloaded; see Retry-After", body = ErrorResponse),
        (status = 503, description = "Not ready", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[post("/v1/embeddings")]
pub async fn embeddings(
    state: Data<AppState>,
    ApiJson(req): ApiJson<EmbeddingRequest>,
) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    if !state.config.model.embeddings {
        return Err(ApiError::invalid_with_code(
            None,
            "this server does not serve embeddings: start it with `--embeddings` \
             (config key `model.embeddings`, KILN_EMBEDDINGS=1)",
            "embeddings_disabled",
        ));
    }
    ready.check_model(req.model.as_deref())?;
    let dims = dimensions(req.dimensions, ready.client.spec().hidden)?;
    let format = req.encoding_format.unwrap_or_default();
    let list = inputs(req.input, state.config.limits.max_embedding_inputs)?;
    let (tok, context) = (ready.tokenizer.clone(), ready.client.max_model_len());
    let prompts = blocking(move || encode(&tok, list, context)).await?;
    // Every input is checked before any is queued.
    let valid = prompts
        .into_iter()
        .map(|prompt_ids| {
            ready.client.validate_embed(EmbedRequest {
                prompt_ids,
                prompt_param: "input",
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let handles = valid
        .into_iter()
        .map(|v| ready.client.submit_embed(v))
        .collect::<Result<Vec<_>, _>>()?;
    let mut data = Vec::with_capacity(handles.len());
    let mut prompt_tokens = 0;
    for (index, r) in join_all(handles.into_iter().map(|h| h.wait()))
        .await
        .into_iter()
        .enumerate()
    {
        let e = r?;
        prompt_tokens += e.prompt_tokens;
        data.push(EmbeddingData {
            object: "embedding".into(),
            index,
            embedding: encoded(e.vector, dims, format),
        });
    }
    Ok(HttpResponse::Ok().json(EmbeddingResponse {
        object: "list".into(),
        data,
        model: ready.model_name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        for (raw, b64) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), b64, "{raw}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn truncated_vectors_are_renormalized() {
        let EmbeddingVector::Float(v) =
            encoded(vec![3.0, 4.0, 12.0], Some(2), EncodingFormat::Float)
        else {
            panic!("float asked");
        };
        assert_eq!(v, vec![0.6, 0.8]);
        assert!(dimensions(Some(4), 3).is_err() && dimensions(Some(0), 3).is_err());
        assert_eq!(dimensions(Some(3), 3).unwrap(), Some(3));
    }
}
