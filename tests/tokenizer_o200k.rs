//! gpt-oss's tokenizer (o200k_harmony) against independent references: Kiln's encoder, built
//! from the vocab GGUF and from the `tokenizer.json` that `scripts/o200k_files.py` writes,
//! gives bpe-openai's o200k_base ids on a corpus and openai-harmony's ids where harmony
//! special tokens are written in the text; every id decodes back to its text.
//!
//! The references are the PyPI packages `bpe-openai` and `openai-harmony` (and gguf-py for
//! the GGUF). Without them the tests skip with a message, unless `KILN_REQUIRE_HARMONY` is set
//! (CI sets it once it has installed them), in which case they fail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use kiln::model::gguf::GgufFile;
use kiln::tokenizer::{IncrementalDecoder, Tokenizer};

const VOCAB_SIZE: usize = 201088;
const FIRST_SPECIAL: u32 = 199998;

/// The named harmony tokens (openai-harmony's o200k_harmony table; the rest are reserved).
const NAMED: &[(u32, &str)] = &[
    (199998, "<|startoftext|>"),
    (199999, "<|endoftext|>"),
    (200002, "<|return|>"),
    (200003, "<|constrain|>"),
    (200005, "<|channel|>"),
    (200006, "<|start|>"),
    (200007, "<|end|>"),
    (200008, "<|message|>"),
    (200012, "<|call|>"),
    (200018, "<|endofprompt|>"),
];

/// Encodes with both references and reads the special-token table, printing JSON:
/// `plain` (bpe-openai, special texts as plain text), `harmony` (openai-harmony with every
/// special token allowed) per string, and `specials`: [id, decoded text, ids of that text].
const REFERENCE_PY: &str = r#"
import json, sys
import bpe_openai, openai_harmony as h
texts = json.load(open(sys.argv[1], encoding="utf-8"))
base = bpe_openai.get_encoding("o200k_base")
harmony = h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)
specials = []
for i in range(199998, 201088):
    t = harmony.decode([i])
    specials.append([i, t, harmony.encode(t, allowed_special="all")])
json.dump({
    "plain": [base.encode(t, disallowed_special=()) for t in texts],
    "harmony": [harmony.encode(t, allowed_special="all") for t in texts],
    "endofprompt": harmony.encode("<|endofprompt|>", allowed_special="all"),
    "endofprompt_base": base.encode("<|endofprompt|>", allowed_special="all"),
    "specials": specials,
}, sys.stdout)
"#;

struct Fixture {
    gguf: Tokenizer,
    hf: Tokenizer,
    texts: Vec<String>,
    plain: Vec<Vec<u32>>,
    harmony: Vec<Vec<u32>>,
    endofprompt: Vec<u32>,
    /// bpe-openai's o200k_base ids of `<|endofprompt|>` as a special token.
    endofprompt_base: Vec<u32>,
    /// (id, openai-harmony's text of it, openai-harmony's ids of that text).
    specials: Vec<(u32, String, Vec<u32>)>,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether the Python references import; fails the test when CI requires them.
fn references_present() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import bpe_openai, openai_harmony"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("KILN_REQUIRE_HARMONY").is_none(),
            "KILN_REQUIRE_HARMONY is set but python3 cannot import bpe_openai and openai_harmony"
        );
        eprintln!(
            "skipped: python3 lacks bpe_openai / openai_harmony (pip install bpe-openai openai-harmony)"
        );
    }
    ok
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().expect("run python3");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// llama.cpp's test strings (`../shared/models/vocab/*.inp`, the qwen35 ones among them)
/// and strings of our own.
fn corpus() -> Vec<String> {
    let dir = repo().join("../shared/models/vocab");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "inp"))
        .collect();
    files.sort();
    assert!(
        files.iter().any(|p| p.to_string_lossy().contains("qwen35")),
        "the qwen35 strings are in {}",
        dir.display()
    );
    let mut texts = Vec::new();
    for file in files {
        let inp = std::fs::read_to_string(&file).unwrap();
        let mut parts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        assert_eq!(
            parts.pop(),
            Some(""),
            "{} ends with a separator",
            file.display()
        );
        texts.extend(parts.into_iter().map(str::to_owned));
    }
    texts.extend(ours().iter().map(|s| s.to_string()));
    texts.extend(generated());
    texts
}

