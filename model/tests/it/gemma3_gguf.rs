//! Gemma 3 270M (GGUF Q4_K_M) at the GGUF layer: every tensor dequantizes, and tensors of each
//! type in the file equal, bit for bit, what llama.cpp's Python package `gguf` gives.
//!
//! The model comes from `scripts/fetch-gemma3.sh`; without it these tests fail if `CI` is set and
//! otherwise say how to fetch it and pass. The comparison with `gguf` also needs a Python with
//! `gguf` and `numpy` (`pip install gguf==0.19.0 numpy`): `$HTPKV_GGUF_PYTHON`, else `python3`;
//! without them it says so and passes (CI does not install them).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::process::Command;

use model::fsio::{FileKind, open_regular};
use model::gguf::{GgmlType, GgufFile, TensorInfo};

fn open(path: &Path) -> (File, GgufFile) {
    let (mut f, len) = open_regular(path, FileKind::GGUF).expect("opens");
    let file = GgufFile::read(BufReader::new(&mut f), len).expect("GGUF header parses");
    (f, file)
}

#[test]
fn every_tensor_dequantizes_to_finite_values() {
    let Some(path) =
        test_support::fetched::gemma3_gguf("every_tensor_dequantizes_to_finite_values")
    else {
        return;
    };
    let (mut f, file) = open(&path);
    let mut by_type = BTreeMap::new();
    for t in &file.tensors {
        let data = file
            .read_f32(&mut f, t)
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert_eq!(data.len() as u64, t.n_elements, "{}", t.name);
        let bad = data.iter().position(|v| !v.is_finite());
        assert!(bad.is_none(), "{}: element {bad:?} is not finite", t.name);
        *by_type.entry(format!("{:?}", t.ty)).or_insert(0) += 1;
    }
    eprintln!("tensors by type: {by_type:?}");
    let types: Vec<&str> = by_type.keys().map(String::as_str).collect();
    assert_eq!(types, ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]);
    assert_eq!(file.tensors.len(), 236);
}

/// Reads the tensors `names` of the GGUF file `path` with `gguf.GGUFReader`, dequantizes them
/// with `gguf.quants.dequantize` and writes each as little-endian f32 to `out/<i>.f32`.
const GGUF_DEQUANTIZE: &str = r#"
import sys, numpy as np, gguf
path, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
for i, name in enumerate(names):
    t = tensors[name]
    v = gguf.quants.dequantize(t.data, t.tensor_type)
    np.asarray(v, dtype="<f4").reshape(-1).tofile(f"{out}/{i}.f32")
"#;

