//! GGUF reader and dequantizer tests: real fixtures, gguf-py golden data, malformed files.

use std::path::{Path, PathBuf};

use kiln::model::gguf::{GgmlType, GgufError, GgufFile, MetaValue, TensorInfo};
use kiln::model::quant::{self, QuantError};
use kiln::model::{ModelError, ModelSpec, TensorSource};

// ---------------------------------------------------------------------------------------
// helpers

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models")
}

fn open(name: &str) -> GgufFile {
    let path = models_dir().join(name);
    GgufFile::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

fn read(name: &str) -> Vec<u8> {
    let path = models_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn golden(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/quant")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn fnv1a64(values: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in values.iter().flat_map(|v| v.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Parses `bytes`, expecting an error whose text contains `phrase`; returns the text.
fn parse_err(bytes: &[u8], phrase: &str) -> String {
    match GgufFile::parse(bytes) {
        Ok(_) => panic!("expected an error containing {phrase:?}, parsed fine"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(phrase), "error {msg:?} lacks {phrase:?}");
            msg
        }
    }
}

const F32: u32 = 0;
const Q8_0: u32 = 8;
const T_U8: u32 = 0;
const T_U32: u32 = 4;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;

fn gstr(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

/// Writes small GGUF images (also subtly wrong ones) for tests.
struct Builder {
    version: u32,
    align: usize,
    n_kv: u64,
    kvs: Vec<u8>,
    n_tensors: u64,
    infos: Vec<u8>,
    data: Vec<u8>,
}

impl Builder {
    fn new() -> Self {
        Builder {
            version: 3,
            align: 32,
            n_kv: 0,
            kvs: Vec::new(),
            n_tensors: 0,
            infos: Vec::new(),
            data: Vec::new(),
        }
    }

    /// A key with an already-encoded value (`vtype` u32 + payload).
    fn kv(mut self, key: &str, vtype: u32, payload: &[u8]) -> Self {
        self.n_kv += 1;
        self.kvs.extend(gstr(key.as_bytes()));
        self.kvs.extend(vtype.to_le_bytes());
        self.kvs.extend_from_slice(payload);
        self
    }

    fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv(key, T_U32, &v.to_le_bytes())
    }

    /// A tensor info with an explicit relative offset and no data.
    fn info(mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Self {
        self.n_tensors += 1;
        self.infos.extend(gstr(name.as_bytes()));
        self.infos.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| self.infos.extend(d.to_le_bytes()));
        self.infos.extend(ty.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self
    }

    /// A tensor whose data is appended (aligned) to the data section.
    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: &[u8]) -> Self {
        self.data
            .resize(self.data.len().next_multiple_of(self.align), 0);
        let offset = self.data.len() as u64;
        self.data.extend_from_slice(data);
        self.info(name, dims, ty, offset)
    }

    fn header_len(&self) -> usize {
        24 + self.kvs.len() + self.infos.len()
    }

    /// Absolute offset of the data section.
    fn data_start(&self) -> usize {
        self.header_len().next_multiple_of(self.align)
    }

    /// The header alone: no padding, no data (for exact "remaining bytes" messages).
    fn build_unpadded(&self) -> Vec<u8> {
        let mut out = self.build();
        out.truncate(self.header_len());
        out
    }

    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kvs);
        out.extend_from_slice(&self.infos);
        out.resize(self.data_start(), 0);
        out.extend_from_slice(&self.data);
        out
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

// ---------------------------------------------------------------------------------------
// real fixtures

#[test]
fn stories260k_metadata_and_tensors() {
    let f = open("stories260K.gguf");
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset(), 14176);
    assert_eq!(f.file_size(), 1_185_376);
    assert_eq!(f.metadata().len(), 19);
    assert_eq!(f.meta_str("general.architecture"), Some("llama"));
    assert_eq!(f.meta_str("tokenizer.ggml.model"), Some("llama"));
    assert_eq!(f.meta_u64("llama.embedding_length"), Some(64));
    assert_eq!(f.meta_u64("llama.feed_forward_length"), Some(172));
    assert_eq!(f.meta_u64("llama.attention.head_count"), Some(8));
    assert_eq!(f.meta_u64("llama.attention.head_count_kv"), Some(4));
    assert_eq!(f.meta_u64("llama.block_count"), Some(5));
    assert_eq!(f.meta_u64("llama.context_length"), Some(2048));
    assert_eq!(f.meta_u64("llama.rope.dimension_count"), Some(8));
    assert_eq!(
        f.meta_u64("tokenizer.ggml.seperator_token_id"),
        Some(4_294_967_295)
    );
    let eps = f
        .meta_f64("llama.attention.layer_norm_rms_epsilon")
        .unwrap();
    assert!((eps - 1e-5).abs() < 1e-9, "{eps}");
    assert_eq!(f.meta_bool("tokenizer.ggml.add_bos_token"), None);
    assert_eq!(
        f.meta_str("llama.embedding_length"),
        None,
        "u32 is not a string"
    );
    assert_eq!(f.meta_u64("general.name"), None, "string is not an integer");

    let tokens = f.meta_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 512);
    assert_eq!(&tokens[..4], ["<unk>", "<s>", "</s>", "<0x00>"]);
    assert_eq!(tokens[258], "<0xFF>");
    assert_eq!(
        f.meta_f32_array("tokenizer.ggml.scores").unwrap().len(),
        512
    );
    let types = f.meta_i64_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!((types.len(), types[0], types[1], types[3]), (512, 2, 3, 6));
    assert_eq!(f.meta_str_array("tokenizer.ggml.scores"), None);

    assert_eq!(f.tensors().len(), 48);
    let dims = |n: &str| f.tensor(n).unwrap().dims.clone();
    assert_eq!(dims("token_embd.weight"), [64, 512]);
    assert_eq!(dims("output.weight"), [64, 512]);
    assert_eq!(dims("output_norm.weight"), [64]);
    assert_eq!(dims("blk.0.attn_q.weight"), [64, 64]);
    assert_eq!(dims("blk.4.attn_k.weight"), [64, 32]);
    assert_eq!(dims("blk.2.ffn_down.weight"), [172, 64]);
    assert_eq!(dims("blk.2.ffn_gate.weight"), [64, 172]);
    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (emb.offset, emb.n_bytes, emb.ggml_type),
        (14176, 131072, GgmlType::F32)
    );
    for t in f.tensors() {
        assert_eq!(t.ggml_type, GgmlType::F32, "{}", t.name);
        assert_eq!(t.n_bytes, t.n_elements() * 4, "{}", t.name);
        assert_eq!(f.tensor_bytes(t).len() as u64, t.n_bytes);
        assert_eq!(t.offset % 32, 0);
        assert_eq!(f.tensor_f32(&t.name).unwrap().len() as u64, t.n_elements());
    }
    let norm = f.tensor_f32("output_norm.weight").unwrap();
    assert!(norm.iter().all(|v| v.is_finite()));
    let msg = f.tensor_f32("nope.weight").unwrap_err().to_string();
    assert!(msg.contains("tensor 'nope.weight' not found"), "{msg}");
}

