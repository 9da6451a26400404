//! The routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`.

use crate::api::{ChatRequest, CommonFields, CompletionRequest, Usage, finish_reason};
use crate::constraint::Structured;
use crate::error::{ApiError, ErrorKind};
use crate::generation::{CancelOnDrop, Outcome, Piece, start};
use crate::pool::{Admission, Pool};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::Stream;
use htpkv::session::GenerateOptions;
use htpkv_runtime::session::check_text_fits;
use htpkv_structured::Vocabulary;
use model::Message;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    pub pool: Arc<Pool>,
    /// The name `/v1/models` lists and responses carry.
    pub model_name: String,
    /// The largest request body taken, in bytes.
    pub max_body_bytes: usize,
    next_id: AtomicU64,
    /// The model's token bytes for constrained output (`None`: its tokenizer cannot give them,
    /// and constrained requests are refused as unsupported).
    vocab: Option<Arc<Vocabulary>>,
}

impl AppState {
    pub fn new(pool: Arc<Pool>, model_name: String, max_body_bytes: usize) -> AppState {
        let vocab = Vocabulary::new(pool.model().tokenizer()).ok().map(Arc::new);
        AppState {
            pool,
            model_name,
            max_body_bytes,
            next_id: AtomicU64::new(0),
            vocab,
        }
    }

    fn id(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

/// The server's routes over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .fallback(|| async { ApiError::new(ErrorKind::NotFound, "no such route") })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("{method} is not allowed on this route"),
            )
        })
        .with_state(state)
}

async fn health(State(state): State<Arc<AppState>>) -> Json<Value> {
    let pool = &state.pool;
    let c = &pool.counters;
    let (parallel, queue) = pool.bounds();
    let idle = pool.idle();
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Json(json!({
        "status": "ok",
        "model": state.model_name,
        "parallel": parallel,
        "queue": queue,
        "idle_sessions": idle,
        "admitted": pool.admitted(),
        "completed": n(&c.completed),
        "cancelled": n(&c.cancelled),
        "failed": n(&c.failed),
        "rejected": n(&c.rejected),
        "prompt_tokens": n(&c.prompt_tokens),
        "reused_tokens": n(&c.reused_tokens),
        "completion_tokens": n(&c.completion_tokens),
    }))
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": state.model_name, "object": "model", "created": 0, "owned_by": "htpkv"}],
    }))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How long a client may take to send a request's body, once its headers are in (408 past it).
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads a body of at most `max` bytes within [`BODY_READ_TIMEOUT`]: 413 past the size (declared
/// or sent), 408 past the time, 400 for a body that breaks HTTP (a malformed chunk, a connection
/// closed before the declared length).
async fn read_body(headers: &HeaderMap, body: Body, max: usize) -> Result<Vec<u8>, ApiError> {
    use futures_util::StreamExt;
    let too_large = || {
        ApiError::new(
            ErrorKind::TooLarge,
            format!("the request body is larger than {max} bytes (--max-body-bytes)"),
        )
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let read = async {
        let mut bytes = Vec::new();
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::new(
                    ErrorKind::BadRequest,
                    format!("the request body could not be read: {e}"),
                )
                .with_source(e)
            })?;
            if bytes.len().saturating_add(chunk.len()) > max {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    tokio::time::timeout(BODY_READ_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                ErrorKind::Timeout,
                format!(
                    "the request body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            ))
        })
}

/// Parses a request body: 400 for what is not the expected JSON, naming the field at fault (its
/// first path segment) when there is one. The fields both endpoints share are flattened into the
/// request, where serde loses the path: a type error there is found by reading them alone.
fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let invalid = |e: &dyn std::fmt::Display| {
        ApiError::new(
            ErrorKind::BadRequest,
            format!("the request body is not a valid request: {e}"),
        )
    };
    let value: Value = serde_json::from_slice(bytes).map_err(|e| invalid(&e).with_source(e))?;
    let error = match serde_path_to_error::deserialize::<_, T>(&value) {
        Ok(request) => return Ok(request),
        Err(e) => e,
    };
    let path = match serde_path_to_error::deserialize::<_, CommonFields>(&value) {
        Err(common) => common.path().to_string(),
        Ok(_) => error.path().to_string(),
    };
    let field = path.split(['.', '[']).next().unwrap_or("");
    let inner = error.into_inner();
    let mut api = invalid(&inner);
    if !field.is_empty() && field != "?" {
        api = api.with_param(field);
    }
    Err(api.with_source(inner))
}

/// A checked request, ready to run: its prompt's tokens and its generation options.
struct Job {
    prompt: Vec<u32>,
    options: GenerateOptions,
    stream: bool,
    include_usage: bool,
}

/// Checks the shared fields and the token counts against the context: the prompt must leave room,
/// and `max_tokens` (default: all the room left) must fit in it.
/// `prompt_param` names the request field the prompt comes from (`messages` or `prompt`). A text
/// whose byte length shows it cannot fit is refused before it is tokenized.
fn job(
    pool: &Pool,
    prompt_text: &str,
    prompt_param: &str,
    common: &CommonFields,
    max_tokens: Option<u64>,
) -> Result<Job, ApiError> {
    common.check_n()?;
    let sampler = common.sampler()?;
    let stop = common.stops()?;
    let capacity = pool.capacity();
    let codec = pool.model().tokenizer();
    check_text_fits(codec, prompt_text, capacity.saturating_sub(1), true).map_err(|e| {
        ApiError::new(
            ErrorKind::ContextLength,
            format!("the {prompt_param} do not fit the context of {capacity} tokens: {e}"),
        )
        .with_param(prompt_param)
        .with_source(e)
    })?;
    let prompt = codec.encode(prompt_text, true);
    if prompt.is_empty() {
        return Err(ApiError::bad_param(
            "prompt",
            "the prompt encodes to no tokens",
        ));
    }
    if prompt.len() >= capacity {
        return Err(ApiError::new(
            ErrorKind::ContextLength,
            format!(
                "the prompt has {} tokens; the context holds {capacity}, answer included",
                prompt.len()
            ),
        )
        .with_param(prompt_param));
    }
    let room = capacity - prompt.len();
    let max_tokens = match max_tokens {
        None => room,
        Some(0) => {
            return Err(ApiError::bad_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        Some(n) if n > room as u64 => {
            return Err(ApiError::new(
                ErrorKind::ContextLength,
                format!(
                    "max_tokens = {n} does not fit: the prompt has {} tokens and the context holds {capacity}, so at most {room} can be generated",
                    prompt.len()
                ),
            )
            .with_param("max_tokens"));
        }
        Some(n) => n as usize,
    };
    let mut options = GenerateOptions::new(max_tokens, sampler);
    options.stop = stop;
    Ok(Job {
        prompt,
        options,
        stream: common.stream,
        include_usage: common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
    })
}

/// The request's messages, checked.
fn chat_messages(request: &ChatRequest) -> Result<Vec<Message>, ApiError> {
    if request.messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "messages must not be empty",
        ));
    }
    request
        .messages
        .iter()
        .map(|m| Ok(Message::new(&m.role, &m.text()?)))
        .collect()
}

