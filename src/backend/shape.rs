//! The shapes the backend's ops take: attention heads and RoPE. They are the backend's
//! own types; `model::ModelSpec` builds them from a file's metadata.

/// Head geometry of one attention layer, and how its scores are formed. The fused qkv tensor
/// holds `n_heads` query heads, then `n_kv_heads` key heads, then `n_kv_heads` value heads,
/// each `head_dim` wide.
///
/// The query at position `i` attends to the keys at positions `j <= i` (and `i - j < window`
/// when the layer has a window) with logits
/// `s = q . k * scale`, then `s = softcap * tanh(s / softcap)` when soft-capped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Sliding window: `W` keys including the query's own position (Hugging Face and
    /// llama.cpp semantics). `None`: the whole causal context.
    pub window: Option<usize>,
    /// Attention-logit soft-capping (Gemma 2): logits become `c * tanh(s / c)`.
    pub softcap: Option<f32>,
    /// Factor the `q . k` products are multiplied by; `None`: `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
}

impl AttnShape {
    /// Full causal attention with the default scale, no soft-capping.
    pub fn new(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> AttnShape {
        AttnShape {
            n_heads,
            n_kv_heads,
            head_dim,
            window: None,
            softcap: None,
            scale: None,
        }
    }
    /// The factor applied to `q . k`: [`AttnShape::scale`] or `1 / sqrt(head_dim)`.
    pub fn score_scale(&self) -> f32 {
        self.scale
            .unwrap_or_else(|| 1.0 / (self.head_dim as f32).sqrt())
    }
    /// The first key position a query at `pos` sees (`0` without a window).
    pub fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
    /// Why the score parameters cannot be used (a zero window, a soft cap or scale that is
    /// not a positive finite number), if so.
    pub fn check(&self) -> Result<(), String> {
        if self.window == Some(0) {
            return Err("attention window 0: a query must see at least itself".into());
        }
        if let Some(c) = self.softcap.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(format!("attention soft cap {c} is not a positive number"));
        }
        if let Some(s) = self.scale.filter(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(format!("attention scale {s} is not a positive number"));
        }
        Ok(())
    }
    /// Width of the query part (`n_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Width of the key (= value) part (`n_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// Width of the fused qkv tensor.
    pub fn qkv_dim(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }
}

/// Which elements RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs `(x[2i], x[2i+1])`: llama.cpp's "normal" rope, used by GGUF llama files.
    Interleaved,
    /// Half split `(x[i], x[i + d/2])`: NeoX / Hugging Face layout.
    Half,
}

/// Llama-3 style frequency scaling (`rope_scaling.rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position: f32,
}

/// RoPE parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    /// Number of leading dims of each head that are rotated (usually `head_dim`).
    pub dim: usize,
    pub layout: RopeLayout,
    pub llama3: Option<Llama3Scaling>,
    /// Per-frequency divisors (GGUF `rope_freqs.weight`, how llama.cpp stores Llama-3.1 scaling).
    pub freq_factors: Option<Vec<f32>>,
    /// Factor the rotated dims are multiplied by after rotation (cos and sin times it):
    /// long-rope's attention factor (Phi-3/4 past the original context); 1 elsewhere. With a
    /// partial rope the dims past [`RopeSpec::dim`] keep their values.
    pub attn_factor: f32,
}

impl RopeSpec {
    /// Inverse frequencies, one per rotated pair, with Llama-3 scaling applied. Length `dim / 2`.
    pub fn inv_freqs(&self) -> Vec<f32> {
        let half = self.dim / 2;
        (0..half)
            .map(|i| {
                let mut f = (self.theta as f64).powf(-(2.0 * i as f64) / self.dim as f64);
                if let Some(s) = self.llama3 {
                    f = llama3_scale(f, s);
                }
                if let Some(div) = self.freq_factors.as_ref().and_then(|d| d.get(i)) {
                    f /= *div as f64;
                }
                f as f32
            })
            .collect()
    }
}

fn llama3_scale(freq: f64, s: Llama3Scaling) -> f64 {
    let two_pi = 2.0 * std::f64::consts::PI;
    let wavelen = two_pi / freq;
    let low_wavelen = s.original_max_position as f64 / s.low_freq_factor as f64;
    let high_wavelen = s.original_max_position as f64 / s.high_freq_factor as f64;
    if wavelen < high_wavelen {
        freq
    } else if wavelen > low_wavelen {
        freq / s.factor as f64
    } else {
        let smooth = (s.original_max_position as f64 / wavelen - s.low_freq_factor as f64)
            / (s.high_freq_factor as f64 - s.low_freq_factor as f64);
        (1.0 - smooth) * freq / s.factor as f64 + smooth * freq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_scale_and_window_defaults() {
        let plain = AttnShape::new(8, 2, 64);
        assert_eq!(plain.score_scale(), 0.125);
        assert_eq!(plain.first_visible(5000), 0);
        let gemma = AttnShape {
            window: Some(4),
            scale: Some(256f32.powf(-0.5)),
            ..AttnShape::new(8, 2, 128)
        };
        assert_eq!(gemma.score_scale(), 0.0625);
        // Position 10 with a window of 4 sees 7, 8, 9, 10; position 2 sees 0, 1, 2.
        assert_eq!(gemma.first_visible(10), 7);
        assert_eq!(gemma.first_visible(2), 0);
        assert!(plain.check().is_ok() && gemma.check().is_ok());
    }

    #[test]
    fn llama3_scaling_keeps_high_freqs_and_divides_low_ones() {
        let s = Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192.0,
        };
        let rope = RopeSpec {
            theta: 500000.0,
            dim: 128,
            layout: RopeLayout::Half,
            llama3: Some(s),
            freq_factors: None,
            attn_factor: 1.0,
        };
        let plain = RopeSpec {
            llama3: None,
            ..rope.clone()
        };
        let (a, b) = (rope.inv_freqs(), plain.inv_freqs());
        assert_eq!(a[0], b[0]);
        assert!((a[63] - b[63] / 8.0).abs() < 1e-12);
        // Pair 40: wavelength ~22.9k > 8192 / 1: fully divided by the factor.
        assert!((a[40] - b[40] / 8.0).abs() <= 1e-6 * b[40]);
        // Pair 30: wavelength ~4.2k, between 8192 / 4 and 8192 / 1: smoothly interpolated.
        assert!(
            a[30] < b[30] && a[30] > b[30] / 8.0,
            "{} vs {}",
            a[30],
            b[30]
        );
    }
}
