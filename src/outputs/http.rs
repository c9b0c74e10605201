//! The read-only HTTP endpoint: `/metrics`, `/healthz` and `/readyz`.
//!
//! It answers the probes from the daemon's [`Health`]: whether the loop is
//! still turning (liveness) and whether the last contact with the runtime
//! succeeded (readiness). It changes nothing on the node and accepts no input
//! beyond a method and a path, so requests with a body are refused unread and
//! every limit (header size, header count, header read time, connections) is
//! small and fixed: the endpoint must never be the thing that makes a node agent
//! use memory or sockets it should not.
//!
//! Probes must be answered even when a local user opens hundreds of
//! connections that send nothing useful: idle keep-alive connections,
//! slowloris heads that trickle in and never end, requests whose responses
//! are never read. At most [`MAX_CONNECTIONS`] are open at once, and every
//! accepted connection gets a slot: when all are taken, the connection that
//! has gone longest without sending a request is closed for it, a
//! connection whose response has waited on its reader for [`SLOW_WRITE`]
//! first. A probe sends its request head with the connection, so it is the
//! youngest and is answered before its slot could be taken; the accept loop
//! lets every new connection read its head before it accepts the next one.
//! A response nobody reads for [`WRITE_TIMEOUT`] closes its connection even
//! when no one else needs the slot.
//!
//! The caller binds the listener (port 0 in tests, the configured address in the
//! daemon) and owns the shutdown token; [`serve`] stops accepting when the token
//! is cancelled and gives in-flight requests [`SHUTDOWN_GRACE`] to finish.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::outputs::health::Health;
use crate::outputs::metrics::{CLASSIC_CONTENT_TYPE, Metrics, OPENMETRICS_CONTENT_TYPE};

/// Largest request head (request line and headers) accepted, in bytes. A scrape
/// or a probe sends a few hundred; larger heads get 431.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Most header fields accepted in one request; more get 431.
pub const MAX_HEADERS: usize = 32;

/// Time a client has to send a complete request head, also the longest an idle
/// keep-alive connection is held open waiting for the next request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections open at once. One Prometheus, a kubelet prober and a person
/// with curl need a handful; past this, each new connection closes the one
/// that has gone longest without sending a request.
pub const MAX_CONNECTIONS: usize = 64;

/// A response write that has waited this long on a client that does not
/// read marks its connection slow: the first to close for a new one.
pub const SLOW_WRITE: Duration = Duration::from_secs(1);

/// A response write that has waited this long on its reader closes the
/// connection: the largest answer, `/metrics`, takes milliseconds to read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long in-flight requests may run after shutdown is requested.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Pause after an accept error that is not about one connection (such as
/// running out of file descriptors), so the loop does not spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(500);

/// How often responses nobody reads are looked for ([`WRITE_TIMEOUT`]).
const STALL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

const ALLOWED_METHODS: &str = "GET, HEAD";
const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `shutdown` is
/// cancelled, then waits up to [`SHUTDOWN_GRACE`] for open requests and returns.
///
/// Each connection runs in its own task on the current runtime. Accept errors
/// are logged and retried rather than returned: a full file descriptor table
/// is a reason to answer later, not to stop exporting metrics.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS)
        .keep_alive(true);
    let connections = Arc::new(Connections::default());
    let mut stall_check = tokio::time::interval(STALL_CHECK_INTERVAL);
    stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            _ = stall_check.tick() => {
                connections.close_stalled(Instant::now());
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) if is_connection_error(&error) => {
                    debug!(%error, "accepting an HTTP connection failed");
                    continue;
                }
                Err(error) => {
                    warn!(%error, "accepting HTTP connections failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(ACCEPT_RETRY_DELAY) => continue,
                    }
                }
            },
        };
        let (id, slot) = connections.admit(peer, Instant::now());
        let service = {
            let metrics = Arc::clone(&metrics);
            let health = Arc::clone(&health);
            let slot = Arc::clone(&slot);
            service_fn(move |request| {
                slot.requested(Instant::now());
                let response = respond(&request, &metrics, &health);
                std::future::ready(Ok::<_, Infallible>(response))
            })
        };
        let io = TokioIo::new(Tracked {
            stream,
            slot: Arc::clone(&slot),
        });
        let connection = http.serve_connection(io, service);
        let shutdown = shutdown.clone();
        let connections_ = Arc::clone(&connections);
        tokio::spawn(async move {
            drive(connection, peer, &shutdown, &slot.close).await;
            connections_.ended(id);
        });
        // Let the new connection read its request head before the next
        // accept: a probe is then answered however many connections wait
        // behind it.
        tokio::task::yield_now().await;
    }

    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.all_ended())
        .await
        .is_err()
    {
        debug!("HTTP connections still open after the shutdown grace period");
    }
    connections.close_all();
    Ok(())
}

