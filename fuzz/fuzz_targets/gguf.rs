//! Fuzz target: `GgufFile::parse` on arbitrary bytes, then dequantize every small tensor.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The reader's sources, reachable as `crate::model::gguf` and `crate::backend::quant` as
// in the main crate.
#[allow(dead_code)]
#[path = "../../src/model/gguf.rs"]
pub mod gguf;
#[allow(dead_code)]
#[path = "../../src/backend/quant.rs"]
pub mod quant;
mod model {
    pub use super::gguf;
}
mod backend {
    pub use super::quant;
}

use model::gguf::{GgufFile, MetaValue};

/// Tensors up to this many bytes are dequantized (keeps each run fast).
const MAX_DEQUANT_BYTES: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::parse(data) else {
        return;
    };
    for (key, value) in file.metadata() {
        assert!(std::ptr::eq(file.meta(key).unwrap(), value));
        let _ = (file.meta_u64(key), file.meta_f64(key), file.meta_str(key));
        if let MetaValue::Array(_) = value {
            let _ = file.meta_str_array(key);
            let _ = file.meta_f32_array(key);
            let _ = file.meta_i64_array(key);
        }
    }
    // The loader's NaN/Inf scan reads the ends of every tensor: it must never panic.
    let _ = file.nonfinite_tensors();
    for info in file.tensors() {
        // Invariants of a parsed file: data inside the file, sizes consistent.
        let bytes = file.tensor_bytes(info);
        assert_eq!(bytes.len() as u64, info.n_bytes, "{}", info.name);
        assert!(info.offset + info.n_bytes <= data.len() as u64);
        if info.ggml_type.is_supported() && info.n_bytes <= MAX_DEQUANT_BYTES {
            // A tensor that parsed must dequantize: any error here is a reader bug.
            let values = file
                .tensor_f32(&info.name)
                .expect("validated tensor dequantizes");
            assert_eq!(values.len() as u64, info.n_elements());
        } else if !info.ggml_type.is_supported() {
            assert!(file.tensor_f32(&info.name).is_err());
        }
    }
});