/// The chat prompt: the messages rendered with the model's chat format (with the tools when it
/// takes them), ending where the assistant's answer starts.
fn chat_prompt(
    pool: &Pool,
    messages: &[Message],
    tools: Option<&Value>,
) -> Result<String, ApiError> {
    // A rendering is bounded by the body's bytes times the template's own text: well under this.
    let cap = 64 << 20;
    pool.model()
        .chat_format()
        .render_with_tools(messages, tools, true, cap)
        .map_err(|e| {
            ApiError::bad_param(
                "messages",
                format!("the chat template cannot render these messages: {e}"),
            )
            .with_source(e)
        })
}

/// A chat request made ready on a blocking thread ([`Pool::prepare`]): parsed, its constraint
/// compiled, its prompt rendered and tokenized against the context.
fn chat_job(state: &AppState, body: &[u8]) -> Result<(Job, Structured), ApiError> {
    let request: ChatRequest = parse_json(body)?;
    let structured = Structured::of(&request)?;
    if structured.needs_vocabulary() && state.vocab.is_none() {
        return Err(ApiError::new(
            ErrorKind::Unsupported,
            "this model's tokenizer cannot give the token bytes constrained output needs",
        ));
    }
    let takes_tools = state.pool.model().chat_format().takes_tools();
    let (messages, tools) = structured.conversation(chat_messages(&request)?, takes_tools);
    let prompt = chat_prompt(&state.pool, &messages, tools.as_ref())?;
    let max_tokens = request.common.max_tokens.or(request.max_completion_tokens);
    let mut job = job(
        &state.pool,
        &prompt,
        "messages",
        &request.common,
        max_tokens,
    )?;
    // Compiled last: a prompt that cannot fit costs no grammar.
    job.options.constraint = structured.constraint(state.vocab.as_ref())?;
    Ok((job, structured))
}