/// Serves one connection until it ends, `shutdown` has let it finish its
/// request, or `close` closes it at once.
async fn drive<S>(
    connection: http1::Connection<TokioIo<Tracked>, S>,
    peer: SocketAddr,
    shutdown: &CancellationToken,
    close: &CancellationToken,
) where
    S: hyper::service::HttpService<Incoming, ResBody = Full<Bytes>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = close.cancelled() => {
            debug!(%peer, "HTTP connection closed");
            return;
        }
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                result = tokio::time::timeout(SHUTDOWN_GRACE, connection.as_mut()) => result.unwrap_or(Ok(())),
                () = close.cancelled() => Ok(()),
            }
        }
    };
    if let Err(error) = result {
        debug!(%peer, %error, "HTTP connection ended with an error");
    }
}

/// One open connection as the slot table sees it: what it last did, and the
/// token that closes it.
struct Slot {
    peer: SocketAddr,
    close: CancellationToken,
    times: Mutex<SlotTimes>,
}

#[derive(Clone, Copy)]
struct SlotTimes {
    /// When the connection was accepted or last completed a request head.
    active: Instant,
    /// Since when a response write has waited on the client to read.
    write_blocked: Option<Instant>,
}

impl Slot {
    fn requested(&self, now: Instant) {
        self.lock().active = now;
    }

    fn wrote(&self, blocked: bool) {
        let mut times = self.lock();
        if !blocked {
            times.write_blocked = None;
        } else if times.write_blocked.is_none() {
            times.write_blocked = Some(Instant::now());
        }
    }

    /// How much less this connection deserves its slot than others, at
    /// `now`: a response unread for [`SLOW_WRITE`] first, then the longest
    /// time without a request.
    fn uselessness(&self, now: Instant) -> (bool, Duration) {
        let times = *self.lock();
        let slow = times
            .write_blocked
            .is_some_and(|since| now.saturating_duration_since(since) >= SLOW_WRITE);
        (slow, now.saturating_duration_since(times.active))
    }

