//! Checkpoint loading and validation against the real stories260K file, committed under `models/stories260K`.

use model::llama2c::{
    Checkpoint, HEADER_BYTES, ModelError, STORIES260K_BYTES, STORIES260K_SHA256, sha256_hex,
};
use test_support::files::ScratchDir;

fn real_bytes() -> Vec<u8> {
    let files = test_support::stories::stories260k();
    std::fs::read(&files.checkpoint).expect("model file readable")
}

fn set_field(bytes: &mut [u8], index: usize, value: i32) {
    bytes[4 * index..4 * index + 4].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn loads_real_checkpoint_with_readme_config() {
    let bytes = real_bytes();
    assert_eq!(bytes.len() as u64, STORIES260K_BYTES);
    assert_eq!(sha256_hex(&bytes), STORIES260K_SHA256);
    let ck = Checkpoint::from_bytes(&bytes, "stories260K").unwrap();
    let c = ck.config;
    assert_eq!(
        (
            c.dim,
            c.hidden_dim,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.vocab_size,
            c.seq_len
        ),
        (64, 172, 5, 8, 4, 512, 512)
    );
    assert!(c.shared_classifier);
    assert_eq!((c.head_dim(), c.kv_dim()), (8, 32));
    assert_eq!(c.file_bytes(), bytes.len() as u64);
    // The first embedding float sits right after the header.
    let first = f32::from_le_bytes([bytes[28], bytes[29], bytes[30], bytes[31]]);
    assert_eq!(ck.weights.token_embedding[0], first);
    // The last layer's w3 row ends right before rms_final.
    let w = &ck.weights;
    assert_eq!(w.wq(4).len(), 64 * 64);
    assert_eq!(w.wk(4).len(), 32 * 64);
    assert_eq!(w.w2(4).len(), 64 * 172);
    assert_eq!(ck.classifier().len(), 512 * 64);
    assert!(w.wcls.is_none());
    // Norm weights are positive-ish numbers around 1; a misaligned read would not be.
    let mean = w.rms_final.iter().sum::<f32>() / 64.0;
    assert!(mean > 0.1 && mean < 10.0, "rms_final mean {mean}");
}

#[test]
fn every_truncation_names_the_short_section() {
    let bytes = real_bytes();
    let ck = Checkpoint::from_bytes(&bytes, "x").unwrap();
    let mut start = HEADER_BYTES;
    for (name, n) in ck.config.sections() {
        let end = start + 4 * n;
        // Cut one byte short of the section's end, and at its start + 1 byte.
        for cut in [end - 1, start + 1] {
            match Checkpoint::from_bytes(&bytes[..cut], "cut.bin") {
                Err(ModelError::Truncated {
                    origin,
                    what,
                    expected,
                    found,
                }) => {
                    assert_eq!(what, format!("section {name}"), "cut at {cut}");
                    assert_eq!(expected, bytes.len() as u64);
                    assert_eq!(found, cut as u64);
                    assert_eq!(origin, "cut.bin");
                }
                other => panic!("cut at {cut} in {name}: expected Truncated, got {other:?}"),
            }
        }
        start = end;
    }
    assert_eq!(start, bytes.len());
    for cut in [0, 27] {
        assert!(matches!(
            Checkpoint::from_bytes(&bytes[..cut], "h"),
            Err(ModelError::Truncated { ref what, .. }) if what == "header"
        ));
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    let mut bytes = real_bytes();
    let n = bytes.len() as u64;
    bytes.extend_from_slice(&[0; 4]);
    let err = Checkpoint::from_bytes(&bytes, "long.bin").unwrap_err();
    assert!(
        matches!(err, ModelError::TrailingBytes { expected, found, .. } if expected == n && found == n + 4),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&n.to_string()) && msg.contains(&(n + 4).to_string()),
        "{msg}"
    );
}

#[test]
fn corrupted_headers_are_rejected() {
    let bytes = real_bytes();
    // (field index, value, expected error field)
    let cases = [
        (0, 0, "dim"),
        (0, -64, "dim"),
        (1, 0, "hidden_dim"),
        (2, -5, "n_layers"),
        (3, 0, "n_heads"),
        (3, 7, "n_heads"),    // 64 % 7 != 0
        (3, 64, "n_heads"),   // head_dim 1: odd
        (4, 3, "n_kv_heads"), // 8 % 3 != 0
        (4, 0, "n_kv_heads"),
        (5, 0, "vocab_size"),
        (5, i32::MIN, "vocab_size"),
        (6, 0, "seq_len"),
        (6, i32::MAX, "seq_len"),
        (1, i32::MAX, "hidden_dim"),
    ];
    for (index, value, field) in cases {
        let mut b = bytes.clone();
        set_field(&mut b, index, value);
        match Checkpoint::from_bytes(&b, "bad.bin") {
            Err(ModelError::BadHeader {
                field: got,
                value: v,
                ..
            }) => {
                assert_eq!(got, field, "field {index} = {value}");
                assert_eq!(v, i64::from(value));
            }
            other => panic!("field {index} = {value}: expected BadHeader({field}), got {other:?}"),
        }
    }
    // Valid but different headers change the expected size: caught as truncation/trailing data.
    let mut b = bytes.clone();
    set_field(&mut b, 5, -512); // untied classifier -> wcls section missing
    assert!(matches!(
        Checkpoint::from_bytes(&b, "cls.bin"),
        Err(ModelError::Truncated { ref what, .. }) if what == "section wcls"
    ));
    let mut b = bytes.clone();
    set_field(&mut b, 4, 8); // 8 KV heads: wk/wv twice as large
    assert!(matches!(
        Checkpoint::from_bytes(&b, "kv.bin"),
        Err(ModelError::Truncated { .. })
    ));
    let mut b = bytes.clone();
    set_field(&mut b, 2, 4); // one layer fewer than stored
    assert!(matches!(
        Checkpoint::from_bytes(&b, "layers.bin"),
        Err(ModelError::TrailingBytes { .. })
    ));
}

#[test]
fn load_reports_path_in_errors() {
    let bytes = real_bytes();
    let dir = ScratchDir::new("llama2c-trunc");
    let path = dir.join("trunc.bin");
    std::fs::write(&path, &bytes[..1000]).unwrap();
    let msg = Checkpoint::load(&path).unwrap_err().to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(
        msg.contains("section rms_att") || msg.contains("section token_embedding"),
        "{msg}"
    );
    assert!(msg.contains("1056540") && msg.contains("1000"), "{msg}");
    let missing = dir.join("definitely-missing.bin");
    assert!(matches!(
        Checkpoint::load(&missing),
        Err(ModelError::File(model::fsio::FileError::Io { ref path, op: "open", .. })) if *path == missing
    ));
}

/// Issue 14 row 5: `/dev/zero` as a checkpoint or tokenizer was read without end; issue 21
/// finding 5: it is refused before a byte is read, as not a regular file.
#[test]
fn dev_zero_fails_fast_as_checkpoint_and_tokenizer() {
    let zero = std::path::Path::new("/dev/zero");
    let started = std::time::Instant::now();
    let e = Checkpoint::load(zero).unwrap_err();
    assert_eq!(
        e.to_string(),
        "checkpoint /dev/zero is a character device, not a regular file"
    );
    let e = model::llama2c::Tokenizer::load(zero, 512).unwrap_err();
    assert_eq!(
        e.to_string(),
        "tokenizer /dev/zero is a character device, not a regular file"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

/// A checkpoint behind a FIFO is refused without blocking (no writer ever opens it), and a
/// regular file longer than its header implies is refused before the rest is read.
#[test]
fn a_fifo_is_refused_and_a_long_file_is_refused_from_its_size() {
    let bytes = real_bytes();
    let dir = ScratchDir::new("ckpt-fifo");
    let long = dir.join("long.bin");
    let f = std::fs::File::create(&long).unwrap();
    // Sparse: the header is real, 1 GiB of nothing follows it.
    std::io::Write::write_all(&mut &f, &bytes).unwrap();
    f.set_len(bytes.len() as u64 + (1 << 30)).unwrap();
    let e = Checkpoint::load(&long).unwrap_err();
    assert!(
        matches!(e, ModelError::TrailingBytes { found, .. } if found == bytes.len() as u64 + (1 << 30)),
        "{e}"
    );
    let fifo = dir.join("ckpt");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let e = Checkpoint::load(&fifo).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "checkpoint {} is a FIFO, not a regular file",
                fifo.display()
            )
        );
    }
}

