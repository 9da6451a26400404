//! Live sessions, keyed by the `long` handles Java holds.
//!
//! Java never holds a pointer: it holds a number that this registry maps to a session. A handle
//! is never reused, so a stale handle (used after `close()`), handle 0 or a forged number finds
//! nothing and gives a `closed` error — it is never dereferenced. Each session sits behind its own
//! mutex, taken with `try_lock`: a second thread using the same session at the same moment gets a
//! `busy` error instead of waiting or racing.

use crate::error::{GlueError, KIND_BUSY, KIND_CLOSED, KIND_POISONED};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

/// A map from handles to shared, individually locked values.
#[derive(Debug)]
pub struct Registry<T> {
    next: AtomicU64,
    live: Mutex<BTreeMap<u64, Arc<Mutex<T>>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry::new()
    }
}

impl<T> Registry<T> {
    /// An empty registry whose first handle is 1.
    pub const fn new() -> Registry<T> {
        Registry {
            next: AtomicU64::new(1),
            live: Mutex::new(BTreeMap::new()),
        }
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Mutex<T>>>> {
        // Map operations cannot leave the map half-updated, so a poisoned lock is still usable.
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `value` and returns its handle: positive, never returned before by this registry.
    pub fn insert(&self, value: T) -> i64 {
        let handle = self.next.fetch_add(1, Ordering::Relaxed);
        self.map().insert(handle, Arc::new(Mutex::new(value)));
        // 2^63 insertions would be needed to overflow; handles stay positive in Java's `long`.
        i64::try_from(handle).unwrap_or(i64::MAX)
    }

    /// The value of `handle`; `closed` when it is not live.
    pub fn get(&self, handle: i64) -> Result<Arc<Mutex<T>>, GlueError> {
        let key = u64::try_from(handle).map_err(|_| closed(handle))?;
        self.map().get(&key).cloned().ok_or_else(|| closed(handle))
    }

    /// Removes `handle`; `closed` when it is not live. The value is dropped here unless another
    /// thread is still using it, in which case it is dropped when that call returns.
    pub fn remove(&self, handle: i64) -> Result<(), GlueError> {
        let key = u64::try_from(handle).map_err(|_| closed(handle))?;
        let removed = self.map().remove(&key);
        // Dropped after the map lock is released: tearing a session down may take a while.
        match removed {
            Some(value) => {
                drop(value);
                Ok(())
            }
            None => Err(closed(handle)),
        }
    }

    /// Number of live handles.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// True when no handle is live.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// Runs `f` on the value of `handle` while holding its lock. Fails with `closed` when the
    /// handle is not live, `busy` when another thread holds the value, and `poisoned` when an
    /// earlier call panicked while holding it.
    pub fn with<R>(
        &self,
        handle: i64,
        f: impl FnOnce(&mut T) -> Result<R, GlueError>,
    ) -> Result<R, GlueError> {
        let value = self.get(handle)?;
        let mut guard = lock(&value)?;
        f(&mut guard)
    }
}

/// Takes `value`'s lock without waiting: `busy` when another thread holds it, `poisoned` when a
/// panic left it.
pub fn lock<T>(value: &Mutex<T>) -> Result<MutexGuard<'_, T>, GlueError> {
    match value.try_lock() {
        Ok(guard) => Ok(guard),
        Err(TryLockError::WouldBlock) => Err(GlueError::new(
            KIND_BUSY,
            "session is busy: another call (from another thread, or from inside the token \
             callback) is using it; one session serves one call at a time",
        )),
        Err(TryLockError::Poisoned(_)) => Err(GlueError::new(
            KIND_POISONED,
            "session is unusable: an earlier call panicked while using it; close it and open a new one",
        )),
    }
}

fn closed(handle: i64) -> GlueError {
    GlueError::new(
        KIND_CLOSED,
        format!("session is closed (handle {handle} is not a live session)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_fresh_and_stale_ones_are_refused() {
        let reg = Registry::new();
        let a = reg.insert(10u32);
        let b = reg.insert(20u32);
        assert!(a > 0 && b > a);
        assert_eq!(reg.with(a, |v| Ok(*v)).unwrap(), 10);
        reg.remove(a).unwrap();
        assert_eq!(reg.with(a, |v| Ok(*v)).unwrap_err().kind(), KIND_CLOSED);
        assert_eq!(reg.remove(a).unwrap_err().kind(), KIND_CLOSED);
        let c = reg.insert(30u32);
        assert_ne!(c, a, "a handle must never be reused");
        for forged in [0, -1, i64::MIN, 987_654_321] {
            assert_eq!(reg.get(forged).unwrap_err().kind(), KIND_CLOSED);
        }
        assert_eq!(reg.len(), 2);
    }

    #[test]
    fn a_second_user_gets_busy_not_a_wait() {
        let reg = Registry::new();
        let h = reg.insert(Vec::<u8>::new());
        let held = reg.get(h).unwrap();
        let guard = held.lock().unwrap();
        std::thread::scope(|s| {
            let other = s.spawn(|| reg.with(h, |v| Ok(v.len())));
            assert_eq!(other.join().unwrap().unwrap_err().kind(), KIND_BUSY);
        });
        drop(guard);
        assert_eq!(reg.with(h, |v| Ok(v.len())).unwrap(), 0);
    }

    #[test]
    fn closing_while_in_use_keeps_the_value_alive_until_the_user_is_done() {
        let reg = Registry::new();
        let h = reg.insert(String::from("alive"));
        let in_use = reg.get(h).unwrap();
        reg.remove(h).unwrap();
        assert_eq!(reg.get(h).unwrap_err().kind(), KIND_CLOSED);
        assert_eq!(*in_use.lock().unwrap(), "alive");
        assert_eq!(Arc::strong_count(&in_use), 1);
    }

    #[test]
    fn a_panic_poisons_only_its_own_session() {
        let reg = Registry::new();
        let h = reg.insert(1u8);
        let other = reg.insert(2u8);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = reg.with(h, |_| -> Result<(), GlueError> { panic!("boom") });
        }));
        assert!(caught.is_err());
        assert_eq!(reg.with(h, |v| Ok(*v)).unwrap_err().kind(), KIND_POISONED);
        assert_eq!(reg.with(other, |v| Ok(*v)).unwrap(), 2);
        reg.remove(h).unwrap();
    }
}
