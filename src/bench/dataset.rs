//! Workloads: random prompts of exact token lengths, ShareGPT conversations, fixed prompts.

use std::path::PathBuf;
use std::str::FromStr;

use futures_util::{StreamExt, TryStreamExt, stream};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use super::error::BenchError;
use crate::tokenizer::Tokenizer;

/// Token counting requests in flight while a workload is built against a server.
const COUNT_CONCURRENCY: usize = 16;
/// ShareGPT filters (as in vLLM's benchmark): shorter prompts or replies are skipped...
const SHAREGPT_MIN_LEN: usize = 4;
/// ...and so are longer prompts...
const SHAREGPT_MAX_PROMPT: usize = 1024;
/// ...and prompts plus replies past this.
const SHAREGPT_MAX_TOTAL: usize = 2048;
/// Rounds of recounting a random prompt after its first draft.
const FIX_ROUNDS: usize = 6;

/// A token length or an inclusive range of them: `N` or `MIN..MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LenRange {
    /// Shortest, at least 1.
    pub min: usize,
    /// Longest, at least `min`.
    pub max: usize,
}

impl LenRange {
    /// Exactly `n`.
    pub fn exact(n: usize) -> Self {
        Self { min: n, max: n }
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> usize {
        rng.random_range(self.min..=self.max)
    }
}

impl FromStr for LenRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("'{s}' is not N or MIN..MAX"))
        };
        let r = match s.split_once("..") {
            Some((a, b)) => Self {
                min: num(a)?,
                max: num(b.trim_start_matches('='))?,
            },
            None => Self::exact(num(s)?),
        };
        if r.min == 0 || r.min > r.max {
            return Err(format!("'{s}': lengths must be at least 1 and MIN <= MAX"));
        }
        Ok(r)
    }
}

/// Which workload to build.
#[derive(Debug, Clone)]
pub enum DatasetSpec {
    /// Prompts of random words, token-exact in `input` (counted with the tokenizer, BOS included).
    Random { input: LenRange, output: LenRange },
    /// The first human turn of each conversation as prompt; `output` or the reply's length.
    ShareGpt {
        path: PathBuf,
        output: Option<LenRange>,
    },
    /// These prompts in turn.
    Fixed {
        prompts: Vec<String>,
        output: LenRange,
    },
}

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub prompt: String,
    /// Prompt tokens as the workload's tokenizer counts them (BOS included), if counted.
    pub prompt_len: Option<usize>,
    /// `max_tokens` to ask for.
    pub output_len: usize,
}

/// Counts prompt tokens as the server will: a local tokenizer, or the server's `/tokenize`.
#[derive(Clone)]
pub enum TokenCounter {
    /// Encodes with the model's BOS default, as Kiln does for a text prompt.
    Local(Tokenizer),
    /// `POST {base_url}/tokenize {"prompt", "model"}` → `{"count"}`.
    Server {
        http: reqwest::Client,
        base_url: String,
        model: String,
        api_key: Option<String>,
    },
}

impl TokenCounter {
    /// Tokens of `text` as a prompt.
    pub async fn count(&self, text: &str) -> Result<usize, BenchError> {
        match self {
            TokenCounter::Local(t) => t
                .encode(text, t.add_bos_default())
                .map(|v| v.len())
                .map_err(|e| BenchError::Tokenizer(e.to_string())),
            TokenCounter::Server {
                http,
                base_url,
                model,
                api_key,
            } => {
                let url = format!("{base_url}/tokenize");
                let fail = |message: String| BenchError::Server {
                    url: url.clone(),
                    message,
                };
                let mut req = http
                    .post(&url)
                    .json(&serde_json::json!({"prompt": text, "model": model}));
                if let Some(k) = api_key {
                    req = req.bearer_auth(k);
                }
                let res = req.send().await.map_err(|e| fail(e.to_string()))?;
                let status = res.status();
                let body = res.text().await.map_err(|e| fail(e.to_string()))?;
                if !status.is_success() {
                    let head: String = body.chars().take(200).collect();
                    return Err(fail(format!(
                        "{status}: {head} (pass --tokenizer PATH to count locally)"
                    )));
                }
                let v: Value =
                    serde_json::from_str(&body).map_err(|e| fail(format!("bad JSON: {e}")))?;
                match (
                    v.get("count").and_then(Value::as_u64),
                    v.get("tokens").and_then(Value::as_array),
                ) {
                    (Some(n), _) => Ok(n as usize),
                    (None, Some(t)) => Ok(t.len()),
                    _ => Err(fail("the response has neither `count` nor `tokens`".into())),
                }
            }
        }
    }
}

