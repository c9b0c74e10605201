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
//! Probes must be answered even when every connection slot is held by clients
//! that send nothing useful (idle keep-alive connections, or slowloris heads
//! that trickle in and never end). Connections past [`MAX_CONNECTIONS`] go to a
//! small overflow pool: each gets one request, must send its head within
//! [`OVERFLOW_HEADER_READ_TIMEOUT`], and is closed after its answer; when the
//! pool is full, its oldest connection is closed to make room. A probe, which
//! sends its head at once, is therefore answered whatever holds the slots.
//!
//! The caller binds the listener (port 0 in tests, the configured address in the
//! daemon) and owns the shutdown token; [`serve`] stops accepting when the token
//! is cancelled and gives in-flight requests [`SHUTDOWN_GRACE`] to finish.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::daemon::Health;
use crate::metrics::{CLASSIC_CONTENT_TYPE, Metrics, OPENMETRICS_CONTENT_TYPE};

/// Largest request head (request line and headers) accepted, in bytes. A scrape
/// or a probe sends a few hundred; larger heads get 431.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Most header fields accepted in one request; more get 431.
pub const MAX_HEADERS: usize = 32;

/// Time a client has to send a complete request head, also the longest an idle
/// keep-alive connection is held open waiting for the next request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once. One Prometheus, a kubelet prober and a person
/// with curl need a handful; connections beyond this are closed at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Connections accepted past [`MAX_CONNECTIONS`], each for one request. When
/// the pool is full the oldest overflow connection is closed for the newest.
pub const MAX_OVERFLOW_CONNECTIONS: usize = 16;

/// Time an overflow connection has to send its request head: a probe or a
/// scrape sends it with the connection, so this only cuts off the slow.
pub const OVERFLOW_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How long in-flight requests may run after shutdown is requested.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Pause after an accept error that is not about one connection (such as
/// running out of file descriptors), so the loop does not spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(500);

const ALLOWED_METHODS: &str = "GET, HEAD";
const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `shutdown` is
/// cancelled, then waits up to [`SHUTDOWN_GRACE`] for open requests and returns.
///
/// Each connection runs in its own task on the current runtime. Accept errors
/// are logged and retried rather than returned: a full file descriptor table
/// is a reason to answer later, not to stop exporting metrics.
// Long on purpose: the accept loop and its connection limits (slots, the
// overflow pool, shutdown) are one piece of state machine.
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
    let mut overflow_http = http.clone();
    overflow_http
        .header_read_timeout(OVERFLOW_HEADER_READ_TIMEOUT)
        .keep_alive(false);
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let overflow = Arc::new(Overflow::default());

    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
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
        let service = {
            let metrics = Arc::clone(&metrics);
            let health = Arc::clone(&health);
            service_fn(move |request| {
                let response = respond(&request, &metrics, &health);
                std::future::ready(Ok::<_, Infallible>(response))
            })
        };
        let io = TokioIo::new(stream);
        let shutdown = shutdown.clone();
        match Arc::clone(&connections).try_acquire_owned() {
            Ok(permit) => {
                let connection = http.serve_connection(io, service);
                tokio::spawn(async move {
                    drive(connection, peer, &shutdown, &CancellationToken::new()).await;
                    drop(permit);
                });
            }
            Err(_) => {
                let (id, evicted) = overflow.admit();
                debug!(%peer, limit = MAX_CONNECTIONS, "every HTTP connection slot is taken; serving one request");
                let connection = overflow_http.serve_connection(io, service);
                let overflow = Arc::clone(&overflow);
                tokio::spawn(async move {
                    drive(connection, peer, &shutdown, &evicted).await;
                    overflow.release(id);
                });
            }
        }
    }

    drop(listener);
    // Every connection task holds a permit until it ends, so holding all of
    // them means every connection is closed.
    let all = u32::try_from(MAX_CONNECTIONS).unwrap_or(u32::MAX);
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.acquire_many(all))
        .await
        .is_err()
    {
        debug!("HTTP connections still open after the shutdown grace period");
    }
    overflow.close_all();
    Ok(())
}

/// Serves one connection until it ends, `shutdown` has let it finish its
/// request, or `evicted` closes it at once.
async fn drive<S>(
    connection: http1::Connection<TokioIo<tokio::net::TcpStream>, S>,
    peer: SocketAddr,
    shutdown: &CancellationToken,
    evicted: &CancellationToken,
) where
    S: hyper::service::HttpService<Incoming, ResBody = Full<Bytes>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = evicted.cancelled() => {
            debug!(%peer, "closing the oldest overflow HTTP connection for a newer one");
            return;
        }
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::time::timeout(SHUTDOWN_GRACE, connection.as_mut())
                .await
                .unwrap_or(Ok(()))
        }
    };
    if let Err(error) = result {
        debug!(%peer, %error, "HTTP connection ended with an error");
    }
}

/// The overflow pool: the connections past [`MAX_CONNECTIONS`], oldest first,
/// each with the token that closes it.
#[derive(Default)]
struct Overflow {
    open: Mutex<VecDeque<(u64, CancellationToken)>>,
    next_id: AtomicU64,
}

impl Overflow {
    /// Takes a place for a new connection, closing the oldest one when the
    /// pool is full. Returns the place's id and the token that closes it.
    fn admit(&self) -> (u64, CancellationToken) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        let mut open = self.lock();
        while open.len() >= MAX_OVERFLOW_CONNECTIONS {
            if let Some((_, oldest)) = open.pop_front() {
                oldest.cancel();
            }
        }
        open.push_back((id, token.clone()));
        (id, token)
    }

    fn release(&self, id: u64) {
        self.lock().retain(|(open, _)| *open != id);
    }

    fn close_all(&self) {
        for (_, token) in self.lock().drain(..) {
            token.cancel();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, CancellationToken)>> {
        // The deque stays consistent even if a holder panicked.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
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
