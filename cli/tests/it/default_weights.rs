//! The default weights (`ref_backend::WeightType::DEFAULT`, what `generate`, `chat`, `eval` and
//! `serve` compile when no `--weights` is given) keep the quality they were chosen for on
//! SmolLM2-135M (docs/measurements/quality-and-speed-2026-11-28.md): the float model's answer to a
//! sky question, which `--weights i8` changes ("a breathtaking sight" instead of "... a deep, rich
//! shade of blue"), and llama.cpp Q8_0's mean KL and top-1 on the held-out text at the positions
//! `llama-perplexity --kl-divergence` scores.

use crate::{htpkv, ok_stdout};
use test_support::files::ScratchDir;

/// The question whose float answer `--weights i8` loses.
const SKY: &str = "What color is the sky on a clear day?";

/// llama.cpp Q8_0 against its F32 on the held-out text, positions 256..510 (llama.cpp `0c1e570`,
/// `scripts/accuracy-vs-llamacpp.sh`): mean KL 0.014392, the same top-1 at 242 of 255 positions.
/// The default must be at least as near its own f32 model.
const Q8_0_MEAN_KL: f64 = 0.014392;
const Q8_0_TOP1: f64 = 242.0 / 255.0;

#[test]
fn the_default_weights_keep_smollm2s_float_answer_and_q8_0s_quality() {
    let Some(model) = test_support::fetched::smollm2_gguf("the_default_weights_keep_smollm2s")
    else {
        return;
    };
    let cache = ScratchDir::new("default-weights");
    let model = model.to_str().unwrap();
    // One context for every run, so the default build is compiled once and shared.
    let base = ["--model", model, "--context", "1024"];
    let answer = |extra: &[&str]| {
        let args = [
            &["generate", "--chat", SKY, "--steps", "20"],
            &base[..],
            extra,
        ]
        .concat();
        ok_stdout(&htpkv(&args, &cache))
    };
    let float = answer(&["--weights", "f32", "--kv-dtype", "f32"]);
    let blue = float.find(" blue").map(|i| i + " blue".len());
    let Some(end) = blue else {
        panic!("the f32 answer has no ` blue`: {float:?}")
    };
    let default = answer(&[]);
    assert!(
        default.starts_with(&float[..end]),
        "the default weights lost the float answer: {default:?} against {float:?}"
    );

    let text = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ref_backend/examples/data/heldout.txt"
    );
    let eval = [
        &[
            "eval", "--text", text, "--tokens", "511", "--skip", "256", "--json",
        ],
        &base[..],
    ];
    let doc: serde_json::Value = serde_json::from_str(&ok_stdout(&htpkv(&eval.concat(), &cache)))
        .expect("eval --json prints JSON");
    let (kl, top1) = (
        doc["mean_kl"].as_f64().unwrap(),
        doc["top1_agreement"].as_f64().unwrap(),
    );
    assert_eq!(doc["positions"], 255, "{doc}");
    assert!(
        kl <= Q8_0_MEAN_KL,
        "mean KL {kl} above Q8_0's {Q8_0_MEAN_KL}: {doc}"
    );
    assert!(
        top1 >= Q8_0_TOP1,
        "top-1 {top1} below Q8_0's {Q8_0_TOP1}: {doc}"
    );
}
