//! A bounded load test on loopback: N concurrent streaming clients, each sending R requests, over
//! plain HTTP/1.1 on tokio's TCP (no HTTP client library). Every answer is checked against the
//! same request served alone first (greedy decoding makes them equal), and no request may be
//! lost; the report has throughput, latency percentiles (time to first token, total) and the
//! process's peak resident memory. `examples/serve_load.rs` runs it from the command line.

use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// What to send.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub clients: usize,
    pub requests_per_client: usize,
    pub max_tokens: usize,
    /// Prompts sent in turn (`/v1/completions`, greedy).
    pub prompts: Vec<String>,
    /// The most one request may take.
    pub timeout: Duration,
}

/// Errors of the load test's client.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("talking to the server")]
    Io(#[from] std::io::Error),
    #[error("the server answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("a malformed response: {0}")]
    Malformed(String),
    #[error("a request took longer than {0:?}")]
    Timeout(Duration),
}

/// One streamed answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub text: String,
    pub completion_tokens: usize,
    pub finish_reason: String,
    pub first_token: Duration,
    pub total: Duration,
}

/// Percentiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles (zeros for no samples).
    pub fn of(samples: &[Duration]) -> Percentiles {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let at = |p: f64| {
            if ms.is_empty() {
                return 0.0;
            }
            let rank = ((p / 100.0) * ms.len() as f64).ceil() as usize;
            ms[rank.clamp(1, ms.len()) - 1]
        };
        Percentiles {
            p50_ms: at(50.0),
            p95_ms: at(95.0),
            p99_ms: at(99.0),
        }
    }
}

/// What the load test measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadReport {
    pub clients: usize,
    pub requests: usize,
    /// Requests that failed or never answered.
    pub lost: usize,
    /// Answers that differ from the same request served alone.
    pub mismatched: usize,
    pub completion_tokens: usize,
    pub wall_seconds: f64,
    pub tokens_per_second: f64,
    pub requests_per_second: f64,
    pub first_token: Percentiles,
    pub total: Percentiles,
    /// Peak resident memory of this process (`VmHWM`), when the system says.
    pub peak_rss_bytes: Option<u64>,
    /// The first failures, for the report.
    pub errors: Vec<String>,
}

impl LoadReport {
    /// True when no request was lost and every answer matched.
    pub fn passed(&self) -> bool {
        self.lost == 0 && self.mismatched == 0
    }
}

/// Runs the test against the server at `addr`: every prompt alone first (the references), then
/// `clients` clients at once, each sending `requests_per_client` requests one after another.
pub async fn run(addr: SocketAddr, options: &LoadOptions) -> Result<LoadReport, LoadError> {
    let mut references = Vec::new();
    for prompt in &options.prompts {
        references
            .push(stream_completion(addr, prompt, options.max_tokens, options.timeout).await?);
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..options.clients)
        .map(|client| tokio::spawn(client_loop(addr, client, options.clone())))
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        match task.await {
            Ok(r) => results.extend(r),
            Err(e) => results.push((
                0,
                Err(LoadError::Malformed(format!("a client panicked: {e}"))),
            )),
        }
    }
    Ok(report(options, &references, results, started.elapsed()))
}

type Outcome = (usize, Result<Answer, LoadError>);

async fn client_loop(addr: SocketAddr, client: usize, options: LoadOptions) -> Vec<Outcome> {
    let mut out = Vec::new();
    for i in 0..options.requests_per_client {
        let which = (client + i) % options.prompts.len();
        let answer = stream_completion(
            addr,
            &options.prompts[which],
            options.max_tokens,
            options.timeout,
        )
        .await;
        out.push((which, answer));
    }
    out
}

