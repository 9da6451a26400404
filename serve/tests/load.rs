//! A small run of the bounded load test (`examples/serve_load.rs`) on stories260K: 8 concurrent
//! streaming clients × 4 requests on loopback, 2 sessions and a queue for the rest; no request
//! may be lost and every answer must equal the same request served alone.

use htpkv::engine::{Engine, EngineOptions};
use htpkv_serve::loadtest::{LoadOptions, run};
use htpkv_serve::{ServeOptions, state};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The tests of this binary run one at a time: each measures or loads the machine's 2 cores.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A server state on stories260K with `parallel` sessions and `queue` places.
fn stories_state(
    name: &str,
    parallel: usize,
    queue: usize,
) -> std::sync::Arc<htpkv_serve::AppState> {
    let cache = test_support::files::ScratchDir::new(name);
    let options = EngineOptions {
        model_dir: Some(test_support::stories::stories260k_dir()),
        cache_dir: Some(cache.to_path_buf()),
        ..EngineOptions::default()
    };
    let engine = Engine::open(&options, &mut |_| {}).unwrap();
    let serve_options = ServeOptions {
        parallel,
        queue,
        ..ServeOptions::default()
    };
    state(engine, &serve_options).unwrap()
}

/// Runs `client` against a server of `state` on loopback (connections timed by `timeouts`:
/// header and idle), then shuts the server down and returns what `client` returned.
fn served<T>(
    state: &std::sync::Arc<htpkv_serve::AppState>,
    timeouts: (Duration, Duration),
    client: impl AsyncFnOnce(std::net::SocketAddr) -> T,
) -> T {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let listener = htpkv_serve::timeouts::TimedListener::with(tcp, timeouts.0, timeouts.1);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(htpkv_serve::serve_on(listener, state.clone(), async {
            let _ = stopped.await;
        }));
        let out = client(addr).await;
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        out
    })
}

/// The server's own connection timeouts.
const TIMEOUTS: (Duration, Duration) = (
    htpkv_serve::timeouts::HEADER_READ_TIMEOUT,
    htpkv_serve::timeouts::IDLE_TIMEOUT,
);

