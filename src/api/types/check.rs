//! Field combinations OpenAI refuses, checked as the body is read (before any handler runs).

use super::{ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest};
use crate::api::errors::ApiError;

/// A request body's own consistency: fields that are each well-typed but make no sense together.
pub trait CheckRequest {
    /// A 400 naming the field at fault, or `Ok`.
    fn check(&self) -> Result<(), ApiError> {
        Ok(())
    }
}

/// `stream_options` only with `stream: true`, as OpenAI and vLLM require.
fn stream_options_need_stream(stream: Option<bool>, has_options: bool) -> Result<(), ApiError> {
    if has_options && stream != Some(true) {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed when `stream` is true",
        ));
    }
    Ok(())
}

impl CheckRequest for CompletionRequest {
    /// `stream_options` needs `stream: true`; `best_of` is not implemented, so only values
    /// that ask for nothing beyond `n` (1, or `n` itself) are accepted, never ignored;
    /// neither is vLLM's `prompt_logprobs` (`echo` with `logprobs` gives prompt logprobs).
    fn check(&self) -> Result<(), ApiError> {
        stream_options_need_stream(self.stream, self.stream_options.is_some())?;
        if self.prompt_logprobs.is_some() {
            return Err(ApiError::invalid(
                "prompt_logprobs",
                "`prompt_logprobs` is not supported: set `echo` to true with `logprobs` to get \
                 the prompt's logprobs",
            ));
        }
        let n = self.n.unwrap_or(1);
        match self.best_of {
            None => Ok(()),
            Some(b) if b == 1 || b == n => Ok(()),
            Some(b) => Err(ApiError::invalid(
                "best_of",
                format!(
                    "`best_of` {b} is not supported: Kiln does not rank extra candidates; \
                     omit it or set it to `n` ({n})"
                ),
            )),
        }
    }
}

impl CheckRequest for ChatCompletionRequest {
    /// `stream_options` needs `stream: true`; `tool_choice` needs `tools`.
    fn check(&self) -> Result<(), ApiError> {
        stream_options_need_stream(self.stream, self.stream_options.is_some())?;
        let has_tools = self.tools.as_ref().is_some_and(|t| !t.is_empty());
        if self.tool_choice.is_some() && !has_tools {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` is only allowed when `tools` are given",
            ));
        }
        Ok(())
    }
}

impl CheckRequest for TokenizeRequest {}

impl CheckRequest for DetokenizeRequest {}