#[test]
fn derived_fixtures_have_expected_types() {
    for (file, ty, n_quant, file_type) in [
        ("stories260K-F16.gguf", GgmlType::F16, 37, 1),
        ("stories260K-Q8_0.gguf", GgmlType::Q8_0, 32, 7),
        ("stories260K-Q4_0.gguf", GgmlType::Q4_0, 32, 2),
    ] {
        let f = open(file);
        assert_eq!(f.version(), 3);
        assert_eq!(f.tensors().len(), 48, "{file}");
        assert_eq!(f.meta_u64("general.file_type"), Some(file_type), "{file}");
        let quantized = f.tensors().iter().filter(|t| t.ggml_type == ty).count();
        let plain = f
            .tensors()
            .iter()
            .filter(|t| t.ggml_type == GgmlType::F32)
            .count();
        assert_eq!((quantized, plain), (n_quant, 48 - n_quant), "{file}");
        for t in f.tensors() {
            assert_eq!(
                Ok(t.n_bytes),
                t.ggml_type.byte_size(t.n_elements()),
                "{}",
                t.name
            );
        }
        // The types its matrices come in (what the GPU waits for at start): the F32 norm
        // vectors are not among them; the quantized files keep their five ffn_down matrices
        // (rows of 172, not whole blocks) in F32.
        let mut types = f.weight_types().expect("a GGUF file knows its types");
        types.sort_by_key(|t| format!("{t:?}"));
        let want = if ty == GgmlType::F16 {
            vec![GgmlType::F16]
        } else {
            let mut v = vec![ty, GgmlType::F32];
            v.sort_by_key(|t| format!("{t:?}"));
            v
        };
        assert_eq!(types, want, "{file}");
    }
}

#[test]
fn llama2_tiny_random_and_vocab_files_open() {
    let f = open("llama-2-tiny-random.gguf");
    assert_eq!(f.meta_str("general.name"), Some("LLaMA v2"));
    assert_eq!(f.meta_u64("llama.embedding_length"), Some(8));
    assert_eq!(f.tensors().len(), 12);
    assert_eq!(
        f.meta_str_array("tokenizer.ggml.tokens").unwrap().len(),
        32000
    );
    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (emb.dims.as_slice(), emb.ggml_type),
        ([8u64, 32000].as_slice(), GgmlType::F16)
    );

    let spm = open("vocab/ggml-vocab-llama-spm.gguf");
    assert!(spm.tensors().is_empty());
    assert_eq!(spm.meta_bool("tokenizer.ggml.add_bos_token"), Some(true));
    assert_eq!(spm.meta_bool("tokenizer.ggml.add_eos_token"), Some(false));
    assert_eq!(spm.meta_str("tokenizer.ggml.pre"), Some("default"));
    assert_eq!(
        spm.meta_f32_array("tokenizer.ggml.scores").unwrap().len(),
        32000
    );
    // Vocab-only files end before the aligned data section would start.
    assert!(spm.data_offset() > spm.file_size());

    let gpt2 = open("vocab/ggml-vocab-gpt-2.gguf");
    assert_eq!(gpt2.meta_str("general.architecture"), Some("gpt2"));
    assert_eq!(
        gpt2.meta_str_array("tokenizer.ggml.tokens").unwrap().len(),
        50257
    );
    assert_eq!(
        gpt2.meta_str_array("tokenizer.ggml.merges").unwrap().len(),
        50000
    );
    assert_eq!(gpt2.meta_u64("tokenizer.ggml.bos_token_id"), Some(50256));
}

#[test]
fn open_reports_io_errors_and_empty_files() {
    let missing = models_dir().join("does-not-exist.gguf");
    match GgufFile::open(&missing) {
        Err(GgufError::Io { path, .. }) => assert!(path.contains("does-not-exist.gguf")),
        other => panic!("expected an io error, got {:?}", other.err()),
    }
    let empty = std::env::temp_dir().join(format!("kiln-empty-{}.gguf", std::process::id()));
    std::fs::write(&empty, b"").unwrap();
    let err = GgufFile::open(&empty).err().map(|e| e.to_string());
    std::fs::remove_file(&empty).unwrap();
    let msg = err.expect("an empty file must not parse");
    assert!(
        msg.contains("header: magic: unexpected end of file at offset 0"),
        "{msg}"
    );
}

// ---------------------------------------------------------------------------------------
// dequantization against gguf-py