    fn write_stalled_for(&self, now: Instant) -> Duration {
        self.lock()
            .write_blocked
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotTimes> {
        // Two instants, valid even if a holder panicked.
        self.times.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The open connections, at most [`MAX_CONNECTIONS`], and the count of
/// connection tasks still running (a closed connection's task ends a moment
/// after its slot is given away).
#[derive(Default)]
struct Connections {
    table: Mutex<Table>,
    ended: Notify,
}

#[derive(Default)]
struct Table {
    open: HashMap<u64, Arc<Slot>>,
    tasks: usize,
    next_id: u64,
}

impl Connections {
    /// Gives a new connection a slot, closing the connection that deserves
    /// its own least when every slot is taken.
    fn admit(&self, peer: SocketAddr, now: Instant) -> (u64, Arc<Slot>) {
        let mut table = self.lock();
        while table.open.len() >= MAX_CONNECTIONS {
            let Some(victim) = table
                .open
                .iter()
                .max_by_key(|(_, slot)| slot.uselessness(now))
                .map(|(id, _)| *id)
            else {
                break;
            };
            if let Some(slot) = table.open.remove(&victim) {
                let (slow, idle) = slot.uselessness(now);
                debug!(
                    peer = %slot.peer,
                    slow,
                    idle_ms = idle.as_millis() as u64,
                    limit = MAX_CONNECTIONS,
                    "every HTTP connection slot is taken: closing the connection that has waited longest"
                );
                slot.close.cancel();
            }
        }
        let slot = Arc::new(Slot {
            peer,
            close: CancellationToken::new(),
            times: Mutex::new(SlotTimes {
                active: now,
                write_blocked: None,
            }),
        });
        let id = table.next_id;
        table.next_id += 1;
        table.open.insert(id, Arc::clone(&slot));
        table.tasks += 1;
        (id, slot)
    }

    /// Closes the connections whose response has waited on the client for
    /// [`WRITE_TIMEOUT`].
    fn close_stalled(&self, now: Instant) {
        let mut table = self.lock();
        table.open.retain(|_, slot| {
            let stalled = slot.write_stalled_for(now) >= WRITE_TIMEOUT;
            if stalled {
                debug!(peer = %slot.peer, "closing an HTTP connection that does not read its response");
                slot.close.cancel();
            }
            !stalled
        });
    }

    /// A connection task ended.
    fn ended(&self, id: u64) {
        let mut table = self.lock();
        table.open.remove(&id);
        table.tasks = table.tasks.saturating_sub(1);
        drop(table);
        self.ended.notify_waiters();
    }

    /// Returns once every connection task has ended.
    async fn all_ended(&self) {
        loop {
            let notified = self.ended.notified();
            if self.lock().tasks == 0 {
                return;
            }
            notified.await;
        }
    }

    fn close_all(&self) {
        for (_, slot) in self.lock().open.drain() {
            slot.close.cancel();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // The table stays consistent even if a holder panicked.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection's socket, telling its [`Slot`] when a write has to wait on
/// the client.
struct Tracked {
    stream: TcpStream,
    slot: Arc<Slot>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.slot.wrote(written.is_pending());
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.slot.wrote(written.is_pending());
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Errors that concern one connection that never got going, not the listener.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

fn respond(request: &Request<Incoming>, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    let has_body = !request.body().is_end_stream();
    let mut response = route(request, has_body, metrics, health);
    if has_body {
        // The body is never read, and it sits where the next request on this
        // connection would start: close instead of reading it.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    debug!(
        method = %request.method(),
        path = request.uri().path(),
        status = response.status().as_u16(),
        "HTTP request"
    );
    response
}

fn route(request: &Request<Incoming>, has_body: bool, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
        return response;
    }
    if has_body {
        // Nothing here takes input, so any body is too large.
        return text(StatusCode::PAYLOAD_TOO_LARGE, "request body not accepted\n");
    }
    match path {
        "/metrics" => {
            let accept = request.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok());
            let (body, content_type) = if wants_openmetrics(accept.unwrap_or("")) {
                (metrics.encode(), OPENMETRICS_CONTENT_TYPE)
            } else {
                (metrics.encode_classic(), CLASSIC_CONTENT_TYPE)
            };
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
                .headers_mut()
                .insert(header::VARY, HeaderValue::from_static("Accept"));
            response
        }
        "/healthz" if health.is_alive() => text(StatusCode::OK, "ok\n"),
        "/healthz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "daemon loop has not run within the liveness window\n",
        ),
        _ if health.is_ready() => text(StatusCode::OK, "ready\n"),
        _ => text(StatusCode::SERVICE_UNAVAILABLE, "runtime not reachable\n"),
    }
}

/// True when an `Accept` header asks for OpenMetrics at least as much as
/// for the classic text format (`text/plain`, `text/*` or `*/*`). No header,
/// or one that does not name OpenMetrics, gets the classic format, which
/// every Prometheus and `promtool check metrics` read.
fn wants_openmetrics(accept: &str) -> bool {
    let mut openmetrics = 0.0_f32;
    let mut classic = 0.0_f32;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(Some(1.0), |(_, v)| v.trim().parse::<f32>().ok())
            .unwrap_or(0.0);
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => classic = classic.max(q),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= classic
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for_at_least_as_much_as_text() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                          text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(prometheus));
        assert!(wants_openmetrics("application/openmetrics-text; version=1.0.0"));
        assert!(!wants_openmetrics(""));
        assert!(!wants_openmetrics("*/*"));
        assert!(!wants_openmetrics("text/plain;version=0.0.4"));
        assert!(!wants_openmetrics("text/plain;q=1,application/openmetrics-text;q=0.5"));
        assert!(!wants_openmetrics("application/openmetrics-text;q=0"));
        assert!(!wants_openmetrics("application/openmetrics-text;q=oops"));
    }
}