/// A completion request made ready on a blocking thread.
fn completion_job(state: &AppState, body: &[u8]) -> Result<Job, ApiError> {
    let request: CompletionRequest = parse_json(body)?;
    let prompts = request.prompt.into_vec();
    let [prompt] = prompts.as_slice() else {
        return Err(ApiError::bad_param(
            "prompt",
            format!(
                "{} prompts: this server answers one prompt per request",
                prompts.len()
            ),
        ));
    };
    let common = &request.common;
    job(&state.pool, prompt, "prompt", common, common.max_tokens)
}

/// Reads the body, admits the request (429 when the queue is full) and makes it ready with
/// `make` inside admission, on a blocking thread ([`Pool::prepare`]).
async fn admitted<T: Send + 'static>(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
    make: fn(&AppState, &[u8]) -> Result<T, ApiError>,
) -> Result<(T, Admission), ApiError> {
    let body = read_body(headers, body, state.max_body_bytes).await?;
    let admission = state.pool.admit()?;
    let shared = state.clone();
    let made = (state.pool)
        .prepare(&admission, move || make(&shared, &body))
        .await?;
    Ok((made, admission))
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let ((job, structured), admission) = admitted(&state, &headers, body, chat_job).await?;
    let (rx, guard) = run(&state, admission, &job).await?;
    let meta = Meta {
        id: state.id("chatcmpl"),
        created: now(),
        model: state.model_name.clone(),
        chat: true,
        include_usage: job.include_usage,
    };
    if job.stream && !structured.may_call_tools() {
        return Ok(sse(stream_chunks(rx, guard, meta)).into_response());
    }
    // An answer that may be a tool call is known only when it is whole: a streaming request gets
    // it as one chunk (content or tool_calls), then the finish reason.
    let (text, outcome) = collect(rx, guard).await?;
    let tool_calls = structured.tool_calls_in(&text);
    if job.stream {
        let events = meta.whole_answer_events(&text, tool_calls, outcome);
        return Ok(sse(futures_util::stream::iter(events)).into_response());
    }
    Ok(Json(meta.chat_response(&text, tool_calls, outcome)).into_response())
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (job, admission) = admitted(&state, &headers, body, completion_job).await?;
    let (rx, guard) = run(&state, admission, &job).await?;
    let meta = Meta {
        id: state.id("cmpl"),
        created: now(),
        model: state.model_name.clone(),
        chat: false,
        include_usage: job.include_usage,
    };
    if job.stream {
        return Ok(sse(stream_chunks(rx, guard, meta)).into_response());
    }
    let (text, outcome) = collect(rx, guard).await?;
    Ok(Json(meta.completion_response(&text, outcome)).into_response())
}

/// Waits for a session (the admitted job's place in the queue) and starts generating.
async fn run(
    state: &AppState,
    admission: Admission,
    job: &Job,
) -> Result<(mpsc::Receiver<Piece>, CancelOnDrop), ApiError> {
    let lease = state.pool.checkout(admission, &job.prompt).await?;
    Ok(start(lease, job.prompt.clone(), job.options.clone()))
}

/// The whole answer of a non-streaming request. The guard lives as long as this future: a client
/// that leaves drops it and so cancels the generation.
async fn collect(
    mut rx: mpsc::Receiver<Piece>,
    guard: CancelOnDrop,
) -> Result<(String, Outcome), ApiError> {
    let mut text = String::new();
    let outcome = loop {
        match rx.recv().await {
            Some(Piece::Text(t)) => text.push_str(&t),
            Some(Piece::Done(o)) => break o,
            Some(Piece::Failed(e)) => return Err(e),
            None => {
                return Err(ApiError::new(
                    ErrorKind::Internal,
                    "the generation ended without an answer",
                ));
            }
        }
    };
    drop(guard);
    Ok((text, outcome))
}

