//! The token-budget scheduler (vLLM v1 style): running sequences first, then chunked
//! prefill of waiting ones; no prefill/decode modes. Out of blocks, it preempts the newest
//! running sequence, which is recomputed later (its cached full blocks usually survive).
//! When every layer of the model attends within a sliding window, the blocks that fall
//! wholly before the window of a sequence's next query are freed as it advances.

use std::collections::VecDeque;
use std::rc::Rc;

use super::FinishReason;
use super::TokenInfo;
use super::blocks::{BlockId, BlockPool};
use super::constraint::Grammar;
use super::pooling::Pooler;
use super::request::{LaneRequest, SeqOutput};
use crate::backend::{BatchPlan, SeqSlice};
use crate::sampling::{Penalties, SampleRow, Sampled, uniform};

/// Identifies one sequence (one choice of one request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// One choice of one request: its tokens, how many of them are in the cache, its limits and
/// the request data it shares with its sibling choices.
#[derive(Debug)]
pub struct Sequence {
    pub id: SeqId,
    /// Prompt followed by generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose KV is in the cache.
    pub num_computed: usize,
    blocks: Vec<BlockId>,
    /// Leading entries of `blocks` already released: every key in them lies before the
    /// window of any query still to come (their ids stay as placeholders).
    dead: usize,
    /// Hash chain of the registered full blocks.
    hashes: Vec<u64>,
    /// Lower runs first.
    pub priority: i32,
    /// Submission order (FCFS within a priority).
    pub arrival: u64,
    /// Wait until this sequence's prompt is computed (n > 1 choices share its blocks).
    pub after: Option<SeqId>,
    /// Index of this choice within its request.
    pub choice: usize,
    pub(crate) request: Rc<LaneRequest>,
    /// Repetition/presence/frequency state, updated per token.
    penalties: Penalties,
    /// The matcher of a constrained choice, advanced per token.
    grammar: Option<Grammar>,
    /// Prompt logprobs still to report (choice 0 of a request that asks for them): how many
    /// prompt rows have been reported (row `r` gives the logprob of prompt token `r + 1`).
    /// `None` once the last was sent, or when not asked. Survives preemption: the rows
    /// reported are not reported again, and only they may come from the prefix cache.
    prompt_lp: Option<usize>,
    /// An embedding's pooling state (its request's `pooling`); it samples nothing.
    pooler: Option<Pooler>,
}

impl Sequence {
    pub(crate) fn new(
        id: SeqId,
        prompt: Vec<u32>,
        request: Rc<LaneRequest>,
        choice: usize,
        (priority, arrival): (i32, u64),
        after: Option<SeqId>,
    ) -> Self {
        let prompt_lp = (choice == 0 && request.params.prompt_logprobs.is_some()).then_some(0);
        Self {
            id,
            prompt_lp,
            pooler: request.pooling.map(Pooler::new),
            prompt_len: prompt.len(),
            penalties: Penalties::new(&request.params, &prompt),
            grammar: request.grammar.clone(),
            tokens: prompt,
            num_computed: 0,
            blocks: Vec::new(),
            dead: 0,
            hashes: Vec::new(),
            priority,
            arrival,
            after,
            choice,
            request,
        }
    }
    /// Generated tokens so far.
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// The block table of a step: a released block's entry repeats the first live block (no
    /// kernel reads keys before the window; the entry stays a valid block).
    fn block_table(&self) -> Vec<u32> {
        let live = self.blocks.get(self.dead).or(self.blocks.last());
        let stand_in = live.map_or(0, |b| b.0);
        (0..self.blocks.len())
            .map(|i| match i < self.dead {
                true => stand_in,
                false => self.blocks[i].0,
            })
            .collect()
    }

    /// Live (not yet released) blocks held.
    pub fn live_blocks(&self) -> usize {
        self.blocks.len() - self.dead
    }

    /// The prompt logprobs of a just computed chunk of `n` tokens whose forced rows gave
    /// `rows` (rows already reported before a preemption are skipped), and whether they are
    /// the last; `None` when this sequence reports none.
    fn report_prompt(&mut self, n: usize, rows: Vec<Sampled>) -> Option<(Vec<TokenInfo>, bool)> {
        let done = self.prompt_lp?;
        let start = self.num_computed - n;
        let new: Vec<TokenInfo> = rows
            .into_iter()
            .enumerate()
            .map(|(r, s)| (start + r, s))
            .filter(|&(pos, _)| pos >= done && pos + 1 < self.prompt_len)
            .map(|(pos, s)| TokenInfo {
                id: self.tokens[pos + 1],
                logprob: s.logprob,
                top: s.top,
            })
            .collect();
        let complete = self.num_computed >= self.prompt_len;
        self.prompt_lp = (!complete).then_some(done + new.len());
        Some((new, complete))
    }

