//! Host side of sampling on the device: packs each row's parameters, its penalty/bias
//! entries and the token masks of constrained rows into one upload, launches the sampling kernels, and downloads only the chosen
//! ids, their logprobs and the requested top alternatives.

pub(in crate::backend::gpu) mod kernels;

use crate::backend::BackendError;
use crate::backend::gpu::args::{
    SampleGreedyArgs, SampleMaskArgs, SamplePenaltyArgs, SamplePickArgs, SamplePrepArgs,
    SampleTopNArgs,
};
use crate::backend::gpu::device::DevBuf;
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, check_rows, ensure};
use crate::sampling::{SampleRow, Sampled};

/// Words of one row's parameters (see `kernels/sample.cu`).
pub const PARAM_WORDS: usize = 8;
/// Words of one penalty/bias entry: row, token, bias, repetition, subtraction.
pub const ENTRY_WORDS: usize = 5;
/// Most top alternatives one row may ask for (one per thread of the top-n kernel).
pub const MAX_TOP: usize = 1024;
/// Added to a forced row's token in the sampling workspace: any finite logit plus this is
/// larger than every other finite logit, so the greedy pick is the forced token.
pub const FORCE_BIAS: f32 = f32::MAX;

/// The packed upload of one `sample` call.
#[derive(Debug, Default)]
pub struct SamplePack {
    /// `[rows x PARAM_WORDS]`, `[entries x ENTRY_WORDS]`, the row of each masked row
    /// `[masked]`, then their masks `[masked x mask_words]`.
    pub words: Vec<u32>,
    pub rows: usize,
    pub entries: usize,
    /// Rows with a token mask, and the words of one mask (`ceil(vocab / 32)`).
    pub masked: usize,
    pub mask_words: usize,
    /// Total top alternatives over all rows.
    pub total_top: usize,
    pub any_top: bool,
    /// Every row greedy with no top alternatives and no penalty/bias entries: one pass.
    pub plain_greedy: bool,
}

impl SamplePack {
    /// Words of the output: `[token, logprob]` per row, then `[id, logprob]` per alternative.
    pub fn out_words(&self) -> usize {
        2 * self.rows + 2 * self.total_top
    }
}