/// What every response of one request carries.
struct Meta {
    id: String,
    created: u64,
    model: String,
    chat: bool,
    include_usage: bool,
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.chat, chunk) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    fn chat_response(&self, text: &str, tool_calls: Option<Vec<Value>>, o: Outcome) -> Value {
        let (message, finish) = match tool_calls {
            Some(calls) => (
                json!({"role": "assistant", "content": null, "tool_calls": calls}),
                "tool_calls",
            ),
            None => (
                json!({"role": "assistant", "content": text}),
                finish_reason(o.stop),
            ),
        };
        let choice =
            json!({"index": 0, "message": message, "logprobs": null, "finish_reason": finish});
        with_usage(self.envelope(false, json!([choice])), o.usage)
    }

    fn completion_response(&self, text: &str, o: Outcome) -> Value {
        let choice = json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason(o.stop)});
        with_usage(self.envelope(false, json!([choice])), o.usage)
    }

    /// The SSE events of a whole chat answer: one delta (content, or tool calls), the finish
    /// reason, the usage when asked, `[DONE]`.
    fn whole_answer_events(&self, text: &str, calls: Option<Vec<Value>>, o: Outcome) -> Vec<Event> {
        let data = |v: &Value| Event::default().data(v.to_string());
        let (delta, finish) = match calls {
            Some(calls) => {
                let calls: Vec<Value> = (calls.into_iter().enumerate())
                    .map(|(i, mut c)| {
                        c["index"] = json!(i);
                        c
                    })
                    .collect();
                (
                    json!({"role": "assistant", "content": null, "tool_calls": calls}),
                    "tool_calls",
                )
            }
            None => (
                json!({"role": "assistant", "content": text}),
                finish_reason(o.stop),
            ),
        };
        let chunk = |delta: Value, finish: Option<&str>| {
            let choice =
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish});
            self.envelope(true, json!([choice]))
        };
        let mut events = vec![
            data(&chunk(delta, None)),
            data(&chunk(json!({}), Some(finish))),
        ];
        if self.include_usage {
            let mut usage = self.envelope(true, json!([]));
            usage["usage"] = json!(o.usage);
            events.push(data(&usage));
        }
        events.push(Event::default().data("[DONE]"));
        events
    }

    /// A streamed chunk: a text piece, or the finish reason (`text` None).
    fn chunk(&self, text: Option<&str>, finish: Option<&str>, first: bool) -> Value {
        let choice = if self.chat {
            let delta = match (text, first) {
                (Some(t), true) => json!({"role": "assistant", "content": t}),
                (Some(t), false) => json!({"content": t}),
                (None, _) => json!({}),
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
        };
        self.envelope(true, json!([choice]))
    }
}

fn with_usage(mut body: Value, usage: Usage) -> Value {
    body["usage"] = json!(usage);
    body
}

fn sse(
    stream: impl Stream<Item = Event> + Send + 'static,
) -> Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>> {
    use futures_util::StreamExt;
    Sse::new(stream.map(Ok))
}

/// The SSE events of a streaming request: `data: {chunk}` per text piece (the first one of a chat
/// carries the role), one with the finish reason, one with the usage when asked, then
/// `data: [DONE]`. An engine failure mid-stream is sent as an `{"error":…}` event. The stream owns
/// the guard: dropped (the client gone), it cancels the generation.
fn stream_chunks(
    rx: mpsc::Receiver<Piece>,
    guard: CancelOnDrop,
    meta: Meta,
) -> impl Stream<Item = Event> + Send {
    struct S {
        rx: mpsc::Receiver<Piece>,
        _guard: CancelOnDrop,
        meta: Meta,
        first: bool,
        finished: bool,
        tail: Vec<Event>,
    }
    let state = S {
        rx,
        _guard: guard,
        meta,
        first: true,
        finished: false,
        tail: Vec::new(),
    };
    futures_util::stream::unfold(state, |mut s| async move {
        if let Some(event) = s.tail.pop() {
            return Some((event, s));
        }
        if s.finished {
            return None;
        }
        let data = |v: &Value| Event::default().data(v.to_string());
        let event = match s.rx.recv().await {
            Some(Piece::Text(t)) => {
                let e = data(&s.meta.chunk(Some(&t), None, s.first));
                s.first = false;
                e
            }
            Some(Piece::Done(o)) => {
                s.finished = true;
                s.tail.push(Event::default().data("[DONE]"));
                if s.meta.include_usage {
                    let mut usage = s.meta.envelope(true, json!([]));
                    usage["usage"] = json!(o.usage);
                    s.tail.push(data(&usage));
                }
                let text = (s.first && s.meta.chat).then_some("");
                data(&s.meta.chunk(text, Some(finish_reason(o.stop)), s.first))
            }
            Some(Piece::Failed(e)) => {
                s.finished = true;
                s.tail.push(Event::default().data("[DONE]"));
                data(&e.body())
            }
            None => return None,
        };
        Some((event, s))
    })
}
