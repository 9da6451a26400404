//! quant's integration tests, one binary (`cargo test -p quant --test it`), one module per concern.

mod exact_and_errors;
mod observers;
mod roundtrip;
