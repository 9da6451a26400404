//! Replays the `jni_options` fuzz corpus (see docs/guide/fuzzing.md) through its check.

#[path = "../../fuzz/checks/jni_options.rs"]
mod jni_options;
#[path = "../../fuzz/checks/replay.rs"]
mod replay;

#[test]
fn jni_options_corpus() {
    replay::replay("jni_options", jni_options::check);
}