fn ours() -> &'static [&'static str] {
    &[
        // code
        "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{v:?}\");\n}\n",
        "def f(a, b=None, *args, **kw):\n\treturn {'a': a, \"b\": b}  # comment\n",
        "#include <stdio.h>\nint main(void){printf(\"%d\\n\",42);return 0;}",
        "SELECT u.id, COUNT(*) FROM users u LEFT JOIN orders o ON o.uid=u.id GROUP BY 1;",
        "<div class=\"a\"><a href=\"https://example.com/a/b/c?d=1&e=2#f\">link</a></div>",
        "path/to/file.rs C:\\Users\\me\\x.txt ./a//b///c /// // / ://",
        "{\"key\": [1, 2.5e-3, true, null], \"nested\": {\"x\": \"y\"}}",
        "x+=1;y-=2;z*=3;w/=4;a<<=1;b>>=2;c&&d||e!=f==g<=h>=i=>j->k::l",
        // languages
        "Die Größe des Übermaßes ist überraschend; ÄÖÜ äöü ß ẞ.",
        "Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
        "我能吞下玻璃而不伤身体。你好，世界！",
        "私はガラスを食べられます。それは私を傷つけません。カタカナ ひらがな",
        "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.",
        "أنا قادر على أكل الزجاج و هذا لا يؤلمني.",
        "אני יכול לאכול זכוכית וזה לא מזיק לי.",
        "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती.",
        "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ",
        "Tôi có thể ăn thủy tinh mà không hại gì.",
        "e\u{301}te\u{301} cafe\u{301} n\u{303} A\u{30a} combining marks",
        "ǅemal ǈubljana ǋegoš titlecase digraphs",
        // emoji
        "👨‍👩‍👧‍👦 👍🏽 🏳️‍🌈 🇺🇸🇯🇵 ❤️‍🔥 🤖🦙🚀 😶‍🌫️",
        "emoji🙂in🙃words and 🔥🔥🔥🔥🔥🔥",
        // digits
        "1234567890123456789012345678901234567890",
        "3.14159265358979 1,000,000 10^100 0x7fffffff 1e-9 ١٢٣٤٥ ४५६",
        "9999999 99999999 999999999 12/31/2026 v1.2.3-rc.4",
        // whitespace
        "   \n\n\t\t  \r\n  x  \n",
        "a  b   c    d     e\t\tf\n\n\ng\r\r\rh",
        "\n\n\n\n",
        "                                                            end",
        " \u{a0}\u{2003}\u{3000}nbsp em ideographic",
        "trailing spaces   ",
        // contractions with odd casing
        "I'M HE'S she'S they'Re WE'LL you'VE it'D don'T CAN'T won't",
        "'s 'S 'll 'LL 'Re 'rE O'Neil McDonald's ROCK'N'ROLL",
        "HTTPServerError iPhone XMLHttpRequest camelCaseWord snake_case_word SCREAMING_CASE",
        "ABC'S abc's Abc'S aBC'd",
        // punctuation runs
        "!!!??? ... --- === ___ *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
        "«guillemets» „Anführung“ “smart” ‘quotes’ — en–dash … ellipsis",
        // special-token texts
        "<|start|>system<|message|>You are ChatGPT.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant",
        "<|start|>assistant<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
        "a<|end|>b <|endoftext|><|endoftext|> x<|startoftext|>y",
        "<|reserved_200100|> and <|reserved_201087|><|reserved_200000|>",
        "<|start <|unknown|> |> <| |> <|channel|<|message|>",
        "<|channel|>",
    ]
}

/// Long inputs built in code: repeated letters, a long digit run, a long whitespace run.
fn generated() -> Vec<String> {
    vec![
        "a".repeat(2000),
        "0123456789".repeat(100),
        " ".repeat(500) + "x",
        "ab\n".repeat(300),
        "Ünïcödé🙂".repeat(100),
    ]
}