#[test]
fn dequantizers_match_gguf_py_golden_blocks() {
    type Deq = fn(&[u8], &mut [f32]) -> Result<(), QuantError>;
    let cases: [(&str, GgmlType, Deq); 6] = [
        ("f16", GgmlType::F16, quant::dequantize_f16),
        ("bf16", GgmlType::BF16, quant::dequantize_bf16),
        ("q8_0", GgmlType::Q8_0, quant::dequantize_q8_0),
        ("q4_0", GgmlType::Q4_0, quant::dequantize_q4_0),
        ("q4_k", GgmlType::Q4K, quant::dequantize_q4_k),
        ("q6_k", GgmlType::Q6K, quant::dequantize_q6_k),
    ];
    for (stem, ty, deq) in cases {
        let raw = golden(&format!("{stem}.raw"));
        let want = f32s(&golden(&format!("{stem}.f32")));
        let mut got = vec![f32::NAN; want.len()];
        deq(&raw, &mut got).unwrap();
        let mismatch = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(mismatch, None, "{stem}: first mismatch");
        let mut via_enum = vec![f32::NAN; want.len()];
        quant::dequantize(ty, &raw, &mut via_enum).unwrap();
        assert_eq!(via_enum, want, "{stem} via dequantize()");
        let vec = quant::dequantize_to_vec(ty, &raw, want.len() as u64).unwrap();
        assert_eq!(vec, want, "{stem} via dequantize_to_vec()");
    }
}

#[test]
fn large_tensors_dequantize_in_parallel_identically() {
    // 64 copies of the Q4_K golden blocks: past the parallel threshold.
    let raw = golden("q4_k.raw").repeat(64);
    let want = f32s(&golden("q4_k.f32")).repeat(64);
    let got = quant::dequantize_to_vec(GgmlType::Q4K, &raw, want.len() as u64).unwrap();
    assert_eq!(got, want);
}

#[test]
fn fixture_tensors_match_gguf_py() {
    let text = String::from_utf8(golden("fixtures.json")).unwrap();
    let summaries: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for (file, tensors) in summaries.as_object().unwrap() {
        let f = open(file);
        let n_non_f32 = f
            .tensors()
            .iter()
            .filter(|t| t.ggml_type != GgmlType::F32)
            .count();
        assert_eq!(tensors.as_object().unwrap().len(), n_non_f32, "{file}");
        for (name, s) in tensors.as_object().unwrap() {
            let info = f.tensor(name).unwrap();
            assert_eq!(
                info.ggml_type.name(),
                s["type"].as_str().unwrap(),
                "{file} {name}"
            );
            let values = f.tensor_f32(name).unwrap();
            assert_eq!(values.len() as u64, s["n_elements"].as_u64().unwrap());
            let first: Vec<f32> = s["first"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            assert_eq!(values[..first.len()], first, "{file} {name}: first values");
            let hash = format!("{:016x}", fnv1a64(&values));
            assert_eq!(
                hash,
                s["fnv1a64"].as_str().unwrap(),
                "{file} {name}: fnv1a64"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 37 + 32 + 32 + 9);
}

/// Max |quantized - f32| over each 32-element block must stay within `bound(amax)`.
fn check_against_f32(file: &str, ty: GgmlType, bound: impl Fn(f32) -> f32) {
    let reference = open("stories260K.gguf");
    let f = open(file);
    for t in f.tensors() {
        let want = reference.tensor_f32(&t.name).unwrap();
        let got = f.tensor_f32(&t.name).unwrap();
        assert_eq!(got.len(), want.len(), "{}", t.name);
        if t.ggml_type == GgmlType::F32 {
            assert_eq!(got, want, "{file} {}: F32 tensors are copied", t.name);
            continue;
        }
        assert_eq!(t.ggml_type, ty, "{}", t.name);
        for (i, (g, w)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
            let amax = w.iter().fold(0f32, |m, x| m.max(x.abs()));
            let err = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= bound(amax),
                "{file} {} block {i}: error {err} > bound {} (amax {amax})",
                t.name,
                bound(amax)
            );
        }
    }
}

#[test]
fn quantized_fixtures_stay_within_quantization_error_of_f32() {
    // Q8_0: d = amax/127, error <= d/2 plus f16 rounding of d.
    check_against_f32("stories260K-Q8_0.gguf", GgmlType::Q8_0, |amax| {
        amax / 127.0 * 0.6 + 1e-7
    });
    // Q4_0: d = amax/8, error <= d (the clipped top level) plus f16 rounding of d.
    check_against_f32("stories260K-Q4_0.gguf", GgmlType::Q4_0, |amax| {
        amax / 8.0 * 1.02 + 1e-7
    });
}

#[test]
fn f16_fixture_rounds_f32_to_nearest_half() {
    let reference = open("stories260K.gguf");
    let f = open("stories260K-F16.gguf");
    for t in f.tensors() {
        let want = reference.tensor_f32(&t.name).unwrap();
        let got = f.tensor_f32(&t.name).unwrap();
        for (g, w) in got.iter().zip(&want) {
            // Half an f16 ulp: 2^-11 relative, 2^-25 absolute in the subnormal range.
            let tol = w.abs() * 2f32.powi(-11) + 2f32.powi(-25);
            assert!((g - w).abs() <= tol, "{}: {g} vs {w}", t.name);
        }
    }
}

#[test]
fn k_quant_and_bf16_tensors_load_from_a_gguf_file() {
    let q4k = golden("q4_k.raw");
    let q6k = golden("q6_k.raw");
    let bf16 = golden("bf16.raw");
    let bytes = Builder::new()
        .tensor("a.q4k", &[256, 8], 12, &q4k)
        .tensor("b.q6k", &[512, 4], 14, &q6k)
        .tensor("c.bf16", &[16, 16], 30, &bf16)
        .build();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.tensor("a.q4k").unwrap().ggml_type, GgmlType::Q4K);
    assert_eq!(f.tensor("b.q6k").unwrap().n_bytes, 1680);
    assert_eq!(f.tensor_f32("a.q4k").unwrap(), f32s(&golden("q4_k.f32")));
    assert_eq!(f.tensor_f32("b.q6k").unwrap(), f32s(&golden("q6_k.f32")));
    assert_eq!(f.tensor_f32("c.bf16").unwrap(), f32s(&golden("bf16.f32")));
}

#[test]
fn quant_api_checks_sizes_and_types() {
    let mut out = vec![0f32; 32];
    let err = quant::dequantize_q8_0(&[0u8; 33], &mut out).unwrap_err();
    assert_eq!(err.to_string(), "Q8_0: 32 elements need 34 bytes, got 33");
    let mut out = vec![0f32; 48];
    let err = quant::dequantize_q4_0(&[0u8; 36], &mut out).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Q4_0: 48 elements is not a multiple of the block size 32"
    );
    let err = quant::dequantize(GgmlType::Other(13), &[], &mut []).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Kiln cannot dequantize tensors of type Q5_K"
    );
    let err = quant::dequantize_to_vec(GgmlType::Q6K, &[0u8; 210], u64::MAX / 2).unwrap_err();
    assert!(matches!(err, QuantError::PartialBlock { .. }), "{err}");
    let err = quant::dequantize_to_vec(GgmlType::F32, &[0u8; 8], 1 << 62).unwrap_err();
    assert!(matches!(err, QuantError::Overflow { .. }), "{err}");
    assert_eq!(GgmlType::Q4K.byte_size(512), Ok(288));
    assert_eq!(
        GgmlType::F32.byte_size(u64::MAX),
        Err(QuantError::Overflow {
            ty: GgmlType::F32,
            n_elements: u64::MAX
        })
    );
}

