//! Scheduler tests: chunking, preemption, the prefix cache and prompt logprobs.

use super::*;
use crate::engine::request::Limits;
use crate::sampling::SamplingParams;

fn sched(blocks: usize, budget: usize) -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: budget,
        block_size: 4,
        window: None,
    };
    Scheduler::new(cfg, BlockPool::new(blocks, true))
}

/// A greedy request that never finishes within these tests, with room to stream.
fn seq(id: u64, prompt: Vec<u32>, arrival: u64) -> Sequence {
    seq_with(id, prompt, arrival, SamplingParams::greedy())
}

fn seq_with(id: u64, prompt: Vec<u32>, arrival: u64, params: SamplingParams) -> Sequence {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    std::mem::forget(rx);
    let limits = Limits {
        max_tokens: 1000,
        max_len: 1000,
        stop_ids: vec![],
    };
    let req = LaneRequest::new(params, 0, limits, 1, tx);
    Sequence::new(SeqId(id), prompt, Rc::new(req), 0, (0, arrival), None)
}

/// A request that reports its prompt logprobs.
fn scored(id: u64, prompt: Vec<u32>, arrival: u64) -> Sequence {
    let params = SamplingParams {
        prompt_logprobs: Some(0),
        ..SamplingParams::greedy()
    };
    seq_with(id, prompt, arrival, params)
}

/// Runs one step whose forced rows report `-pos` for the token at `pos`; returns the
/// step and the prompt logprobs reported, as (token, logprob) pairs.
fn run_scored_step(s: &mut Scheduler) -> (Step, Vec<(u32, f32)>) {
    let step = s.schedule().expect("work");
    let rows = s.sample_rows(&step);
    assert_eq!(rows.len(), step.plan.num_logits_rows());
    assert_eq!(rows.len(), step.plan.logits_rows().len());
    assert!(
        rows.len() <= s.cfg.max_num_seqs,
        "the logits scratch holds the step"
    );
    let sampled: Vec<Sampled> = step
        .plan
        .logits_rows()
        .iter()
        .zip(&rows)
        .map(|(&r, row)| Sampled {
            token: row.forced.unwrap_or(99),
            logprob: -(step.plan.positions[r as usize] as f32 + 1.0),
            top: vec![],
        })
        .collect();
    let mut reported = Vec::new();
    for out in s.update(&step, sampled) {
        if let Some((tokens, _)) = out.prompt {
            reported.extend(tokens.iter().map(|t| (t.id, t.logprob)));
        }
    }
    (step, reported)
}

#[test]
fn prompt_logprobs_chunks_fit_the_logits_rows_beside_decodes() {
    let mut s = sched(64, 64);
    s.add(seq(1, vec![1, 2, 3], 0));
    s.add(seq(2, vec![4, 5, 6], 1));
    run_step(&mut s, 7); // both prefilled, decoding from now on
    let prompt: Vec<u32> = (100..130).collect();
    s.add(scored(3, prompt.clone(), 2));
    let mut reported = Vec::new();
    let mut steps = 0;
    while reported.len() < prompt.len() - 1 {
        let (step, got) = run_scored_step(&mut s);
        // Two decode rows, and at most 8 - 2 rows of the prompt.
        assert_eq!(step.plan.seqs.len(), 3);
        assert_eq!(step.plan.every_row_logits, vec![2]);
        assert!(step.plan.seqs[2].q_len <= 6, "{:?}", step.plan.seqs[2]);
        reported.extend(got);
        steps += 1;
    }
    assert_eq!(steps, 5, "29 prompt rows, 6 per step");
    // Token `p + 1` is reported with the logprob of row `p`.
    let want: Vec<(u32, f32)> = (1..prompt.len())
        .map(|i| (prompt[i], -(i as f32)))
        .collect();
    assert_eq!(reported, want);
    let (step, got) = run_scored_step(&mut s);
    assert!(got.is_empty() && step.plan.every_row_logits.is_empty());
}

#[test]
fn a_preempted_prompt_reports_each_logprob_once() {
    let mut s = sched(4, 4);
    s.add(seq(1, vec![1, 2, 3, 4], 0));
    let prompt: Vec<u32> = (50..59).collect();
    s.add(scored(2, prompt.clone(), 1));
    let mut reported = Vec::new();
    for _ in 0..50 {
        if reported.len() == prompt.len() - 1 {
            break;
        }
        reported.extend(run_scored_step(&mut s).1);
        if s.counters.preemptions > 0 {
            s.remove(SeqId(1)); // the decode ends: room for the rest of the prompt
        }
    }
    assert!(s.counters.preemptions > 0, "the pool of 4 blocks preempts");
    let want: Vec<(u32, f32)> = (1..prompt.len())
        .map(|i| (prompt[i], -(i as f32)))
        .collect();
    assert_eq!(reported, want);
}

