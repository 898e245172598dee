//! `POST /v1/embeddings` request and response shapes (openai-python's
//! `types/embedding_create_params.py` and `create_embedding_response.py`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{CheckRequest, PromptInput};
use crate::api::errors::ApiError;

/// How the vectors are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    /// JSON numbers.
    #[default]
    Float,
    /// The vector's little-endian f32 bytes in base64 (what the openai SDK asks for by
    /// default, and decodes itself).
    Base64,
}

/// An embeddings request. A field Kiln does not know is a 400 naming it.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    /// The served model name (optional: the only model is used).
    #[serde(default)]
    pub model: Option<String>,
    /// Text, texts, token ids, or lists of token ids: one embedding per text or id list.
    pub input: PromptInput,
    /// `float` (default) or `base64`.
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    /// Keep the first `dimensions` values of each vector, renormalized (at most the
    /// model's hidden size).
    #[serde(default)]
    pub dimensions: Option<u64>,
    /// Accepted and ignored.
    #[serde(default)]
    pub user: Option<String>,
    /// Every other field, refused by name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

impl CheckRequest for EmbeddingRequest {
    /// A field outside OpenAI's embeddings parameters is a 400 naming it (never ignored).
    fn check(&self) -> Result<(), ApiError> {
        match self.unknown.keys().next() {
            Some(k) => Err(ApiError::invalid_with_code(
                Some(k.clone()),
                format!(
                    "unknown parameter `{k}` (embeddings take `input`, `model`, \
                     `encoding_format`, `dimensions` and `user`)"
                ),
                "unknown_parameter",
            )),
            None => Ok(()),
        }
    }
}

/// One vector as sent: numbers, or base64 of its little-endian f32 bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

/// One input's embedding.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingData {
    /// Always `embedding`.
    pub object: String,
    /// The input's index in `input`.
    pub index: usize,
    /// L2-normalized.
    pub embedding: EmbeddingVector,
}

/// Token counts of an embeddings response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// `POST /v1/embeddings`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingResponse {
    /// Always `list`.
    pub object: String,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: EmbeddingUsage,
}
