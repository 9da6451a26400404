//! The compiled-model file: round trips and typed errors for damaged files.

use quant::DataType;
use ref_backend::format::{HEADER_LEN, LAST_ROW_FORMAT_VERSION, MAGIC};
use ref_backend::{
    CompileOptions, CompiledModel, FormatError, Granularity, KLayout, WeightType, compile,
};
use test_support::files::ScratchDir;

fn models() -> Vec<CompiledModel> {
    let mut out = Vec::new();
    let configs = [
        (
            true,
            DataType::U8,
            WeightType::I8,
            KLayout::Rows,
            Granularity::PerHead,
        ),
        (
            false,
            DataType::U16,
            WeightType::F16,
            KLayout::Transposed,
            Granularity::PerLayer,
        ),
        (
            true,
            DataType::F16,
            WeightType::I8,
            KLayout::Rows,
            Granularity::PerLayer,
        ),
        (
            false,
            DataType::F32,
            WeightType::F32,
            KLayout::Transposed,
            Granularity::PerHead,
        ),
        (
            false,
            DataType::U16,
            WeightType::I4,
            KLayout::Rows,
            Granularity::PerHead,
        ),
        (
            true,
            DataType::U8,
            WeightType::I8F16,
            KLayout::Rows,
            Granularity::PerHead,
        ),
    ];
    for (shared, kv, w, layout, gran) in configs {
        let ckpt = test_support::stories::synthetic(shared);
        let mut o = CompileOptions::new(32, vec![1, 4, 16]);
        o.kv_dtype = kv;
        o.weights = w;
        o.k_layout = layout;
        o.granularity = gran;
        o.calibration_tokens = 16;
        let prompts = test_support::stories::synthetic_prompts(64);
        out.push(test_support::compile::compile_ckpt(&ckpt, &prompts, &o).expect("compile"));
    }
    out
}

fn small_model_bytes() -> Vec<u8> {
    models().swap_remove(0).to_bytes()
}

#[test]
fn round_trip_bytes_and_file() {
    let dir = ScratchDir::new("ref-format");
    for (i, m) in models().into_iter().enumerate() {
        let bytes = m.to_bytes();
        let back = CompiledModel::from_bytes(&bytes, "mem").expect("parse");
        assert!(back == m, "model {i} differs after a round trip");
        assert_eq!(
            back.to_bytes(),
            bytes,
            "model {i}: re-serialization differs"
        );
        assert_eq!(back.fingerprint(), m.fingerprint());
        let path = dir.join(format!("m{i}.htpkv"));
        m.write(&path, &[]).expect("write");
        let read = CompiledModel::read(&path).expect("read");
        assert!(read == m, "model {i} differs after write/read");
        // Graph lookup.
        assert_eq!(read.graph("ar4_cl32").map(|g| g.ar()), Some(4));
        assert_eq!(read.graph_for_ar(16).map(|g| g.name()), Some("ar16_cl32"));
        assert!(read.graph_for_ar(2).is_none());
    }
    // No temporary files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn truncated_files_are_typed_errors() {
    let bytes = small_model_bytes();
    let n = bytes.len();
    for cut in [0, 1, 7, 8, 11, 12, 20, 27, 28, 29, 100, n / 2, n - 1] {
        match CompiledModel::from_bytes(&bytes[..cut], "cut") {
            Err(FormatError::Truncated {
                offset,
                expected,
                available,
                what,
                ..
            }) => {
                assert!(
                    offset as usize <= cut && available < expected,
                    "cut {cut}: {what} at {offset}: expected {expected}, available {available}"
                );
                if cut >= HEADER_LEN {
                    assert_eq!(what, "payload");
                    assert_eq!(offset, HEADER_LEN as u64);
                    assert_eq!(expected as usize, n - HEADER_LEN);
                    assert_eq!(available as usize, cut - HEADER_LEN);
                }
            }
            other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
        }
    }
    let msg = CompiledModel::from_bytes(&bytes[..100], "cut.bin")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("cut.bin") && msg.contains("offset 28"),
        "{msg}"
    );
}