fn fixture() -> Option<&'static Fixture> {
    static FIXTURE: OnceLock<Option<Fixture>> = OnceLock::new();
    FIXTURE
        .get_or_init(|| references_present().then(build_fixture))
        .as_ref()
}

fn build_fixture() -> Fixture {
    let dir = std::env::temp_dir().join(format!("kiln-o200k-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    run(Command::new("python3")
        .arg(repo().join("scripts/o200k_files.py"))
        .arg(&dir));
    let texts = corpus();
    let corpus_json = dir.join("corpus.json");
    std::fs::write(&corpus_json, serde_json::to_vec(&texts).unwrap()).unwrap();
    let out = run(Command::new("python3")
        .args(["-c", REFERENCE_PY])
        .arg(&corpus_json)
        .env("TIKTOKEN_ENCODINGS_BASE", &dir));
    let refs: serde_json::Value = serde_json::from_slice(&out).expect("reference JSON");
    let ids =
        |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).expect("ids") };
    let lists =
        |key: &str| -> Vec<Vec<u32>> { refs[key].as_array().unwrap().iter().map(ids).collect() };
    let specials = refs["specials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let id = s[0].as_u64().unwrap() as u32;
            (id, s[1].as_str().unwrap().to_string(), ids(&s[2]))
        })
        .collect();
    let gguf = GgufFile::open(&dir.join("o200k-harmony.gguf")).expect("open the vocab GGUF");
    let gguf = Tokenizer::from_gguf(&gguf).expect("tokenizer from the vocab GGUF");
    let hf = Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .expect("tokenizer from tokenizer.json");
    let _ = std::fs::remove_dir_all(&dir);
    Fixture {
        gguf,
        hf,
        plain: lists("plain"),
        harmony: lists("harmony"),
        endofprompt: ids(&refs["endofprompt"]),
        endofprompt_base: ids(&refs["endofprompt_base"]),
        specials,
        texts,
    }
}