fn report(
    options: &LoadOptions,
    references: &[Answer],
    results: Vec<Outcome>,
    wall: Duration,
) -> LoadReport {
    let expected = options.clients * options.requests_per_client;
    let (mut first, mut total, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    let (mut tokens, mut mismatched, mut answered) = (0, 0, 0);
    for (which, result) in results {
        match result {
            Ok(a) => {
                answered += 1;
                tokens += a.completion_tokens;
                first.push(a.first_token);
                total.push(a.total);
                let reference = &references[which];
                if a.text != reference.text || a.finish_reason != reference.finish_reason {
                    mismatched += 1;
                    errors.push(format!(
                        "prompt {which}: {:?} ({}) differs from {:?} ({}) served alone",
                        a.text, a.finish_reason, reference.text, reference.finish_reason
                    ));
                }
            }
            Err(e) => errors.push(error_chain(&e)),
        }
    }
    errors.truncate(8);
    let secs = wall.as_secs_f64().max(1e-9);
    LoadReport {
        clients: options.clients,
        requests: expected,
        lost: expected - answered,
        mismatched,
        completion_tokens: tokens,
        wall_seconds: secs,
        tokens_per_second: tokens as f64 / secs,
        requests_per_second: answered as f64 / secs,
        first_token: Percentiles::of(&first),
        total: Percentiles::of(&total),
        peak_rss_bytes: htpkv::engine::peak_memory_bytes(),
        errors,
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    s
}

/// One greedy streaming `/v1/completions` request, read event by event.
pub async fn stream_completion(
    addr: SocketAddr,
    prompt: &str,
    max_tokens: usize,
    timeout: Duration,
) -> Result<Answer, LoadError> {
    let body = json!({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    tokio::time::timeout(timeout, request(addr, "/v1/completions", &body))
        .await
        .map_err(|_| LoadError::Timeout(timeout))?
}

async fn request(addr: SocketAddr, path: &str, body: &Value) -> Result<Answer, LoadError> {
    let started = Instant::now();
    let (status, mut events) = exchange(addr, "POST", path, &body.to_string()).await?;
    if status != 200 {
        let body = events.rest().await?;
        return Err(LoadError::Status { status, body });
    }
    let mut answer = Answer {
        text: String::new(),
        completion_tokens: 0,
        finish_reason: String::new(),
        first_token: Duration::ZERO,
        total: Duration::ZERO,
    };
    while let Some(data) = events.next_data().await? {
        if data == "[DONE]" {
            answer.total = started.elapsed();
            return Ok(answer);
        }
        absorb(&mut answer, &data, started)?;
    }
    Err(LoadError::Malformed(
        "the stream ended before data: [DONE]".into(),
    ))
}

/// Sends one request and reads its whole answer: the status and the body (a streamed body as its
/// raw events). `body` `None` sends no body (a GET).
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String), LoadError> {
    let (status, mut events) = exchange(addr, method, path, body.unwrap_or("")).await?;
    Ok((status, events.rest().await?))
}

/// Sends one request on a new connection; returns the status and the body's reader.
async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, Events), LoadError> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut reader = BufReader::new(stream);
    let (status, chunked) = read_head(&mut reader).await?;
    let events = Events {
        reader,
        chunked,
        pending: Vec::new(),
        done: false,
    };
    Ok((status, events))
}

/// What `/health` did while heavy requests were in flight ([`health_under_load`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct HealthUnderLoad {
    /// `/health` answers, each within its time.
    pub probes: usize,
    /// The median `/health` answer, in milliseconds.
    pub median_ms: f64,
    /// The slowest `/health` answer, in milliseconds.
    pub slowest_ms: f64,
    /// The heavy requests' statuses, in the order given.
    pub statuses: Vec<u16>,
    /// How long the heavy requests took, all of them, in seconds.
    pub heavy_seconds: f64,
}

