//! Tokenizer tests against llama.cpp's expected tokenizations and the real fixture vocabularies.

use std::path::{Path, PathBuf};

use kiln::model::gguf::GgufFile;
use kiln::tokenizer::{
    GgufVocab, IncrementalDecoder, PreTokenizer, TokenType, Tokenizer, TokenizerError, VocabModel,
};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models")
}

fn gguf_tokenizer(rel: &str) -> Tokenizer {
    let file = GgufFile::open(&models().join(rel)).expect("open GGUF fixture");
    Tokenizer::from_gguf(&file).expect("build tokenizer from GGUF")
}

fn llama3_tokenizer() -> Tokenizer {
    let dir = models().join("tokenizers/llama3.2");
    Tokenizer::from_gpt2_files(
        &dir.join("encoder.json"),
        &dir.join("vocab.bpe"),
        PreTokenizer::Llama3,
    )
    .expect("load llama3.2 encoder.json + vocab.bpe")
}

fn stories_hf() -> Tokenizer {
    let dir = models().join("stories260K-hf");
    Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .expect("load stories260K-hf tokenizer")
}

/// llama.cpp's test vectors: `.inp` holds the strings, each followed by a line
/// `__ggml_vocab_test__`; `.out` holds one line of space-separated ids per string.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = models().join("vocab");
    let inp = std::fs::read_to_string(dir.join(format!("{name}.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(texts.pop(), Some(""), "the .inp file ends with a separator");
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), 46);
    assert_eq!(texts.len(), ids.len());
    texts.into_iter().map(str::to_owned).zip(ids).collect()
}

