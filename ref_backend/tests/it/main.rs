//! The reference executor's integration tests, one binary (`cargo test -p ref_backend --test it`),
//! one module per concern; the tiny models, compile helpers and the hand-built KV harness they
//! share are in `test_support`.

mod calibration;
mod encdec;
mod exec;
mod families;
mod float_equivalence;
mod format;
mod fuzz_replay;
mod gptq;
mod i8f16;
mod last_row;
mod lpbq;
mod part_graphs;
mod quantized;
mod smollm2;
mod smoothing;
mod windows;
