//! `HtpkvSession.cancel()`: the cancel handles of running generations, by session handle, outside
//! the sessions' locks (a cancel never waits for the generation it stops).

use htpkv::session::{Cancel, GenerateOptions};
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// Session handle → the cancel handle of the generation running on it (or waiting for its lock).
#[derive(Debug)]
pub struct Cancels {
    running: Mutex<BTreeMap<i64, Cancel>>,
}

/// Removes its generation's entry when the generation returns.
#[derive(Debug)]
pub struct Running<'a> {
    cancels: &'a Cancels,
    handle: i64,
    cancel: Cancel,
}

impl Cancels {
    pub const fn new() -> Cancels {
        Cancels {
            running: Mutex::new(BTreeMap::new()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, Cancel>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives `options` a fresh cancel handle, registered for `handle` until the guard drops.
    pub fn register(&self, handle: i64, options: &mut GenerateOptions) -> Running<'_> {
        let cancel = Cancel::new();
        options.cancel = Some(cancel.clone());
        self.map().insert(handle, cancel.clone());
        Running {
            cancels: self,
            handle,
            cancel,
        }
    }

    /// Cancels the generation registered for `handle`, if any.
    pub fn cancel(&self, handle: i64) {
        if let Some(c) = self.map().get(&handle) {
            c.cancel();
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut map = self.cancels.map();
        // A later generation on the same session (waiting for the lock) may have replaced it.
        if map
            .get(&self.handle)
            .is_some_and(|c| c.same_flag(&self.cancel))
        {
            map.remove(&self.handle);
        }
    }
}