#[test]
fn ggml_type_ids_names_and_layouts() {
    for (id, ty, name, block, bytes) in [
        (0, GgmlType::F32, "F32", 1, 4),
        (1, GgmlType::F16, "F16", 1, 2),
        (2, GgmlType::Q4_0, "Q4_0", 32, 18),
        (8, GgmlType::Q8_0, "Q8_0", 32, 34),
        (12, GgmlType::Q4K, "Q4_K", 256, 144),
        (13, GgmlType::Q5K, "Q5_K", 256, 176),
        (14, GgmlType::Q6K, "Q6_K", 256, 210),
        (30, GgmlType::BF16, "BF16", 1, 2),
        (11, GgmlType::Other(11), "Q3_K", 256, 110),
    ] {
        assert_eq!(GgmlType::from_id(id), ty);
        assert_eq!(ty.id(), id);
        assert_eq!((ty.name(), ty.to_string()), (name, name.to_string()));
        assert_eq!(
            (ty.block_size(), ty.block_bytes()),
            (Some(block), Some(bytes))
        );
        assert_eq!(ty.is_supported(), id != 11);
    }
    let unknown = GgmlType::from_id(4);
    assert_eq!((unknown.name(), unknown.block_size()), ("unknown", None));
    assert_eq!(unknown.to_string(), "unknown type 4");
}

// ---------------------------------------------------------------------------------------
// synthetic files: every value type, v2, alignment, unsupported tensor types

#[test]
fn all_metadata_value_types_round_trip() {
    let mut nested = T_ARRAY.to_le_bytes().to_vec(); // array of 2 arrays of u8
    nested.extend(2u64.to_le_bytes());
    for items in [&[1u8, 2][..], &[][..]] {
        nested.extend(T_U8.to_le_bytes());
        nested.extend((items.len() as u64).to_le_bytes());
        nested.extend_from_slice(items);
    }
    let mut strings = T_STRING.to_le_bytes().to_vec();
    strings.extend(2u64.to_le_bytes());
    strings.extend(gstr(b"a"));
    strings.extend(gstr("é✓".as_bytes()));
    let bytes = Builder {
        version: 2,
        ..Builder::new()
    }
    .kv("u8", 0, &[200])
    .kv("i8", 1, &(-5i8).to_le_bytes())
    .kv("u16", 2, &60000u16.to_le_bytes())
    .kv("i16", 3, &(-300i16).to_le_bytes())
    .kv_u32("u32", 4_000_000_000)
    .kv("i32", 5, &(-7i32).to_le_bytes())
    .kv("f32", 6, &1.5f32.to_le_bytes())
    .kv("bool", 7, &[1])
    .kv("string", T_STRING, &gstr(b"hello"))
    .kv("strings", T_ARRAY, &strings)
    .kv("nested", T_ARRAY, &nested)
    .kv("u64", 10, &u64::MAX.to_le_bytes())
    .kv("i64", 11, &i64::MIN.to_le_bytes())
    .kv("f64", 12, &0.25f64.to_le_bytes())
    .build();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.version(), 2);
    assert!(f.tensors().is_empty());
    assert_eq!(f.meta("u8"), Some(&MetaValue::U8(200)));
    assert_eq!(f.meta("i8"), Some(&MetaValue::I8(-5)));
    assert_eq!(f.meta("u16"), Some(&MetaValue::U16(60000)));
    assert_eq!(f.meta("i16"), Some(&MetaValue::I16(-300)));
    assert_eq!(f.meta_u64("u32"), Some(4_000_000_000));
    assert_eq!((f.meta_u64("i32"), f.meta_f64("i32")), (None, Some(-7.0)));
    assert_eq!(f.meta_f64("f32"), Some(1.5));
    assert_eq!(f.meta_bool("bool"), Some(true));
    assert_eq!(f.meta_str("string"), Some("hello"));
    assert_eq!(f.meta_str_array("strings"), Some(vec!["a", "é✓"]));
    assert_eq!(
        f.meta("nested"),
        Some(&MetaValue::Array(vec![
            MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)]),
            MetaValue::Array(vec![]),
        ]))
    );
    assert_eq!(f.meta_u64("u64"), Some(u64::MAX));
    assert_eq!(f.meta("i64").and_then(MetaValue::as_i64), Some(i64::MIN));
    assert_eq!(f.meta_f64("f64"), Some(0.25));
    assert_eq!(f.meta_str_array("nested"), None);
    let keys: Vec<&str> = f.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys[..3], ["u8", "i8", "u16"]);
}

#[test]
fn custom_alignment_is_honoured() {
    let data = f32_bytes(&[1.0, 2.0, 3.0]);
    let mut b = Builder::new().kv_u32("general.alignment", 64);
    b.align = 64;
    let bytes = b
        .tensor("x", &[3], F32, &data)
        .tensor("y", &[3], F32, &data)
        .build();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor("y").unwrap().offset, f.data_offset() + 64);
    assert_eq!(f.tensor_f32("y").unwrap(), [1.0, 2.0, 3.0]);
}

