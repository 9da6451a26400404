//! What the workspace's test binaries share (never published): one function per job.
//!
//! - [`fetched`]: the models and libraries that are fetched, never committed (SmolLM2, Qualcomm's
//!   QNN libraries), and the one rule for tests that need them: skipped with a message locally,
//!   failed when `CI` is set.
//! - [`stories`]: the committed stories260K model, tiny synthetic checkpoints, calibration prompts
//!   and a `tokenizer.json` of stories260K's pieces.
//! - [`compile`]: models compiled for the reference executor, as the tests need them.
//! - [`harness`]: a plain left-padded KV window harness over a compiled graph (deliberately not the
//!   `kv_manager` crate), and small numeric helpers.
//! - [`kv`]: the random operations the KV cache's property tests draw and their reference.
//! - [`runtime`]: sessions on the reference executor.
//! - [`files`]: scratch directories and the libraries cargo built for the running test.
//! - [`cli`]: the arguments of a quick `htpkv compile`.
//! - [`gguf`]: a GGUF v3 writer; [`families`]: tiny GGUF files of each model family, the inputs of
//!   the recorded llama.cpp fixtures.

#![forbid(unsafe_code)]

pub mod cli;
pub mod compile;
pub mod families;
pub mod fetched;
pub mod files;
pub mod gguf;
pub mod harness;
pub mod hf;
pub mod kv;
pub mod runtime;
pub mod stories;
