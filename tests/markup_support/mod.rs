//! Shared by the tests that need Qwen-style reply markup: `llama-2-tiny-random.gguf` with its
//! vocabulary patched so that `<tool_call>`, `</tool_call>`, `<think>` and `</think>` are added
//! special tokens, and a `chat_template` list with a `tool_use` entry.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use kiln::config::Config;
use kiln::model::{LoadFormat, ModelFiles};
use kiln::tokenizer::Tokenizer;
use serde_json::{Value, json};

use super::api_support::{TestServer, start_with};

/// Ids given to the markup tokens (pieces of the Llama-2 vocabulary that prompts here never use).
pub const TOOL_CALL: u32 = 31990;
pub const THINK_OPEN: u32 = 31992;
pub const THINK_CLOSE: u32 = 31993;
pub const MARKUP: [(u32, &str); 4] = [
    (TOOL_CALL, "<tool_call>"),
    (31991, "</tool_call>"),
    (THINK_OPEN, "<think>"),
    (THINK_CLOSE, "</think>"),
];

/// The default template opens the thinking; the `tool_use` one lists the tools first.
pub const DEFAULT_TEMPLATE: &str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}";
pub const TOOL_USE_TEMPLATE: &str = "Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}. Call one as <tool_call>{json}</tool_call>.\n{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// The fixture's tokenizer with [`MARKUP`] as special added tokens and the two templates.
pub fn patched_tokenizer() -> Tokenizer {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let config = json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": [
            {"name": "default", "template": DEFAULT_TEMPLATE},
            {"name": "tool_use", "template": TOOL_USE_TEMPLATE}]});
        write_patched_tokenizer(&MARKUP, "markup", &config)
    });
    Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .expect("patched tokenizer")
}

/// Writes the fixture's tokenizer with `tokens` (id, text) as special added tokens into a
/// fresh `kiln-api-<tag>-<pid>` folder of the temp dir, with `config` as its
/// `tokenizer_config.json`; returns the folder. The tokens take over their ids: the pieces
/// there leave the vocabulary, with the merges that make or use them.
pub fn write_patched_tokenizer(tokens: &[(u32, &str)], tag: &str, config: &Value) -> PathBuf {
    let base = fixture().tokenizer.expect("a tokenizer");
    let mut hf: Value = serde_json::from_str(&base.hf().to_string(false).unwrap()).unwrap();
    let vocab = hf["model"]["vocab"]
        .as_object_mut()
        .expect("a BPE vocabulary");
    let old: Vec<String> = tokens
        .iter()
        .map(|(id, text)| {
            let piece = vocab
                .iter()
                .find(|(_, v)| v.as_u64() == Some(u64::from(*id)))
                .map(|(k, _)| k.clone())
                .expect("the id is in the vocabulary");
            vocab.remove(&piece);
            vocab.insert(text.to_string(), json!(id));
            piece
        })
        .collect();
    let merges = hf["model"]["merges"].as_array_mut().expect("merges");
    merges.retain(|m| {
        let (a, b) = match m {
            Value::String(s) => s.split_once(' ').unwrap(),
            Value::Array(p) => (p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            _ => unreachable!(),
        };
        let joined = format!("{a}{b}");
        ![a, b, joined.as_str()]
            .iter()
            .any(|p| old.iter().any(|o| o == p))
    });
    let added = hf["added_tokens"].as_array_mut().expect("added_tokens");
    for (id, text) in tokens {
        added.push(
            json!({"id": id, "content": text, "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}),
        );
    }
    let dir = std::env::temp_dir().join(format!("kiln-api-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), hf.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

pub fn fixture() -> ModelFiles {
    let path = kiln::config::project_root().join("../shared/models/llama-2-tiny-random.gguf");
    ModelFiles::open(&path, LoadFormat::Gguf).expect("llama-2-tiny-random.gguf")
}

pub fn start_patched(cfg: Config) -> TestServer {
    let mut files = fixture();
    files.tokenizer = Some(patched_tokenizer());
    start_with(files, cfg)
}