#[test]
fn unsupported_tensor_types_parse_but_do_not_dequantize() {
    let bytes = Builder::new()
        .tensor("q3k", &[256], 11, &[0u8; 110])
        .info("future", &[7, 3], 99, 0)
        .tensor("ok", &[2], F32, &f32_bytes(&[4.0, 5.0]))
        .build();
    let f = GgufFile::parse(&bytes).unwrap();
    let q3k = f.tensor("q3k").unwrap();
    assert_eq!((q3k.ggml_type, q3k.n_bytes), (GgmlType::Other(11), 110));
    let future = f.tensor("future").unwrap();
    assert_eq!(
        (future.ggml_type, future.n_bytes, future.n_elements()),
        (GgmlType::Other(99), 0, 21)
    );
    let msg = f.tensor_f32("q3k").unwrap_err().to_string();
    assert_eq!(
        msg,
        "unsupported GGUF: tensor 'q3k' has type Q3_K, which Kiln cannot dequantize"
    );
    let msg = f.tensor_f32("future").unwrap_err().to_string();
    assert!(msg.contains("type unknown type 99"), "{msg}");
    assert_eq!(f.tensor_f32("ok").unwrap(), [4.0, 5.0]);
}

#[test]
fn scalars_and_empty_tensors() {
    let bytes = Builder::new()
        .tensor("scalar", &[], F32, &f32_bytes(&[9.0]))
        .tensor("empty", &[0, 4], Q8_0, &[])
        .build();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.tensor_f32("scalar").unwrap(), [9.0]);
    assert_eq!(f.tensor("empty").unwrap().n_bytes, 0);
    assert!(f.tensor_f32("empty").unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------
// malformed files: each error names what is wrong

#[test]
fn bad_magic_and_versions() {
    let good = Builder::new().build();
    let mut bad = good.clone();
    bad[..4].copy_from_slice(b"GGML");
    parse_err(&bad, "bad magic [47, 47, 4d, 4c]");
    for (version, phrase) in [
        (1u32, "unsupported GGUF: GGUF version 1 is not supported"),
        (4, "GGUF version 4 is not supported"),
        (0, "GGUF version 0 is not supported"),
        (3u32.swap_bytes(), "big-endian GGUF (version 3)"),
    ] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&version.to_le_bytes());
        let msg = parse_err(&b, phrase);
        assert!(
            matches!(GgufFile::parse(&b), Err(GgufError::Unsupported(_))),
            "{msg}"
        );
    }
}

