//! `htpkv serve`: an OpenAI-compatible HTTP server over one htpkv model.
//!
//! Routes: `POST /v1/chat/completions` and `POST /v1/completions` (streamed as server-sent events
//! with `"stream": true`), `GET /v1/models`, `GET /health`. Many sessions share the one model in
//! a bounded [`pool::Pool`] with a bounded queue; generation runs on blocking threads and streams
//! through a channel ([`generation`]); a client that disconnects cancels its generation; shutdown
//! stops accepting, cancels what runs and waits for the answers to end.
//!
//! Constrained output (`tools`, `tool_choice`, `response_format`) goes through one seam,
//! [`constraint::constraint_for`] and [`constraint::tool_calls_in`].

#![forbid(unsafe_code)]

pub mod api;
pub mod constraint;
pub mod error;
pub mod generation;
pub mod loadtest;
pub mod pool;
pub mod routes;
pub mod timeouts;

pub use error::{ApiError, ErrorKind};
pub use pool::Pool;
pub use routes::{AppState, router};

use std::future::Future;
use std::sync::Arc;

/// The server's bounds.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Sessions, so generations running at once.
    pub parallel: usize,
    /// Requests that may wait for a session; more are refused (429).
    pub queue: usize,
    /// The largest request body taken, in bytes (413 past it).
    pub max_body_bytes: usize,
    /// The model's name in `/v1/models` and in responses.
    pub model_name: String,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            parallel: 2,
            queue: 16,
            max_body_bytes: 1 << 20,
            model_name: "htpkv".into(),
        }
    }
}

/// Errors of starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("opening the sessions of the pool")]
    Pool(#[source] htpkv::engine::EngineError),
    #[error("serving HTTP")]
    Io(#[source] std::io::Error),
}

/// The state of a server: `parallel` sessions on `first`'s model (`first` one of them).
pub fn state(first: htpkv::Engine, options: &ServeOptions) -> Result<Arc<AppState>, ServeError> {
    let pool = Pool::new(first, options.parallel, options.queue).map_err(ServeError::Pool)?;
    Ok(Arc::new(AppState::new(
        Arc::new(pool),
        options.model_name.clone(),
        options.max_body_bytes,
    )))
}

/// How long shutdown waits for open responses to end before it drops them (a client that stopped
/// reading its stream would otherwise hold the server up).
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves on `listener` until `shutdown` resolves; then stops accepting, refuses new requests
/// (503), cancels running generations and returns once every open response has ended, or after
/// [`SHUTDOWN_GRACE`], dropping the connections still open.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_on(timeouts::TimedListener::new(listener), state, shutdown).await
}

/// [`serve`] on a listener with its own connection timeouts ([`timeouts::TimedListener`]).
pub async fn serve_on(
    listener: timeouts::TimedListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let pool = state.pool.clone();
    let (began, shutting_down) = tokio::sync::oneshot::channel::<()>();
    let graceful = axum::serve(listener, router(state)).with_graceful_shutdown(async move {
        shutdown.await;
        pool.close();
        let _ = began.send(());
    });
    let grace_over = async {
        if shutting_down.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        served = graceful => served.map_err(ServeError::Io),
        () = grace_over => Ok(()),
    }
}
