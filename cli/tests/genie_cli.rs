//! Qualcomm Genie 1.21 (`libGenie.so` from `scripts/fetch-qnn.sh`) against the bundles
//! `htpkv compile --convention aihub` writes, through `genie-run` in a child process (Genie can
//! crash its process). Skipped with a message when the libraries are missing; a failure under
//! `CI` (which runs the fetch script).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use htpkv::qnn_libs::QnnLibs;
use serde_json::Value;

fn genie_run(libs: &QnnLibs, dir: &Path, args: &[&str]) -> (Output, Value) {
    let out = dir.join(format!("genie-run-{}.json", args[0]));
    let _ = std::fs::remove_file(&out);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_genie-run"))
        .arg("--genie")
        .arg(libs.genie())
        .arg("--out")
        .arg(&out)
        .args(args)
        // Genie finds libQnnHtp.so beside itself (its RPATH has $ORIGIN): no LD_LIBRARY_PATH.
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("genie-run runs");
    let doc = std::fs::read(&out)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| {
            panic!(
                "genie-run {args:?} wrote no document ({:?}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            )
        });
    (o, doc)
}

/// `genie-run dialog CONFIG --tokens 1 --max-tokens MAX`: generation from BOS.
fn from_bos(libs: &QnnLibs, dir: &Path, config: &Path, max: &str) -> (Output, Value) {
    let config = config.to_str().unwrap();
    genie_run(
        libs,
        dir,
        &["dialog", config, "--tokens", "1", "--max-tokens", max],
    )
}

