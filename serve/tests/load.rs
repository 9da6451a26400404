//! A small run of the bounded load test (`examples/serve_load.rs`) on stories260K: 8 concurrent
//! streaming clients × 4 requests on loopback, 2 sessions and a queue for the rest; no request
//! may be lost and every answer must equal the same request served alone.

use htpkv::engine::{Engine, EngineOptions};
use htpkv_serve::loadtest::{LoadOptions, run};
use htpkv_serve::{ServeOptions, serve, state};
use std::time::Duration;

#[test]
fn eight_streaming_clients_lose_nothing_and_match_the_answers_served_alone() {
    let cache = test_support::files::ScratchDir::new("serve-load-cache");
    let options = EngineOptions {
        model_dir: Some(test_support::stories::stories260k_dir()),
        cache_dir: Some(cache.to_path_buf()),
        ..EngineOptions::default()
    };
    let engine = Engine::open(&options, &mut |_| {}).unwrap();
    let serve_options = ServeOptions {
        parallel: 2,
        queue: 8,
        ..ServeOptions::default()
    };
    let state = state(engine, &serve_options).unwrap();
    let load = LoadOptions {
        clients: 8,
        requests_per_client: 4,
        max_tokens: 24,
        prompts: ["Once upon a time", "The little dog", "Lily wanted to"]
            .map(String::from)
            .to_vec(),
        timeout: Duration::from_secs(60),
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let report = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state.clone(), async {
            let _ = stopped.await;
        }));
        let report = run(addr, &load).await.unwrap();
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        report
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    assert_eq!(report.requests, 32);
    assert!(report.passed(), "{report:?}");
    assert!(report.completion_tokens > 0);
    // Requests of the same prompt found it in a session's cache.
    let reused = state
        .pool
        .counters
        .reused_tokens
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(reused > 0, "no prefix was reused");
    assert_eq!(state.pool.idle(), 2, "every session is back in the pool");
}