/// Every string encodes (without BOS) to llama.cpp's ids, and decodes back to itself.
///
/// For SentencePiece vocabularies the encoder adds a dummy-prefix `▁` and the decoder strips
/// one leading space, the way llama.cpp's detokenizer does; so the round trip is exact there
/// too, including for inputs that themselves start with spaces.
fn assert_matches_llama_cpp(tok: &Tokenizer, name: &str) {
    let cases = cases(name);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
            continue;
        }
        let back = tok.decode(&got, false).unwrap();
        if &back != text {
            failures.push(format!("{text:?}: decodes to {back:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {}/{} strings differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn llama_spm_gguf_matches_llama_cpp() {
    let tok = gguf_tokenizer("vocab/ggml-vocab-llama-spm.gguf");
    assert_matches_llama_cpp(&tok, "ggml-vocab-llama-spm.gguf");
    assert_eq!(tok.vocab_size(), 32000);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_ids(), &[2]);
    assert!(tok.add_bos_default());
    assert_eq!(
        tok.encode("Hello world", true).unwrap(),
        vec![1, 15043, 3186]
    );
    assert_eq!(tok.id_to_piece(15043).as_deref(), Some("▁Hello"));
    assert_eq!(tok.id_to_piece(13).as_deref(), Some("<0x0A>"));
    assert_eq!(tok.token_to_id("</s>"), Some(2));
    assert!(tok.is_special(1) && tok.is_special(2));
    assert!(!tok.is_special(15043) && !tok.is_special(13));
}

#[test]
fn llama2_model_file_has_the_same_vocab() {
    let tok = gguf_tokenizer("llama-2-tiny-random.gguf");
    assert_matches_llama_cpp(&tok, "ggml-vocab-llama-spm.gguf");
    assert!(
        tok.add_bos_default(),
        "SentencePiece default without the key"
    );
}

#[test]
fn gpt2_gguf_matches_llama_cpp() {
    let tok = gguf_tokenizer("vocab/ggml-vocab-gpt-2.gguf");
    assert_matches_llama_cpp(&tok, "ggml-vocab-gpt-2.gguf");
    assert_eq!(tok.vocab_size(), 50257);
    assert_eq!(tok.bos_id(), Some(50256));
    assert_eq!(tok.eos_ids(), &[50256]);
    assert!(
        !tok.add_bos_default(),
        "byte-level BPE default without the key"
    );
    assert!(tok.is_special(50256));
    assert_eq!(
        tok.encode("a<|endoftext|>b", false).unwrap(),
        vec![64, 50256, 65]
    );
    assert_eq!(tok.decode(&[64, 50256, 65], true).unwrap(), "ab");
}

#[test]
fn llama3_files_match_llama_cpp() {
    let tok = llama3_tokenizer();
    assert_matches_llama_cpp(&tok, "ggml-vocab-llama-bpe.gguf");
    assert_eq!(tok.vocab_size(), 128000);
    assert_eq!(tok.bos_id(), None);
}

#[test]
fn special_tokens_in_text_are_parsed() {
    let tok = gguf_tokenizer("vocab/ggml-vocab-llama-spm.gguf");
    // As llama.cpp: text after a special token gets the dummy prefix again.
    let ids = tok.encode("<s>Hello</s>", false).unwrap();
    assert_eq!(ids, vec![1, 15043, 2]);
    assert_eq!(tok.decode(&ids, true).unwrap(), "Hello");
    assert_eq!(tok.decode(&ids, false).unwrap(), "<s> Hello</s>");
}

#[test]
fn stories260k_hf_and_gguf_tokenize_alike() {
    let gguf = gguf_tokenizer("stories260K.gguf");
    let hf = stories_hf();
    assert_eq!(gguf.vocab_size(), 512);
    assert_eq!(hf.vocab_size(), 512);
    for tok in [&gguf, &hf] {
        assert_eq!(tok.bos_id(), Some(1));
        assert_eq!(tok.eos_ids(), &[2]);
        assert!(tok.add_bos_default());
        assert!(tok.is_special(0) && tok.is_special(1) && tok.is_special(2));
    }
    let extra = [
        "Once upon a time, there was a little girl named Lily.",
        "She liked to play outside in the sun!",
        "  two leading spaces and trailing  ",
        "<s>Tom said \"hi\".</s> And then <unk> left.",
        "tab\there\r\nCRLF",
        "Ünïcödé ñ 日本語 🤖👍🏽",
        "1234567890 + 3.14159 = π?",
        "a",
        "",
    ];
    let texts = cases("ggml-vocab-llama-spm.gguf")
        .into_iter()
        .map(|(t, _)| t)
        .chain(extra.iter().map(|s| s.to_string()));
    for text in texts {
        for add_bos in [false, true] {
            let a = gguf.encode(&text, add_bos).unwrap();
            let b = hf.encode(&text, add_bos).unwrap();
            assert_eq!(a, b, "{text:?} (add_bos {add_bos})");
            assert_eq!(
                gguf.decode(&a, false).unwrap(),
                hf.decode(&b, false).unwrap()
            );
        }
        if !text.contains('<') {
            let ids = gguf.encode(&text, true).unwrap();
            assert_eq!(gguf.decode(&ids, true).unwrap(), text);
        }
    }
}

/// Streams `ids` one by one; checks every emitted piece is free of U+FFFD (`valid` input) and
/// that the text emitted so far is always a prefix of the full decode.
fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool, valid: bool) -> Vec<String> {
    let full = tok.decode(ids, skip_special).unwrap();
    let mut dec = IncrementalDecoder::new(tok, skip_special);
    let mut pieces = Vec::new();
    let mut so_far = String::new();
    for &id in ids {
        let piece = dec.push(id).unwrap();
        if valid {
            assert!(
                !piece.contains('\u{FFFD}'),
                "U+FFFD in {piece:?} of {full:?}"
            );
        }
        so_far.push_str(&piece);
        assert!(
            full.starts_with(&so_far),
            "{so_far:?} is not a prefix of {full:?}"
        );
        pieces.push(piece);
    }
    let rest = dec.finish();
    if valid {
        assert_eq!(rest, "", "nothing is held back at the end of valid text");
    }
    so_far.push_str(&rest);
    assert_eq!(so_far, full);
    pieces
}

