//! Wire request fields -> the engine's validated request parts, with 400s naming the field.

use super::errors::ApiError;
use super::types::SamplingFields;
use crate::config::LimitsConfig;
use crate::engine::StopCriteria;
use crate::sampling::SamplingParams;

/// Sampling and stopping, validated.
#[derive(Debug, Clone)]
pub struct Validated {
    pub params: SamplingParams,
    pub stop: StopCriteria,
    pub n: usize,
}

fn range(param: &str, v: Option<f32>, lo: f32, hi: f32, default: f32) -> Result<f32, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
        Some(x) => Err(ApiError::invalid(
            param,
            format!("`{param}` must be between {lo} and {hi}, got {x}"),
        )),
    }
}

/// Checks every sampling field against OpenAI's ranges and the configured caps.
/// `logprobs` is the number of alternatives asked for (already capped by the caller).
pub fn sampling(
    f: &SamplingFields<'_>,
    limits: &LimitsConfig,
    vocab_size: usize,
    logprobs: Option<usize>,
) -> Result<Validated, ApiError> {
    let temperature = range("temperature", f.temperature, 0.0, 2.0, 1.0)?;
    let top_p = range("top_p", f.top_p, 0.0, 1.0, 1.0)?;
    if top_p <= 0.0 {
        return Err(ApiError::invalid("top_p", "`top_p` must be in (0, 1]"));
    }
    let top_k = match f.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX).min(vocab_size),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("`top_k` must be -1 (off) or positive, got {k}"),
            ));
        }
    };
    let min_p = range("min_p", f.min_p, 0.0, 1.0, 0.0)?;
    let presence_penalty = range("presence_penalty", f.presence_penalty, -2.0, 2.0, 0.0)?;
    let frequency_penalty = range("frequency_penalty", f.frequency_penalty, -2.0, 2.0, 0.0)?;
    let repetition_penalty = range("repetition_penalty", f.repetition_penalty, 0.0, 10.0, 1.0)?;
    if repetition_penalty <= 0.0 {
        return Err(ApiError::invalid(
            "repetition_penalty",
            "`repetition_penalty` must be positive",
        ));
    }
    let n = match f.n {
        None => 1,
        Some(n) if n >= 1 && n as usize <= limits.max_n => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "n",
                format!("`n` must be between 1 and {}, got {n}", limits.max_n),
            ));
        }
    };
    let params = SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        presence_penalty,
        frequency_penalty,
        logit_bias: logit_bias(f, limits, vocab_size)?,
        seed: f.seed.map(|s| s as u64),
        logprobs,
        prompt_logprobs: None,
    };
    Ok(Validated {
        params,
        stop: stop(f, limits, vocab_size)?,
        n,
    })
}