/// Builds `n` samples. `counter` is required by `Random` and `ShareGpt`; the same `seed` and
/// tokenizer give the same workload.
pub async fn build(
    spec: &DatasetSpec,
    n: usize,
    seed: u64,
    counter: Option<&TokenCounter>,
) -> Result<Vec<Sample>, BenchError> {
    let need_counter = || {
        counter.ok_or_else(|| {
            BenchError::Tokenizer("this dataset needs a tokenizer: pass --tokenizer PATH".into())
        })
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    match spec {
        DatasetSpec::Random { input, output } => {
            random(need_counter()?, n, *input, *output, &mut rng).await
        }
        DatasetSpec::ShareGpt { path, output } => {
            sharegpt(need_counter()?, path, n, *output, &mut rng).await
        }
        DatasetSpec::Fixed { prompts, output } => {
            if prompts.is_empty() {
                return Err(BenchError::Invalid {
                    flag: "--prompt",
                    message: "the fixed dataset needs a --prompt".into(),
                });
            }
            // Counting is best-effort here: a server without /tokenize still gets fixed prompts.
            let mut lens = Vec::with_capacity(prompts.len());
            for p in prompts {
                lens.push(match counter {
                    Some(c) => c.count(p).await.ok(),
                    None => None,
                });
            }
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                out.push(Sample {
                    prompt: prompts[i % prompts.len()].clone(),
                    prompt_len: lens[i % prompts.len()],
                    output_len: output.sample(&mut rng),
                });
            }
            Ok(out)
        }
    }
}

/// Random token-id prompts for a model without a tokenizer (e.g. dummy weights offline):
/// lengths exact by construction, ids uniform over the vocabulary. The samples' text is empty.
pub fn random_token_ids(
    n: usize,
    input: LenRange,
    output: LenRange,
    seed: u64,
    vocab_size: usize,
) -> (Vec<Sample>, Vec<Vec<u32>>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let top = u32::try_from(vocab_size).unwrap_or(u32::MAX).max(1);
    (0..n)
        .map(|_| {
            let len = input.sample(&mut rng);
            let ids: Vec<u32> = (0..len).map(|_| rng.random_range(0..top)).collect();
            let sample = Sample {
                prompt: String::new(),
                prompt_len: Some(len),
                output_len: output.sample(&mut rng),
            };
            (sample, ids)
        })
        .unzip()
}

/// Words of random prompts (TinyStories-like, so small story models see familiar text).
const WORDS: &[&str] = &[
    "the", "a", "and", "to", "was", "he", "she", "it", "they", "his", "her", "in", "on", "with",
    "of", "day", "one", "little", "big", "girl", "boy", "dog", "cat", "bird", "tree", "park",
    "ball", "toy", "house", "sun", "sky", "happy", "sad", "friend", "mom", "dad", "play", "played",
    "run", "ran", "saw", "looked", "said", "wanted", "went", "found", "very", "so", "but", "then",
    "up", "down", "time", "together", "every", "fun", "nice", "red", "blue", "green", "car", "box",
    "cake", "water", "fish", "flower", "garden", "school", "book", "smile", "laugh", "jump",
    "sing", "help", "share", "kind", "brave", "small", "funny", "slowly", "quickly", "home",
    "room", "bed", "night", "morning", "rain", "snow", "hill", "river", "boat", "bear", "lion",
    "bunny", "duck", "frog", "tiny", "shiny", "soft", "warm", "cold", "new", "old", "good", "best",
    "love", "hug", "idea", "story",
];
/// The first word of every random prompt; per-word costs are measured after it.
const ANCHOR: &str = "Once";

/// Token cost of each word when it follows another word (leading space included).
struct WordTable {
    anchor_cost: usize,
    /// Ascending by cost.
    words: Vec<(&'static str, usize)>,
}

impl WordTable {
    async fn measure(counter: &TokenCounter) -> Result<Self, BenchError> {
        let anchor_cost = counter.count(ANCHOR).await?;
        let costs: Vec<usize> = stream::iter(WORDS.iter())
            .map(|w| async move { counter.count(&format!("{ANCHOR} {w}")).await })
            .buffered(COUNT_CONCURRENCY)
            .try_collect()
            .await?;
        let mut words: Vec<_> = WORDS
            .iter()
            .zip(costs)
            .filter(|(_, c)| *c > anchor_cost)
            .map(|(w, c)| (*w, c - anchor_cost))
            .collect();
        words.sort_by_key(|&(_, c)| c);
        if words.is_empty() {
            return Err(BenchError::Tokenizer(
                "no word adds tokens to a prompt; is this a tokenizer?".into(),
            ));
        }
        Ok(Self { anchor_cost, words })
    }

    /// Appends random words costing `need` tokens in all, or as close below as the table allows.
    fn fill(&self, picked: &mut Vec<usize>, mut need: usize, rng: &mut ChaCha8Rng) {
        while need > 0 {
            let affordable = self.words.partition_point(|&(_, c)| c <= need);
            if affordable == 0 {
                break;
            }
            let mut i = rng.random_range(0..self.words.len());
            if self.words[i].1 > need {
                i = rng.random_range(0..affordable);
            }
            picked.push(i);
            need -= self.words[i].1;
        }
    }

