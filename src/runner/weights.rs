//! The weights in the layout the forward pass expects, generic over where they live, and
//! their loading from a model's tensor source in forward order.

use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::HostTensor;
use crate::model::{ModelError, ModelFiles, ModelSpec, TensorSource};

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
    /// `[hidden]` (f32): the output projection's bias (gpt-oss).
    pub bo: Option<W>,
    /// `[n_heads]` (f32): each query head's sink logit (gpt-oss).
    pub sinks: Option<W>,
    /// `[hidden]`
    pub ffn_norm: W,
    /// The feed-forward block: one dense FFN or a mixture of experts.
    pub ffn: Ffn<W>,
    /// `[head_dim]` each: per-head norms of q and k (Qwen3, Gemma 3).
    pub q_norm: Option<W>,
    pub k_norm: Option<W>,
    /// `[hidden]` each: norms of the attention and FFN outputs (Gemma 2 / 3).
    pub post_attn_norm: Option<W>,
    pub post_ffn_norm: Option<W>,
}

/// A layer's feed-forward weights.
#[derive(Debug, Clone)]
pub enum Ffn<W> {
    /// A SwiGLU / GeGLU FFN.
    Dense {
        /// `[2 * intermediate, hidden]`: gate then up.
        w_gate_up: W,
        /// `[hidden, intermediate]`
        w_down: W,
    },
    /// A mixture of experts (`f` = the expert width, `E` = the expert count).
    Moe {
        /// `[E, hidden]`
        router: W,
        /// `[E * f, hidden]`: expert `e`'s gate rows are `e * f..(e + 1) * f`.
        gate: W,
        /// `[E * f, hidden]`
        up: W,
        /// `[E * hidden, f]`
        down: W,
        /// The shared expert every token goes through (Qwen2-MoE).
        shared: Option<SharedFfn<W>>,
        /// `[E]` (f32): the router's bias (gpt-oss).
        router_bias: Option<W>,
        /// The experts' biases (gpt-oss).
        bias: Option<ExpertBias<W>>,
    },
}

/// The experts' biases (f32), row `e` expert `e`'s.
#[derive(Debug, Clone)]
pub struct ExpertBias<W> {
    /// `[E, f]`
    pub gate: W,
    /// `[E, f]`
    pub up: W,
    /// `[E, hidden]`
    pub down: W,
}

/// A shared expert's weights (`s` = its width).
#[derive(Debug, Clone)]
pub struct SharedFfn<W> {
    /// `[2 * s, hidden]`: gate then up.
    pub gate_up: W,
    /// `[hidden, s]`
    pub down: W,
    /// `[hidden]` (f32): the sigmoid gate's row.
    pub gate: W,
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

/// The one walk over every tensor of a model, in a fixed order (embed, then each layer's
/// tensors in declaration order, norm, output), applying `$f` (an `FnMut`) to each.
/// `$w` is a `ModelWeights<W>` (fields arrive by value, `$opt` is the identity) or a
/// `&ModelWeights<W>` (fields arrive as `&W` through match ergonomics, `$opt` is
/// `Option::as_ref`, turning `&Option<W>` into `Option<&W>`).
macro_rules! map_weights {
    ($w:expr, $f:ident, $opt:path) => {{
        let ModelWeights {
            embed,
            layers,
            norm,
            output,
        } = $w;
        let embed = $f(embed)?;
        let mut mapped = Vec::with_capacity(layers.len());
        for l in layers {
            let LayerWeights {
                attn_norm,
                wqkv,
                bqkv,
                wo,
                bo,
                sinks,
                ffn_norm,
                ffn,
                q_norm,
                k_norm,
                post_attn_norm,
                post_ffn_norm,
            } = l;
            mapped.push(LayerWeights {
                attn_norm: $f(attn_norm)?,
                wqkv: $f(wqkv)?,
                bqkv: $opt(bqkv).map(&mut $f).transpose()?,
                wo: $f(wo)?,
                bo: $opt(bo).map(&mut $f).transpose()?,
                sinks: $opt(sinks).map(&mut $f).transpose()?,
                ffn_norm: $f(ffn_norm)?,
                ffn: match ffn {
                    Ffn::Dense { w_gate_up, w_down } => Ffn::Dense {
                        w_gate_up: $f(w_gate_up)?,
                        w_down: $f(w_down)?,
                    },
                    Ffn::Moe {
                        router,
                        gate,
                        up,
                        down,
                        shared,
                        router_bias,
                        bias,
                    } => Ffn::Moe {
                        router: $f(router)?,
                        gate: $f(gate)?,
                        up: $f(up)?,
                        down: $f(down)?,
                        shared: match $opt(shared) {
                            Some(SharedFfn {
                                gate_up,
                                down,
                                gate,
                            }) => Some(SharedFfn {
                                gate_up: $f(gate_up)?,
                                down: $f(down)?,
                                gate: $f(gate)?,
                            }),
                            None => None,
                        },
                        router_bias: $opt(router_bias).map(&mut $f).transpose()?,
                        bias: match $opt(bias) {
                            Some(ExpertBias { gate, up, down }) => Some(ExpertBias {
                                gate: $f(gate)?,
                                up: $f(up)?,
                                down: $f(down)?,
                            }),
                            None => None,
                        },
                    },
                },
                q_norm: $opt(q_norm).map(&mut $f).transpose()?,
                k_norm: $opt(k_norm).map(&mut $f).transpose()?,
                post_attn_norm: $opt(post_attn_norm).map(&mut $f).transpose()?,
                post_ffn_norm: $opt(post_ffn_norm).map(&mut $f).transpose()?,
            });
        }
        Ok(ModelWeights {
            embed,
            layers: mapped,
            norm: $f(norm)?,
            output: $opt(output).map(&mut $f).transpose()?,
        })
    }};
}

impl<W> ModelWeights<W> {
    /// Converts every tensor with `f`, in a fixed order (embed, layers, norm, output).
    pub fn try_map<U, E>(
        &self,
        mut f: impl FnMut(&W) -> Result<U, E>,
    ) -> Result<ModelWeights<U>, E> {
        map_weights!(self, f, Option::as_ref)
    }

