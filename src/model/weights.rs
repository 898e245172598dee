//! Host-side weights in the layout the forward pass expects, generic over where they live.

/// A dense f32 tensor on the host, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// `[rows, cols]` for matrices, `[len]` for vectors.
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
    /// A tensor; `data.len()` must equal the product of `shape`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self { shape, data }
    }
    /// Number of rows (first dim) of a matrix, or 1 for a vector.
    pub fn rows(&self) -> usize {
        if self.shape.len() == 2 {
            self.shape[0]
        } else {
            1
        }
    }
    /// Number of columns (last dim).
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&0)
    }
    /// Stacks matrices with equal column counts along rows.
    pub fn concat_rows(parts: &[HostTensor]) -> HostTensor {
        let cols = parts[0].cols();
        let rows = parts.iter().map(|p| p.rows()).sum();
        let mut data = Vec::with_capacity(rows * cols);
        for p in parts {
            debug_assert_eq!(p.cols(), cols);
            data.extend_from_slice(&p.data);
        }
        HostTensor::new(vec![rows, cols], data)
    }
}

/// One decoder layer's weights. Matrices are `[out, in]`.
#[derive(Debug, Clone)]
pub struct LayerWeights<W> {
    /// `[hidden]`
    pub attn_norm: W,
    /// `[q_dim + 2 * kv_dim, hidden]`: q, k, v projections stacked.
    pub wqkv: W,
    /// `[q_dim + 2 * kv_dim]`, Qwen2 only.
    pub bqkv: Option<W>,
    /// `[hidden, q_dim]`
    pub wo: W,
    /// `[hidden]`
    pub ffn_norm: W,
    /// `[2 * intermediate, hidden]`: gate then up.
    pub w_gate_up: W,
    /// `[hidden, intermediate]`
    pub w_down: W,
}

/// All weights of a Llama-family model.
#[derive(Debug, Clone)]
pub struct ModelWeights<W> {
    /// `[vocab, hidden]`
    pub embed: W,
    pub layers: Vec<LayerWeights<W>>,
    /// `[hidden]`
    pub norm: W,
    /// `[vocab, hidden]`; `None` when tied to `embed`.
    pub output: Option<W>,
}

impl<W> ModelWeights<W> {
    /// Converts every tensor with `f`, in a fixed order (embed, layers, norm, output).
    pub fn try_map<U, E>(
        &self,
        mut f: impl FnMut(&W) -> Result<U, E>,
    ) -> Result<ModelWeights<U>, E> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(LayerWeights {
                attn_norm: f(&l.attn_norm)?,
                wqkv: f(&l.wqkv)?,
                bqkv: l.bqkv.as_ref().map(&mut f).transpose()?,
                wo: f(&l.wo)?,
                ffn_norm: f(&l.ffn_norm)?,
                w_gate_up: f(&l.w_gate_up)?,
                w_down: f(&l.w_down)?,
            });
        }
        Ok(ModelWeights {
            embed: f(&self.embed)?,
            layers,
            norm: f(&self.norm)?,
            output: self.output.as_ref().map(&mut f).transpose()?,
        })
    }

    /// The output projection (the embedding when tied).
    pub fn output(&self) -> &W {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}