#[test]
fn incremental_decoding_concatenates_to_decode() {
    let tokenizers = [
        (
            gguf_tokenizer("vocab/ggml-vocab-llama-spm.gguf"),
            "ggml-vocab-llama-spm.gguf",
        ),
        (
            gguf_tokenizer("vocab/ggml-vocab-gpt-2.gguf"),
            "ggml-vocab-gpt-2.gguf",
        ),
        (llama3_tokenizer(), "ggml-vocab-llama-bpe.gguf"),
    ];
    for (tok, name) in &tokenizers {
        for (text, ids) in cases(name) {
            let pieces = stream(tok, &ids, false, true);
            assert_eq!(pieces.concat(), text, "{name}");
            if let Some(bos) = tok.bos_id() {
                let with_bos: Vec<u32> = std::iter::once(bos).chain(ids).collect();
                let pieces = stream(tok, &with_bos, true, true);
                assert_eq!(pieces.concat(), text, "{name}, BOS skipped");
            }
        }
    }
}

#[test]
fn incremental_decoding_holds_back_partial_characters() {
    let spm = gguf_tokenizer("vocab/ggml-vocab-llama-spm.gguf");
    // " this is 🦙.cpp": the llama emoji is four byte tokens.
    let ids = [29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223];
    let pieces = stream(&spm, &ids, false, true);
    assert_eq!(pieces[4..7], ["", "", ""]);
    assert_eq!(pieces[7], "🦙");
    assert_eq!(pieces.concat(), " this is 🦙.cpp");

    // Byte-level BPE: a CJK character and an emoji split over several tokens.
    for tok in [
        gguf_tokenizer("vocab/ggml-vocab-gpt-2.gguf"),
        llama3_tokenizer(),
    ] {
        for text in ["龘 🦙", "🚀 (normal) 😶\u{200d}🌫️ ✅"] {
            let ids = tok.encode(text, false).unwrap();
            let pieces = stream(&tok, &ids, false, true);
            assert!(
                pieces.iter().any(String::is_empty),
                "{text:?}: some ids end mid-character"
            );
            assert_eq!(pieces.concat(), text);
        }
    }
}

#[test]
fn incremental_decoding_with_prompt_and_finish() {
    let spm = gguf_tokenizer("vocab/ggml-vocab-llama-spm.gguf");
    let prompt = spm.encode("Hello", true).unwrap();
    let mut dec = IncrementalDecoder::with_prompt(&spm, &prompt, true);
    // The space SentencePiece strips at the start of a text belongs to the continuation.
    assert_eq!(dec.push(3186).unwrap(), " world");
    assert_eq!(dec.push(2).unwrap(), "", "skipped special");
    assert_eq!(dec.finish(), "");

    // An incomplete character is held back, then flushed lossily by `finish`.
    let mut dec = IncrementalDecoder::new(&spm, false);
    assert_eq!(dec.push(15043).unwrap(), "Hello");
    assert_eq!(dec.push(243).unwrap(), "");
    assert_eq!(dec.finish(), "\u{FFFD}");

    // An id outside the vocabulary is an error that leaves the decoder usable.
    let mut dec = IncrementalDecoder::new(&spm, false);
    assert!(matches!(
        dec.push(32000),
        Err(TokenizerError::UnknownId { id: 32000, .. })
    ));
    assert_eq!(dec.push(15043).unwrap(), "Hello");
    assert!(spm.decode(&[15043, 99999], false).is_err());
}

