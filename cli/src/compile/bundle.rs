//! `htpkv compile --parts N` / `--convention aihub`: the compiled model as Qualcomm AI Hub ships
//! an LLM — one context binary per part (`{model}_part_{i}_of_{N}.bin`), `genie_config.json`
//! and `tokenizer.json` in one directory, which `htpkv generate --bundle DIR` runs.

use std::path::{Path, PathBuf};

use anyhow::Context;
use model::LlamaConfig;
use model::fsio::{AtomicDir, check_output_dir};
use ref_backend::CompiledModel;
use serde_json::{Value, json};

/// What to emit.
pub struct BundleSpec<'a> {
    /// Number of parts.
    pub parts: usize,
    /// How the parts are cut.
    pub split: ref_backend::Split,
    /// Positions as RoPE cos/sin tables (the `aihub` convention).
    pub rope_tables: bool,
    /// The HF `tokenizer.json` written into the bundle.
    pub tokenizer: &'a [u8],
    /// File-name stem of the parts (the checkpoint's).
    pub stem: &'a str,
    /// Context lengths to write graphs for (empty: the model's own); the model was compiled at
    /// the largest.
    pub contexts: &'a [usize],
}

/// Checks that `dir` may receive a bundle: new, an empty directory or an earlier bundle (it has a
/// `genie_config.json`), not a symlink, and holding none of `inputs`. Any other directory is
/// refused: the bundle replaces the directory whole.
pub fn check_bundle_out(dir: &Path, inputs: &[&Path]) -> anyhow::Result<()> {
    check_output_dir(dir, inputs)?;
    let Ok(mut entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    if entries.next().is_some() && !dir.join("genie_config.json").exists() {
        anyhow::bail!(
            "refusing to replace the directory {}: it is not empty and holds no \
             genie_config.json (a bundle replaces its directory whole)",
            dir.display()
        );
    }
    Ok(())
}

/// Writes the bundle into a new temporary directory beside `dir`, then puts it in place of `dir`
/// (an old bundle there is replaced whole): a failure leaves `dir` as it was and nothing
/// half-written. Returns the part files.
pub fn write_bundle(
    model: &CompiledModel,
    dir: &Path,
    spec: &BundleSpec<'_>,
    inputs: &[&Path],
) -> anyhow::Result<Vec<PathBuf>> {
    check_bundle_out(dir, inputs)?;
    let out = AtomicDir::create(dir, inputs)?;
    let own = model.options().context;
    let mut contexts = spec.contexts.to_vec();
    contexts.sort_unstable();
    contexts.dedup();
    if contexts.is_empty() {
        contexts.push(own);
    }
    let mut bins = Vec::new();
    for &c in &contexts {
        // The same weights and encodings with graphs of context c (rows mean the same in each).
        let tier = (c != own).then(|| model.with_context(c)).transpose()?;
        // One file per part and context length (AI Hub links all of a part's graphs into one
        // binary; the reference format holds one context length per file).
        let label = if contexts.len() > 1 {
            format!("_cl{c}")
        } else {
            String::new()
        };
        for part in
            tier.as_ref()
                .unwrap_or(model)
                .split_as(spec.parts, spec.rope_tables, spec.split)?
        {
            let p = part.part();
            let name = format!(
                "{}{label}_part_{}_of_{}.bin",
                spec.stem,
                p.index + 1,
                p.count
            );
            // Verified: read back and compared before it counts as written.
            part.write(&out.path_of(&name), inputs)?;
            bins.push(name);
        }
    }
    out.write("tokenizer.json", spec.tokenizer)?;
    let config = genie_config(model.config(), model.options().context, &bins);
    let text = serde_json::to_string_pretty(&config).context("genie_config.json")?;
    out.write("genie_config.json", text.as_bytes())?;
    out.commit()?;
    Ok(bins.iter().map(|name| dir.join(name)).collect())
}

/// `genie_config.json` with the fields `htpkv::bundle` reads: context size, vocabulary, BOS,
/// the tokens that end generation (EOS, end of turn, and BOS, which ends a llama2.c story),
/// tokenizer path, the binaries, and the RoPE settings (`rope-dim` is the width of the cos/sin
/// tables: half the head dim, or, for window layers with a RoPE base of their own, the one table
/// holding both bases, `qnn_compile::RopeTable`).
///
/// It also passes Genie 1.21's own schema (`GenieDialogConfig_createFromJson`; the test
/// `genie_accepts_the_bundle_config` in cli/tests/genie_cli.rs checks it with the real
/// `libGenie.so`): `engine.n-threads` and, under `QnnHtp`, `spill-fill-bufsize`, `use-mmap`,
/// `mmap-budget`, `poll` and `cpu-mask` are required there. Values are AI Hub's (its
/// `create_genie_config`), with `kv-dim` the head dim, except the sampler's `top-k` 1: greedy, the
/// tokens `htpkv generate` gives by default (temperature 0). Genie 1.21's sampler key `greedy`
/// passes the schema but does not make it greedy: with `greedy: true`, `top-k` 40 and seed 42 it
/// sampled (a stories260K binary diverged from the float model's greedy tokens at step 15; with
/// `top-k` 1 all 40 agreed).
pub fn genie_config(c: &LlamaConfig, context: usize, bins: &[String]) -> Value {
    let s = &c.special;
    let eos: Vec<u32> = [s.eos, s.eot, s.bos].into_iter().flatten().collect();
    // Window layers with a base of their own read both bases from one table
    // (`qnn_compile::RopeTable`; a model one table cannot carry was refused by the compiler).
    let (dim, theta) = match qnn_compile::rope_table(c) {
        Ok(t) if c.rope.window_theta.is_some() => (t.dim, json!(t.theta)),
        _ => (c.head_dim / 2, json!(c.rope.theta)),
    };
    let mut rope = json!({"type": "rope", "rope-dim": dim, "rope-theta": theta});
    if let Some(sc) = &c.rope.scaling {
        rope["rope-scaling"] = json!({
            "rope-type": "llama3",
            "factor": sc.factor,
            "low-freq-factor": sc.low_freq_factor,
            "high-freq-factor": sc.high_freq_factor,
            "original-max-position-embeddings": sc.original_context,
        });
    }
    json!({"dialog": {
        "version": 1,
        "type": "basic",
        "context": {
            "version": 1,
            "size": context,
            "n-vocab": c.vocab_size,
            "bos-token": s.bos.map_or(-1, i64::from),
            "eos-token": eos,
        },
        "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 1, "top-p": 0.95},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {
            "version": 1,
            "n-threads": 3,
            "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {
                "version": 1,
                "spill-fill-bufsize": 0,
                "use-mmap": false,
                "mmap-budget": 0,
                "poll": true,
                "cpu-mask": "0xe0",
                "kv-dim": c.head_dim,
                "allow-async-init": false,
            }},
            "model": {
                "version": 1,
                "type": "binary",
                "binary": {"version": 1, "ctx-bins": bins},
                "positional-encoding": rope,
            },
        },
    }})
}