#[test]
fn damaged_files_are_typed_errors() {
    let bytes = small_model_bytes();
    // A flipped payload byte: checksum.
    for at in [HEADER_LEN, HEADER_LEN + 5, bytes.len() / 2, bytes.len() - 1] {
        let mut b = bytes.clone();
        b[at] ^= 0x10;
        assert!(
            matches!(
                CompiledModel::from_bytes(&b, "x"),
                Err(FormatError::ChecksumMismatch { .. })
            ),
            "flip at {at}"
        );
    }
    // Wrong magic.
    let mut b = bytes.clone();
    b[0] = b'X';
    assert!(matches!(
        CompiledModel::from_bytes(&b, "x"),
        Err(FormatError::BadMagic { .. })
    ));
    assert!(matches!(
        CompiledModel::from_bytes(b"GARBAGE!", "x"),
        Err(FormatError::BadMagic { .. })
    ));
    assert!(matches!(
        CompiledModel::from_bytes(b"GA", "x"),
        Err(FormatError::BadMagic { .. })
    ));
    // Wrong version.
    let mut b = bytes.clone();
    b[8..12].copy_from_slice(&(LAST_ROW_FORMAT_VERSION + 1).to_le_bytes());
    match CompiledModel::from_bytes(&b, "x") {
        Err(FormatError::UnsupportedVersion {
            found, supported, ..
        }) => assert_eq!(
            (found, supported),
            (LAST_ROW_FORMAT_VERSION + 1, LAST_ROW_FORMAT_VERSION)
        ),
        other => panic!("{other:?}"),
    }
    // Trailing bytes.
    let mut b = bytes.clone();
    b.push(0);
    assert!(matches!(
        CompiledModel::from_bytes(&b, "x"),
        Err(FormatError::TrailingBytes { extra: 1, .. })
    ));
    assert_eq!(&bytes[..8], &MAGIC);
}

