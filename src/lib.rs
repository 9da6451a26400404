//! htpkv: run large language models as static-shape graphs on Qualcomm HTP with the
//! KV cache managed by the application.
//!
//! This crate is the app façade: [`Model`] finds and compiles a model (with its compile cache),
//! [`Engine`] opens sessions on a provider, [`bundle`] reads Genie/AI Hub bundles. The pieces it
//! puts together are crates of their own, re-exported here under their old paths:
//! - the runtime (`htpkv_runtime`): [`backend`] (the provider seam), [`session`], [`sampler`],
//!   [`text`], [`convention`], [`persist`], [`constraint`] (the seam of constrained decoding),
//!   [`speculate`] (speculative decoding);
//! - [`structured`] (`htpkv_structured`): JSON schema, regex and grammar constraints over
//!   llguidance, and tool calls;
//! - the providers: [`reference`] (`htpkv_reference`, the CPU executor) and [`qnn`],
//!   [`qnn_memory`], [`qnn_libs`] (`htpkv_qnn`, QNN context binaries);
//! - planning (`htpkv_planning`): [`config`] and [`budget`];
//! - [`quant`] (fixed-point math) and [`kv_manager`] (the KV cache region and its strategies).
//!
//! `ARCHITECTURE.md` draws the crate map.

#![forbid(unsafe_code)]

pub use kv_manager;
pub use quant;

pub use htpkv_planning::{budget, config};
pub use htpkv_qnn::{backend as qnn, libs as qnn_libs, memory as qnn_memory};
pub use htpkv_reference as reference;
pub use htpkv_runtime::{
    backend, constraint, convention, persist, sampler, session, speculate, text,
};
pub use htpkv_structured as structured;

pub mod bundle;
pub mod engine;

pub use engine::{Engine, Model};
