//! Sampling parameters and the CPU sampler (the reference the GPU sampler is checked against).

use std::collections::BTreeMap;

use rand::{RngExt, SeedableRng};

/// How to pick the next token. Neutral values disable each stage.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means off.
    pub top_k: usize,
    /// 1 means off.
    pub top_p: f32,
    /// 0 means off.
    pub min_p: f32,
    /// 1 means off; applied to tokens of the prompt and the output (vLLM semantics).
    pub repetition_penalty: f32,
    /// Subtracted once from every token already in the output.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output.
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens.
    pub logit_bias: Vec<(u32, f32)>,
    /// Same seed, same output.
    pub seed: Option<u64>,
    /// Number of top alternatives to report with each token (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// Number of top alternatives to report with each prompt token after the first, whose
    /// log-probability given the tokens before it is reported too (`None`: none).
    pub prompt_logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            logprobs: None,
            prompt_logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }
    /// True when the choice does not depend on random numbers.
    pub fn is_greedy(&self) -> bool {
        self.temperature < 1e-5 || self.top_k == 1
    }
    /// True when repetition, presence or frequency penalties are on.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// The uniform number in [0, 1) used for step `step` of a request seeded with `seed`.
/// Counter-based, so the draw does not depend on batching or on other requests.
pub fn uniform(seed: u64, step: u64) -> f32 {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(step);
    rng.random::<f32>()
}

/// The token counts behind one sequence's repetition, presence and frequency penalties,
/// kept up to date one token at a time (never rebuilt from the whole history).
/// Empty, and never updated, when the sequence's parameters turn no penalty on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Penalties {
    /// Every token of the prompt and the output -> its count in the output (0: prompt only).
    counts: BTreeMap<u32, u32>,
    on: bool,
}

static NO_PENALTIES: Penalties = Penalties {
    counts: BTreeMap::new(),
    on: false,
};

impl Penalties {
    /// The state of a sequence with `prompt` and no output yet.
    pub fn new(params: &SamplingParams, prompt: &[u32]) -> Self {
        let mut p = Self {
            counts: BTreeMap::new(),
            on: params.has_penalties(),
        };
        if p.on {
            for &t in prompt {
                p.counts.entry(t).or_insert(0);
            }
        }
        p
    }

    /// The state after `output` was generated from `prompt`.
    pub fn from_history(params: &SamplingParams, prompt: &[u32], output: &[u32]) -> Self {
        let mut p = Self::new(params, prompt);
        for &t in output {
            p.push(t);
        }
        p
    }

    /// No penalties (for rows whose parameters turn none on).
    pub fn none() -> &'static Penalties {
        &NO_PENALTIES
    }

    /// Records one generated token.
    pub fn push(&mut self, token: u32) {
        if self.on {
            *self.counts.entry(token).or_insert(0) += 1;
        }
    }

    /// Each distinct token of the history with its count in the output, in token order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.counts.iter().map(|(&t, &c)| (t, c))
    }
}

/// One logits row to sample from.
#[derive(Debug, Clone, Copy)]
pub struct SampleRow<'a> {
    pub params: &'a SamplingParams,
    /// This step's uniform draw (see [`uniform`]).
    pub uniform: f32,
    /// The sequence's history as the penalties need it.
    pub penalties: &'a Penalties,
    /// Tokens allowed next (constrained decoding): bit `t % 32` of word `t / 32` is set
    /// for an allowed token `t`; `None`: every token.
    pub mask: Option<&'a [u32]>,
    /// A prompt position: the row is not sampled, this token (the next prompt token) is
    /// its result, with its log-probability and the top alternatives under the raw logits
    /// (temperature 1, no bias or penalty: vLLM's prompt logprobs). Penalties, bias, mask
    /// and temperature of the row are ignored.
    pub forced: Option<u32>,
}

impl<'a> SampleRow<'a> {
    /// The row of a prompt position whose next prompt token is `token`, reporting `top`
    /// alternatives (`params` says how many: `logprobs`).
    pub fn forced(params: &'a SamplingParams, token: u32) -> Self {
        Self {
            params,
            uniform: 0.0,
            penalties: Penalties::none(),
            mask: None,
            forced: Some(token),
        }
    }
}

/// Whether `mask` allows token `t` (ids past the mask are not allowed).
pub fn mask_allows(mask: &[u32], t: usize) -> bool {
    mask.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1)
}

