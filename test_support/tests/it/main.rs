//! test_support's own integration tests: the GGUF writer read back by the model crate's reader,
//! and the toy families against their recorded llama.cpp fixtures.

mod gguf_writer;
mod llamacpp_fixtures;