    /// Converts every tensor with `f`, consuming them, in the order of [`ModelWeights::try_map`].
    pub fn into_map<U, E>(
        self,
        mut f: impl FnMut(W) -> Result<U, E>,
    ) -> Result<ModelWeights<U>, E> {
        map_weights!(self, f, std::convert::identity)
    }

    /// The output projection (the embedding when tied).
    pub fn output(&self) -> &W {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}

/// Reads every tensor in forward order, handing each to `upload` (which may move it to a
/// device and drop the host copy). Tensors arrive in the file's type (GGUF blocks borrowed
/// from the mapping); fused q/k/v and gate/up matrices arrive as stacks of their parts
/// unless all parts are f32. Shows a progress bar on a terminal.
pub fn load_weights<W, E>(
    files: &ModelFiles,
    mut upload: impl FnMut(HostTensor) -> Result<W, E>,
) -> Result<ModelWeights<W>, E>
where
    E: From<ModelError>,
{
    let s = &files.spec;
    let bar = ProgressBar::new(s.n_layers as u64 + 2);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(files.name.clone());
    let r = Reader {
        s,
        src: &*files.source,
    };
    let h = s.hidden;
    let embed = upload(r.get("token_embd.weight", vec![s.vocab_size, h])?)?;
    bar.inc(1);
    let mut layers = Vec::with_capacity(s.n_layers);
    for i in 0..s.n_layers {
        layers.push(r.layer(i, &mut upload)?);
        bar.inc(1);
    }
    let norm = upload(r.get_norm("output_norm.weight", h)?)?;
    let output = if s.tied_embeddings {
        None
    } else {
        Some(upload(r.get("output.weight", vec![s.vocab_size, h])?)?)
    };
    bar.inc(1);
    bar.finish_and_clear();
    Ok(ModelWeights {
        embed,
        layers,
        norm,
        output,
    })
}

/// What [`load_weights`] reads from: the spec and the tensor source.
struct Reader<'a> {
    s: &'a ModelSpec,
    src: &'a dyn TensorSource,
}

impl Reader<'_> {
    /// Tensor `name` in the file's own type, straight from its mapping: the backend decides
    /// what to convert.
    fn get(&self, name: &str, shape: Vec<usize>) -> Result<HostTensor, ModelError> {
        self.src
            .fetch_host(name, &shape)?
            .ok_or_else(|| ModelError::Missing(name.to_string()))
    }

    /// A bias or sink vector (or matrix of bias rows) as f32.
    fn get_f32(&self, name: &str, shape: Vec<usize>) -> Result<HostTensor, ModelError> {
        Ok(self.get(name, shape)?.into_f32()?)
    }