/// Packs `rows` for a vocabulary of `vocab`, reusing `pack`'s buffer.
pub fn pack(
    rows: &[SampleRow<'_>],
    vocab: usize,
    pack: &mut SamplePack,
) -> Result<(), BackendError> {
    pack.words.clear();
    pack.rows = rows.len();
    pack.total_top = 0;
    pack.any_top = false;
    let mut all_greedy = true;
    for row in rows {
        let p = row.params;
        let n_top = match p.logprobs {
            Some(n) if n > 0 => n.min(vocab),
            _ => 0,
        };
        if n_top > MAX_TOP {
            return Err(BackendError::Unsupported {
                backend: "gpu",
                op: "sample",
                dtype: format!("{n_top} top logprobs (max {MAX_TOP})"),
            });
        }
        // A forced row (a prompt position) is a greedy pick that its bias entry makes
        // the forced token (see `entries`).
        let greedy = p.is_greedy() || row.forced.is_some();
        let inv_t = if greedy { 1.0 } else { 1.0 / p.temperature };
        pack.words.extend_from_slice(&[
            greedy as u32,
            inv_t.to_bits(),
            p.top_k.min(u32::MAX as usize) as u32,
            p.top_p.to_bits(),
            p.min_p.to_bits(),
            row.uniform.to_bits(),
            n_top as u32,
            pack.total_top as u32,
        ]);
        pack.total_top += n_top;
        pack.any_top |= n_top > 0;
        all_greedy &= greedy;
    }
    let start = pack.words.len();
    for (i, row) in rows.iter().enumerate() {
        entries(i as u32, row, vocab, &mut pack.words);
    }
    pack.entries = (pack.words.len() - start) / ENTRY_WORDS;
    pack_masks(rows, vocab, pack);
    pack.plain_greedy = all_greedy && !pack.any_top && pack.entries == 0 && pack.masked == 0;
    Ok(())
}

/// Appends the masked rows' indices, then their masks, each `ceil(vocab / 32)` words (a
/// shorter mask is padded with zeros: ids past it are not allowed).
fn pack_masks(rows: &[SampleRow<'_>], vocab: usize, pack: &mut SamplePack) {
    let w = vocab.div_ceil(32);
    let masked: Vec<(usize, &[u32])> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.mask.map(|m| (i, m)))
        .collect();
    pack.masked = masked.len();
    pack.mask_words = w;
    pack.words.extend(masked.iter().map(|&(i, _)| i as u32));
    for (_, m) in masked {
        let n = m.len().min(w);
        pack.words.extend_from_slice(&m[..n]);
        pack.words.extend(std::iter::repeat_n(0, w - n));
    }
}

/// Appends one entry per distinct token that bias or penalties touch, composed in the CPU
/// sampler's order: bias, then repetition (prompt and output), then presence/frequency.
/// The penalty counts are the sequence's own, kept per token; only the bias is merged here.
/// A forced row gets one entry instead: [`FORCE_BIAS`] on its token, so the greedy pick is
/// that token while its logprob and the top alternatives still come from the raw logits.
fn entries(row: u32, r: &SampleRow<'_>, vocab: usize, out: &mut Vec<u32>) {
    if let Some(t) = r.forced {
        let t = t.min(vocab.saturating_sub(1) as u32);
        out.extend_from_slice(&[row, t, FORCE_BIAS.to_bits(), 1f32.to_bits(), 0]);
        return;
    }
    let p = r.params;
    let rep_on = p.repetition_penalty != 1.0;
    let sub_on = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
    if p.logit_bias.is_empty() && !rep_on && !sub_on {
        return;
    }
    // token -> summed bias (a handful of entries: the request's `logit_bias`)
    let mut bias: std::collections::BTreeMap<u32, f32> = std::collections::BTreeMap::new();
    for &(id, b) in &p.logit_bias {
        if (id as usize) < vocab {
            *bias.entry(id).or_default() += b;
        }
    }
    let mut push = |t: u32, bias: f32, rep: f32, sub: f32| {
        out.extend_from_slice(&[row, t, bias.to_bits(), rep.to_bits(), sub.to_bits()]);
    };
    if rep_on || sub_on {
        for (t, count) in r.penalties.iter() {
            if (t as usize) >= vocab || (!rep_on && count == 0 && !bias.contains_key(&t)) {
                continue;
            }
            let rep = if rep_on { p.repetition_penalty } else { 1.0 };
            let sub = if sub_on && count > 0 {
                p.presence_penalty + p.frequency_penalty * count as f32
            } else {
                0.0
            };
            push(t, bias.remove(&t).unwrap_or(0.0), rep, sub);
        }
    }
    for (t, b) in bias {
        push(t, b, 1.0, 0.0);
    }
}

/// Turns the downloaded output words into one result per row.
pub fn unpack(pack: &SamplePack, words: &[u32]) -> Vec<Sampled> {
    (0..pack.rows)
        .map(|i| {
            let param = &pack.words[i * PARAM_WORDS..(i + 1) * PARAM_WORDS];
            let at = 2 * pack.rows + 2 * param[7] as usize;
            let top = (0..param[6] as usize)
                .map(|j| (words[at + 2 * j], f32::from_bits(words[at + 2 * j + 1])))
                .collect();
            Sampled {
                token: words[2 * i],
                logprob: f32::from_bits(words[2 * i + 1]),
                top,
            }
        })
        .collect()
}

/// Threads of the per-row sampling kernels (`SAMPLE_THREADS` in `kernels/sample.cu`).
const SAMPLE_THREADS: u32 = 1024;
/// Most slices, and fewest logits a slice, of one row's greedy pass (`sample_greedy`).
const GREEDY_MAX_PARTS: usize = 64;
const GREEDY_MIN_SLICE: usize = 2048;

/// Slices of each row's greedy pass: enough blocks for about two per SM over the `rows`
/// rows, none shorter than [`GREEDY_MIN_SLICE`] logits (one for short vocabularies or many
/// rows), and none empty (the kernel's slices are `ceil(v / parts)` long).
fn greedy_parts(rows: usize, v: usize, sms: usize) -> usize {
    let want = (2 * sms / rows.max(1)).clamp(1, GREEDY_MAX_PARTS);
    let parts = want.min(v / GREEDY_MIN_SLICE).max(1);
    v.div_ceil(v.div_ceil(parts))
}

/// The sampling workspaces of one backend, allocated on first use and kept across steps.
#[derive(Default)]
pub(in crate::backend::gpu) struct SampleState {
    input: Option<DevBuf>,
    work: Option<DevBuf>,
    out: Option<DevBuf>,
    /// The greedy pass's per-slice results, and its per-row counters (zeroed when allocated;
    /// the kernel leaves them zero).
    parts: Option<DevBuf>,
    counts: Option<DevBuf>,
    pack: SamplePack,
}

impl<R: Runtime> GpuBackend<R> {
    pub(in crate::backend::gpu) fn sample_on_device(
        &mut self,
        logits: &GpuTensor,
        rows: &[SampleRow<'_>],
    ) -> Result<Vec<Sampled>, BackendError> {
        check_rows("sample", rows.len(), logits.rows)?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut pk = std::mem::take(&mut self.sample.pack);
        let out = pack(rows, logits.cols, &mut pk)
            .and_then(|()| self.run_sample(logits, &pk))
            .map(|w| unpack(&pk, &w));
        self.sample.pack = pk;
        out
    }

    /// One upload (parameters and entries), the kernels, one download (ids and logprobs).
    /// Kernel order: prep (float copy and lse), top-n on the raw values, penalties, pick;
    /// plain greedy steps run one kernel over the raw logits instead, with no upload.
    fn run_sample(
        &mut self,
        logits: &GpuTensor,
        pk: &SamplePack,
    ) -> Result<Vec<u32>, BackendError> {
        let (s, v) = (pk.rows, logits.cols);
        let rows = Grid {
            blocks: (s as u32, 1, 1),
            threads: SAMPLE_THREADS,
        };
        let out = ensure(
            &self.ctx.dev,
            &mut self.sample.out,
            pk.out_words() * 4,
            "sampling output",
            &mut self.ctx.generation,
        )?;
        if pk.plain_greedy {
            let parts = greedy_parts(s, v, self.ctx.caps.sms);
            let (part, counts) = if parts > 1 {
                let part = ensure(
                    &self.ctx.dev,
                    &mut self.sample.parts,
                    s * parts * 16,
                    "greedy sampling slices",
                    &mut self.ctx.generation,
                )?;
                let g = self.ctx.generation;
                let counts = ensure(
                    &self.ctx.dev,
                    &mut self.sample.counts,
                    s * 4,
                    "greedy sampling counters",
                    &mut self.ctx.generation,
                )?;
                if let Some(buf) = self
                    .sample
                    .counts
                    .as_ref()
                    .filter(|_| self.ctx.generation != g)
                {
                    // A new buffer: the counters start at zero (the kernel leaves them so).
                    self.ctx.dev.upload(buf, 0, &vec![0u8; buf.bytes()])?;
                }
                (part, counts)
            } else {
                (0, 0)
            };
            let args = SampleGreedyArgs {
                logits: logits.buf.ptr(),
                v: v as i32,
                out,
                part,
                counts,
            };
            let grid = Grid {
                blocks: (s as u32, parts as u32, 1),
                threads: SAMPLE_THREADS,
            };
            self.launch_with(Kernel::SampleGreedy, grid, &args)?;
            return self.download_sampled(pk);
        }
        let bytes: Vec<u8> = pk.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let input = ensure(
            &self.ctx.dev,
            &mut self.sample.input,
            bytes.len(),
            "sampling parameters",
            &mut self.ctx.generation,
        )?;
        let work = ensure(
            &self.ctx.dev,
            &mut self.sample.work,
            (s * v + s) * 4,
            "sampling workspace",
            &mut self.ctx.generation,
        )?;
        let lse = work + (s * v * 4) as u64;
        if let Some(buf) = &self.sample.input {
            self.ctx.dev.upload(buf, 0, &bytes)?;
        }
        let entries = input + (s * PARAM_WORDS * 4) as u64;
        let vi = v as i32;
        let prep = SamplePrepArgs {
            logits: logits.buf.ptr(),
            v: vi,
            work,
            lse,
        };
        self.launch_with(Kernel::SamplePrep, rows, &prep)?;
        if pk.any_top {
            let args = SampleTopNArgs {
                work,
                lse,
                params: input,
                v: vi,
                rows: s as i32,
                out,
            };
            self.launch_with(Kernel::SampleTopN, rows, &args)?;
        }
        if pk.entries > 0 {
            let grid = Grid {
                blocks: (pk.entries.div_ceil(256) as u32, 1, 1),
                threads: 256,
            };
            let args = SamplePenaltyArgs {
                entries,
                n: pk.entries as i32,
                work,
                v: vi,
            };
            self.launch_with(Kernel::SamplePenalty, grid, &args)?;
        }
        if pk.masked > 0 {
            let mask_rows = entries + (pk.entries * ENTRY_WORDS * 4) as u64;
            let grid = Grid {
                blocks: (pk.masked as u32, 1, 1),
                threads: 256,
            };
            let args = SampleMaskArgs {
                rows: mask_rows,
                masks: mask_rows + (pk.masked * 4) as u64,
                w: pk.mask_words as i32,
                work,
                v: vi,
            };
            self.launch_with(Kernel::SampleMask, grid, &args)?;
        }
        let args = SamplePickArgs {
            logits: logits.buf.ptr(),
            work,
            lse,
            params: input,
            v: vi,
            out,
        };
        self.launch_with(Kernel::SamplePick, rows, &args)?;
        self.download_sampled(pk)
    }

    /// The output words of the sampling kernels.
    fn download_sampled(&mut self, pk: &SamplePack) -> Result<Vec<u32>, BackendError> {
        let mut raw = vec![0u8; pk.out_words() * 4];
        if let Some(buf) = &self.sample.out {
            self.ctx.dev.download(buf, 0, &mut raw)?;
        }
        Ok(raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{Penalties, SamplingParams};

    /// A greedy pass's slices (`ceil(v / parts)` logits each in the kernel) cover the row with
    /// none empty, stay within the cap and the shortest slice, and spread one row of a large
    /// vocabulary wide while a large batch or a short vocabulary keeps one block a row.
    #[test]
    fn greedy_slices_cover_the_row_and_none_is_empty() {
        for v in [1, 7, 2_047, 2_048, 4_097, 32_000, 128_256, 151_936] {
            for rows in [1, 2, 5, 64, 300] {
                for sms in [1, 108, 132] {
                    let p = greedy_parts(rows, v, sms);
                    let chunk = v.div_ceil(p);
                    assert!((1..=GREEDY_MAX_PARTS).contains(&p), "{v} {rows} {sms}: {p}");
                    assert!((p - 1) * chunk < v, "{v} {rows} {sms}: an empty last slice");
                    assert!(
                        p == 1 || chunk >= GREEDY_MIN_SLICE,
                        "{v} {rows} {sms}: {chunk}"
                    );
                }
            }
        }
        assert_eq!(greedy_parts(1, 128_256, 132), 62);
        assert_eq!(greedy_parts(64, 128_256, 132), 4);
        assert_eq!(greedy_parts(300, 128_256, 132), 1);
        assert_eq!(greedy_parts(1, 4_000, 132), 1);
    }

    /// A forced row packs as a greedy pick with one entry, `FORCE_BIAS` on its token, whatever
    /// its parameters' temperature, bias and penalties; its top count stays.
    #[test]
    fn a_forced_row_packs_as_greedy_with_one_bias_entry() {
        let p = SamplingParams {
            temperature: 0.7,
            repetition_penalty: 1.3,
            logit_bias: vec![(3, 5.0)],
            logprobs: Some(4),
            ..SamplingParams::default()
        };
        let history = Penalties::from_history(&p, &[1, 2], &[3]);
        let free = SampleRow {
            params: &p,
            uniform: 0.5,
            penalties: &history,
            mask: None,
            forced: None,
        };
        let forced = SampleRow {
            forced: Some(9),
            ..free
        };
        let mut pk = SamplePack::default();
        pack(&[free, forced], 100, &mut pk).unwrap();
        let row = |i: usize| &pk.words[i * PARAM_WORDS..(i + 1) * PARAM_WORDS];
        assert_eq!(row(0)[0], 0, "the free row draws");
        assert_eq!(
            (row(1)[0], f32::from_bits(row(1)[1]), row(1)[6]),
            (1, 1.0, 4)
        );
        let entries = &pk.words[2 * PARAM_WORDS..2 * PARAM_WORDS + pk.entries * ENTRY_WORDS];
        let of_row_1: Vec<&[u32]> = entries
            .chunks_exact(ENTRY_WORDS)
            .filter(|e| e[0] == 1)
            .collect();
        assert_eq!(
            of_row_1,
            vec![&[1, 9, FORCE_BIAS.to_bits(), 1f32.to_bits(), 0][..]]
        );
        assert!(!pk.plain_greedy);
    }
}
