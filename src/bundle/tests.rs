use test_support::files::ScratchDir;

use super::*;

const LLAMA32: &str = r#"{
  "dialog": {
    "version": 1, "type": "basic",
    "context": {"version": 1, "size": 4096, "n-vocab": 128256, "bos-token": 128000,
                "eos-token": [128001, 128009, 128008]},
    "sampler": {"version": 1, "seed": 42, "temp": 0.8},
    "tokenizer": {"version": 1, "path": "tokenizer.json"},
    "engine": {
      "version": 1, "n-threads": 3,
      "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {"version": 1, "spill-fill-bufsize": 0}},
      "model": {
        "version": 1, "type": "binary",
        "binary": {"version": 1, "ctx-bins": ["llama_part_1_of_3.bin", "./llama_part_2_of_3.bin", "llama_part_3_of_3.bin"]},
        "positional-encoding": {"type": "rope", "rope-dim": 64, "rope-theta": 500000,
          "rope-scaling": {"rope-type": "llama3", "factor": 8.0, "low-freq-factor": 1.0,
                           "high-freq-factor": 4.0, "original-max-position-embeddings": 8192}}
      }
    }
  }
}"#;

fn open_with(name: &str, config: &str) -> Result<Bundle, BundleError> {
    let dir = ScratchDir::new(name);
    std::fs::write(dir.join("genie_config.json"), config).unwrap();
    Bundle::open(&dir)
}

#[test]
fn an_ai_hub_llama_bundle_reads_completely() {
    let b = open_with("llama", LLAMA32).unwrap();
    assert_eq!((b.context, b.vocab, b.bos), (4096, 128256, Some(128000)));
    assert_eq!(b.eos, [128001, 128009, 128008]);
    assert_eq!(b.ctx_bins.len(), 3);
    assert!(b.ctx_bins[1].ends_with("llama_part_2_of_3.bin"));
    assert!(b.ctx_bins.iter().all(|p| p.starts_with(&b.dir)));
    assert_eq!(b.tokenizer, b.dir.join("tokenizer.json"));
    let rope = b.rope.unwrap();
    assert_eq!(rope.theta, 500000.0);
    let s = rope.scaling.unwrap();
    assert_eq!((s.factor, s.original_context), (8.0, 8192));
    assert_eq!(b.rope_dim, Some(64));
}

#[test]
fn older_bundles_give_theta_in_the_backend_section_and_no_bos() {
    let config = r#"{"dialog": {"context": {"size": 1024, "n-vocab": 32000, "bos-token": -1,
        "eos-token": 2}, "engine": {"backend": {"QnnHtp": {"rope-theta": 10000, "pos-id-dim": 64}},
        "model": {"binary": {"ctx-bins": ["a.bin"]}}}}}"#;
    let b = open_with("old", config).unwrap();
    assert_eq!((b.bos, b.eos.as_slice()), (None, &[2][..]));
    assert_eq!(b.rope.as_ref().unwrap().theta, 10000.0);
    assert!(b.rope.as_ref().unwrap().scaling.is_none());
    assert_eq!(b.rope_dim, Some(64));
}

#[test]
fn hostile_configs_are_typed_errors_naming_the_field() {
    for (name, from, to, field) in [
        (
            "escape",
            "llama_part_1_of_3.bin",
            "../../etc/passwd",
            "ctx-bins",
        ),
        (
            "absolute",
            "llama_part_1_of_3.bin",
            "/etc/passwd",
            "ctx-bins",
        ),
        (
            "tokpath",
            "\"path\": \"tokenizer.json\"",
            "\"path\": \"../t.json\"",
            "tokenizer.path",
        ),
        (
            "bos",
            "\"bos-token\": 128000",
            "\"bos-token\": 999999",
            "bos-token",
        ),
        (
            "ctx",
            "\"size\": 4096",
            "\"size\": 99999999999",
            "context.size",
        ),
        ("vocab", "\"n-vocab\": 128256", "\"n-vocab\": 0", "n-vocab"),
        (
            "theta",
            "\"rope-theta\": 500000",
            "\"rope-theta\": -1",
            "rope-theta",
        ),
        (
            "scaling",
            "\"rope-type\": \"llama3\"",
            "\"rope-type\": \"yarn\"",
            "rope-scaling",
        ),
        (
            "factors",
            "\"high-freq-factor\": 4.0",
            "\"high-freq-factor\": 0.5",
            "rope-scaling",
        ),
    ] {
        assert!(LLAMA32.contains(from), "{name}");
        let err = open_with(name, &LLAMA32.replace(from, to)).unwrap_err();
        assert!(matches!(err, BundleError::Field { .. }), "{name}: {err}");
        assert!(err.to_string().contains(field), "{name}: {err}");
    }
    let err = open_with("nobins", &LLAMA32.replace("\"ctx-bins\"", "\"bins\"")).unwrap_err();
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("ctx-bins"), "{source}");
    let err = open_with(
        "type",
        &LLAMA32.replace("\"size\": 4096", "\"size\": \"big\""),
    )
    .unwrap_err();
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("dialog.context.size"), "{source}");
}

#[test]
fn a_missing_bundle_is_a_file_error() {
    let dir = ScratchDir::new("bundle-missing");
    let err = Bundle::open(&dir).unwrap_err();
    assert!(matches!(err, BundleError::File(_)), "{err}");
}