#[test]
fn eight_streaming_clients_lose_nothing_and_match_the_answers_served_alone() {
    let _one = one_at_a_time();
    let state = stories_state("serve-load-cache", 2, 8);
    let load = LoadOptions {
        clients: 8,
        requests_per_client: 4,
        max_tokens: 24,
        prompts: ["Once upon a time", "The little dog", "Lily wanted to"]
            .map(String::from)
            .to_vec(),
        timeout: Duration::from_secs(60),
    };
    let report = served(&state, TIMEOUTS, async |addr| {
        run(addr, &load).await.unwrap()
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

/// Issue 36: work before admission stalled the server. Four chat requests with 20,000 tools each
/// (a `required` choice), four prompts of 1 MB and two schemas of 20,000 values to compile are
/// sent at once; `/health` must answer within 100 ms throughout, and each heavy request gets its
/// answer (prepared inside admission, on blocking threads, `--parallel` at a time).
#[test]
fn health_answers_within_100_ms_while_heavy_requests_are_prepared() {
    let _one = one_at_a_time();
    use htpkv_serve::loadtest::health_under_load;
    let defaults = ServeOptions::default();
    let state = stories_state("serve-heavy-cache", defaults.parallel, defaults.queue);
    let tools: Vec<serde_json::Value> = (0..20_000)
        .map(|i| serde_json::json!({"type": "function", "function": {"name": format!("f{i}")}}))
        .collect();
    let tools_body = serde_json::json!({
        "messages": [{"role": "user", "content": "x"}], "tools": tools,
        "tool_choice": "required", "max_tokens": 4,
    })
    .to_string();
    assert!(tools_body.len() < 1 << 20, "{} bytes", tools_body.len());
    let prompt_body =
        serde_json::json!({"prompt": "a ".repeat(500_000), "max_tokens": 4}).to_string();
    // And grammars that compile (their prompt fits): an enum of 20,000 strings.
    let values: Vec<String> = (0..20_000).map(|i| format!("v{i}")).collect();
    let enum_body = serde_json::json!({
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {"enum": values}}},
    })
    .to_string();
    let mut heavy = Vec::new();
    for _ in 0..4 {
        heavy.push(("/v1/chat/completions".to_owned(), tools_body.clone()));
        heavy.push(("/v1/completions".to_owned(), prompt_body.clone()));
    }
    for _ in 0..2 {
        heavy.push(("/v1/chat/completions".to_owned(), enum_body.clone()));
    }
    let report = served(&state, TIMEOUTS, async |addr| {
        let every = Duration::from_millis(20);
        health_under_load(addr, heavy, every).await.unwrap()
    });
    println!("{}", serde_json::to_string(&report).unwrap());
    assert!(report.probes > 0);
    assert!(report.slowest_ms < 100.0, "{report:?}");
    // The tool lists' prompts and the 1 MB prompts cannot fit stories260K's 512 tokens: 400
    // (before any grammar is compiled); the enums compile and answer.
    assert_eq!(report.statuses[..8], [400; 8], "{report:?}");
    assert_eq!(report.statuses[8..], [200; 2], "{report:?}");
}

#[path = "../../fuzz/checks/replay.rs"]
mod replay;
#[path = "../../fuzz/checks/serve_request.rs"]
mod serve_request;

/// The `serve_request` fuzz target's corpus (the issue's requests among its seeds) through its
/// check.
#[test]
fn serve_request_fuzz_corpus() {
    replay::replay("serve_request", serve_request::check);
}

/// Issue 36, smaller faults over HTTP: a framework rejection (405) and a body of the wrong type
/// get OpenAI error bodies with the right `param`; a malformed chunk or a body cut short is a 400,
/// not a 413; `/v1/completions` names `prompt` when it cannot fit; a schema llguidance cannot
/// compile safely is a 400 and the server stays up; `--queue usize::MAX` does not wrap; slow
/// headers are cut off.
#[test]
fn framework_rejections_and_bad_bodies_get_openai_errors() {
    let _one = one_at_a_time();
    use htpkv_serve::loadtest::send;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let state = stories_state("serve-errors-cache", 1, usize::MAX);
    let error = |body: &str| -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(body).unwrap()["error"].clone()
    };
    let short = (Duration::from_millis(300), Duration::from_secs(5));
    served(&state, short, async |addr| {
        let (status, body) = send(addr, "GET", "/v1/chat/completions", None)
            .await
            .unwrap();
        assert_eq!(status, 405, "{body}");
        assert_eq!(error(&body)["code"], "method_not_allowed", "{body}");
        let wrong = r#"{"prompt": "x", "max_tokens": "many"}"#;
        let (status, body) = send(addr, "POST", "/v1/completions", Some(wrong))
            .await
            .unwrap();
        assert_eq!(
            (status, &error(&body)["param"]),
            (400, &serde_json::json!("max_tokens")),
            "{body}"
        );
        let long = serde_json::json!({"prompt": "a ".repeat(200_000)}).to_string();
        let (status, body) = send(addr, "POST", "/v1/completions", Some(&long))
            .await
            .unwrap();
        assert_eq!(status, 400, "{body}");
        assert_eq!(error(&body)["param"], "prompt", "{body}");
        assert_eq!(error(&body)["code"], "context_length_exceeded", "{body}");
        let schema = r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"integer","minimum":-9223372036854775807,"maximum":-9223372036854775807}}}}"#;
        let (status, body) = send(addr, "POST", "/v1/chat/completions", Some(schema))
            .await
            .unwrap();
        assert_eq!(
            (status, &error(&body)["param"]),
            (400, &serde_json::json!("response_format")),
            "{body}"
        );
        assert!(body.contains("9007199254740991"), "{body}");
        // An idle server with an unbounded queue admits (the sum saturates).
        let ok = r#"{"prompt": "Once", "max_tokens": 2}"#;
        let (status, body) = send(addr, "POST", "/v1/completions", Some(ok))
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        // Raw HTTP: a malformed chunk size, a body shorter than declared, slow headers.
        let raw = |bytes: &'static [u8], shut: bool| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(bytes).await.unwrap();
            if shut {
                s.shutdown().await.unwrap();
            }
            let mut out = String::new();
            let read = s.read_to_string(&mut out);
            tokio::time::timeout(Duration::from_secs(10), read)
                .await
                .unwrap()
                .unwrap_or(0);
            out
        };
        let chunked = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n";
        let out = raw(chunked, false).await;
        assert!(out.starts_with("HTTP/1.1 400"), "{out}");
        let short =
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"";
        let out = raw(short, true).await;
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 400"), "{out}");
        let slow = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
        let started = std::time::Instant::now();
        let out = raw(slow, false).await;
        assert!(
            !out.contains("200 OK") && started.elapsed() < Duration::from_secs(5),
            "{out}"
        );
        let (status, _) = send(addr, "GET", "/health", None).await.unwrap();
        assert_eq!(status, 200);
    });
}