    /// Whether every row of this sequence's next chunk produces logits (prompt logprobs), or
    /// hidden rows to pool (an embedding's mean, or its first token's chunk for CLS).
    fn every_row(&self) -> bool {
        self.prompt_lp
            .is_some_and(|done| done + 1 < self.prompt_len)
            || self.pooler.as_ref().is_some_and(Pooler::every_row)
    }

    /// The sampler's view of this sequence for its next token.
    fn sample_row(&self) -> SampleRow<'_> {
        let r = &self.request;
        SampleRow {
            params: &r.params,
            uniform: uniform(r.seed ^ self.choice as u64, self.output().len() as u64),
            penalties: &self.penalties,
            mask: self.grammar.as_ref().and_then(|g| g.mask()),
            forced: None,
        }
    }

    /// Appends a sampled token and decides whether the choice ends: a stop id, a completed
    /// grammar, its `max_tokens`, or the context length. `Err`: the grammar failed.
    fn push(&mut self, token: u32) -> Result<Option<FinishReason>, String> {
        self.tokens.push(token);
        self.penalties.push(token);
        let l = &self.request.limits;
        let grammar_done = match &mut self.grammar {
            Some(g) => g.consume(token)?,
            None => false,
        };
        Ok(if grammar_done || l.stop_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.output().len() >= l.max_tokens || self.tokens.len() >= l.max_len {
            Some(FinishReason::Length)
        } else {
            None
        })
    }
}

/// Limits of one lane's scheduler.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    /// The sliding window every layer of the model attends within (`None`: some layer sees
    /// the whole context), which lets blocks behind it be freed.
    pub window: Option<usize>,
}

/// Counters for the stats snapshot.
#[derive(Debug, Clone, Copy, Default)]
pub struct SchedulerCounters {
    /// Prompt tokens looked up in the prefix cache / found there.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    pub id: SeqId,
    pub num_tokens: usize,
    /// The chunk reaches the end of the sequence: a token is sampled.
    pub wants_logits: bool,
    /// Every row of the chunk produces logits (prompt logprobs).
    pub every_row: bool,
}

impl Scheduled {
    /// Logits rows of this share of the step.
    fn logits_rows(&self) -> usize {
        if self.every_row {
            self.num_tokens
        } else {
            self.wants_logits as usize
        }
    }
}

/// A step: the plan for the model plus who is in it.
#[derive(Debug, Clone)]
pub struct Step {
    pub plan: BatchPlan,
    pub seqs: Vec<Scheduled>,
}

