//! The runtime's integration tests, one binary (`cargo test -p htpkv --test it`), one module per
//! concern; the compile helpers, sessions and model locators they share are in `test_support`.

mod beams;
mod budget;
mod budget_cross;
mod chat;
mod config_fuzz;
mod conversations;
mod encdec;
mod families;
mod last_row;
mod parts;
mod qnn_backend;
mod runtime;
mod smollm2_strategies;
mod speculate;
mod stops;
mod structured;
mod windows;