#[test]
fn huge_counts_fail_before_allocating() {
    let mut bytes = Builder::new().kv_u32("a", 1).build();
    bytes[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    parse_err(
        &bytes,
        "header: tensor count 1152921504606846976 needs at least 24 bytes each",
    );
    let mut bytes = Builder::new().build_unpadded();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    parse_err(
        &bytes,
        "header: metadata count 18446744073709551615 needs at least 13 bytes each, only 0 bytes remain",
    );
    // A tensor count that fits the file size but not what is left after the metadata.
    let mut b = Builder::new().kv("s", T_STRING, &gstr(&[b'x'; 100]));
    b.n_tensors = 4;
    parse_err(
        &b.build_unpadded(),
        "tensor count 4 needs at least 24 bytes each, only 0 bytes remain after the metadata",
    );
}

#[test]
fn huge_strings_and_arrays_fail_before_allocating() {
    let mut payload = 9_999_999u64.to_le_bytes().to_vec();
    payload.extend_from_slice(b"twelve bytes");
    let bytes = Builder::new().kv("x", T_STRING, &payload).build_unpadded();
    let msg = parse_err(
        &bytes,
        "metadata key 'x': string length 9999999 exceeds remaining 12 bytes",
    );
    assert!(msg.starts_with("malformed GGUF: "), "{msg}");

    let mut key = Builder::new().kv_u32("k", 1).build_unpadded();
    key[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    parse_err(
        &key,
        "metadata entry 0: key: string length 1099511627776 exceeds remaining 9 bytes",
    );

    for (etype, n, phrase) in [
        (
            T_U8,
            1u64 << 60,
            "metadata key 'arr': array length 1152921504606846976 of u8 needs at least 1 bytes each",
        ),
        (
            10,
            1 << 62,
            "array length 4611686018427387904 of u64 needs at least 8 bytes each",
        ),
        (
            T_STRING,
            u64::MAX,
            "array length 18446744073709551615 of string needs",
        ),
        (T_ARRAY, 1 << 40, "of array needs at least 12 bytes each"),
    ] {
        let mut payload = etype.to_le_bytes().to_vec();
        payload.extend(n.to_le_bytes());
        payload.extend([0u8; 16]);
        parse_err(&Builder::new().kv("arr", T_ARRAY, &payload).build(), phrase);
    }

    // An element string inside an array names its index.
    let mut payload = T_STRING.to_le_bytes().to_vec();
    payload.extend(2u64.to_le_bytes());
    payload.extend(gstr(b"ok"));
    payload.extend(1000u64.to_le_bytes());
    payload.extend([b'z'; 8]);
    parse_err(
        &Builder::new()
            .kv("tokens", T_ARRAY, &payload)
            .build_unpadded(),
        "metadata key 'tokens': element 1: string length 1000 exceeds remaining 8 bytes",
    );
}

#[test]
fn metadata_value_budget_is_enforced() {
    let n = 5u64 << 20; // more than MAX_META_VALUES u8 elements, only 5 MiB of file
    let mut payload = T_U8.to_le_bytes().to_vec();
    payload.extend(n.to_le_bytes());
    payload.resize(payload.len() + n as usize, 0);
    let bytes = Builder::new().kv("big", T_ARRAY, &payload).build();
    parse_err(
        &bytes,
        "metadata key 'big': array length 5242880 exceeds the limit of 4194304 metadata values per file",
    );
}

#[test]
fn bad_metadata_values() {
    let mut deep = Vec::new();
    for _ in 0..5 {
        deep.extend(T_ARRAY.to_le_bytes());
        deep.extend(1u64.to_le_bytes());
    }
    deep.extend(T_U8.to_le_bytes());
    deep.extend(0u64.to_le_bytes());
    let bytes = Builder::new().kv("deep", T_ARRAY, &deep).build();
    parse_err(
        &bytes,
        "metadata key 'deep': element 0: element 0: element 0: element 0: arrays nested deeper than 4 levels",
    );

    parse_err(
        &Builder::new().kv("t", 13, &[0; 8]).build(),
        "metadata key 't': unknown value type 13",
    );
    let mut payload = 42u32.to_le_bytes().to_vec();
    payload.extend(0u64.to_le_bytes());
    parse_err(
        &Builder::new().kv("t", T_ARRAY, &payload).build(),
        "metadata key 't': unknown array element type 42",
    );
    parse_err(
        &Builder::new().kv("b", 7, &[2]).build(),
        "metadata key 'b': bool value 2 is neither 0 nor 1",
    );
    parse_err(
        &Builder::new()
            .kv("s", T_STRING, &gstr(&[0xff, 0xfe]))
            .build(),
        "metadata key 's': string at offset 45 is not valid UTF-8",
    );
    parse_err(
        &Builder::new().kv_u32("a", 1).kv_u32("a", 2).build(),
        "duplicate metadata key 'a'",
    );
    parse_err(
        &Builder::new().kv("v", T_U32, &[1, 2]).build_unpadded(),
        "metadata key 'v': unexpected end of file at offset 37: need 4 bytes, 2 remain",
    );
}

#[test]
fn bad_alignment() {
    for (payload, vtype, phrase) in [
        (
            0u32.to_le_bytes().to_vec(),
            T_U32,
            "general.alignment must be a nonzero power of two, found 0",
        ),
        (
            48u32.to_le_bytes().to_vec(),
            T_U32,
            "general.alignment must be a nonzero power of two, found 48",
        ),
        (
            (-32i32).to_le_bytes().to_vec(),
            5,
            "general.alignment must be a nonzero power of two, found -32",
        ),
        (
            gstr(b"32"),
            T_STRING,
            "general.alignment must be an integer, found a string",
        ),
    ] {
        parse_err(
            &Builder::new()
                .kv("general.alignment", vtype, &payload)
                .build(),
            phrase,
        );
    }
}

#[test]
fn bad_tensor_infos() {
    let data = f32_bytes(&[0.0; 8]);
    parse_err(
        &Builder::new().info("w", &[1, 1, 1, 1, 1], F32, 0).build(),
        "tensor 'w': n_dims 5 exceeds the maximum 4",
    );
    parse_err(
        &Builder::new()
            .info("w", &[1 << 32, 1 << 32], F32, 0)
            .build(),
        "tensor 'w': dims [4294967296, 4294967296] overflow the element count",
    );
    parse_err(
        &Builder::new().info("w", &[1 << 62, 4], 0, 0).build(),
        "tensor 'w': dims [4611686018427387904, 4] overflow",
    );
    parse_err(
        &Builder::new().info("w", &[1 << 61, 2], 0, 0).build(),
        "tensor 'w': F32: byte size of 4611686018427387904 elements overflows",
    );
    parse_err(
        &Builder::new().tensor("w", &[16, 2], Q8_0, &[0; 34]).build(),
        "tensor 'w': row length 16 (dim 0) is not a multiple of the Q8_0 block size 32",
    );
    parse_err(
        &Builder::new().info("w", &[8], F32, 4).build(),
        "tensor 'w': offset 4 is not a multiple of the alignment 32",
    );
    parse_err(
        &Builder::new()
            .tensor("w", &[8], F32, &data)
            .tensor("w", &[8], F32, &data)
            .build(),
        "duplicate tensor name 'w'",
    );
    parse_err(
        &Builder::new()
            .tensor("a", &[16], F32, &[0; 64])
            .info("b", &[8], F32, 32)
            .build(),
        "tensor 'a' (data 96..160) overlaps tensor 'b' (data 128..160)",
    );
    parse_err(
        &Builder::new().info("w", &[8], F32, u64::MAX - 31).build(),
        "tensor 'w': data range 64 + 18446744073709551584 + 32 bytes overflows",
    );
    let mut nameless = Builder::new().info("w", &[8], F32, 0).build();
    nameless[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    parse_err(
        &nameless,
        "tensor 0: name: string length 18446744073709551615 exceeds remaining",
    );
}

#[test]
fn tensor_outside_the_file_names_the_range() {
    let b = Builder::new().info("blk.0.attn_q.weight", &[8, 4], F32, 64);
    let bytes = b.build();
    let start = b.data_start() + 64;
    let msg = parse_err(&bytes, "data range");
    assert_eq!(
        msg,
        format!(
            "malformed GGUF: tensor 'blk.0.attn_q.weight': data range {start}..{} exceeds file size {}",
            start + 128,
            bytes.len()
        )
    );
}

#[test]
fn corrupted_real_file_errors_name_the_field() {
    let original = read("stories260K.gguf");
    // tokenizer.ggml.tokens is the first key: its array length sits after
    // the 24-byte header, the key (8 + 21 bytes), the value type and the element type.
    let at = 24 + 8 + "tokenizer.ggml.tokens".len() + 4 + 4;
    let mut bytes = original.clone();
    assert_eq!(
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()),
        512
    );
    bytes[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    parse_err(
        &bytes,
        "metadata key 'tokenizer.ggml.tokens': array length 1152921504606846976 of string",
    );

    // Grow the first tensor's relative offset past the end of the file.
    let f = GgufFile::parse(&original).unwrap();
    let name = "token_embd.weight";
    let header = &original[..f.data_offset() as usize];
    let pos = header
        .windows(name.len())
        .position(|w| w == name.as_bytes())
        .unwrap();
    let off_at = pos + name.len() + 4 + 2 * 8 + 4;
    let mut bytes = original.clone();
    bytes[off_at..off_at + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let start = f.data_offset() + (1 << 20);
    parse_err(
        &bytes,
        &format!(
            "tensor 'token_embd.weight': data range {start}..{} exceeds file size 1185376",
            start + 131072
        ),
    );
}

// ---------------------------------------------------------------------------------------
// robustness: truncation and corruption must give errors, never panics

fn data_end(bytes: &[u8]) -> usize {
    let f = GgufFile::parse(bytes).unwrap();
    let end = f
        .tensors()
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .unwrap_or(0);
    let header_end = f.data_offset().min(bytes.len() as u64);
    end.max(header_end) as usize
}

fn check_truncations(name: &str, every_byte_up_to: usize, stride: usize) {
    let bytes = read(name);
    let end = data_end(&bytes);
    let mut cut = 0;
    while cut < bytes.len() {
        let result = GgufFile::parse(&bytes[..cut]);
        if cut < end {
            let err = result
                .err()
                .unwrap_or_else(|| panic!("{name} cut at {cut} parsed"));
            assert!(
                matches!(err, GgufError::Malformed(_)),
                "{name} cut at {cut}: {err}"
            );
        }
        cut += if cut < every_byte_up_to { 1 } else { stride };
    }
}

#[test]
fn truncated_fixtures_fail_cleanly() {
    // Every byte of the header region (metadata and tensor infos) of the small models,
    // then strided cuts through the data and the larger headers.
    for name in [
        "stories260K.gguf",
        "stories260K-F16.gguf",
        "stories260K-Q8_0.gguf",
        "stories260K-Q4_0.gguf",
    ] {
        check_truncations(name, 14_400, 4093);
    }
    check_truncations("llama-2-tiny-random.gguf", 16_384, 7919);
    check_truncations("vocab/ggml-vocab-llama-spm.gguf", 4096, 4099);
}

#[test]
fn truncation_errors_name_the_place() {
    let bytes = read("stories260K.gguf");
    parse_err(
        &bytes[..3],
        "header: magic: unexpected end of file at offset 0: need 4 bytes, 3 remain",
    );
    parse_err(
        &bytes[..6],
        "header: version: unexpected end of file at offset 4",
    );
    parse_err(
        &bytes[..12],
        "header: tensor count: unexpected end of file at offset 8",
    );
    parse_err(
        &bytes[..20],
        "header: metadata count: unexpected end of file at offset 16",
    );
    parse_err(
        &bytes[..24],
        "header: metadata count 19 needs at least 13 bytes each, only 0 bytes remain",
    );
    parse_err(
        &bytes[..5000],
        "metadata key 'tokenizer.ggml.tokens': element",
    );
    let msg = parse_err(&bytes[..bytes.len() - 1], "exceeds file size 1185375");
    assert!(
        msg.starts_with("malformed GGUF: tensor '") && msg.contains("': data range "),
        "{msg}"
    );
}

/// xorshift64*: a small deterministic generator for corruption tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn corrupted_headers_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for name in ["stories260K-Q4_0.gguf", "stories260K-F16.gguf"] {
        let original = read(name);
        let header = GgufFile::parse(&original).unwrap().data_offset() as usize;
        let mut ok = 0;
        for _ in 0..1500 {
            let mut bytes = original[..].to_vec();
            for _ in 0..1 + rng.next() % 4 {
                let at = (rng.next() % header as u64) as usize;
                bytes[at] = match rng.next() % 3 {
                    0 => rng.next() as u8,
                    1 => 0xff,
                    _ => bytes[at] ^ (1 << (rng.next() % 8)),
                };
            }
            if let Ok(f) = GgufFile::parse(&bytes) {
                ok += 1;
                for t in f.tensors() {
                    let _ = f.tensor_f32(&t.name);
                    assert!(f.tensor_bytes(t).len() as u64 == t.n_bytes);
                }
            }
        }
        assert!(
            ok > 0,
            "{name}: some corruptions (e.g. in token text) still parse"
        );
    }
}

#[test]
fn foreign_tensor_info_gives_empty_bytes() {
    let f = GgufFile::parse(&Builder::new().build()).unwrap();
    let info = TensorInfo {
        name: "x".into(),
        dims: vec![u64::MAX, 2],
        ggml_type: GgmlType::F32,
        offset: u64::MAX - 1,
        n_bytes: 10,
    };
    assert!(f.tensor_bytes(&info).is_empty());
    assert_eq!(info.n_elements(), u64::MAX);
    assert!(f.dequantize(&info).is_err());
}

// ---------------------------------------------------------------------------------------
// model spec from crafted metadata: every size is bounded, bad constants name their key

const T_F32: u32 = 6;
const T_U64: u32 = 10;
const F16: u32 = 1;

/// A llama header (64 wide, 4 heads of 16, 2 KV heads, 2 layers) with `over` replacing or
/// adding `llama.*` keys; a value of `None` drops the key.
/// An encoded metadata value (type id, payload); `None` leaves the key out.
type Value = Option<(u32, Vec<u8>)>;

fn spec_with(over: &[(&str, Value)]) -> Result<ModelSpec, ModelError> {
    let mut keys: Vec<(&str, Value)> = [
        ("embedding_length", 64u32),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("feed_forward_length", 128),
        ("block_count", 2),
        ("vocab_size", 100),
        ("context_length", 256),
    ]
    .into_iter()
    .map(|(k, v)| (k, Some((T_U32, v.to_le_bytes().to_vec()))))
    .collect();
    for (k, v) in over {
        match keys.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = v.clone(),
            None => keys.push((k, v.clone())),
        }
    }
    let mut b = Builder::new().kv("general.architecture", T_STRING, &gstr(b"llama"));
    for (k, v) in keys {
        if let Some((ty, payload)) = v {
            b = b.kv(&format!("llama.{k}"), ty, &payload);
        }
    }
    ModelSpec::from_gguf(&GgufFile::parse(&b.build()).expect("crafted header parses"))
}

fn u32v(v: u32) -> Value {
    Some((T_U32, v.to_le_bytes().to_vec()))
}

fn f32v(v: f32) -> Value {
    Some((T_F32, v.to_le_bytes().to_vec()))
}

/// Expects `spec_with(over)` to fail with a message naming `key` (the full GGUF key).
fn spec_err(over: &[(&str, Value)], key: &str) {
    match spec_with(over) {
        Ok(s) => panic!("{over:?}: expected an error naming {key}, got {s:?}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(key),
                "{over:?}: error {msg:?} does not name {key}"
            );
        }
    }
}