/// The Python that has `gguf` and `numpy`, or why there is none.
fn gguf_python() -> Result<String, String> {
    let python = std::env::var("HTPKV_GGUF_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let probe = Command::new(&python)
        .args(["-c", "import gguf, numpy"])
        .output();
    match probe {
        Ok(o) if o.status.success() => Ok(python),
        Ok(o) => Err(format!(
            "{python} cannot import gguf and numpy ({}); pip install gguf==0.19.0 numpy, or set \
             HTPKV_GGUF_PYTHON",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("{python} does not run: {e}")),
    }
}

/// The first `n` tensors of each type of `file`, in file order, leaving out the token embedding
/// (168M elements: the other Q8_0 tensors cover its type).
fn sample(file: &GgufFile, n: usize) -> Vec<&TensorInfo> {
    let mut per_type: BTreeMap<u32, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for t in file.tensors.iter().filter(|t| t.n_elements < 1 << 24) {
        let count = per_type.entry(t.ty.id()).or_default();
        if *count < n {
            *count += 1;
            out.push(t);
        }
    }
    out
}

#[test]
fn tensors_equal_the_gguf_python_package() {
    const TEST: &str = "tensors_equal_the_gguf_python_package";
    let Some(path) = test_support::fetched::gemma3_gguf(TEST) else {
        return;
    };
    let python = match gguf_python() {
        Ok(p) => p,
        Err(why) => return eprintln!("SKIPPED {TEST}: {why}"),
    };
    let (mut f, file) = open(&path);
    let tensors = sample(&file, 3);
    let dir = test_support::files::ScratchDir::new("gguf-python");
    let status = Command::new(&python)
        .args(["-c", GGUF_DEQUANTIZE])
        .arg(&path)
        .arg(dir.path())
        .args(tensors.iter().map(|t| &t.name))
        .status()
        .expect("python runs");
    assert!(status.success(), "gguf's dequantization failed: {status}");
    let mut checked: BTreeMap<String, usize> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        let ours = file.read_f32(&mut f, t).unwrap();
        let theirs = std::fs::read(dir.path().join(format!("{i}.f32"))).unwrap();
        assert_eq!(theirs.len(), ours.len() * 4, "{}: element count", t.name);
        let max_diff = ours
            .iter()
            .zip(theirs.chunks_exact(4))
            .map(|(a, b)| (a - f32::from_le_bytes(b.try_into().unwrap())).abs())
            .fold(0.0f32, f32::max);
        assert_eq!(max_diff, 0.0, "{} ({:?}): max abs diff", t.name, t.ty);
        *checked.entry(format!("{:?}", t.ty)).or_default() += 1;
    }
    eprintln!("equal to gguf's dequantization (tensors per type): {checked:?}");
    for ty in [
        GgmlType::F32,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
    ] {
        assert_eq!(checked.get(&format!("{ty:?}")), Some(&3), "{ty:?}");
    }
}

/// llama.cpp's F32 run of the real model, recorded (`model/tests/fixtures/llamacpp/gemma3-270m.json`,
/// `scripts/llamacpp-reference.py real`): its held-out token ids with each position's NLL, and
/// greedy continuations of three prompts.
fn gemma3_reference() -> serde_json::Value {
    let path = test_support::families::fixture_dir().join("gemma3-270m.json");
    let text = model::fsio::read_text_capped(&path, FileKind::HF_JSON).expect("the fixture");
    serde_json::from_str(&text).expect("the fixture is JSON")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    let a = v.as_array().expect("a list of token ids");
    a.iter()
        .map(|t| t.as_u64().expect("a token id") as u32)
        .collect()
}

/// Positions of the held-out text scored (llama.cpp recorded 511; the first 128 keep the test's
/// time within CI's budget and are compared position for position).
const SCORED: usize = 128;

/// Issue 37: the f32 forward of the real Gemma 3 270M (its GGUF dequantized, the weights llama.cpp's
/// F32 requantization holds) against llama.cpp's F32: perplexity over the same positions of the
/// same token ids within 0.5%, and the same 24 greedy tokens on three prompts.
#[test]
fn gemma3_270m_f32_matches_llama_cpp() {
    let Some(path) = test_support::fetched::gemma3_gguf("gemma3_270m_f32_matches_llama_cpp") else {
        return;
    };
    let m = model::gguf::GgufModel::load(&path).expect("Gemma 3 270M loads");
    let fx = gemma3_reference();
    let held = ids(&fx["heldout"]["tokens"]);
    let want_nll: Vec<f64> = (fx["heldout"]["nll"].as_array().unwrap().iter())
        .map(|v| v.as_f64().unwrap())
        .collect();
    let mut fm = model::FloatModel::new(m.config.clone(), std::sync::Arc::clone(&m.weights), 160)
        .expect("a float model");
    let (mut ours, mut theirs) = (0.0, 0.0);
    for p in 0..SCORED {
        let logits = fm.forward(held[p], p).unwrap();
        let mx = logits.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        let z: f64 = logits.iter().map(|&l| (l as f64 - mx).exp()).sum();
        ours += mx + z.ln() - logits[held[p + 1] as usize] as f64;
        theirs += want_nll[p];
    }
    let (ours, theirs) = ((ours / SCORED as f64).exp(), (theirs / SCORED as f64).exp());
    eprintln!("perplexity over {SCORED} positions: htpkv f32 {ours:.5}, llama.cpp F32 {theirs:.5}");
    assert!(
        (ours / theirs - 1.0).abs() < 0.005,
        "{ours} against {theirs}"
    );
    for g in fx["greedy"].as_array().unwrap() {
        let (prompt, want) = (ids(&g["prompt_tokens"]), ids(&g["tokens"]));
        let got = fm.generate_greedy(&prompt, want.len(), &[]).unwrap();
        assert_eq!(got, want, "prompt {}", g["prompt"]);
    }
}