#[test]
fn prompt_logprobs_take_nothing_from_the_prefix_cache() {
    let mut s = sched(64, 64);
    let prompt: Vec<u32> = (0..13).collect();
    s.add(seq(1, prompt.clone(), 0));
    run_step(&mut s, 1);
    s.remove(SeqId(1));
    s.add(scored(2, prompt.clone(), 1));
    let (step, got) = run_scored_step(&mut s);
    assert_eq!(step.plan.positions[0], 0, "recomputed from the start");
    assert_eq!(
        (step.plan.num_tokens(), got.len()),
        (8, 8),
        "8 logits rows a step"
    );
    let (step, rest) = run_scored_step(&mut s);
    assert_eq!((step.plan.num_tokens(), rest.len()), (5, 4));
    assert_eq!(s.counters.prefix_hits, 0);
}

fn run_step(s: &mut Scheduler, next: u32) -> Step {
    let step = s.schedule().expect("work");
    let rows = s.sample_rows(&step).len();
    let sampled = (0..rows)
        .map(|_| Sampled {
            token: next,
            logprob: 0.0,
            top: vec![],
        })
        .collect();
    assert!(
        s.update(&step, sampled)
            .iter()
            .all(|o| matches!(o.finish, Ok(None)))
    );
    step
}

#[test]
fn chunked_prefill_then_decode_within_budget() {
    let mut s = sched(16, 6);
    s.add(seq(1, (0..10).collect(), 0));
    let a = run_step(&mut s, 99);
    assert_eq!((a.plan.num_tokens(), a.seqs[0].wants_logits), (6, false));
    let b = run_step(&mut s, 99);
    assert_eq!((b.plan.num_tokens(), b.seqs[0].wants_logits), (4, true));
    let c = run_step(&mut s, 99);
    assert_eq!(c.plan.num_tokens(), 1);
    assert_eq!(c.plan.positions, vec![10]);
    s.remove(SeqId(1));
    assert_eq!(s.pool().num_free(), 16);
}

#[test]
fn preempts_newest_when_blocks_run_out() {
    let mut s = sched(4, 64);
    s.add(seq(1, (0..7).collect(), 0));
    s.add(seq(2, (10..17).collect(), 1));
    run_step(&mut s, 5); // both prefilled: 2 blocks each, 8 tokens each now
    run_step(&mut s, 5); // token 8 computed: still 2 blocks each
    assert_eq!((s.num_running(), s.counters.preemptions), (2, 0));
    let step = run_step(&mut s, 5); // seq 1 needs a third block: seq 2 is preempted
    assert_eq!(s.counters.preemptions, 1);
    assert_eq!(
        step.seqs.iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![SeqId(1)]
    );
    assert_eq!(s.num_waiting(), 1);
    s.remove(SeqId(1));
    s.remove(SeqId(2));
    assert_eq!(s.pool().num_free(), 4);
}

#[test]
fn second_request_hits_prefix_cache() {
    let mut s = sched(16, 64);
    s.add(seq(1, (0..9).collect(), 0));
    run_step(&mut s, 1);
    s.remove(SeqId(1));
    s.add(seq(2, (0..9).collect(), 1));
    let step = run_step(&mut s, 1);
    assert_eq!(
        step.plan.num_tokens(),
        1,
        "8 of 9 prompt tokens come from the cache"
    );
    assert_eq!(s.counters.prefix_hits, 8);
}