    /// The norm before the FFN: `ffn_norm`, or `post_attention_norm` where a file of a
    /// family without post-norms names it so (llama.cpp's gpt-oss files).
    fn get_ffn_norm(&self, i: usize, len: usize) -> Result<HostTensor, ModelError> {
        let name = format!("blk.{i}.ffn_norm.weight");
        let alt = format!("blk.{i}.post_attention_norm.weight");
        if !self.s.variant.post_norms
            && self.src.fetch_host(&name, &[len])?.is_none()
            && self.src.fetch_host(&alt, &[len])?.is_some()
        {
            return self.get_norm(&alt, len);
        }
        self.get_norm(&name, len)
    }

    /// Norm weights as f32, with the family's offset added (Hugging Face Gemma's `1 + w`).
    fn get_norm(&self, name: &str, len: usize) -> Result<HostTensor, ModelError> {
        let offset = self.s.variant.norm_offset;
        let t = self.get(name, vec![len])?.into_f32()?;
        if offset == 0.0 {
            return Ok(t);
        }
        let vals: Vec<f32> = t
            .values()
            .unwrap_or_default()
            .iter()
            .map(|w| w + offset)
            .collect();
        Ok(HostTensor::new(vec![len], vals))
    }

    /// Layer `i`'s weights, uploaded in a fixed order (biases, FFN, head norms, post-norms,
    /// then the norms and attention matrices).
    fn layer<W, E: From<ModelError>>(
        &self,
        i: usize,
        upload: &mut impl FnMut(HostTensor) -> Result<W, E>,
    ) -> Result<LayerWeights<W>, E> {
        let (s, v) = (self.s, &self.s.variant);
        let (h, q, kv) = (s.hidden, s.q_dim(), s.kv_dim());
        let n = |leaf: &str| format!("blk.{i}.{leaf}");
        let wqkv = if v.fused_tensors {
            self.get(&n("attn_qkv.weight"), vec![q + 2 * kv, h])?
        } else {
            HostTensor::concat_rows(vec![
                self.get(&n("attn_q.weight"), vec![q, h])?,
                self.get(&n("attn_k.weight"), vec![kv, h])?,
                self.get(&n("attn_v.weight"), vec![kv, h])?,
            ])
            .map_err(ModelError::from)?
        };
        let bqkv = if s.qkv_bias {
            let mut b = Vec::with_capacity(q + 2 * kv);
            for (leaf, len) in [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)] {
                let part = self
                    .get(&n(leaf), vec![len])?
                    .into_f32()
                    .map_err(ModelError::from)?;
                b.extend_from_slice(part.values().unwrap_or_default());
            }
            Some(upload(HostTensor::new(vec![b.len()], b))?)
        } else {
            None
        };
        let ffn = self.ffn(i, upload)?;
        let bo = match v.out_bias {
            true => Some(upload(self.get_f32(&n("attn_output.bias"), vec![h])?)?),
            false => None,
        };
        let sinks = match v.sinks {
            true => Some(upload(
                self.get_f32(&n("attn_sinks.weight"), vec![s.n_heads])?,
            )?),
            false => None,
        };
        let mut pair = |on: bool, a: &str, b: &str, len: usize| -> Result<_, E> {
            Ok(match on {
                true => (
                    Some(upload(self.get_norm(&n(a), len)?)?),
                    Some(upload(self.get_norm(&n(b), len)?)?),
                ),
                false => (None, None),
            })
        };
        let (q_norm, k_norm) = pair(
            v.qk_norm,
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            s.head_dim,
        )?;
        let (post_attn_norm, post_ffn_norm) = pair(
            v.post_norms,
            "post_attention_norm.weight",
            "post_ffw_norm.weight",
            h,
        )?;
        Ok(LayerWeights {
            attn_norm: upload(self.get_norm(&n("attn_norm.weight"), h)?)?,
            wqkv: upload(wqkv)?,
            bqkv,
            wo: upload(self.get(&n("attn_output.weight"), vec![h, q])?)?,
            bo,
            sinks,
            ffn_norm: upload(self.get_ffn_norm(i, h)?)?,
            ffn,
            q_norm,
            k_norm,
            post_attn_norm,
            post_ffn_norm,
        })
    }

    /// Layer `i`'s FFN: a mixture of experts (with its shared expert) or one dense FFN.
    fn ffn<W, E: From<ModelError>>(
        &self,
        i: usize,
        upload: &mut impl FnMut(HostTensor) -> Result<W, E>,
    ) -> Result<Ffn<W>, E> {
        let (s, src) = (self.s, self.src);
        let (h, ff) = (s.hidden, s.intermediate);
        let n = |leaf: &str| format!("blk.{i}.{leaf}");
        let get = |leaf: &str, shape: Vec<usize>| self.get(&n(leaf), shape);
        let glu = |gate: HostTensor, up: HostTensor| {
            HostTensor::concat_rows(vec![gate, up]).map_err(ModelError::from)
        };
        Ok(match &s.variant.moe {
            Some(m) => Ffn::Moe {
                router: upload(get("ffn_gate_inp.weight", vec![m.n_expert, h])?)?,
                gate: upload(experts(src, i, "gate", m.n_expert, m.expert_ff, h)?)?,
                up: upload(experts(src, i, "up", m.n_expert, m.expert_ff, h)?)?,
                down: upload(experts(src, i, "down", m.n_expert, h, m.expert_ff)?)?,
                shared: match m.shared_ff {
                    0 => None,
                    sf => Some(SharedFfn {
                        gate_up: upload(glu(
                            get("ffn_gate_shexp.weight", vec![sf, h])?,
                            get("ffn_up_shexp.weight", vec![sf, h])?,
                        )?)?,
                        down: upload(get("ffn_down_shexp.weight", vec![h, sf])?)?,
                        gate: upload(shared_gate(src, i, h)?)?,
                    }),
                },
                router_bias: match s.variant.moe_bias {
                    true => Some(upload(
                        self.get_f32(&n("ffn_gate_inp.bias"), vec![m.n_expert])?,
                    )?),
                    false => None,
                },
                bias: match s.variant.moe_bias {
                    true => {
                        let (e, f) = (m.n_expert, m.expert_ff);
                        Some(ExpertBias {
                            gate: upload(self.get_f32(&n("ffn_gate_exps.bias"), vec![e, f])?)?,
                            up: upload(self.get_f32(&n("ffn_up_exps.bias"), vec![e, f])?)?,
                            down: upload(self.get_f32(&n("ffn_down_exps.bias"), vec![e, h])?)?,
                        })
                    }
                    false => None,
                },
            },
            None if s.variant.fused_tensors => Ffn::Dense {
                w_gate_up: upload(get("ffn_up.weight", vec![2 * ff, h])?)?,
                w_down: upload(get("ffn_down.weight", vec![h, ff])?)?,
            },
            None => Ffn::Dense {
                w_gate_up: upload(glu(
                    get("ffn_gate.weight", vec![ff, h])?,
                    get("ffn_up.weight", vec![ff, h])?,
                )?)?,
                w_down: upload(get("ffn_down.weight", vec![h, ff])?)?,
            },
        })
    }
}

