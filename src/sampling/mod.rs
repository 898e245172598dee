//! Sampling parameters and the CPU sampler (the reference the GPU sampler is checked against).

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
    fn has_penalties(&self) -> bool {
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

/// One logits row to sample from.
#[derive(Debug, Clone, Copy)]
pub struct SampleRow<'a> {
    pub params: &'a SamplingParams,
    /// This step's uniform draw (see [`uniform`]).
    pub uniform: f32,
    pub prompt: &'a [u32],
    pub output: &'a [u32],
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
        self.work.clear();
        self.work.extend_from_slice(logits);
        apply_bias_and_penalties(&mut self.work, row);
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
    if p.repetition_penalty != 1.0 {
        let mut seen = std::collections::HashSet::new();
        for &t in row.prompt.iter().chain(row.output) {
            if seen.insert(t)
                && let Some(v) = x.get_mut(t as usize)
            {
                *v = if *v > 0.0 {
                    *v / p.repetition_penalty
                } else {
                    *v * p.repetition_penalty
                };
            }
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts = std::collections::HashMap::<u32, u32>::new();
        for &t in row.output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            if let Some(v) = x.get_mut(t as usize) {
                *v -= p.presence_penalty + p.frequency_penalty * c as f32;
            }
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

    fn row<'a>(p: &'a SamplingParams, u: f32, out: &'a [u32]) -> SampleRow<'a> {
        SampleRow {
            params: p,
            uniform: u,
            prompt: &[],
            output: out,
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
    fn uniform_is_seeded_and_counter_based() {
        assert_eq!(uniform(1, 5), uniform(1, 5));
        assert_ne!(uniform(1, 5), uniform(1, 6));
        assert_ne!(uniform(1, 5), uniform(2, 5));
        assert!((0..100).all(|i| (0.0..1.0).contains(&uniform(3, i))));
    }
}
