//! Mixture-of-experts shapes and the routing rule every backend follows: softmax over the
//! router logits, the top `k` experts (ties to the lowest index), their weights optionally
//! renormalised to sum to one (Qwen3-MoE's `norm_topk_prob`; Mixtral's softmax over the top
//! logits is the same thing). Qwen2-MoE adds a shared expert every token goes through,
//! scaled by `sigmoid(x · w_gate)`.

/// One MoE layer's geometry and routing options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeShape {
    /// Experts per layer.
    pub n_expert: usize,
    /// Experts each token is sent to.
    pub top_k: usize,
    /// Width of one expert's FFN.
    pub expert_ff: usize,
    /// Renormalise the top-k weights to sum to one.
    pub norm_topk: bool,
    /// Width of the shared expert's FFN (Qwen2-MoE); 0: none.
    pub shared_ff: usize,
    /// The experts' gate activation.
    pub act: MoeAct,
}

/// How an expert combines its gate row `g` and up row `u` (after their biases, if any).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum MoeAct {
    /// SwiGLU: `silu(g) * u` (Qwen-MoE, Mixtral).
    #[default]
    Silu,
    /// gpt-oss's clamped SwiGLU: `g = min(g, limit)`, `u = clamp(u, -limit, limit)`, then
    /// `g * sigmoid(alpha * g) * (u + 1)` (alpha 1.702, limit 7.0 in the released models).
    ClampedSwiglu { alpha: f32, limit: f32 },
}

impl MoeAct {
    /// The activation of one gate/up pair, the reference every backend follows.
    pub fn apply(self, g: f32, u: f32) -> f32 {
        match self {
            MoeAct::Silu => g / (1.0 + (-g).exp()) * u,
            MoeAct::ClampedSwiglu { alpha, limit } => {
                let g = g.min(limit);
                let u = u.clamp(-limit, limit);
                g / (1.0 + (-alpha * g).exp()) * (u + 1.0)
            }
        }
    }
}

/// Upper bound on experts per layer (the GPU routing kernels keep per-expert counts in
/// shared memory).
pub const MAX_EXPERTS: usize = 512;
/// Upper bound on experts per token.
pub const MAX_TOP_K: usize = 32;

impl MoeShape {
    /// Checks the bounds; the error names the value.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_EXPERTS).contains(&self.n_expert) {
            return Err(format!(
                "expert count {} is outside 1..={MAX_EXPERTS}",
                self.n_expert
            ));
        }
        if !(1..=MAX_TOP_K.min(self.n_expert)).contains(&self.top_k) {
            return Err(format!(
                "experts per token {} is outside 1..={}",
                self.top_k,
                MAX_TOP_K.min(self.n_expert)
            ));
        }
        if self.expert_ff == 0 {
            return Err("expert feed-forward length 0".into());
        }
        if let MoeAct::ClampedSwiglu { alpha, limit } = self.act
            && !(alpha.is_finite() && limit.is_finite() && limit > 0.0)
        {
            return Err(format!(
                "clamped SwiGLU alpha {alpha} / limit {limit}: expected finite numbers, limit > 0"
            ));
        }
        Ok(())
    }

    /// (token, expert) pairs of a step of `n` rows.
    pub fn assignments(&self, n: usize) -> usize {
        n * self.top_k
    }
}

/// The weights of one MoE layer's experts, as the backend ops take them: expert `e`'s
/// gate rows are `gate[e * f..(e + 1) * f]`, and likewise for up; its down projection is
/// `down[e * hidden..(e + 1) * hidden]`.
#[derive(Debug, Clone, Copy)]
pub struct MoeExperts<'a, W> {
    /// `[n_expert * expert_ff, hidden]`
    pub gate: &'a W,
    /// `[n_expert * expert_ff, hidden]`
    pub up: &'a W,
    /// `[n_expert * hidden, expert_ff]`
    pub down: &'a W,
    /// The shared expert (`MoeShape::shared_ff > 0`).
    pub shared: Option<SharedExpert<'a, W>>,
    /// Per-expert biases (gpt-oss), added to each expert's gate, up and down outputs.
    pub bias: Option<MoeBias<'a, W>>,
}

/// The experts' biases (gpt-oss), f32: expert `e`'s gate bias is row `e` of `gate`, and
/// likewise for up and down.
#[derive(Debug, Clone, Copy)]
pub struct MoeBias<'a, W> {
    /// `[n_expert, expert_ff]`
    pub gate: &'a W,
    /// `[n_expert, expert_ff]`
    pub up: &'a W,
    /// `[n_expert, hidden]`
    pub down: &'a W,
}

/// A shared expert (Qwen2-MoE): every row adds
/// `sigmoid(x · gate) * down(silu(x W_g^T) * (x W_u^T))`.
#[derive(Debug, Clone, Copy)]
pub struct SharedExpert<'a, W> {
    /// `[2 * shared_ff, hidden]`: the gate rows over the up rows.
    pub gate_up: &'a W,
    /// `[hidden, shared_ff]`
    pub down: &'a W,
    /// `[hidden]` the row vector of the sigmoid gate's logit (f32 or compute type).
    pub gate: &'a W,
}

/// The top `k` experts of one row of router logits and their weights: softmax over all
/// logits, the `k` largest probabilities (ties to the lowest index), renormalised over
/// the `k` when `norm` is set. Written into `out[..k]` in rank order.
pub fn route_row(logits: &[f32], k: usize, norm: bool, out: &mut [(u32, f32)]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    let mut chosen = [usize::MAX; MAX_TOP_K];
    for r in 0..k {
        let mut best = usize::MAX;
        for (e, &l) in logits.iter().enumerate() {
            // Strictly greater: the first (lowest) index wins a tie.
            if !chosen[..r].contains(&e) && (best == usize::MAX || l > logits[best]) {
                best = e;
            }
        }
        chosen[r] = best;
    }
    let prob = |e: usize| (logits[e] - max).exp() / sum;
    let total: f32 = chosen[..k].iter().map(|&e| prob(e)).sum();
    for (o, &e) in out.iter_mut().zip(&chosen[..k]) {
        let p = prob(e);
        *o = (e as u32, if norm { p / total } else { p });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lowest_index_and_norm_sums_to_one() {
        let mut out = [(0, 0.0); 2];
        route_row(&[1.0, 3.0, 3.0, 0.5], 2, false, &mut out);
        assert_eq!((out[0].0, out[1].0), (1, 2));
        assert!((out[0].1 - out[1].1).abs() < 1e-7 && out[0].1 < 0.5);
        route_row(&[2.0, 2.0, 2.0, 2.0], 2, true, &mut out);
        assert_eq!(out, [(0, 0.5), (1, 0.5)]);
        route_row(&[0.0, 1.0, -1.0], 2, true, &mut out);
        let e = std::f32::consts::E;
        assert_eq!((out[0].0, out[1].0), (1, 0));
        assert!((out[0].1 - e / (e + 1.0)).abs() < 1e-6);
        assert!((out[0].1 + out[1].1 - 1.0).abs() < 1e-6);
    }
}
