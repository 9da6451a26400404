//! Replays the `compiled_model` fuzz corpus (see fuzz/README.md) through its check.

#[path = "../../../fuzz/checks/compiled.rs"]
mod compiled;
#[path = "../../../fuzz/checks/replay.rs"]
mod replay;

#[test]
fn compiled_model_corpus() {
    replay::replay("compiled_model", compiled::check);
}