/// Layer `layer`'s shared-expert gate row as an f32 `[hidden]` vector (`[1, hidden]` in
/// Hugging Face files; GGUF shapes compare without their unit dimensions).
fn shared_gate(src: &dyn TensorSource, layer: usize, h: usize) -> Result<HostTensor, ModelError> {
    let name = format!("blk.{layer}.ffn_gate_inp_shexp.weight");
    let t = src
        .fetch_host(&name, &[1, h])?
        .ok_or_else(|| ModelError::Missing(name.clone()))?
        .into_f32()?;
    Ok(HostTensor::new(
        vec![h],
        t.values().unwrap_or_default().to_vec(),
    ))
}

/// Layer `layer`'s `kind` (`gate`, `up`, `down`) matrices of all `n_expert` experts as one
/// `[n_expert * rows, cols]` tensor in the file's type: llama.cpp's 3-D
/// `ffn_{kind}_exps` (`[n_expert, rows, cols]`) or one `ffn_{kind}.{e}` per expert (older
/// GGUF files, Hugging Face directories), stacked without converting (quantized experts
/// of one type joined into one buffer: one host copy of their bytes).
fn experts(
    src: &dyn TensorSource,
    layer: usize,
    kind: &str,
    n_expert: usize,
    rows: usize,
    cols: usize,
) -> Result<HostTensor, ModelError> {
    let all = format!("blk.{layer}.ffn_{kind}_exps.weight");
    if let Some(t) = src.fetch_host(&all, &[n_expert, rows, cols])? {
        return Ok(HostTensor {
            shape: vec![n_expert * rows, cols],
            ..t
        });
    }
    let parts = (0..n_expert)
        .map(|e| {
            let name = format!("blk.{layer}.ffn_{kind}.{e}.weight");
            src.fetch_host(&name, &[rows, cols])?
                .ok_or_else(|| ModelError::Missing(format!("{all} (or {name})")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // One tensor per expert (of one type, as files store them) becomes one matrix.
    Ok(HostTensor::concat_rows(parts)?.joined())
}