/// Every corpus string encodes to `want` (with special tokens parsed, as Kiln always does) and
/// decodes back to itself.
fn check_corpus(name: &str, tok: &Tokenizer, want: &[Vec<u32>], texts: &[String]) {
    let mut failures = Vec::new();
    for (text, want) in texts.iter().zip(want) {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            failures.push(format!("{text:?}:\n  got  {got:?}\n  want {want:?}"));
            continue;
        }
        let back = tok.decode(&got, false).unwrap();
        if &back != text {
            failures.push(format!("{text:?} decodes to {back:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {}/{} strings differ:\n{}",
        failures.len(),
        texts.len(),
        failures.join("\n")
    );
}

/// Strings without special-token text: Kiln's ids are bpe-openai's o200k_base ids.
fn check_plain(name: &str, tok: &Tokenizer) {
    let Some(f) = fixture() else { return };
    let (texts, want): (Vec<String>, Vec<Vec<u32>>) = f
        .texts
        .iter()
        .zip(&f.plain)
        .filter(|(t, _)| !t.contains("<|"))
        .map(|(t, w)| (t.clone(), w.clone()))
        .unzip();
    assert!(texts.len() > 300, "{} plain strings", texts.len());
    check_corpus(name, tok, &want, &texts);
}

#[test]
fn o200k_gguf_matches_bpe_openai() {
    if let Some(f) = fixture() {
        check_plain("vocab GGUF", &f.gguf);
    }
}

#[test]
fn o200k_tokenizer_json_matches_bpe_openai() {
    if let Some(f) = fixture() {
        check_plain("tokenizer.json", &f.hf);
    }
}

/// Every string, special-token texts included, encodes as openai-harmony encodes it with all
/// special tokens allowed; the plain ones agree with bpe-openai there too.
#[test]
fn harmony_texts_match_openai_harmony() {
    let Some(f) = fixture() else { return };
    for (text, (plain, harmony)) in f.texts.iter().zip(f.plain.iter().zip(&f.harmony)) {
        if !text.contains("<|") {
            assert_eq!(plain, harmony, "the two references differ on {text:?}");
        }
    }
    let specials = f
        .harmony
        .iter()
        .filter(|ids| ids.iter().any(|&id| id >= FIRST_SPECIAL));
    assert!(specials.count() >= 6, "the corpus writes harmony tokens");
    check_corpus("vocab GGUF", &f.gguf, &f.harmony, &f.texts);
    check_corpus("tokenizer.json", &f.hf, &f.harmony, &f.texts);
}

/// The 1,090 special tokens: openai-harmony's text for each id, that text encoding to that id
/// alone, in both of Kiln's tokenizers. 200018 is the one difference: the released
/// tokenizer.json (and llama.cpp's GGUF from it) call it `<|endofprompt|>`, openai-harmony
/// `<|reserved_200018|>`, and openai-harmony reads `<|endofprompt|>` as plain text, while
/// bpe-openai's o200k_base has `<|endofprompt|>` at 200018 as Kiln does.
#[test]
fn harmony_special_tokens_match_openai_harmony() {
    let Some(f) = fixture() else { return };
    assert_eq!(f.specials.len(), VOCAB_SIZE - FIRST_SPECIAL as usize);
    assert!(f.endofprompt.iter().all(|&id| id < FIRST_SPECIAL));
    assert_eq!(f.endofprompt_base, vec![200018]);
    for (name, tok) in [("vocab GGUF", &f.gguf), ("tokenizer.json", &f.hf)] {
        assert_eq!(tok.vocab_size(), VOCAB_SIZE, "{name}");
        for (id, text, ids) in &f.specials {
            assert_eq!(ids, &vec![*id], "openai-harmony encodes {text:?}");
            let text = match *id {
                200018 => {
                    assert_eq!(text, "<|reserved_200018|>");
                    "<|endofprompt|>".to_string()
                }
                _ => text.clone(),
            };
            let named = NAMED.iter().find(|(n, _)| n == id).map(|(_, t)| *t);
            let want = named.map_or(format!("<|reserved_{id}|>"), str::to_string);
            assert_eq!(text, want, "{name}: the table's text of {id}");
            assert_eq!(
                tok.id_to_piece(*id).as_deref(),
                Some(text.as_str()),
                "{name}"
            );
            assert_eq!(tok.token_to_id(&text), Some(*id), "{name}");
            assert!(tok.is_special(*id), "{name}: {text} is special");
            assert_eq!(
                tok.encode(&text, false).unwrap(),
                vec![*id],
                "{name}: {text}"
            );
            assert_eq!(tok.decode(&[*id], false).unwrap(), text, "{name}");
        }
        assert!(!tok.is_special(0) && !tok.is_special(FIRST_SPECIAL - 1));
    }
}

/// BOS, the ids that end generation (`<|return|>`, `<|call|>`, `<|endoftext|>`; not
/// `<|end|>`, which closes a message inside a turn), no BOS by default, and decoding that
/// skips special tokens keeps the harmony markup the reply parser reads.
#[test]
fn harmony_control_tokens() {
    let Some(f) = fixture() else { return };
    for (name, tok) in [("vocab GGUF", &f.gguf), ("tokenizer.json", &f.hf)] {
        assert_eq!(tok.bos_id(), Some(199998), "{name}");
        assert!(!tok.add_bos_default(), "{name}");
        assert_eq!(tok.eos_ids()[0], 200002, "{name}: the declared EOS first");
        for id in [200002, 200012, 199999] {
            assert!(
                tok.eos_ids().contains(&id),
                "{name}: {id} in {:?}",
                tok.eos_ids()
            );
        }
        assert!(
            !tok.eos_ids().contains(&200007),
            "{name}: <|end|> ends no turn"
        );
        let text = "<|start|>assistant<|channel|>final<|message|>Hi there.<|end|><|return|><|reserved_200100|>";
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(
            tok.decode(&ids, true).unwrap(),
            "<|start|>assistant<|channel|>final<|message|>Hi there.<|end|>",
            "{name}"
        );
        let mut dec = IncrementalDecoder::new(tok, false);
        let streamed: String = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
        assert_eq!(streamed + &dec.finish(), text, "{name}: streamed");
    }
}
