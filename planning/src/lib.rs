//! htpkv's planning: the model configuration schema ([`config`]) that `htpkv budget`, `htpkv plan`
//! and the runtime read, the memory budgets of a configuration ([`budget`]), and the charts
//! `htpkv budget --plot` draws ([`svg`]).

#![forbid(unsafe_code)]

pub mod budget;
pub mod config;
pub mod svg;