#[test]
fn sentencepiece_merges_follow_scores() {
    // "ab" (score -1) outranks "▁a" (score -5): "ab" segments as ▁ + ab, not ▁a + b.
    let pieces = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab"];
    let mut vocab = GgufVocab::new(
        VocabModel::Llama,
        pieces.iter().map(|s| s.to_string()).collect(),
    );
    vocab.scores = vec![0.0, 0.0, 0.0, -2.0, -3.0, -4.0, -5.0, -1.0];
    vocab.token_types = [2, 3, 3, 1, 1, 1, 1, 1]
        .iter()
        .map(|&t| TokenType::from_i64(t).unwrap())
        .collect();
    vocab.unk_id = Some(0);
    vocab.bos_id = Some(1);
    vocab.eos_id = Some(2);
    let tok = Tokenizer::from_gguf_vocab(vocab.clone()).unwrap();
    assert_eq!(tok.encode("ab", false).unwrap(), vec![3, 7]);
    assert_eq!(tok.encode("ba", true).unwrap(), vec![1, 3, 5, 4]);
    // No byte tokens: an unknown character falls back to <unk>.
    assert_eq!(tok.encode("c", false).unwrap(), vec![3, 0]);

    vocab.scores[7] = -6.0;
    let tok = Tokenizer::from_gguf_vocab(vocab).unwrap();
    assert_eq!(tok.encode("ab", false).unwrap(), vec![6, 5]);
}

#[test]
fn bad_vocabularies_are_rejected() {
    let tokens = vec!["a".to_string(), "b".to_string()];
    let mut vocab = GgufVocab::new(VocabModel::Llama, tokens.clone());
    vocab.scores = vec![0.0];
    assert!(matches!(
        Tokenizer::from_gguf_vocab(vocab),
        Err(TokenizerError::InvalidMetadata {
            key: "tokenizer.ggml.scores",
            ..
        })
    ));

    let mut vocab = GgufVocab::new(VocabModel::Llama, tokens.clone());
    vocab.scores = vec![0.0, 0.0];
    vocab.eos_id = Some(7);
    assert!(matches!(
        Tokenizer::from_gguf_vocab(vocab),
        Err(TokenizerError::InvalidMetadata { .. })
    ));

    let mut vocab = GgufVocab::new(VocabModel::Gpt2, tokens);
    vocab.merges = vec!["a b".into()];
    vocab.pre = Some("made-up".into());
    let err = Tokenizer::from_gguf_vocab(vocab).unwrap_err();
    assert!(err.to_string().contains("made-up"), "{err}");

    assert!(matches!(
        VocabModel::parse("bert"),
        Err(TokenizerError::UnsupportedModel(_))
    ));
}

/// A scratch directory holding a copy of stories260K-hf's `tokenizer.json`.
fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-tok-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        models().join("stories260K-hf/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    dir
}