#[test]
fn crafted_base_spec_loads() {
    let s = spec_with(&[]).unwrap();
    assert_eq!(
        (s.hidden, s.n_heads, s.n_kv_heads, s.head_dim, s.n_layers),
        (64, 4, 2, 16, 2)
    );
    assert_eq!((s.max_position, s.rope.dim), (256, 16));
}

#[test]
fn huge_block_count_is_refused_before_allocating() {
    // 2^32-1 layers used to abort the process in `Vec::with_capacity` while loading.
    spec_err(&[("block_count", u32v(u32::MAX))], "llama.block_count");
    let huge = Some((T_U64, (1u64 << 62).to_le_bytes().to_vec()));
    spec_err(&[("block_count", huge)], "llama.block_count");
    spec_err(&[("block_count", u32v(0))], "llama.block_count");
}

#[test]
fn huge_dims_heads_vocab_and_context_are_refused() {
    spec_err(
        &[("embedding_length", u32v(u32::MAX))],
        "llama.embedding_length",
    );
    spec_err(
        &[("feed_forward_length", u32v(u32::MAX))],
        "llama.feed_forward_length",
    );
    spec_err(&[("vocab_size", u32v(u32::MAX))], "llama.vocab_size");
    spec_err(
        &[
            ("attention.head_count", u32v(1 << 20)),
            ("attention.head_count_kv", u32v(1 << 20)),
        ],
        "llama.attention.head_count",
    );
    spec_err(
        &[("context_length", u32v(u32::MAX))],
        "llama.context_length",
    );
    spec_err(
        &[("attention.key_length", u32v(1 << 20))],
        "llama.attention.key_length",
    );
    spec_err(
        &[("attention.key_length", u32v(0))],
        "llama.attention.key_length",
    );
}