/// Sends the `heavy` requests (path, body) at once and asks `/health` every `every` until they
/// have all been answered: how slow `/health` was meanwhile, and how the heavy ones ended.
pub async fn health_under_load(
    addr: SocketAddr,
    heavy: Vec<(String, String)>,
    every: Duration,
) -> Result<HealthUnderLoad, LoadError> {
    let started = Instant::now();
    let tasks: Vec<_> = (heavy.into_iter())
        .map(|(path, body)| {
            tokio::spawn(async move { send(addr, "POST", &path, Some(&body)).await })
        })
        .collect();
    let mut times = Vec::new();
    while !tasks.iter().all(|t| t.is_finished()) {
        let asked = Instant::now();
        let (status, body) = send(addr, "GET", "/health", None).await?;
        if status != 200 {
            return Err(LoadError::Status { status, body });
        }
        times.push(asked.elapsed());
        tokio::time::sleep(every).await;
    }
    let spread = Percentiles::of(&times);
    let heavy_seconds = started.elapsed().as_secs_f64();
    let mut statuses = Vec::new();
    for task in tasks {
        let (status, _) = task
            .await
            .map_err(|e| LoadError::Malformed(format!("a heavy request's task: {e}")))??;
        statuses.push(status);
    }
    Ok(HealthUnderLoad {
        probes: times.len(),
        median_ms: spread.p50_ms,
        slowest_ms: times.iter().max().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        statuses,
        heavy_seconds,
    })
}

/// Adds one `data:` event to the answer.
fn absorb(answer: &mut Answer, data: &str, started: Instant) -> Result<(), LoadError> {
    let v: Value =
        serde_json::from_str(data).map_err(|e| LoadError::Malformed(format!("{e}: {data}")))?;
    if v.get("error").is_some() {
        return Err(LoadError::Status {
            status: 200,
            body: data.to_owned(),
        });
    }
    if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
        answer.completion_tokens = n as usize;
    }
    let choice = &v["choices"][0];
    if let Some(t) = choice["text"].as_str().filter(|t| !t.is_empty()) {
        if answer.text.is_empty() {
            answer.first_token = started.elapsed();
        }
        answer.text.push_str(t);
    }
    if let Some(f) = choice["finish_reason"].as_str() {
        answer.finish_reason = f.to_owned();
    }
    Ok(())
}

/// The status code, and whether the body is chunked.
async fn read_head(reader: &mut BufReader<TcpStream>) -> Result<(u16, bool), LoadError> {
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| LoadError::Malformed(format!("status line {line:?}")))?;
    let mut chunked = false;
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
            return Ok((status, chunked));
        }
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
}

/// A response body (chunked or read to its end), split into SSE `data:` payloads.
struct Events {
    reader: BufReader<TcpStream>,
    chunked: bool,
    pending: Vec<u8>,
    done: bool,
}

impl Events {
    /// The next body bytes; empty at the end.
    async fn more(&mut self) -> Result<Vec<u8>, LoadError> {
        if self.done {
            return Ok(Vec::new());
        }
        if !self.chunked {
            let mut buf = vec![0; 8192];
            let n = self.reader.read(&mut buf).await?;
            buf.truncate(n);
            self.done = n == 0;
            return Ok(buf);
        }
        let mut line = String::new();
        self.reader.read_line(&mut line).await?;
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| LoadError::Malformed(format!("chunk size {line:?}")))?;
        let mut buf = vec![0; size + 2];
        self.reader.read_exact(&mut buf).await?;
        buf.truncate(size);
        self.done = size == 0;
        Ok(buf)
    }

    /// The whole rest of the body as text.
    async fn rest(&mut self) -> Result<String, LoadError> {
        let mut all = std::mem::take(&mut self.pending);
        loop {
            let bytes = self.more().await?;
            if bytes.is_empty() {
                return Ok(String::from_utf8_lossy(&all).into_owned());
            }
            all.extend(bytes);
        }
    }

    /// The payload of the next `data:` event, `None` at the end of the body.
    async fn next_data(&mut self) -> Result<Option<String>, LoadError> {
        loop {
            if let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.pending.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&event);
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if !data.is_empty() {
                    return Ok(Some(data.join("\n")));
                }
                continue;
            }
            let bytes = self.more().await?;
            if bytes.is_empty() {
                return Ok(None);
            }
            self.pending.extend(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let p = Percentiles::of(&ms);
        assert_eq!((p.p50_ms, p.p95_ms, p.p99_ms), (50.0, 95.0, 99.0));
        assert_eq!(Percentiles::of(&[]).p99_ms, 0.0);
    }
}