    fn text(&self, picked: &[usize]) -> String {
        let mut s = ANCHOR.to_string();
        for &i in picked {
            s.push(' ');
            s.push_str(self.words[i].0);
        }
        s
    }

    /// A prompt of `target` tokens (by the counter), or the closest found in a few rounds.
    async fn prompt(
        &self,
        counter: &TokenCounter,
        target: usize,
        seed: u64,
    ) -> Result<(String, usize), BenchError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut picked = Vec::new();
        self.fill(
            &mut picked,
            target.saturating_sub(self.anchor_cost),
            &mut rng,
        );
        let mut text = self.text(&picked);
        let mut count = counter.count(&text).await?;
        for _ in 0..FIX_ROUNDS {
            if count == target {
                break;
            }
            let mut need = target.saturating_sub(count);
            if count > target {
                let mut dropped = 0;
                while dropped < count - target {
                    let Some(i) = picked.pop() else { break };
                    dropped += self.words[i].1;
                }
                need = dropped.saturating_sub(count - target);
            }
            self.fill(&mut picked, need, &mut rng);
            text = self.text(&picked);
            count = counter.count(&text).await?;
        }
        Ok((text, count))
    }
}

async fn random(
    counter: &TokenCounter,
    n: usize,
    input: LenRange,
    output: LenRange,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<Sample>, BenchError> {
    let table = WordTable::measure(counter).await?;
    let plan: Vec<(usize, usize, u64)> = (0..n)
        .map(|_| (input.sample(rng), output.sample(rng), rng.random::<u64>()))
        .collect();
    let table = &table;
    stream::iter(plan)
        .map(|(input_len, output_len, seed)| async move {
            let (prompt, len) = table.prompt(counter, input_len, seed).await?;
            Ok(Sample {
                prompt,
                prompt_len: Some(len),
                output_len,
            })
        })
        .buffered(COUNT_CONCURRENCY)
        .try_collect()
        .await
}

/// The first two turns of a ShareGPT entry: `{"conversations": [{"from", "value"}, ...]}`.
fn first_exchange(entry: &Value) -> Option<(String, String)> {
    let turns = entry
        .get("conversations")
        .or_else(|| entry.get("conversation"))?
        .as_array()?;
    let text = |t: &Value| {
        t.get("value")
            .or_else(|| t.get("content"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Some((text(turns.first()?)?, text(turns.get(1)?)?))
}

async fn sharegpt(
    counter: &TokenCounter,
    path: &PathBuf,
    n: usize,
    output: Option<LenRange>,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<Sample>, BenchError> {
    let bad = |message: String| BenchError::Dataset {
        path: path.clone(),
        message,
    };
    let raw = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let entries: Vec<Value> =
        serde_json::from_slice(&raw).map_err(|e| bad(format!("not a JSON array: {e}")))?;
    drop(raw);
    let mut pairs: Vec<(String, String)> = entries.iter().filter_map(first_exchange).collect();
    drop(entries);
    pairs.shuffle(rng);
    let overhead = counter.count("").await.unwrap_or(0);
    let lens: Vec<usize> = output
        .map(|o| (0..n).map(|_| o.sample(rng)).collect())
        .unwrap_or_default();
    let mut out: Vec<Sample> = Vec::with_capacity(n);
    for batch in pairs.chunks(COUNT_CONCURRENCY * 4) {
        if out.len() >= n {
            break;
        }
        let counted: Vec<(usize, Option<usize>)> = stream::iter(batch)
            .map(|(p, c)| async move {
                let pl = counter.count(p).await?;
                let cl = if output.is_some() {
                    None
                } else {
                    Some(counter.count(c).await?.saturating_sub(overhead))
                };
                Ok::<_, BenchError>((pl, cl))
            })
            .buffered(COUNT_CONCURRENCY)
            .try_collect()
            .await?;
        for ((prompt, _), (pl, cl)) in batch.iter().zip(counted) {
            let ol = cl.unwrap_or_else(|| lens.get(out.len()).copied().unwrap_or(1));
            let keep = out.len() < n
                && (cl.is_none() || (pl >= SHAREGPT_MIN_LEN && ol >= SHAREGPT_MIN_LEN))
                && pl <= SHAREGPT_MAX_PROMPT
                && (cl.is_none() || pl + ol <= SHAREGPT_MAX_TOTAL);
            if keep {
                out.push(Sample {
                    prompt: prompt.clone(),
                    prompt_len: Some(pl),
                    output_len: ol,
                });
            }
        }
    }
    if out.is_empty() {
        return Err(bad(
            "no conversation with two turns within the length limits".into(),
        ));
    }
    if out.len() < n {
        tracing::warn!(
            usable = out.len(),
            wanted = n,
            "ShareGPT file has too few usable conversations; repeating them"
        );
        let have = out.len();
        for i in have..n {
            out.push(out[i % have].clone());
        }
    }
    Ok(out)
}