/// The fetched libraries and a fresh `htpkv compile --parts 2 --convention aihub` bundle of
/// stories260K (`None` when the libraries are missing outside CI).
fn setup(test: &str, name: &str) -> Option<(QnnLibs, PathBuf, PathBuf)> {
    let libs = QnnLibs::fetched_for_test(test)?;
    let dir = common::scratch("genie_cli", name);
    let o = common::compile_aihub(&dir, "bundle", &["--parts", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let config = dir.join("bundle").join("genie_config.json");
    Some((libs, dir, config))
}

/// The genie_config.json htpkv writes passes Genie's own schema (`GenieDialogConfig_createFromJson`
/// returns 0); the shape it wrote before (no `engine.n-threads`, `QnnHtp` with only `version`)
/// is refused with status −8 and the schema's message, which names the first missing key.
#[test]
fn genie_accepts_the_bundle_config_and_refuses_the_old_shape() {
    let Some((libs, dir, config)) = setup("genie_accepts_the_bundle_config", "schema") else {
        return;
    };
    let (o, doc) = genie_run(&libs, &dir, &["check-config", config.to_str().unwrap()]);
    assert!(
        o.status.success(),
        "{doc} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(doc["valid"], true, "{doc}");
    assert_eq!(doc["genie_api"], "1.21.0", "{doc}");

    let mut old: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    let dialog = old["dialog"].as_object_mut().unwrap();
    dialog.remove("sampler");
    let engine = dialog["engine"].as_object_mut().unwrap();
    engine.remove("n-threads");
    engine["backend"]["QnnHtp"] = serde_json::json!({"version": 1});
    let old_path = dir.join("old_genie_config.json");
    std::fs::write(&old_path, old.to_string()).unwrap();
    let (o, doc) = genie_run(&libs, &dir, &["check-config", old_path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{doc}");
    assert_eq!(
        (doc["status"].as_i64(), doc["valid"].as_bool()),
        (Some(-8), Some(false))
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("Schema validation failed")
            && err.contains("at '/engine'")
            && err.contains("required property 'n-threads' not found in object"),
        "{err}"
    );
}

/// Genie refuses htpkv's own `aihub` bundle at `GenieDialog_create` today: the part binaries are
/// htpkv's reference format, not QNN context binaries, and the real backend cannot read them
/// ("Failed to get context binary info for context index = 0", status −1). This changes when
/// `htpkv compile --target htp` writes genuine binaries (issue 25): then this test must become
/// the token comparison.
#[test]
fn genie_refuses_reference_format_binaries_at_dialog_create() {
    let Some((libs, dir, config)) = setup("genie_refuses_reference_format_binaries", "refusal")
    else {
        return;
    };
    let (o, doc) = from_bos(&libs, &dir, &config, "4");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{doc} {err}");
    assert_eq!(doc["refused_by"], "GenieDialog_create", "{doc}");
    assert_eq!(doc["status"], -1, "{doc}");
    assert!(
        err.contains("Failed to get context binary info for context index = 0"),
        "{err}"
    );
}

/// The first 40 greedy tokens of stories260K in f32 from BOS ("Once upon a time, there was a
/// little girl named Lily. She loved to play outside in the park. One day, she saw a big, r").
const STORIES_F32_GREEDY_40: [u32; 40] = [
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267,
    337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370,
    432, 352,
];

/// Opt-in (`HTPKV_GENIE_BUNDLE=DIR`): Genie runs a bundle of a genuine stories260K HTP context
/// binary (AI Hub's IO names, AR-1, context 64, float; made outside the repository with
/// onnxruntime's QNN execution provider, see the README's "Real QNN") and gives the f32 model's
/// 40 greedy tokens. Becomes a CI test when `htpkv compile --target htp` writes such bundles.
#[test]
fn genie_generates_the_f32_greedy_tokens_from_a_real_htp_bundle() {
    let Some(bundle) = std::env::var_os("HTPKV_GENIE_BUNDLE").map(PathBuf::from) else {
        eprintln!("SKIPPED: set HTPKV_GENIE_BUNDLE to a Genie bundle of stories260K");
        return;
    };
    let Some(libs) = QnnLibs::fetched_for_test("genie_generates_from_a_real_htp_bundle") else {
        return;
    };
    let dir = common::scratch("genie_cli", "real");
    let config = bundle.join("genie_config.json");
    let (o, doc) = from_bos(&libs, &dir, &config, "40");
    assert!(
        o.status.success(),
        "{doc} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let tokens: Vec<u32> = serde_json::from_value(doc["tokens"].clone()).unwrap();
    assert_eq!(tokens, STORIES_F32_GREEDY_40, "{doc}");
    assert_eq!(doc["step_ms"].as_array().unwrap().len(), 39, "{doc}");
}

/// Genie on a genuine context binary from `htpkv compile --target htp` (htpkv's convention, one
/// graph `ar1_cl64`), under the bundle's genie_config.json: Genie reads it as far as the K/V
/// tensors and refuses at `GenieDialog_create` (status −1) because K is laid out in rows
/// (`past_key_0_0 [1, 1, 63, 8]`): Genie takes the K/V update (Scatter or Concat) from the last
/// dimension of K, which must be the context (AI Hub's transposed K `[kv, 1, head_dim, c - n]`).
#[test]
fn genie_refuses_htp_binaries_whose_k_is_in_rows() {
    let Some((libs, dir, config)) = setup("genie_refuses_htp_binaries_whose_k_is_in_rows", "htp")
    else {
        return;
    };
    let bundle = config.parent().unwrap();
    let bin = bundle.join("stories_htp.bin");
    let backend = libs.backend();
    let mut args = vec!["compile", "--target", "htp", "--context", "64", "--ar", "1"];
    args.extend(["--qnn-backend", backend.to_str().unwrap()]);
    args.extend(["--out", bin.to_str().unwrap()]);
    let o = common::htpkv(&args, &dir.join("cache"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    doc["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = serde_json::json!(["stories_htp.bin"]);
    std::fs::write(&config, doc.to_string()).unwrap();
    let (o, doc) = from_bos(&libs, &dir, &config, "4");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{doc} {err}");
    assert_eq!(doc["refused_by"], "GenieDialog_create", "{doc}");
    assert!(
        err.contains(
            "Could not determine whether KV$ uses Scatter or Concat. KV$ has input dimension \
             8.Expected CL=64 or CL - AR-n=63"
        ),
        "{err}"
    );
}