fn logit_bias(
    f: &SamplingFields<'_>,
    limits: &LimitsConfig,
    vocab_size: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = f.logit_bias else {
        return Ok(Vec::new());
    };
    if map.len() > limits.max_logit_bias {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "`logit_bias` has {} entries; at most {} are allowed",
                map.len(),
                limits.max_logit_bias
            ),
        ));
    }
    let mut out = Vec::with_capacity(map.len());
    for (k, &v) in map {
        let id: u32 = k.trim().parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` key {k:?} is not a token id"),
            )
        })?;
        if id as usize >= vocab_size {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` token id {id} is outside the vocabulary (size {vocab_size})"),
            ));
        }
        if !(v.is_finite() && (-100.0..=100.0).contains(&v)) {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` values must be in [-100, 100], got {v}"),
            ));
        }
        out.push((id, v));
    }
    out.sort_by_key(|&(id, _)| id);
    Ok(out)
}

fn stop(
    f: &SamplingFields<'_>,
    limits: &LimitsConfig,
    vocab_size: usize,
) -> Result<StopCriteria, ApiError> {
    let strings = f.stop.map(|s| s.to_vec()).unwrap_or_default();
    if strings.len() > limits.max_stop {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "`stop` has {} entries; at most {} are allowed",
                strings.len(),
                limits.max_stop
            ),
        ));
    }
    if let Some(s) = strings
        .iter()
        .find(|s| s.is_empty() || s.len() > limits.max_stop_len)
    {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "stop strings must be 1 to {} bytes long, got {}",
                limits.max_stop_len,
                s.len()
            ),
        ));
    }
    let token_ids = f.stop_token_ids.map(<[u32]>::to_vec).unwrap_or_default();
    if token_ids.len() > limits.max_stop.max(64) {
        return Err(ApiError::invalid(
            "stop_token_ids",
            "too many `stop_token_ids`",
        ));
    }
    if let Some(t) = token_ids.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!("token id {t} is outside the vocabulary (size {vocab_size})"),
        ));
    }
    Ok(StopCriteria {
        token_ids,
        strings,
        ignore_eos: f.ignore_eos.unwrap_or(false),
    })
}

/// `max_tokens`-like fields: at least 1; absent means `default`.
pub fn max_tokens(param: &str, v: Option<u64>, default: usize) -> Result<usize, ApiError> {
    match v {
        None => Ok(default),
        Some(0) => Err(ApiError::invalid(
            param,
            format!("`{param}` must be at least 1"),
        )),
        Some(m) => Ok(usize::try_from(m).unwrap_or(usize::MAX)),
    }
}

/// `logprobs`/`top_logprobs` capped by the configured maximum.
pub fn logprobs_count(param: &str, v: u32, limits: &LimitsConfig) -> Result<usize, ApiError> {
    if v as usize > limits.max_logprobs {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be at most {}, got {v}", limits.max_logprobs),
        ));
    }
    Ok(v as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::types::StopSpec;
    use std::collections::HashMap;

    fn param_of(r: Result<Validated, ApiError>) -> String {
        r.unwrap_err().body().error.param.unwrap_or_default()
    }

    #[test]
    fn ranges_and_caps() {
        let l = LimitsConfig::default();
        let ok = sampling(&SamplingFields::default(), &l, 512, None).unwrap();
        assert_eq!((ok.params.temperature, ok.n), (1.0, 1));
        let f = |g: fn(&mut SamplingFields<'static>)| {
            let mut s = SamplingFields::default();
            g(&mut s);
            sampling(&s, &l, 512, None)
        };
        assert_eq!(param_of(f(|s| s.temperature = Some(-1.0))), "temperature");
        assert_eq!(param_of(f(|s| s.top_p = Some(0.0))), "top_p");
        assert_eq!(param_of(f(|s| s.top_k = Some(-5))), "top_k");
        assert_eq!(param_of(f(|s| s.n = Some(0))), "n");
        assert_eq!(param_of(f(|s| s.n = Some(10_000))), "n");
        assert_eq!(
            param_of(f(|s| s.stop_token_ids = Some(&[9999]))),
            "stop_token_ids"
        );
        assert!(f(|s| s.top_k = Some(-1)).is_ok());
    }

    #[test]
    fn stop_and_bias() {
        let l = LimitsConfig::default();
        let many = StopSpec::Many(vec!["x".into(); 100]);
        let s = SamplingFields {
            stop: Some(&many),
            ..Default::default()
        };
        assert_eq!(param_of(sampling(&s, &l, 512, None)), "stop");
        let empty = StopSpec::One(String::new());
        let s = SamplingFields {
            stop: Some(&empty),
            ..Default::default()
        };
        assert_eq!(param_of(sampling(&s, &l, 512, None)), "stop");
        let bias: HashMap<String, f32> = [("600".to_string(), 1.0)].into();
        let s = SamplingFields {
            logit_bias: Some(&bias),
            ..Default::default()
        };
        assert_eq!(param_of(sampling(&s, &l, 512, None)), "logit_bias");
        let bias: HashMap<String, f32> = [("5".to_string(), 50.0)].into();
        let s = SamplingFields {
            logit_bias: Some(&bias),
            ..Default::default()
        };
        assert_eq!(
            sampling(&s, &l, 512, None).unwrap().params.logit_bias,
            vec![(5, 50.0)]
        );
    }
}
