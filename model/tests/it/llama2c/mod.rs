//! llama2.c checkpoints, tokenizers and the float forward over them ([`model::llama2c`]), against
//! the real stories260K files (committed; `test_support::stories`).

mod checkpoint;
mod forward;
mod safetensors_crosscheck;
mod sentencepiece_crosscheck;
mod tokenizer;
