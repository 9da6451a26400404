//! htpkv's QNN provider: the graphs of QNN context binaries run through a QNN backend library
//! ([`backend`]), the K/V region as registered shared memory ([`memory`]), and where Qualcomm's
//! libraries are found ([`libs`]).

pub mod backend;
pub mod libs;
pub mod memory;

pub use backend::QnnBackend;
