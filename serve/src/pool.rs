//! The bounded pool of sessions on one model, and the bounded queue in front of it.
//!
//! `parallel` sessions (each an [`Engine`] on the shared [`Model`], with its own KV cache) run at
//! most `parallel` generations at once; up to `queue` more requests wait for one. A request past
//! that is refused at once (429), so the memory a burst costs is bounded. A session keeps its cache
//! after a request, and a request gets the idle session whose cache shares the longest prefix with
//! its prompt: a repeated system prompt or a conversation going on is prefilled only past what
//! is cached (prefix reuse across requests).

use crate::error::{ApiError, ErrorKind};
use htpkv::engine::{Engine, Model};
use htpkv::session::Cancel;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Counters `/health` reports.
#[derive(Debug, Default)]
pub struct Counters {
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    /// Prompt tokens taken from a session's cache instead of prefilled.
    pub reused_tokens: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub rejected: AtomicU64,
}

/// The sessions, the queue's bounds and the running generations' cancel handles.
#[derive(Debug)]
pub struct Pool {
    model: Arc<Model>,
    idle: Mutex<Vec<Engine>>,
    permits: Arc<Semaphore>,
    /// Requests being prepared (parsed, rendered, tokenized, their grammar compiled): at most
    /// `parallel` at once, on blocking threads.
    preparing: Arc<Semaphore>,
    parallel: usize,
    queue: usize,
    /// Requests admitted: waiting for a session or running.
    admitted: AtomicUsize,
    running: Mutex<HashMap<u64, Cancel>>,
    next_id: AtomicU64,
    closing: AtomicBool,
    capacity: usize,
    pub counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind: go on with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// `parallel` sessions on `first`'s model (`first` is one of them), with room for `queue`
    /// waiting requests.
    pub fn new(
        first: Engine,
        parallel: usize,
        queue: usize,
    ) -> Result<Pool, htpkv::engine::EngineError> {
        let parallel = parallel.max(1);
        let model = first.model().clone();
        let capacity = first.capacity();
        let mut idle = vec![first];
        for _ in 1..parallel {
            idle.push(Engine::on(model.clone())?);
        }
        Ok(Pool {
            model,
            idle: Mutex::new(idle),
            permits: Arc::new(Semaphore::new(parallel)),
            preparing: Arc::new(Semaphore::new(parallel)),
            parallel,
            queue,
            admitted: AtomicUsize::new(0),
            running: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            capacity,
            counters: Counters::default(),
        })
    }

    /// The shared model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Tokens a session's cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sessions and queue places: (parallel, queue).
    pub fn bounds(&self) -> (usize, usize) {
        (self.parallel, self.queue)
    }

    /// Sessions idle now.
    pub fn idle(&self) -> usize {
        lock(&self.idle).len()
    }

    /// Requests admitted now (waiting or running).
    pub fn admitted(&self) -> usize {
        self.admitted.load(Ordering::Acquire)
    }

    /// Admits a request, or refuses it: 429 when every session is busy and the queue is full,
    /// 503 once the server is shutting down.
    pub fn admit(self: &Arc<Self>) -> Result<Admission, ApiError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        let most = self.parallel.saturating_add(self.queue);
        let admitted = self
            .admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < most).then_some(n + 1)
            });
        if admitted.is_err() {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::new(
                ErrorKind::QueueFull,
                format!(
                    "the server is busy: {} sessions running and {} requests queued (--parallel {}, --queue {}); retry later",
                    self.parallel, self.queue, self.parallel, self.queue
                ),
            ));
        }
        Ok(Admission(self.clone()))
    }

    /// Runs `work` (parsing a request, rendering and tokenizing its prompt, compiling its
    /// grammar) on a blocking thread, at most `parallel` at once: an admitted request's
    /// preparation waits its turn in the queue like its generation, and never runs on the async
    /// workers that answer `/health`. The turn is held by the blocking task itself, so a client
    /// that leaves does not free it before the work ends.
    pub async fn prepare<T: Send + 'static>(
        &self,
        _admission: &Admission,
        work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let turn = self
            .preparing
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| shutting_down())?;
        let task = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            work()
        });
        task.await.unwrap_or_else(|e| {
            Err(ApiError::new(
                ErrorKind::Internal,
                format!("preparing the request failed: {e}"),
            ))
        })
    }

    /// Waits for a session (the queue) and hands out the idle one whose cache shares the longest
    /// prefix with `prompt`. Dropping the future (a client gone) leaves the queue.
    pub async fn checkout(
        self: &Arc<Self>,
        admission: Admission,
        prompt: &[u32],
    ) -> Result<Lease, ApiError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| shutting_down())?;
        let mut idle = lock(&self.idle);
        let best = (0..idle.len())
            .max_by_key(|&i| common_prefix(idle[i].session().tokens(), prompt))
            .expect("a permit guarantees an idle session");
        let engine = idle.swap_remove(best);
        drop(idle);
        Ok(Lease {
            engine: Some(engine),
            pool: self.clone(),
            _permit: permit,
            _admission: admission,
        })
    }

    /// Registers a running generation's cancel handle, so that shutdown can cancel it.
    pub fn register(self: &Arc<Self>, cancel: Cancel) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut running = lock(&self.running);
        // Checked under the lock `close` takes: a generation starting during shutdown is cancelled.
        if self.closing.load(Ordering::Acquire) {
            cancel.cancel();
        }
        running.insert(id, cancel);
        drop(running);
        Registration {
            pool: self.clone(),
            id,
        }
    }

    /// Starts shutting down: refuses new requests, fails queued ones and cancels running ones.
    pub fn close(&self) {
        let running = lock(&self.running);
        self.closing.store(true, Ordering::Release);
        self.permits.close();
        self.preparing.close();
        for cancel in running.values() {
            cancel.cancel();
        }
    }
}

fn shutting_down() -> ApiError {
    ApiError::new(ErrorKind::ShuttingDown, "the server is shutting down")
}

/// The number of leading tokens `a` and `b` share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A place in the pool or its queue; dropping it frees the place.
#[derive(Debug)]
pub struct Admission(Arc<Pool>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A session lent to one request; dropping it gives the session back with its cache.
#[derive(Debug)]
pub struct Lease {
    engine: Option<Engine>,
    pool: Arc<Pool>,
    _permit: OwnedSemaphorePermit,
    _admission: Admission,
}

impl Lease {
    /// The session.
    pub fn engine(&mut self) -> &mut Engine {
        self.engine.as_mut().expect("present until dropped")
    }

    /// The pool it came from.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(mut engine) = self.engine.take() {
            // A generation that panicked may have left a step half done: start afresh.
            if std::thread::panicking() {
                engine.reset();
            }
            // Given back before the permit (a field dropped after this), so that a permit always
            // finds an idle session.
            lock(&self.pool.idle).push(engine);
        }
    }
}

/// A running generation's entry in the pool; dropping it removes the entry.
#[derive(Debug)]
pub struct Registration {
    pool: Arc<Pool>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.pool.running).remove(&self.id);
    }
}