/// The chosen token, its log-probability under the raw model distribution, and the top
/// alternatives when asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Reusable scratch for sampling on the CPU.
#[derive(Debug, Default)]
pub struct CpuSampler {
    work: Vec<f32>,
    cand: Vec<(u32, f32)>,
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// `log(sum(exp(x)))`, stable.
fn log_sum_exp(x: &[f32]) -> f32 {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    m + x.iter().map(|&v| (v - m).exp()).sum::<f32>().ln()
}

impl CpuSampler {
    /// Samples one token from `logits` (length = vocab).
    pub fn sample(&mut self, logits: &[f32], row: &SampleRow<'_>) -> Sampled {
        let p = row.params;
        let lse = log_sum_exp(logits);
        let top = match p.logprobs {
            Some(n) if n > 0 => top_n(logits, n)
                .into_iter()
                .map(|(i, v)| (i, v - lse))
                .collect(),
            _ => Vec::new(),
        };
        if let Some(t) = row.forced {
            let logprob = logits
                .get(t as usize)
                .map_or(f32::NEG_INFINITY, |&v| v - lse);
            return Sampled {
                token: t,
                logprob,
                top,
            };
        }
        self.work.clear();
        self.work.extend_from_slice(logits);
        apply_bias_and_penalties(&mut self.work, row);
        if let Some(mask) = row.mask {
            for (t, v) in self.work.iter_mut().enumerate() {
                if !mask_allows(mask, t) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        let token = if p.is_greedy() {
            argmax(&self.work)
        } else {
            self.draw(row)
        };
        Sampled {
            token,
            logprob: logits[token as usize] - lse,
            top,
        }
    }

    fn draw(&mut self, row: &SampleRow<'_>) -> u32 {
        let p = row.params;
        let inv_t = 1.0 / p.temperature;
        self.cand.clear();
        self.cand.extend(
            self.work
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as u32, v * inv_t)),
        );
        let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(p.top_k - 1, desc);
            self.cand.truncate(p.top_k);
        }
        self.cand.sort_unstable_by(desc);
        let max = self.cand[0].1;
        let mut total = 0.0f64;
        for c in self.cand.iter_mut() {
            c.1 = (c.1 - max).exp();
            total += c.1 as f64;
        }
        let mut keep = self.cand.len();
        if p.min_p > 0.0 {
            let floor = p.min_p * self.cand[0].1;
            keep = self.cand.iter().take_while(|c| c.1 >= floor).count().max(1);
        }
        if p.top_p < 1.0 {
            let mut cum = 0.0f64;
            for (i, c) in self.cand[..keep].iter().enumerate() {
                cum += c.1 as f64 / total;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        let kept: f64 = self.cand[..keep].iter().map(|c| c.1 as f64).sum();
        let target = row.uniform as f64 * kept;
        let mut cum = 0.0f64;
        for c in &self.cand[..keep] {
            cum += c.1 as f64;
            if target < cum {
                return c.0;
            }
        }
        self.cand[keep - 1].0
    }
}

fn apply_bias_and_penalties(x: &mut [f32], row: &SampleRow<'_>) {
    let p = row.params;
    for &(id, b) in &p.logit_bias {
        if let Some(v) = x.get_mut(id as usize) {
            *v += b;
        }
    }
    if !p.has_penalties() {
        return;
    }
    // Per token: repetition (prompt and output), then presence/frequency (output only), as
    // vLLM composes them; each token's value depends on no other token.
    let (rep, sub_on) = (
        p.repetition_penalty,
        p.presence_penalty != 0.0 || p.frequency_penalty != 0.0,
    );
    for (t, count) in row.penalties.iter() {
        let Some(v) = x.get_mut(t as usize) else {
            continue;
        };
        if rep != 1.0 {
            *v = if *v > 0.0 { *v / rep } else { *v * rep };
        }
        if sub_on && count > 0 {
            *v -= p.presence_penalty + p.frequency_penalty * count as f32;
        }
    }
}

/// The `n` largest values with their indices, largest first (ties: lower id first).
pub fn top_n(x: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut v: Vec<(u32, f32)> = x.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
    let n = n.min(v.len());
    let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if n < v.len() {
        v.select_nth_unstable_by(n, desc);
        v.truncate(n);
    }
    v.sort_unstable_by(desc);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(p: &'a SamplingParams, u: f32, out: &[u32]) -> SampleRow<'a> {
        // Leaked: a few bytes per test row, so rows can borrow it like a sequence's state.
        let pen = Box::leak(Box::new(Penalties::from_history(p, &[], out)));
        SampleRow {
            params: p,
            uniform: u,
            penalties: pen,
            mask: None,
            forced: None,
        }
    }

    #[test]
    fn greedy_picks_argmax_and_reports_logprob() {
        let mut s = CpuSampler::default();
        let logits = [0.0, 3.0, 1.0, 3.0 - 1e-3];
        let p = SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::greedy()
        };
        let r = s.sample(&logits, &row(&p, 0.5, &[]));
        assert_eq!(r.token, 1);
        let lse = log_sum_exp(&logits);
        assert!((r.logprob - (3.0 - lse)).abs() < 1e-6);
        assert_eq!(r.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3]);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let mut s = CpuSampler::default();
        let logits = [1.0, 2.0, 0.5, 1.9];
        for p in [
            SamplingParams {
                top_k: 1,
                ..Default::default()
            },
            SamplingParams {
                top_p: 1e-6,
                ..Default::default()
            },
            SamplingParams {
                min_p: 0.99,
                ..Default::default()
            },
        ] {
            for u in [0.0, 0.3, 0.999] {
                assert_eq!(s.sample(&logits, &row(&p, u, &[])).token, 1, "{p:?}");
            }
        }
    }

