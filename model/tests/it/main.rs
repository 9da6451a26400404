//! model's integration tests, one binary (`cargo test -p model --test it`): the llama2.c loader and
//! forward on stories260K, SmolLM2 (GGUF, HF tokenizer, chat template), the fuzz corpora replayed.

mod fuzz_replay;
mod llama2c;
mod smollm2;