#[test]
fn tokenizer_config_fields() {
    let dir = scratch_dir("config");
    let json = dir.join("tokenizer.json");
    let config = dir.join("tokenizer_config.json");

    std::fs::write(
        &config,
        r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": false,
            "chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "D"}]}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_file(&json, Some(&config)).unwrap();
    assert_eq!(tok.chat_template(), Some("D"));
    assert!(!tok.add_bos_default());
    assert_eq!(tok.bos_id(), Some(1));

    // No add_bos_token: the post-processor (which prepends <s>) decides.
    std::fs::write(
        &config,
        r#"{"bos_token": "<s>", "chat_template": "{{ x }}"}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_file(&json, Some(&config)).unwrap();
    assert!(tok.add_bos_default());
    assert_eq!(tok.chat_template(), Some("{{ x }}"));

    std::fs::write(&config, r#"{"add_bos_token": "yes"}"#).unwrap();
    let err = Tokenizer::from_file(&json, Some(&config)).unwrap_err();
    assert!(matches!(err, TokenizerError::Config { .. }), "{err}");

    std::fs::write(&config, r#"{"eos_token": "<|not-here|>"}"#).unwrap();
    assert!(Tokenizer::from_file(&json, Some(&config)).is_err());

    // Without a config: BOS from the post-processor, EOS by name, template from the sibling file.
    std::fs::write(dir.join("chat_template.jinja"), "J").unwrap();
    let tok = Tokenizer::from_file(&json, None).unwrap();
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_ids(), &[2]);
    assert_eq!(tok.chat_template(), Some("J"));

    let missing = Tokenizer::from_file(&dir.join("nope.json"), None).unwrap_err();
    assert!(missing.to_string().contains("nope.json"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokenizer_is_cheap_to_share() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<IncrementalDecoder>();
}

#[test]
fn incremental_decoding_of_arbitrary_ids() {
    // Models can emit any id sequence: invalid UTF-8 from stray byte tokens included.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as u32
    };
    let tokenizers = [
        gguf_tokenizer("vocab/ggml-vocab-llama-spm.gguf"),
        gguf_tokenizer("vocab/ggml-vocab-gpt-2.gguf"),
        llama3_tokenizer(),
        stories_hf(),
    ];
    for tok in &tokenizers {
        for _ in 0..200 {
            let len = 1 + next(40) as usize;
            // Half the ids from the low range, where the byte tokens of both vocabularies are.
            let ids: Vec<u32> = (0..len)
                .map(|_| match next(2) {
                    0 => next(300),
                    _ => next(tok.vocab_size()),
                })
                .collect();
            for skip_special in [false, true] {
                stream(tok, &ids, skip_special, false);
            }
        }
    }
}

/// A Llama-3 GGUF vocabulary (`gpt2` model, `llama-bpe` pre-tokenizer, control tokens after the
/// 128000 regular ones), assembled from the llama3.2 files the way a GGUF converter stores it.
fn llama3_gguf_vocab() -> GgufVocab {
    let dir = models().join("tokenizers/llama3.2");
    let text = std::fs::read_to_string(dir.join("encoder.json")).unwrap();
    let encoder: std::collections::HashMap<String, u32> = serde_json::from_str(&text).unwrap();
    let mut tokens = vec![String::new(); encoder.len()];
    for (piece, id) in encoder {
        tokens[id as usize] = piece;
    }
    let mut types = vec![TokenType::Normal; tokens.len()];
    let specials = (0..256).map(|i| match i {
        0 => "<|begin_of_text|>".to_string(),
        1 => "<|end_of_text|>".to_string(),
        6 => "<|start_header_id|>".to_string(),
        7 => "<|end_header_id|>".to_string(),
        8 => "<|eom_id|>".to_string(),
        9 => "<|eot_id|>".to_string(),
        i => format!("<|reserved_special_token_{i}|>"),
    });
    for piece in specials {
        tokens.push(piece);
        types.push(TokenType::Control);
    }
    let merges = std::fs::read_to_string(dir.join("vocab.bpe")).unwrap();
    let mut vocab = GgufVocab::new(VocabModel::Gpt2, tokens);
    vocab.merges = merges.lines().map(str::to_owned).collect();
    vocab.token_types = types;
    vocab.pre = Some("llama-bpe".into());
    vocab.bos_id = Some(128000);
    vocab.eos_id = Some(128009);
    vocab.add_bos = Some(true);
    vocab
}

#[test]
fn llama3_gguf_vocab_matches_llama_cpp() {
    let tok = Tokenizer::from_gguf_vocab(llama3_gguf_vocab()).unwrap();
    assert_matches_llama_cpp(&tok, "ggml-vocab-llama-bpe.gguf");
    assert_eq!(tok.vocab_size(), 128256);
    assert!(tok.add_bos_default());
    // The declared EOS first, then the other end-of-generation specials present.
    assert_eq!(tok.eos_ids(), &[128009, 128008, 128001]);
    let ids = tok
        .encode(
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
            true,
        )
        .unwrap();
    assert_eq!(ids[..3], [128000, 128006, 882]);
    assert_eq!(ids.last(), Some(&128009));
    assert!(tok.is_special(128006) && !tok.is_special(882));
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\n\nHi");
    let pieces = stream(&tok, &ids, false, true);
    assert_eq!(pieces.concat(), tok.decode(&ids, false).unwrap());
}