    #[test]
    fn draws_follow_the_distribution() {
        let mut s = CpuSampler::default();
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let p = SamplingParams::default();
        let mut counts = [0usize; 3];
        let n = 4000;
        for i in 0..n {
            let u = uniform(7, i);
            counts[s.sample(&logits, &row(&p, u, &[])).token as usize] += 1;
        }
        assert_eq!(counts[2], 0);
        let frac = counts[1] as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.03, "{frac}");
    }

    #[test]
    fn penalties_and_bias_change_the_choice() {
        let mut s = CpuSampler::default();
        let logits = [1.0, 2.0, 1.5];
        let p = SamplingParams {
            frequency_penalty: 0.3,
            ..SamplingParams::greedy()
        };
        assert_eq!(s.sample(&logits, &row(&p, 0.0, &[1, 1])).token, 2);
        let p = SamplingParams {
            presence_penalty: 0.3,
            ..SamplingParams::greedy()
        };
        assert_eq!(s.sample(&logits, &row(&p, 0.0, &[1, 1])).token, 1);
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        assert_eq!(s.sample(&logits, &row(&p, 0.0, &[1])).token, 2);
        let p = SamplingParams {
            logit_bias: vec![(0, 5.0)],
            ..SamplingParams::greedy()
        };
        assert_eq!(s.sample(&logits, &row(&p, 0.0, &[])).token, 0);
    }

    #[test]
    fn penalties_kept_per_token_equal_those_from_the_history() {
        let p = SamplingParams {
            repetition_penalty: 1.3,
            frequency_penalty: 0.2,
            ..SamplingParams::greedy()
        };
        let (prompt, out) = ([5u32, 7, 5], [7u32, 9, 7]);
        let mut kept = Penalties::new(&p, &prompt);
        for &t in &out {
            kept.push(t);
        }
        assert_eq!(kept, Penalties::from_history(&p, &prompt, &out));
        assert_eq!(
            kept.iter().collect::<Vec<_>>(),
            vec![(5, 0), (7, 2), (9, 1)]
        );
        let mut off = Penalties::new(&SamplingParams::greedy(), &prompt);
        off.push(3);
        assert_eq!(
            off.iter().count(),
            0,
            "nothing tracked when no penalty is on"
        );
    }

    #[test]
    fn the_mask_limits_greedy_and_drawn_tokens() {
        let mut s = CpuSampler::default();
        let logits = [4.0, 1.0, 3.0, 2.0, 0.5];
        let mask = [0b01010u32]; // tokens 1 and 3
        for p in [SamplingParams::greedy(), SamplingParams::default()] {
            for i in 0..200 {
                let r = SampleRow {
                    mask: Some(&mask),
                    ..row(&p, uniform(9, i), &[])
                };
                let got = s.sample(&logits, &r);
                assert!([1, 3].contains(&got.token), "{p:?}: {}", got.token);
                if p.is_greedy() {
                    assert_eq!(got.token, 3);
                }
                let lse = log_sum_exp(&logits);
                assert_eq!(got.logprob, logits[got.token as usize] - lse, "raw logprob");
            }
        }
    }

    #[test]
    fn a_forced_row_reports_the_given_token_under_the_raw_logits() {
        let mut s = CpuSampler::default();
        let logits = [0.5, 3.0, 1.0, -2.0];
        let p = SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::greedy()
        };
        let lse = log_sum_exp(&logits);
        for t in 0..4u32 {
            let r = s.sample(&logits, &SampleRow::forced(&p, t));
            assert_eq!(r.token, t);
            assert!((r.logprob - (logits[t as usize] - lse)).abs() < 1e-6);
            assert_eq!(r.top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2]);
        }
    }

    #[test]
    fn uniform_is_seeded_and_counter_based() {
        assert_eq!(uniform(1, 5), uniform(1, 5));
        assert_ne!(uniform(1, 5), uniform(1, 6));
        assert_ne!(uniform(1, 5), uniform(2, 5));
        assert!((0..100).all(|i| (0.0..1.0).contains(&uniform(3, i))));
    }
}
