//! The serve load test from the command line: opens a model (stories260K by default), serves it
//! in this process on a loopback port, runs N concurrent streaming clients against it and prints
//! the report (`--json`: as JSON). Exits 1 when a request was lost or an answer differed from
//! the same request served alone.
//!
//! `cargo run --release -p htpkv_serve --example serve_load -- --clients 8 --requests 4`

use anyhow::Context;
use htpkv::engine::{Engine, EngineOptions};
use htpkv_serve::loadtest::{LoadOptions, LoadReport, run};
use htpkv_serve::{ServeOptions, serve, state};
use std::time::Duration;

struct Args {
    model: Option<std::path::PathBuf>,
    clients: usize,
    requests: usize,
    max_tokens: usize,
    parallel: usize,
    json: bool,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        model: None,
        clients: 8,
        requests: 4,
        max_tokens: 32,
        parallel: 2,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = Some(value()?.into()),
            "--clients" => a.clients = value()?.parse()?,
            "--requests" => a.requests = value()?.parse()?,
            "--max-tokens" => a.max_tokens = value()?.parse()?,
            "--parallel" => a.parallel = value()?.parse()?,
            "--json" => a.json = true,
            other => anyhow::bail!(
                "unknown option {other} (--model PATH --clients N --requests N --max-tokens N --parallel N --json)"
            ),
        }
    }
    Ok(a)
}

fn main() -> anyhow::Result<()> {
    let args = parse()?;
    let options = EngineOptions {
        model_dir: args.model.clone(),
        ..EngineOptions::default()
    };
    let engine =
        Engine::open(&options, &mut |line| eprintln!("{line}")).context("opening the model")?;
    let serve_options = ServeOptions {
        parallel: args.parallel,
        queue: args.clients,
        ..ServeOptions::default()
    };
    let state = state(engine, &serve_options)?;
    let load = LoadOptions {
        clients: args.clients,
        requests_per_client: args.requests,
        max_tokens: args.max_tokens,
        prompts: [
            "Once upon a time",
            "The little dog",
            "Lily wanted to",
            "One day, a bird",
        ]
        .map(String::from)
        .to_vec(),
        timeout: Duration::from_secs(120),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state, async {
            let _ = stopped.await;
        }));
        let report = run(addr, &load).await;
        let _ = stop.send(());
        server.await??;
        anyhow::Ok(report?)
    })?;
    print(&report, &args)?;
    if !report.passed() {
        anyhow::bail!(
            "{} lost, {} mismatched: {:?}",
            report.lost,
            report.mismatched,
            report.errors
        );
    }
    Ok(())
}

fn print(r: &LoadReport, args: &Args) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(r)?);
        return Ok(());
    }
    let rss = r
        .peak_rss_bytes
        .map_or("n/a".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0));
    println!(
        "{} clients x {} requests (--parallel {}, {} tokens max): {} lost, {} mismatched\n\
         {} tokens in {:.2} s: {:.1} tok/s, {:.1} req/s\n\
         time to first token p50/p95/p99: {:.1} / {:.1} / {:.1} ms\n\
         total per request   p50/p95/p99: {:.1} / {:.1} / {:.1} ms\n\
         peak RSS (server and clients, one process): {rss}",
        r.clients,
        args.requests,
        args.parallel,
        args.max_tokens,
        r.lost,
        r.mismatched,
        r.completion_tokens,
        r.wall_seconds,
        r.tokens_per_second,
        r.requests_per_second,
        r.first_token.p50_ms,
        r.first_token.p95_ms,
        r.first_token.p99_ms,
        r.total.p50_ms,
        r.total.p95_ms,
        r.total.p99_ms,
    );
    Ok(())
}
