//! model's integration tests, one binary (`cargo test -p model --test it`): the llama2.c loader and
//! forward on stories260K, SmolLM2 (GGUF, HF tokenizer, chat template), Gemma 3 270M's tensors
//! dequantized at the GGUF layer, the fuzz corpora replayed.

mod families;
mod fuzz_replay;
mod gemma3_gguf;
mod llama2c;
mod smollm2;
