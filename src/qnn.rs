//! The QNN backend: graphs of a context binary executed through a QNN backend library.

use crate::backend::Backend;
use crate::engine::EngineError;
use std::path::Path;

/// Opens `backend_lib` (and `system_lib` for the binary's tensor descriptions) and loads the context
/// binary at `compiled`.
pub fn open_backend(
    backend_lib: &Path,
    system_lib: Option<&Path>,
    compiled: &Path,
) -> Result<Box<dyn Backend>, EngineError> {
    let _ = (system_lib, compiled);
    Err(EngineError::Qnn(format!(
        "cannot load {}: this build has no QNN loader yet",
        backend_lib.display()
    )))
}