/// Waiting and running sequences plus the block pool.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    pool: BlockPool,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    pub counters: SchedulerCounters,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, pool: BlockPool) -> Self {
        Self {
            cfg,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: SchedulerCounters::default(),
        }
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Queues a sequence by (priority, arrival).
    pub fn add(&mut self, seq: Sequence) {
        let key = (seq.priority, seq.arrival);
        let at = self
            .waiting
            .iter()
            .position(|s| (s.priority, s.arrival) > key)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(at, seq);
    }

    /// A sequence by id, running or waiting.
    pub fn get(&self, id: SeqId) -> Option<&Sequence> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.id == id)
    }

    /// Every sequence held (running then waiting).
    pub fn sequences(&self) -> impl Iterator<Item = &Sequence> {
        self.running.iter().chain(self.waiting.iter())
    }

    /// Ids of every sequence held (running then waiting).
    pub fn ids(&self) -> Vec<SeqId> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .map(|s| s.id)
            .collect()
    }

    /// Removes a sequence (finish or abort) and frees its blocks. The one release path.
    pub fn remove(&mut self, id: SeqId) -> Option<Sequence> {
        let mut seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else {
            let i = self.waiting.iter().position(|s| s.id == id)?;
            self.waiting.remove(i)?
        };
        self.release(&mut seq);
        Some(seq)
    }

    fn release(&mut self, seq: &mut Sequence) {
        self.pool.release(&seq.blocks[seq.dead..]);
        seq.dead = 0;
        seq.blocks.clear();
        seq.hashes.clear();
        seq.num_computed = 0;
    }

    /// Makes sure `seq` has blocks for `upto` tokens. `false` (and no change) if the pool is short.
    fn grow(pool: &mut BlockPool, seq: &mut Sequence, upto: usize, bs: usize) -> bool {
        let need = upto.div_ceil(bs).saturating_sub(seq.blocks.len());
        if need == 0 {
            return true;
        }
        match pool.allocate(need) {
            Some(b) => {
                seq.blocks.extend(b);
                true
            }
            None => false,
        }
    }

    fn ready(&self, seq: &Sequence) -> bool {
        match seq.after {
            None => true,
            Some(p) => match self.get(p) {
                None => true,
                Some(parent) => parent.num_computed >= parent.prompt_len,
            },
        }
    }

    /// Picks the next step's work, or `None` when there is nothing to run. Sequences whose
    /// stream buffer is full sit the step out until their client reads; running ones keep
    /// their blocks unless others wait for a seat or for blocks ([`Scheduler::shed_paused`]),
    /// and are the first preempted when a running sequence needs a block. A step has at most `max_num_seqs` logits rows (the model's logits
    /// scratch): a prompt-logprobs chunk, whose every row produces logits, is cut to fit
    /// beside one row for each other running sequence.
    pub fn schedule(&mut self) -> Option<Step> {
        self.shed_paused();
        let bs = self.cfg.block_size;
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut rows_left = self.cfg.max_num_seqs;
        let mut picked: Vec<Scheduled> = Vec::new();
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if !self.running[i].request.has_room() {
                i += 1;
                continue;
            }
            let (computed, len) = (self.running[i].num_computed, self.running[i].tokens.len());
            let every_row = self.running[i].every_row();
            let mut n = (len - computed).min(budget);
            if every_row {
                // Keep one row for each later running sequence.
                n = n.min(rows_left.saturating_sub(self.running.len() - i - 1));
                if n == 0 {
                    i += 1;
                    continue;
                }
            }
            let mut fits = Self::grow(&mut self.pool, &mut self.running[i], computed + n, bs);
            while !fits && self.running.len() > i + 1 {
                // A paused sequence (never in `picked`) goes before the newest running one.
                let at = (0..self.running.len())
                    .rev()
                    .find(|&j| j != i && !self.running[j].request.has_room())
                    .unwrap_or(self.running.len() - 1);
                let victim = self.running.remove(at);
                i -= (at < i) as usize;
                self.preempt(victim);
                preempted = true;
                fits = Self::grow(&mut self.pool, &mut self.running[i], computed + n, bs);
            }
            if !fits {
                let me = self.running.remove(i);
                self.preempt(me);
                preempted = true;
                break;
            }
            let p = Scheduled {
                id: self.running[i].id,
                num_tokens: n,
                wants_logits: computed + n == len,
                every_row,
            };
            rows_left = rows_left.saturating_sub(p.logits_rows());
            picked.push(p);
            budget -= n;
            i += 1;
        }
        if !preempted {
            self.admit_waiting(&mut budget, &mut rows_left, &mut picked);
        }
        (!picked.is_empty()).then(|| self.build_step(picked))
    }

    /// Sends the running sequences whose stream buffer is full (their clients stopped
    /// reading) back to the waiting queue while a sequence that could run waits for a seat or
    /// for blocks: a paused stream holds neither. Like a preempted sequence, a shed one keeps
    /// its output (and the events already in its buffer), leaves its full blocks in the prefix
    /// cache and is recomputed from prompt and output once its client reads again; the stall
    /// timeout still aborts it.
    fn shed_paused(&mut self) {
        if self.running.iter().all(|s| s.request.has_room()) {
            return;
        }
        let Some(next) = self
            .waiting
            .iter()
            .find(|s| s.request.has_room() && self.ready(s))
        else {
            return;
        };
        let first_chunk =
            (next.tokens.len() - next.num_computed).min(self.cfg.max_num_batched_tokens);
        let short_of_blocks = first_chunk.div_ceil(self.cfg.block_size) > self.pool.num_free();
        if self.running.len() < self.cfg.max_num_seqs && !short_of_blocks {
            return;
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].request.has_room() {
                i += 1;
            } else {
                let seq = self.running.remove(i);
                self.preempt(seq);
            }
        }
    }

    fn preempt(&mut self, mut seq: Sequence) {
        self.counters.preemptions += 1;
        self.release(&mut seq);
        self.add(seq);
    }

    fn admit_waiting(
        &mut self,
        budget: &mut usize,
        rows_left: &mut usize,
        picked: &mut Vec<Scheduled>,
    ) {
        let bs = self.cfg.block_size;
        let mut w = 0;
        while w < self.waiting.len()
            && *budget > 0
            && *rows_left > 0
            && self.running.len() < self.cfg.max_num_seqs
        {
            if !self.ready(&self.waiting[w]) || !self.waiting[w].request.has_room() {
                w += 1;
                continue;
            }
            let mut seq = self.waiting.remove(w).expect("index checked");
            if seq.blocks.is_empty() {
                // Keep at least one token to compute so the step yields logits; a sequence
                // reporting prompt logprobs computes every prompt row not yet reported.
                let keep = match (seq.prompt_lp, &seq.pooler) {
                    (Some(done), _) => done.min(seq.tokens.len() - 1),
                    (None, Some(p)) => p.cacheable(seq.tokens.len()),
                    (None, None) => seq.tokens.len() - 1,
                };
                let (blocks, hashes) = self.pool.take_cached_prefix(&seq.tokens[..keep], bs);
                self.counters.prefix_queries += seq.tokens.len() as u64;
                self.counters.prefix_hits += (blocks.len() * bs) as u64;
                seq.num_computed = blocks.len() * bs;
                seq.blocks = blocks;
                seq.hashes = hashes;
            }
            let every_row = seq.every_row();
            let mut n = (seq.tokens.len() - seq.num_computed).min(*budget);
            if every_row {
                n = n.min(*rows_left);
            }
            let upto = seq.num_computed + n;
            if !Self::grow(&mut self.pool, &mut seq, upto, bs) {
                self.release(&mut seq);
                self.waiting.insert(w, seq);
                break;
            }
            let p = Scheduled {
                id: seq.id,
                num_tokens: n,
                wants_logits: seq.num_computed + n == seq.tokens.len(),
                every_row,
            };
            *rows_left = rows_left.saturating_sub(p.logits_rows());
            picked.push(p);
            *budget -= n;
            self.running.push(seq);
        }
    }

    fn build_step(&self, picked: Vec<Scheduled>) -> Step {
        let bs = self.cfg.block_size;
        let mut plan = BatchPlan {
            block_size: bs as u32,
            ..Default::default()
        };
        for (i, p) in picked.iter().enumerate() {
            let s = self.running_seq(p.id);
            if p.every_row {
                plan.every_row_logits.push(i as u32);
            }
            plan.seqs.push(SeqSlice {
                q_start: plan.token_ids.len() as u32,
                q_len: p.num_tokens as u32,
                ctx_len: (s.num_computed + p.num_tokens) as u32,
                block_table: s.block_table(),
                wants_logits: p.wants_logits,
            });
            plan.token_ids
                .extend_from_slice(&s.tokens[s.num_computed..s.num_computed + p.num_tokens]);
        }
        plan.fill_positions_and_slots();
        Step { plan, seqs: picked }
    }

    /// Running sequences, in scheduling order.
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    fn running_seq(&self, id: SeqId) -> &Sequence {
        self.running
            .iter()
            .find(|s| s.id == id)
            .expect("a scheduled sequence runs until the step is updated")
    }

    /// The grammars of the step's constrained sequences that sample a token, whose masks
    /// the step needs.
    pub(crate) fn grammars_to_mask(&mut self, step: &Step) -> Vec<&mut Grammar> {
        let sampling: Vec<SeqId> = step
            .seqs
            .iter()
            .filter(|p| p.wants_logits)
            .map(|p| p.id)
            .collect();
        self.running
            .iter_mut()
            .filter(|s| sampling.contains(&s.id))
            .filter_map(|s| s.grammar.as_mut())
            .collect()
    }

    /// The sampler rows of a step, one per logits row ([`BatchPlan::logits_rows`]): a
    /// sampled row per sequence that wants logits; each prompt row of a prompt-logprobs
    /// chunk is a row forced to the next prompt token.
    pub fn sample_rows(&self, step: &Step) -> Vec<SampleRow<'_>> {
        let mut rows = Vec::with_capacity(step.plan.num_logits_rows());
        for p in &step.seqs {
            let s = self.running_seq(p.id);
            if s.pooler.is_some() {
                // An embedding's rows are pooled, not sampled: each is a forced row.
                let params = &s.request.prompt_params;
                rows.extend((0..p.logits_rows()).map(|_| SampleRow::forced(params, 0)));
                continue;
            }
            if p.every_row {
                let (from, to) = (s.num_computed, s.num_computed + p.num_tokens);
                let last = if p.wants_logits { to - 1 } else { to };
                let params = &s.request.prompt_params;
                rows.extend((from..last).map(|pos| SampleRow::forced(params, s.tokens[pos + 1])));
            }
            if p.wants_logits {
                rows.push(s.sample_row());
            }
        }
        rows
    }

    /// Whether the step holds an embedding, whose hidden rows [`Scheduler::pool_hidden`] needs.
    pub fn wants_hidden(&self, step: &Step) -> bool {
        step.seqs
            .iter()
            .any(|p| self.running_seq(p.id).pooler.is_some())
    }

    /// Pools the hidden rows of a computed step's embeddings, before [`Scheduler::update`]:
    /// `hidden` holds the final-norm rows of the step's logits rows in order
    /// ([`BatchPlan::logits_rows`]), `width` values each.
    pub fn pool_hidden(&mut self, step: &Step, hidden: &[f32], width: usize) {
        let mut row = 0;
        for p in &step.seqs {
            let k = p.logits_rows();
            let Some(s) = self.running.iter_mut().find(|s| s.id == p.id) else {
                row += k;
                continue;
            };
            // The step's first row sits at `num_computed`; a single row is the chunk's last.
            let first = match p.every_row {
                true => s.num_computed,
                false => s.num_computed + p.num_tokens - 1,
            };
            if let (Some(pl), Some(rows)) = (
                s.pooler.as_mut(),
                hidden.get(row * width..(row + k) * width),
            ) {
                pl.take(first, rows, width);
            }
            row += k;
        }
    }

    /// Applies a computed step (vLLM's `update_from_output`): marks its tokens as computed,
    /// registers newly full blocks, reports prompt logprobs, appends the sampled tokens (one
    /// per row of [`Scheduler::sample_rows`], in order) and decides every finish the token
    /// ids decide. Finished sequences are removed and their blocks freed.
    pub(crate) fn update(&mut self, step: &Step, sampled: Vec<Sampled>) -> Vec<SeqOutput> {
        self.on_computed(step);
        let mut results = sampled.into_iter();
        let mut outputs = Vec::with_capacity(step.seqs.len());
        for p in &step.seqs {
            let mut mine: Vec<Sampled> = results.by_ref().take(p.logits_rows()).collect();
            let token = if p.wants_logits { mine.pop() } else { None };
            let Some(seq) = self.running.iter_mut().find(|s| s.id == p.id) else {
                continue;
            };
            let prompt = seq.report_prompt(p.num_tokens, mine);
            let (mut finish, mut stop_token) = (Ok(None), false);
            let mut embedding = None;
            let sampled = match token {
                // An embedding's last chunk: its pooled vector is its output.
                Some(_) if seq.pooler.is_some() => {
                    embedding = seq.pooler.as_ref().map(|pl| pl.finish(seq.prompt_len));
                    finish = Ok(Some(FinishReason::Stop));
                    None
                }
                // `max_tokens` 0: the prompt was all there was to compute.
                Some(_) if seq.request.limits.max_tokens == 0 => {
                    finish = Ok(Some(FinishReason::Length));
                    None
                }
                Some(s) => {
                    finish = seq.push(s.token);
                    stop_token = seq.request.limits.stop_ids.contains(&s.token);
                    Some(s)
                }
                None => None,
            };
            let ends = !matches!(finish, Ok(None));
            if prompt.is_some() || sampled.is_some() || ends {
                outputs.push(SeqOutput {
                    choice: seq.choice,
                    request: seq.request.clone(),
                    prompt,
                    sampled,
                    finish,
                    stop_token,
                    embedding,
                });
            }
            if ends {
                self.remove(p.id);
            }
        }
        outputs
    }

    /// Marks a step's tokens as computed, registers newly full blocks in the prefix cache,
    /// and frees the blocks that fell behind the window of every query still to come.
    fn on_computed(&mut self, step: &Step) {
        let bs = self.cfg.block_size;
        let window = self.cfg.window;
        for p in &step.seqs {
            let Some(s) = self.running.iter_mut().find(|s| s.id == p.id) else {
                continue;
            };
            s.num_computed += p.num_tokens;
            let full = s.num_computed / bs;
            while s.hashes.len() < full {
                let b = s.hashes.len();
                let parent = s.hashes.last().copied().unwrap_or(0);
                let h =
                    self.pool
                        .register_full(s.blocks[b], parent, &s.tokens[b * bs..(b + 1) * bs]);
                s.hashes.push(h);
            }
            if let Some(w) = window {
                // The next query sits at `num_computed`; it and every later one see keys
                // from `num_computed + 1 - w` on. Registered blocks go to the prefix cache.
                let first = (s.num_computed + 1).saturating_sub(w);
                let dead = (first / bs).min(s.hashes.len());
                if dead > s.dead {
                    self.pool.release(&s.blocks[s.dead..dead]);
                    s.dead = dead;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
