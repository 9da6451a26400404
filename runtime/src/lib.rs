//! htpkv's runtime: what runs a model whatever executes its graphs.
//!
//! - [`backend`]: the seam — the [`backend::Backend`] trait a provider implements (the reference
//!   executor in `htpkv_reference`, QNN context binaries in `htpkv_qnn`) and the graph IO it binds;
//! - [`session`]: a [`session::Session`] runs steps over the KV cache (`kv_manager`), with beams,
//!   cross-attention, overflow rules and several contexts;
//! - [`constraint`]: the logit-mask seam of constrained decoding (JSON schema, regex, grammar);
//! - [`sampler`], [`text`] (tokenizers and chat formats), [`convention`] (which tensor is which);
//! - [`persist`]: a session saved to a file and restored;
//! - [`speculate`]: speculative decoding (prompt lookup, lookahead, a draft model's session).
//!
//! The runtime depends on no provider: providers depend on it, and the app façade (`htpkv`) puts
//! them together.

pub mod backend;
pub mod constraint;
pub mod convention;
pub mod persist;
pub mod sampler;
pub mod session;
pub mod speculate;
pub mod text;
