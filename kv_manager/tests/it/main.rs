//! The KV cache's integration tests, one binary (`cargo test -p kv_manager --test it`), one module
//! per concern; the random operations they share are `test_support::kv`.

mod beams;
mod oracle;
mod saturation;
mod slide;
mod snapshot;
mod static_kv;
mod windows;