#[test]
fn consistent_checksum_but_bad_content_never_panics() {
    let bytes = small_model_bytes();
    // The context (first field of the OPTS section, after tag + length) set to 10^9.
    let mut b = bytes.clone();
    let ctx_at = HEADER_LEN + 4 + 8;
    b[ctx_at..ctx_at + 8].copy_from_slice(&1_000_000_000u64.to_le_bytes());
    assert!(matches!(
        CompiledModel::from_bytes(&test_support::harness::reseal(b), "x"),
        Err(FormatError::Corrupt { .. })
    ));
    // Every byte of the payload flipped in turn (checksum fixed up): errors or (for weight
    // bytes) a valid model, never a panic. Sampled with a stride to keep the test fast.
    let mut errors = 0;
    for at in (HEADER_LEN..bytes.len()).step_by(7) {
        let mut b = bytes.clone();
        b[at] ^= 0xA5;
        if CompiledModel::from_bytes(&test_support::harness::reseal(b), "x").is_err() {
            errors += 1;
        }
    }
    assert!(errors > 0);
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Issue 14 row 12: a NaN norm (or weight) with a fixed-up checksum loaded and printed `<unk>`.
#[test]
fn non_finite_norms_and_weights_are_refused_even_with_a_right_checksum() {
    let ckpt = test_support::stories::synthetic(false);
    let m = models().swap_remove(3); // f32 weights, separate classifier
    let bytes = m.to_bytes();
    let cases: [(&str, &[f32], f32); 3] = [
        ("layer 0 AttnNorm", &ckpt.weights.rms_att[..4], f32::NAN),
        ("output norm", &ckpt.weights.rms_final[..4], f32::INFINITY),
        ("layer 0 Q", &ckpt.weights.wq[..4], f32::NEG_INFINITY),
    ];
    for (name, head, bad) in cases {
        let needle = f32_bytes(head);
        let at = bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap_or_else(|| panic!("{name} not found"));
        let mut b = bytes.clone();
        b[at..at + 4].copy_from_slice(&bad.to_le_bytes());
        match CompiledModel::from_bytes(&test_support::harness::reseal(b), "nan.htpkv") {
            Err(e @ FormatError::NonFinite { .. }) => {
                let msg = e.to_string();
                assert_eq!(
                    msg,
                    format!("nan.htpkv: {name}[0] is {bad} at offset {at}: weights must be finite")
                );
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn the_file_records_the_model_and_calibration_it_was_compiled_from() {
    let ckpt = test_support::stories::synthetic(true);
    let m = models().swap_remove(0);
    assert_eq!(m.model_sha256_hex(), ckpt.sha256_hex());
    let back = CompiledModel::from_bytes(&m.to_bytes(), "mem").unwrap();
    assert_eq!(back.model_sha256_hex(), ckpt.sha256_hex());
    assert_eq!(
        back.calibration(),
        &test_support::stories::synthetic_prompts(64)[..]
    );
    assert_eq!(back.config(), &model::llama2c::llama_config(&ckpt.config));
    let other = test_support::stories::synthetic(false);
    assert_ne!(other.sha256_hex(), ckpt.sha256_hex());
}

/// Issue 14 rows 5 and 7: `/dev/zero` as a model, and writing over a device or an input.
#[test]
fn special_files_are_refused_for_reading_and_writing() {
    // Issue 21 finding 5: refused as a device before a byte is read.
    let e = CompiledModel::read(std::path::Path::new("/dev/zero")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "compiled model /dev/zero is a character device, not a regular file"
    );
    let m = models().swap_remove(0);
    let e = m.write(std::path::Path::new("/dev/null"), &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "refusing to write /dev/null: it is a character device, not a regular file"
    );
    let dir = ScratchDir::new("ref-refuse");
    let input = dir.join("model.bin");
    std::fs::write(&input, b"checkpoint").unwrap();
    let e = m.write(&input, &[&input]).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "refusing to write {}: it is one of this command's inputs",
            input.display()
        )
    );
    assert_eq!(std::fs::read(&input).unwrap(), b"checkpoint");
    // A real header followed by far more than it declares (sparse): refused from the size.
    let good = dir.join("good.htpkv");
    m.write(&good, &[]).unwrap();
    let len = std::fs::metadata(&good).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(&good)
        .unwrap()
        .set_len(len + (1 << 30))
        .unwrap();
    let e = CompiledModel::read(&good).unwrap_err();
    assert!(
        matches!(e, FormatError::TrailingBytes { extra, .. } if extra == 1 << 30),
        "{e}"
    );
}

/// Issue 14 row 8: 2^20 + 1 calibration tokens compiled, then the file failed to read back.
#[test]
fn options_the_file_cannot_hold_are_refused_before_compiling() {
    let ckpt = test_support::stories::synthetic(true);
    let mut o = CompileOptions::new(32, vec![1, 4]);
    o.calibration_tokens = ref_backend::MAX_CALIBRATION_TOKENS + 1;
    let mut calls = 0;
    let c = model::llama2c::llama_config(&ckpt.config);
    let prompts = test_support::stories::synthetic_prompts(64);
    let e = compile(&c, &ckpt, &prompts, &o, ckpt.sha256(), &mut |_| calls += 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid compile options: calibration_tokens 1048577 exceeds the maximum 1048576 (the file format's limit)"
    );
    assert_eq!(calls, 0, "nothing was computed");
}

/// Issue 14 row 14: messages carry their own context once and the cause once, as the source.
#[test]
fn compile_errors_name_the_cause_once() {
    let ckpt = test_support::stories::synthetic(true);
    let o = CompileOptions::new(32, vec![1, 4]);
    let e = test_support::compile::compile_ckpt(&ckpt, &[vec![1, 9999]], &o).unwrap_err();
    assert_eq!(e.to_string(), "calibration sequence 0");
    let cause = std::error::Error::source(&e).expect("a source").to_string();
    assert_eq!(cause, "token 9999 is out of range for a vocabulary of 64");
    let e = CompiledModel::read(std::path::Path::new("/nonexistent/m.htpkv")).unwrap_err();
    assert_eq!(e.to_string(), "cannot open /nonexistent/m.htpkv");
    let cause = std::error::Error::source(&e).expect("a source").to_string();
    assert_eq!(cause, "No such file or directory (os error 2)");
}

/// A read file's matrices keep their values in the file's bytes, which are held once: what the
/// weights hold beyond them after reading is their row scales, row sums and norms (12 bytes a
/// row of 256 or 512 i8 values here), where the model as compiled holds every value itself; f16
/// matrices too, wherever the format puts them (odd or even offsets). A reader that copied the
/// values out again fails this.
#[test]
fn a_read_file_is_the_weights_one_copy_in_memory() {
    let config = model::llama2c::Config {
        dim: 256,
        hidden_dim: 512,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        vocab_size: 256,
        seq_len: 32,
        shared_classifier: true,
    };
    let ckpt = model::llama2c::Checkpoint::synthetic(config, 7).expect("valid config");
    let prompts = test_support::stories::synthetic_prompts(256);
    let dir = ScratchDir::new("ref-format-in-place");
    for weights in [WeightType::I8, WeightType::I8F16, WeightType::F16] {
        let mut o = CompileOptions::new(32, vec![1]);
        o.calibration_tokens = 16;
        o.weights = weights;
        let m = test_support::compile::compile_ckpt(&ckpt, &prompts, &o).expect("compile");
        let path = dir.join(format!("{}.htpkv", weights.name()));
        m.write(&path, &[]).expect("write");
        let file_len = std::fs::metadata(&path).expect("written").len();

        let (compiled_own, compiled_file) = m.weight_memory();
        assert_eq!(compiled_file, 0, "a compiled model reads no file");
        assert!(
            compiled_own > file_len * 9 / 10,
            "{compiled_own} of {file_len}"
        );
        for read in [
            CompiledModel::read(&path).expect("read"),
            CompiledModel::from_bytes(&std::fs::read(&path).unwrap(), "mem").expect("parse"),
        ] {
            assert!(read == m, "{weights:?}: differs after reading");
            let (own, file) = read.weight_memory();
            assert_eq!(file, file_len, "the file's bytes are held once, whole");
            assert!(
                own * 8 < file_len,
                "{weights:?}: {own} bytes copied out of {file_len}"
            );
            assert_eq!(read.weight_bytes(), own + file);
        }
    }
}
