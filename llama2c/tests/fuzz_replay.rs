//! Replays the `checkpoint` and `tokenizer` fuzz corpora (see fuzz/README.md) through their
//! checks.

#[path = "../../fuzz/checks/checkpoint.rs"]
mod checkpoint;
#[path = "../../fuzz/checks/replay.rs"]
mod replay;
#[path = "../../fuzz/checks/tokenizer.rs"]
mod tokenizer;

#[test]
fn checkpoint_corpus() {
    replay::replay("checkpoint", checkpoint::check);
}

#[test]
fn tokenizer_corpus() {
    replay::replay("tokenizer", tokenizer::check);
}
