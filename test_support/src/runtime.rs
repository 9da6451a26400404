//! Sessions on the reference executor.

use std::sync::Arc;

use htpkv::reference::ReferenceBackend;
use htpkv::session::Session;
use kv_manager::{HostAllocator, Strategy};
use ref_backend::CompiledModel;

/// The four strategies with their default settings.
pub const STRATEGIES: [Strategy; 4] = [
    Strategy::SHIFT_2X,
    Strategy::Conveyor,
    Strategy::SmartMask,
    Strategy::Naive,
];

/// A session on the reference executor in host memory.
pub fn session(model: &Arc<CompiledModel>, strategy: Strategy) -> Session<ReferenceBackend> {
    Session::new(
        ReferenceBackend::new(model.clone()),
        strategy,
        &HostAllocator::default(),
    )
    .expect("session")
}
