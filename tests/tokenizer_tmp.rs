use kiln::tokenizer::*;
use serde_json::Value;

const M: &str = "/work/shared/models";

fn vocab_json(name: &str) -> GgufVocab {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(format!("/tmp/tokx/{name}.json")).unwrap()).unwrap();
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let id = |k: &str| v.get(k).and_then(|x| x.as_u64()).filter(|&x| x != u32::MAX as u64).map(|x| x as u32);
    let model = VocabModel::parse(&s("tokenizer.ggml.model").unwrap()).unwrap();
    let tokens: Vec<String> = v["tokenizer.ggml.tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect();
    let mut g = GgufVocab::new(model, tokens);
    g.pre = s("tokenizer.ggml.pre");
    if let Some(a) = v.get("tokenizer.ggml.scores") { g.scores = a.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect(); }
    if let Some(a) = v.get("tokenizer.ggml.token_type") { g.token_types = a.as_array().unwrap().iter().map(|x| TokenType::from_i64(x.as_i64().unwrap()).unwrap()).collect(); }
    if let Some(a) = v.get("tokenizer.ggml.merges") { g.merges = a.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_owned()).collect(); }
    g.bos_id = id("tokenizer.ggml.bos_token_id");
    g.eos_id = id("tokenizer.ggml.eos_token_id");
    g.unk_id = id("tokenizer.ggml.unknown_token_id");
    g.add_bos = v.get("tokenizer.ggml.add_bos_token").and_then(|x| x.as_bool());
    g
}

fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(format!("{M}/vocab/{name}.inp")).unwrap();
    let out = std::fs::read_to_string(format!("{M}/vocab/{name}.out")).unwrap();
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(texts.pop(), Some(""));
    let outs: Vec<Vec<u32>> = out.lines().map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect()).collect();
    assert_eq!(texts.len(), outs.len());
    texts.into_iter().map(str::to_owned).zip(outs).collect()
}

fn check(tok: &Tokenizer, name: &str) {
    let mut bad = 0;
    let cs = cases(name);
    for (text, want) in &cs {
        let got = tok.encode(text, false).unwrap();
        if &got != want { bad += 1; println!("MISMATCH {text:?}\n got  {got:?}\n want {want:?}"); }
        let dec = tok.decode(&got, false).unwrap();
        if &dec != text { println!("DECODE {text:?} -> {dec:?}"); }
    }
    println!("{name}: {}/{} ok", cs.len() - bad, cs.len());
    assert_eq!(bad, 0);
}

#[test]
fn spm() {
    let t = std::time::Instant::now();
    let tok = Tokenizer::from_gguf_vocab(vocab_json("spm")).unwrap();
    println!("build {:?} {:?}", t.elapsed(), tok);
    check(&tok, "ggml-vocab-llama-spm.gguf");
}

#[test]
fn gpt2() {
    let t = std::time::Instant::now();
    let tok = Tokenizer::from_gguf_vocab(vocab_json("gpt2")).unwrap();
    println!("build {:?} {:?}", t.elapsed(), tok);
    check(&tok, "ggml-vocab-gpt-2.gguf");
}

#[test]
fn llama3() {
    let t = std::time::Instant::now();
    let tok = Tokenizer::from_gpt2_files(format!("{M}/tokenizers/llama3.2/encoder.json").as_ref(), format!("{M}/tokenizers/llama3.2/vocab.bpe").as_ref(), Some(LLAMA3_PATTERN)).unwrap();
    println!("build {:?} {:?}", t.elapsed(), tok);
    check(&tok, "ggml-vocab-llama-bpe.gguf");
}

#[test]
fn stories() {
    let g = Tokenizer::from_gguf_vocab(vocab_json("stories")).unwrap();
    let h = Tokenizer::from_file(format!("{M}/stories260K-hf/tokenizer.json").as_ref(), Some(format!("{M}/stories260K-hf/tokenizer_config.json").as_ref())).unwrap();
    println!("{g:?}\n{h:?}");
    for (text, _) in cases("ggml-vocab-llama-spm.gguf") {
        let a = g.encode(&text, true).unwrap();
        let b = h.encode(&text, true).unwrap();
        if a != b { println!("DIFF {text:?}\n {a:?}\n {b:?}"); }
    }
}