#[test]
fn serialization_matches_the_upstream_layout() {
    let bytes = real_bytes();
    let ck = Checkpoint::from_bytes(&bytes, "x").unwrap();
    let out = ck.to_bytes();
    assert_eq!(out.len(), bytes.len());
    // Header and every weight byte are identical; only the ignored RoPE tables may differ.
    let rope = 2 * 4 * ck.config.seq_len * ck.config.head_dim() / 2;
    let weights_end = bytes.len() - rope;
    assert_eq!(&out[..weights_end], &bytes[..weights_end]);
    // The regenerated tables are close to upstream's (same formula, maybe another libm).
    let floats = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let (a, b) = (floats(&out[weights_end..]), floats(&bytes[weights_end..]));
    let max_diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(max_diff < 1e-3, "RoPE table differs by {max_diff}");
    assert_eq!(Checkpoint::from_bytes(&out, "y").unwrap(), ck);
}

#[test]
fn a_loaded_checkpoint_knows_the_sha256_of_its_file() {
    let files = test_support::stories::stories260k();
    let ckpt = Checkpoint::load(&files.checkpoint).unwrap();
    assert_eq!(ckpt.sha256_hex(), model::llama2c::STORIES260K_SHA256);
    // Built from parts, it is the digest of its serialization.
    let rebuilt = Checkpoint::new(ckpt.config, ckpt.weights.clone()).unwrap();
    assert_eq!(
        rebuilt.sha256_hex(),
        model::llama2c::sha256_hex(&rebuilt.to_bytes())
    );
    assert!(rebuilt == ckpt);
}

/// Found by the `checkpoint` fuzz target: a NaN weight loaded (and compiled into nonsense).
#[test]
fn non_finite_weights_are_refused() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus/checkpoint/nan_weight");
    let e = Checkpoint::load(&path).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::NonFinite {
                tensor: "w2",
                index: 57,
                offset: 2112,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .ends_with("weight w2[57] at offset 2112 is not finite"),
        "{e}"
    );
}