#[test]
fn context_length_zero_or_one_is_refused() {
    spec_err(&[("context_length", u32v(0))], "llama.context_length");
    spec_err(&[("context_length", u32v(1))], "llama.context_length");
    assert_eq!(
        spec_with(&[("context_length", u32v(2))])
            .unwrap()
            .max_position,
        2
    );
}

#[test]
fn rope_dimension_zero_or_wider_than_the_head_is_refused() {
    spec_err(
        &[("rope.dimension_count", u32v(0))],
        "llama.rope.dimension_count",
    );
    spec_err(
        &[("rope.dimension_count", u32v(18))],
        "llama.rope.dimension_count",
    );
    spec_err(
        &[("rope.dimension_count", u32v(7))],
        "llama.rope.dimension_count",
    );
    let s = spec_with(&[("rope.dimension_count", u32v(8))]).unwrap();
    assert_eq!(s.rope.inv_freqs().len(), 4);
}

#[test]
fn nan_or_non_positive_rms_eps_is_refused() {
    let key = "llama.attention.layer_norm_rms_epsilon";
    for bad in [f32::NAN, 0.0, -1e-5, f32::INFINITY] {
        spec_err(&[("attention.layer_norm_rms_epsilon", f32v(bad))], key);
    }
    let s = spec_with(&[("attention.layer_norm_rms_epsilon", f32v(1e-6))]).unwrap();
    assert_eq!(s.rms_eps, 1e-6);
    spec_err(
        &[("rope.freq_base", f32v(f32::NAN))],
        "llama.rope.freq_base",
    );
}

#[test]
fn gqa_group_is_bounded_before_attention_sees_it() {
    let kv = "llama.attention.head_count_kv";
    spec_err(&[("attention.head_count_kv", u32v(3))], kv);
    spec_err(&[("attention.head_count_kv", u32v(0))], kv);
    spec_err(&[("attention.head_count_kv", u32v(8))], kv);
    // 128 query heads on one KV head: a group past what the CPU attention holds.
    spec_err(
        &[
            ("embedding_length", u32v(128 * 16)),
            ("attention.head_count", u32v(128)),
            ("attention.head_count_kv", u32v(1)),
        ],
        kv,
    );
    let s = spec_with(&[
        ("embedding_length", u32v(64 * 16)),
        ("attention.head_count", u32v(64)),
        ("attention.head_count_kv", u32v(1)),
    ])
    .unwrap();
    assert_eq!(s.n_heads / s.n_kv_heads, 64);
}

#[test]
fn one_dim_token_embedding_without_vocab_size_errors() {
    let file = Builder::new()
        .kv("general.architecture", T_STRING, &gstr(b"llama"))
        .kv_u32("llama.embedding_length", 64)
        .kv_u32("llama.attention.head_count", 4)
        .kv_u32("llama.feed_forward_length", 128)
        .kv_u32("llama.block_count", 1)
        .tensor("token_embd.weight", &[4], F32, &f32_bytes(&[0.0; 4]))
        .build();
    let err = ModelSpec::from_gguf(&GgufFile::parse(&file).unwrap()).unwrap_err();
    assert!(err.to_string().contains("vocab"), "{err}");
}

#[test]
fn nonfinite_weights_at_either_end_are_reported_by_name() {
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let mut long = vec![1.0f32; 1024];
    long[1023] = f32::NAN;
    let mut middle = vec![1.0f32; 1024];
    middle[512] = f32::INFINITY; // only the ends are scanned
    let mut f16_inf: Vec<u8> = (0..64).flat_map(|_| f16(0.5)).collect();
    f16_inf[..2].copy_from_slice(&f16(f32::INFINITY));
    let mut q8 = vec![0u8; 34 * 2];
    q8[34..36].copy_from_slice(&f16(f32::NAN)); // the second (last) block's scale
    let file = Builder::new()
        .tensor("clean", &[8], F32, &f32_bytes(&[1.0; 8]))
        .tensor("nan_last", &[1024], F32, &f32_bytes(&long))
        .tensor("inf_middle", &[1024], F32, &f32_bytes(&middle))
        .tensor("inf_first", &[64], F16, &f16_inf)
        .tensor("q8_nan_scale", &[64], Q8_0, &q8)
        .build();
    let g = GgufFile::parse(&file).unwrap();
    assert_eq!(
        g.nonfinite_tensors(),
        vec!["nan_last", "inf_first", "q8_nan_scale"]
    );
}
