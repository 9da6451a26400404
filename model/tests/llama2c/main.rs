//! llama2.c checkpoints, tokenizers and the float forward over them ([`model::llama2c`]), against
//! the real stories260K files (those tests are skipped when the files are absent).

mod checkpoint;
mod common;
mod forward;
mod safetensors_crosscheck;
mod sentencepiece_crosscheck;
mod tokenizer;
