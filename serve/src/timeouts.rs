//! Connection timeouts: a client must send a request's headers within [`HEADER_READ_TIMEOUT`] of
//! its first byte, and an idle connection (nothing read, nothing written) is closed after
//! [`IDLE_TIMEOUT`]. axum's server takes no such options, so they are kept by the connection
//! itself ([`TimedListener`] wraps each accepted stream in a [`TimedStream`]); the body has its
//! own timeout in the handler (`routes::BODY_READ_TIMEOUT`).
//!
//! A stream is *waiting* (after it is accepted, or after the server wrote to it), then *in
//! headers* from the first byte it receives until the blank line that ends them, then *in a
//! request* until the server writes. Waiting, a read that stays pending for [`IDLE_TIMEOUT`]
//! fails; in headers, a read pending past the headers' deadline fails; in a request (the body,
//! the generation) nothing is timed here. A write starts the idle time afresh, so a streamed
//! answer is never cut.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// The most a client may take from the first byte of a request to the end of its headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The most a connection may stay idle (between requests, or before its first).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A TCP listener whose connections keep the timeouts of the module docs.
#[derive(Debug)]
pub struct TimedListener {
    inner: TcpListener,
    header: Duration,
    idle: Duration,
}

impl TimedListener {
    /// `inner` with [`HEADER_READ_TIMEOUT`] and [`IDLE_TIMEOUT`].
    pub fn new(inner: TcpListener) -> TimedListener {
        TimedListener::with(inner, HEADER_READ_TIMEOUT, IDLE_TIMEOUT)
    }

    /// `inner` with other timeouts (the tests' short ones).
    pub fn with(inner: TcpListener, header: Duration, idle: Duration) -> TimedListener {
        TimedListener {
            inner,
            header,
            idle,
        }
    }
}

impl axum::serve::Listener for TimedListener {
    type Io = TimedStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (TimedStream, std::net::SocketAddr) {
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        (TimedStream::new(stream, self.header, self.idle), addr)
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    /// Reading headers; how many line ends in a row end the bytes read so far.
    Headers(usize),
    Request,
}

/// An accepted connection under the timeouts of the module docs.
#[derive(Debug)]
pub struct TimedStream {
    inner: TcpStream,
    phase: Phase,
    deadline: Pin<Box<Sleep>>,
    header: Duration,
    idle: Duration,
}

impl TimedStream {
    fn new(inner: TcpStream, header: Duration, idle: Duration) -> TimedStream {
        TimedStream {
            inner,
            phase: Phase::Waiting,
            deadline: Box::pin(tokio::time::sleep(idle)),
            header,
            idle,
        }
    }

    fn set_deadline(&mut self, after: Duration) {
        self.deadline.as_mut().reset(Instant::now() + after);
    }

    /// A write ends the request: the connection waits again, for at most the idle time.
    fn wrote(&mut self) {
        self.phase = Phase::Waiting;
        self.set_deadline(self.idle);
    }

    /// Follows the bytes read: the first starts the headers' deadline, an empty line ends it.
    fn saw(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.phase = match self.phase {
                Phase::Waiting => {
                    self.set_deadline(self.header);
                    next_header_state(0, b)
                }
                Phase::Headers(n) => next_header_state(n, b),
                Phase::Request => Phase::Request,
            };
        }
    }
}

/// The phase after byte `b` with `newlines` line ends in a row seen: headers end at an empty
/// line, `\r\n\r\n` or (as HTTP parsers accept) `\n\n`.
fn next_header_state(newlines: usize, b: u8) -> Phase {
    let newlines = match b {
        b'\n' => newlines + 1,
        b'\r' => newlines,
        _ => 0,
    };
    if newlines == 2 {
        Phase::Request
    } else {
        Phase::Headers(newlines)
    }
}

impl AsyncRead for TimedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                let filled = buf.filled()[before..].to_vec();
                self.saw(&filled);
                Poll::Ready(result)
            }
            Poll::Pending if self.phase == Phase::Request => Poll::Pending,
            Poll::Pending => {
                ready!(self.deadline.as_mut().poll(cx));
                let what = match self.phase {
                    Phase::Waiting => "the connection was idle too long",
                    _ => "the request's headers did not arrive in time",
                };
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
            }
        }
    }
}

impl AsyncWrite for TimedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.inner).poll_write(cx, buf));
        self.wrote();
        Poll::Ready(written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, bufs));
        self.wrote();
        Poll::Ready(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::{Phase, next_header_state};

    fn after(bytes: &[u8]) -> Phase {
        bytes.iter().fold(Phase::Headers(0), |p, &b| match p {
            Phase::Headers(n) => next_header_state(n, b),
            other => other,
        })
    }

    #[test]
    fn headers_end_at_an_empty_line_with_or_without_carriage_returns() {
        assert_eq!(after(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Phase::Request);
        assert_eq!(after(b"GET / HTTP/1.1\nHost: x\n\n"), Phase::Request);
        assert_eq!(after(b"GET / HTTP/1.1\r\nHost: x\r\n"), Phase::Headers(1));
        assert_eq!(after(b"GET / HTTP/1.1\r\nHost: x\r\nA"), Phase::Headers(0));
    }
}
