//! `htpkv serve`: the OpenAI-compatible HTTP server (see the `htpkv_serve` crate).
//!
//! Opens the model once, `--parallel` sessions on it, binds `--host:--port` (port 0: any free
//! port) and prints `listening on http://ADDR` on stdout once it accepts. Ctrl-C (SIGINT) or
//! SIGTERM stops accepting, cancels running generations, lets their answers end, and exits 0.

use crate::generate::{RunArgs, check_run, open_run};
use anyhow::Context;
use std::io::Write;

/// Arguments of `htpkv serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sessions on the model: generations that run at once (each holds its own KV cache).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub parallel: u16,
    /// Requests that may wait for a session; more are refused with 429.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Largest request body, in bytes (413 past it).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// The model's name in /v1/models and in responses [default: the model file or folder name].
    #[arg(long)]
    pub model_name: Option<String>,
    /// Which model runs, and where.
    #[command(flatten)]
    pub run: RunArgs,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.run.bundle.is_some() || args.run.compiled.len() > 1 {
        anyhow::bail!(
            "`htpkv serve` takes one model or compiled file; --bundle and split models are not served yet"
        );
    }
    let checked = check_run(&args.run, None, None)?;
    let (engine, _) = open_run(&args.run, &checked, false)?;
    let options = htpkv_serve::ServeOptions {
        parallel: args.parallel.into(),
        queue: args.queue,
        max_body_bytes: args.max_body_bytes,
        model_name: args
            .model_name
            .clone()
            .unwrap_or_else(|| model_name(&args.run)),
    };
    let state = htpkv_serve::state(engine, &options)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}").and_then(|()| out.flush())?;
        drop(out);
        htpkv_serve::serve(listener, state, shutdown_signal()).await?;
        eprintln!("htpkv serve: shut down");
        anyhow::Ok(())
    });
    // A generation still blocked on a client that stopped reading ends when its stream is
    // dropped; do not wait for it longer than this.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    served
}

/// The model's name: its file's stem or its folder's name.
fn model_name(run: &RunArgs) -> String {
    run.model_dir
        .as_deref()
        .or(run.compiled.first().map(|p| p.as_path()))
        .and_then(|p| p.file_stem())
        .map_or_else(
            || "stories260K".into(),
            |s| s.to_string_lossy().into_owned(),
        )
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => eprintln!("htpkv serve: interrupted, cancelling running generations"),
        () = term => eprintln!("htpkv serve: terminated, cancelling running generations"),
    }
}
