//! Single-sequence generation straight on a backend: `kiln generate` and the reference
//! the batching engine is checked against.

use std::time::{Duration, Instant};

use crate::backend::{Backend, BackendError, BatchPlan, KvShape, SeqSlice};
use crate::model::ModelFiles;
use crate::runner::{Llama, LoadError};
use crate::sampling::{Penalties, SampleRow, Sampled, SamplingParams, uniform};

/// What one generation produced, with in-process timings.
#[derive(Debug, Clone)]
pub struct Generation {
    pub token_ids: Vec<u32>,
    /// Per generated token, when logprobs were asked.
    pub samples: Vec<Sampled>,
    /// Full-vocabulary logits of the first `record_logits` steps (step 0 = last prompt position).
    pub step_logits: Vec<Vec<f32>>,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

/// Options of one run.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub params: SamplingParams,
    /// Stop when one of these is produced (it is kept in the output).
    pub stop_ids: Vec<u32>,
    /// Prefill chunk size (tokens per forward).
    pub chunk: usize,
    pub block_size: usize,
    /// How many steps' full logits to keep in [`Generation::step_logits`].
    pub record_logits: usize,
}

/// A model plus a KV cache just large enough for one sequence.
pub struct SingleGenerator<B: Backend> {
    pub backend: B,
    pub model: Llama<B>,
    kv: B::Kv,
    kv_shape: KvShape,
}

impl<B: Backend> SingleGenerator<B> {
    /// Loads `files` onto `backend` with room for `max_context` tokens.
    pub fn new(
        mut backend: B,
        files: &ModelFiles,
        max_context: usize,
        chunk: usize,
        block_size: usize,
    ) -> Result<Self, LoadError> {
        let model = Llama::load(&mut backend, files, chunk, 1)?;
        let s = &files.spec;
        let kv_shape = KvShape {
            num_layers: s.n_layers,
            num_blocks: max_context.div_ceil(block_size) + 1,
            block_size,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
        };
        let kv = backend.alloc_kv(&kv_shape)?;
        Ok(Self {
            backend,
            model,
            kv,
            kv_shape,
        })
    }

    /// Generates from `prompt`. `on_token` sees each new token as it is sampled.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_token: impl FnMut(u32),
    ) -> Result<Generation, BackendError> {
        let total = prompt.len() + opts.max_tokens;
        if prompt.is_empty() || total > self.kv_shape.num_slots() {
            return Err(BackendError::InvalidBatch(format!(
                "prompt of {} + {} new tokens does not fit {} cache slots",
                prompt.len(),
                opts.max_tokens,
                self.kv_shape.num_slots()
            )));
        }
        // Blocks in reverse order so block tables are non-trivial even for one sequence.
        let table: Vec<u32> = (0..self.kv_shape.num_blocks as u32).rev().collect();
        let seed = opts.params.seed.unwrap_or_else(rand::random);
        let vocab = self.model.spec.vocab_size;
        let mut out = Generation {
            token_ids: Vec::new(),
            samples: Vec::new(),
            step_logits: Vec::new(),
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
        };
        let step = |this: &mut Self,
                    tokens: &[u32],
                    done: usize,
                    want: bool|
         -> Result<(), BackendError> {
            let mut plan = BatchPlan {
                token_ids: tokens.to_vec(),
                seqs: vec![SeqSlice {
                    q_start: 0,
                    q_len: tokens.len() as u32,
                    ctx_len: (done + tokens.len()) as u32,
                    block_table: table.clone(),
                    wants_logits: want,
                }],
                block_size: this.kv_shape.block_size as u32,
                ..Default::default()
            };
            plan.fill_positions_and_slots();
            this.model.forward(&mut this.backend, &mut this.kv, &plan)?;
            Ok(())
        };
        let t0 = Instant::now();
        let mut done = 0;
        for chunk in prompt.chunks(opts.chunk) {
            step(self, chunk, done, done + chunk.len() == prompt.len())?;
            done += chunk.len();
        }
        out.prefill_time = t0.elapsed();
        let t1 = Instant::now();
        let mut penalties = Penalties::new(&opts.params, prompt);
        for i in 0..opts.max_tokens {
            if i > 0 {
                let last = *out.token_ids.last().expect("one token per step");
                step(self, &[last], done, true)?;
                done += 1;
            }
            if i < opts.record_logits {
                let logits = self.backend.to_host(self.model.logits(), 1)?;
                out.step_logits.push(logits[..vocab].to_vec());
            }
            let row = SampleRow {
                params: &opts.params,
                uniform: uniform(seed, i as u64),
                penalties: &penalties,
                mask: None,
                forced: None,
            };
            let s = self.sample_last(row)?;
            on_token(s.token);
            out.token_ids.push(s.token);
            penalties.push(s.token);
            let stop = opts.stop_ids.contains(&s.token);
            out.samples.push(s);
            if stop {
                break;
            }
        }
        out.decode_time = t1.elapsed();
        Ok(out)
    }

    fn sample_last(&mut self, row: SampleRow<'_>) -> Result<Sampled, BackendError> {
        let logits = self.model.logits();
        let mut v = self.backend.sample(logits, &[row])?;
        Ok(v.remove(0))
    }
}
