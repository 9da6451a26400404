//! htpkv against Qualcomm's own QNN 2.51 libraries (x86_64 Linux, HTP in emulation), fetched by
//! `scripts/fetch-qnn.sh`: `compile --target htp` makes a genuine context binary through
//! `libQnnHtp.so`, the real `libQnnSystem.so` lists its graphs, and `generate --backend qnn` runs it
//! with htpkv's KV manager. Skipped with a message when the libraries are absent; a failure under
//! `CI` (CI fetches them).

mod common;

use common::{htpkv, scratch};
use htpkv::qnn_libs::QnnLibs;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const STEPS: &str = "24";

fn libs(test: &str) -> Option<(PathBuf, PathBuf)> {
    let libs = QnnLibs::fetched_for_test(test)?;
    Some((libs.backend(), libs.system()))
}

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "htpkv failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// stories260K compiled once per K/V type for the real HTP: context 64, AR-1 and AR-8.
fn binary(htp: &Path, kv: &str) -> PathBuf {
    static BINS: OnceLock<std::sync::Mutex<Vec<(String, PathBuf)>>> = OnceLock::new();
    let bins = BINS.get_or_init(Default::default);
    let mut bins = bins.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = bins.iter().find(|(k, _)| k == kv) {
        return p.clone();
    }
    let dir = scratch("real_qnn", &format!("bin-{kv}"));
    let out = dir.join(format!("stories260K-htp-{kv}.bin"));
    let (o, h) = (out.to_str().unwrap(), htp.to_str().unwrap());
    let args = [
        "compile",
        "--target",
        "htp",
        "--qnn-backend",
        h,
        "--context",
        "64",
        "--ar",
        "1,8",
        "--kv-dtype",
        kv,
        "--out",
        o,
    ];
    let text = ok(htpkv(&args, &dir));
    assert!(text.contains("ar1_cl64, ar8_cl64"), "{text}");
    bins.push((kv.to_string(), out.clone()));
    out
}

fn generate(extra: &[&str], cache: &Path) -> Value {
    let mut args = vec!["generate", "Once upon a time", "--steps", STEPS, "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(htpkv(&args, cache))).unwrap()
}

fn qnn_run(htp: &Path, system: &Path, kv: &str, update: &str) -> Value {
    let bin = binary(htp, kv);
    let args = [
        "--backend",
        "qnn",
        "--qnn-backend",
        htp.to_str().unwrap(),
        "--qnn-system",
        system.to_str().unwrap(),
        "--compiled",
        bin.to_str().unwrap(),
        "--update",
        update,
    ];
    generate(&args, &scratch("real_qnn", &format!("{kv}-{update}")))
}

/// The real system library lists both graphs with htpkv's tensor names and f32 K/V.
#[test]
fn the_real_system_library_lists_every_graph_htpkv_compiled() {
    let Some((htp, system)) = libs("real_qnn::inspect") else {
        return;
    };
    let bin = binary(&htp, "f32");
    let out = htpkv(
        &[
            "inspect",
            bin.to_str().unwrap(),
            "--qnn-system",
            system.to_str().unwrap(),
            "--json",
        ],
        &scratch("real_qnn", "inspect"),
    );
    let doc: Value = serde_json::from_str(&ok(out)).unwrap();
    let graphs = doc["graphs"].as_array().unwrap();
    let names: Vec<&str> = graphs.iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["ar1_cl64", "ar8_cl64"]);
    let inputs = graphs[0]["inputs"].as_array().unwrap();
    // ids, positions, mask, then K and V for 5 layers x 4 KV heads.
    assert_eq!(inputs.len(), 3 + 5 * 4 * 2, "{doc}");
    assert_eq!(doc["backend_id"], 6, "HTP's backend id: {doc}");
}

/// The four KV strategies feed the real backend the same windows: the same tokens, and the greedy
/// text of the reference executor with the same f32 weights and K/V type (HTP computes in fp16: a
/// divergence would show here first). With u8 K/V the binary's K/V tensors carry htpkv's calibrated
/// encodings, the ones the reference executor uses: the KV manager copies bytes, never requantizes.
#[test]
fn every_strategy_gives_the_reference_tokens_on_the_real_backend() {
    let Some((htp, system)) = libs("real_qnn::strategies") else {
        return;
    };
    for kv in ["f32", "u8"] {
        let reference = generate(
            &[
                "--context",
                "64",
                "--ar",
                "1,8",
                "--weights",
                "f32",
                "--kv-dtype",
                kv,
            ],
            &scratch("real_qnn", &format!("reference-{kv}")),
        );
        for update in ["shift", "conveyor", "smart_mask", "naive"] {
            let run = qnn_run(&htp, &system, kv, update);
            assert_eq!(run["backend"], "qnn");
            assert_eq!(run["kv_dtype"], kv, "{run}");
            assert_eq!(
                run["tokens"], reference["tokens"],
                "{kv} {update}: {run}\nreference: {reference}"
            );
        }
    }
}
