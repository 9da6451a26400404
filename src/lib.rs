//! htpkv: run large language models as static-shape graphs on Qualcomm HTP with the
//! KV cache managed by the application.
//!
//! This root crate re-exports the building blocks:
//! - [`quant`]: QNN fixed-point quantization math and calibration observers;
//! - [`kv_manager`]: the KV cache region, its update strategies and IO binding plans.
//!
//! A [`session::Session`] runs steps; [`persist`] saves and restores one to a file.

pub use kv_manager;
pub use quant;

pub mod backend;
pub mod budget;
pub mod bundle;
pub mod config;
pub mod convention;
pub mod engine;
pub mod persist;
pub mod qnn;
pub mod qnn_libs;
pub mod qnn_memory;
pub mod reference;
pub mod sampler;
pub mod session;
pub mod speculate;
pub mod text;

pub use engine::{Engine, Model};