/// htpkv's own writer before and after it passed Genie's schema (`engine.n-threads`, the
/// required `QnnHtp` keys, a sampler): both shapes read to the same bundle.
#[test]
fn htpkv_bundles_read_the_same_before_and_after_the_genie_schema_fields() {
    let old = r#"{"dialog": {"version": 1, "type": "basic",
        "context": {"version": 1, "size": 64, "n-vocab": 512, "bos-token": 1, "eos-token": [2, 1]},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {"version": 1,
          "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {"version": 1}},
          "model": {"version": 1, "type": "binary",
            "binary": {"version": 1, "ctx-bins": ["s_part_1_of_2.bin", "s_part_2_of_2.bin"]},
            "positional-encoding": {"type": "rope", "rope-dim": 4, "rope-theta": 10000.0}}}}}"#;
    let new = r#"{"dialog": {"version": 1, "type": "basic",
        "context": {"version": 1, "size": 64, "n-vocab": 512, "bos-token": 1, "eos-token": [2, 1]},
        "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 1, "top-p": 0.95},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {"version": 1, "n-threads": 3,
          "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {"version": 1,
            "spill-fill-bufsize": 0, "use-mmap": false, "mmap-budget": 0, "poll": true,
            "cpu-mask": "0xe0", "kv-dim": 8, "allow-async-init": false}},
          "model": {"version": 1, "type": "binary",
            "binary": {"version": 1, "ctx-bins": ["s_part_1_of_2.bin", "s_part_2_of_2.bin"]},
            "positional-encoding": {"type": "rope", "rope-dim": 4, "rope-theta": 10000.0}}}}}"#;
    let a = open_with("htpkv-old", old).unwrap();
    let b = open_with("htpkv-new", new).unwrap();
    assert_eq!((a.context, a.vocab, a.bos), (64, 512, Some(1)));
    assert_eq!((&a.eos, a.rope_dim), (&vec![2, 1], Some(4)));
    assert_eq!(a.ctx_bins.len(), 2);
    // Same fields, different folders.
    let rel = |x: &Bundle| {
        let bins: Vec<_> = x
            .ctx_bins
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        (
            x.context,
            x.vocab,
            x.bos,
            x.eos.clone(),
            bins,
            x.rope.clone(),
            x.rope_dim,
        )
    };
    assert_eq!(rel(&a), rel(&b));
}

/// Issue 21 finding 9: a symlinked directory, a symlinked part or `tokenizer.json ->
/// /etc/passwd` was followed without a word; each is an error naming genie_config.json and the
/// field. A symlink that stays inside the bundle is fine.
#[test]
fn paths_that_leave_the_bundle_through_a_symlink_are_refused() {
    let outside = ScratchDir::new("bundle-outside");
    std::fs::write(outside.join("part.bin"), b"x").unwrap();
    let config = |bins: &str, tok: &str| {
        format!(
            r#"{{"dialog": {{"context": {{"size": 64, "n-vocab": 512}},
            "tokenizer": {{"path": "{tok}"}},
            "engine": {{"model": {{"binary": {{"ctx-bins": [{bins}]}}}}}}}}}}"#
        )
    };
    let cases = [
        (
            "linked-dir",
            r#""parts/part.bin""#,
            "tokenizer.json",
            "dialog.engine.model.binary.ctx-bins",
        ),
        (
            "linked-part",
            r#""part.bin""#,
            "tokenizer.json",
            "dialog.engine.model.binary.ctx-bins",
        ),
        (
            "linked-tokenizer",
            r#""inside.bin""#,
            "tokenizer.json",
            "dialog.tokenizer.path",
        ),
    ];
    for (name, bins, tok, field) in cases {
        let dir = ScratchDir::new(name);
        std::fs::write(dir.join("genie_config.json"), config(bins, tok)).unwrap();
        std::fs::write(dir.join("inside.bin"), b"x").unwrap();
        match name {
            "linked-dir" => std::os::unix::fs::symlink(&outside, dir.join("parts")).unwrap(),
            "linked-part" => {
                std::os::unix::fs::symlink(outside.join("part.bin"), dir.join("part.bin")).unwrap()
            }
            _ => std::os::unix::fs::symlink("/etc/passwd", dir.join("tokenizer.json")).unwrap(),
        }
        let err = Bundle::open(&dir).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, BundleError::Field { field: f, .. } if f == field),
            "{name}: {text}"
        );
        assert!(
            text.starts_with(&format!(
                "{}: `{field}` ",
                dir.join("genie_config.json").display()
            )),
            "{name}: {text}"
        );
        assert!(
            text.contains("outside the bundle directory"),
            "{name}: {text}"
        );
        assert_eq!(text.matches("genie_config.json").count(), 1, "{text}");
    }
    // A symlink inside the bundle to another file of the bundle is followed.
    let dir = ScratchDir::new("bundle-linked-inside");
    std::fs::write(
        dir.join("genie_config.json"),
        config(r#""alias.bin""#, "tokenizer.json"),
    )
    .unwrap();
    std::fs::write(dir.join("real.bin"), b"x").unwrap();
    std::os::unix::fs::symlink(dir.join("real.bin"), dir.join("alias.bin")).unwrap();
    let b = Bundle::open(&dir).unwrap();
    assert!(b.ctx_bins[0].ends_with("real.bin"));
}