#[test]
fn blocks_behind_every_layers_window_are_freed_as_a_sequence_advances() {
    // Window 8 over blocks of 4: the next query at position p sees keys p - 7 ..= p, so at
    // most 3 blocks stay live (and one more while a step grows into a new block).
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            block_size: 4,
            window: Some(8),
        },
        BlockPool::new(8, true),
    );
    s.add(seq(1, (0..10).collect(), 0));
    s.add(seq(2, (20..25).collect(), 1));
    let mut max_live = 0;
    for step_no in 0..40 {
        let step = run_step(&mut s, 7);
        for (p, slice) in step.seqs.iter().zip(&step.plan.seqs) {
            let seq = s.get(p.id).expect("running");
            max_live = max_live.max(seq.live_blocks());
            // Every position a query of this step can see has its own block in the table.
            let q0 = slice.ctx_len - slice.q_len;
            let first = (q0 + 1).saturating_sub(8);
            let table = &slice.block_table;
            let live: Vec<u32> = (first / 4..table.len() as u32)
                .map(|b| table[b as usize])
                .collect();
            let mut unique = live.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), live.len(), "step {step_no}: {table:?}");
        }
        assert_eq!(s.counters.preemptions, 0, "step {step_no}");
    }
    // 50 tokens each would need 13 blocks apiece without freeing; the pool has 8 in all.
    assert!(s.get(SeqId(1)).unwrap().tokens.len() >= 50);
    assert!(max_live <= 4, "live blocks {max_live}");
    s.remove(SeqId(1));
    s.remove(SeqId(2));
    assert_eq!(
        s.pool().num_free(),
        8,
        "every block back, none released twice"
    );
}

#[test]
fn without_a_window_every_block_stays() {
    let mut s = sched(16, 64);
    s.add(seq(1, (0..10).collect(), 0));
    for _ in 0..20 {
        run_step(&mut s, 7);
    }
    let seq = s.get(SeqId(1)).unwrap();
    assert_eq!(seq.live_blocks(), seq.tokens.len().div_ceil(4));
}

/// A greedy request whose stream buffer the test controls: `rx` reads (or not) its events.
fn seq_reading(
    id: u64,
    prompt: Vec<u32>,
    arrival: u64,
) -> (
    Sequence,
    tokio::sync::mpsc::Receiver<crate::engine::request::LaneEvent>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(crate::engine::request::step_events(1) + 2);
    let limits = Limits {
        max_tokens: 1000,
        max_len: 1000,
        stop_ids: vec![],
    };
    let req = LaneRequest::new(SamplingParams::greedy(), 0, limits, 1, tx);
    let seq = Sequence::new(SeqId(id), prompt, Rc::new(req), 0, (0, arrival), None);
    (seq, rx)
}

/// Runs a step and sends its outputs' events, as the lane does.
fn run_emitting_step(s: &mut Scheduler, next: u32) -> Step {
    let step = s.schedule().expect("work");
    let rows = s.sample_rows(&step).len();
    let sampled = (0..rows)
        .map(|_| Sampled {
            token: next,
            logprob: 0.0,
            top: vec![],
        })
        .collect();
    for out in s.update(&step, sampled) {
        out.emit();
    }
    step
}

#[test]
fn a_paused_sequence_gives_its_seat_to_a_waiting_one_and_resumes_with_its_output() {
    let cfg = SchedulerConfig {
        max_num_seqs: 1,
        max_num_batched_tokens: 64,
        block_size: 4,
        window: None,
    };
    let mut s = Scheduler::new(cfg, BlockPool::new(16, true));
    let (a, mut a_rx) = seq_reading(1, (0..6).collect(), 0);
    s.add(a);
    // Three tokens fill A's buffer (room for one step is 4 of its 6 events).
    for t in [50, 51, 52] {
        run_emitting_step(&mut s, t);
    }
    assert!(!s.get(SeqId(1)).unwrap().request.has_room(), "A is paused");
    assert!(s.schedule().is_none(), "alone, A only pauses");
    assert_eq!((s.num_running(), s.counters.preemptions), (1, 0));
    s.add(seq(2, (20..26).collect(), 1));
    let step = run_emitting_step(&mut s, 60);
    assert_eq!(
        step.seqs.iter().map(|p| p.id).collect::<Vec<_>>(),
        [SeqId(2)]
    );
    assert_eq!(s.counters.preemptions, 1, "A was shed");
    let a = s.get(SeqId(1)).unwrap();
    assert_eq!((a.output(), a.live_blocks()), (&[50, 51, 52][..], 0));
    // A's client reads; B ends: A is recomputed from its prompt and output, then goes on.
    while a_rx.try_recv().is_ok() {}
    s.remove(SeqId(2));
    let step = run_emitting_step(&mut s, 53);
    assert_eq!(step.seqs[0].id, SeqId(1));
    assert_eq!(
        step.plan.positions.last(),
        Some(&8),
        "recomputes up to its last token"
    );
    assert_eq!(s.get(SeqId(1)).unwrap().output(), &[50, 51, 52, 53]);
    s.remove(SeqId(1));
    assert_eq!(s.pool().num_free(), 16);
}
