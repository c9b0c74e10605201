//! The HTTP endpoint over real TCP on 127.0.0.1, spoken to with raw requests
//! the way Prometheus, a kubelet probe or curl would.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use imagegc::cri::CallObserver as _;
use imagegc::daemon::Health;
use imagegc::engine::MetricsSink;
use imagegc::engine::sinks::CriCallMetrics;
use imagegc::outputs::http::{HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_HEADER_BYTES, serve};
use imagegc::outputs::metrics::{Metrics, Reason};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a test waits on a socket before calling the server stuck.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

struct Server {
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

async fn start() -> Server {
    start_with(Health::new(Duration::from_secs(600))).await
}

async fn start_with(health: Health) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let metrics = Arc::new(Metrics::new());
    imagegc::engine::sinks::register_every_family(&metrics);
    let health = Arc::new(health);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(
        listener,
        Arc::clone(&metrics),
        Arc::clone(&health),
        shutdown.clone(),
    ));
    Server {
        addr,
        metrics,
        health,
        shutdown,
        task,
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    stream.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
    stream
}

/// Reads one response; `head_only` for answers to HEAD, which carry a
/// Content-Length but no body.
fn read_response(reader: &mut impl BufRead, head_only: bool) -> Response {
    let mut status_line = String::new();
    reader.read_line(&mut status_line).expect("status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP status line: {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').expect("header");
        headers.push((name.to_owned(), value.trim().to_owned()));
    }
    let mut response = Response {
        status,
        headers,
        body: String::new(),
    };
    if !head_only {
        let length: usize = response
            .header("content-length")
            .expect("content-length")
            .parse()
            .expect("a length");
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        response.body = String::from_utf8(body).expect("utf-8 body");
    }
    response
}

/// Sends raw bytes on a fresh connection and reads one response, off the
/// runtime thread so the server keeps running.
async fn exchange(addr: SocketAddr, raw: impl Into<Vec<u8>>) -> Response {
    let raw = raw.into();
    let head_only = raw.starts_with(b"HEAD ");
    tokio::task::spawn_blocking(move || {
        let mut stream = connect(addr);
        stream.write_all(&raw).expect("write request");
        read_response(&mut BufReader::new(stream), head_only)
    })
    .await
    .expect("client thread")
}

async fn get(addr: SocketAddr, path: &str) -> Response {
    exchange(addr, format!("GET {path} HTTP/1.1\r\nHost: node\r\n\r\n")).await
}

/// True once the server has closed the connection: EOF, or a reset because it
/// closed with bytes of ours unread.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0; 1];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// The `Accept` header Prometheus 2.x sends on every scrape.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

async fn get_accepting(addr: SocketAddr, path: &str, accept: &str) -> Response {
    exchange(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: node\r\nAccept: {accept}\r\n\r\n"),
    )
    .await
}

#[tokio::test]
async fn metrics_are_served_in_the_openmetrics_format() {
    let server = start().await;
    let sink = MetricsSink::new(&server.metrics);
    sink.removed(Reason::Space, 4096);
    sink.removed(Reason::Space, 4096);

    let response = get_accepting(server.addr, "/metrics", PROMETHEUS_ACCEPT).await;

    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    for line in [
        r#"image_garbage_collected_total{reason="space"} 2"#,
        r#"imagegc_freed_bytes_total{reason="space"} 8192"#,
        "imagegc_runtime_up 0",
    ] {
        assert!(
            response.body.lines().any(|l| l == line),
            "missing {line:?} in:\n{}",
            response.body
        );
    }
    assert!(response.body.ends_with("# EOF\n"));
}

#[tokio::test]
async fn a_client_that_does_not_ask_for_openmetrics_gets_the_classic_text_format() {
    let server = start().await;
    MetricsSink::new(&server.metrics).removed(Reason::Age, 100);

    for accept in [None, Some("text/plain;version=0.0.4"), Some("*/*")] {
        let response = match accept {
            Some(accept) => get_accepting(server.addr, "/metrics", accept).await,
            None => get(server.addr, "/metrics").await,
        };

        assert_eq!(response.status, 200);
        assert_eq!(
            response.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8"),
            "Accept: {accept:?}"
        );
        let lines: Vec<&str> = response.body.lines().collect();
        for line in [
            "# TYPE image_garbage_collected_total counter",
            "# TYPE imagegc_freed_bytes_total counter",
            "# TYPE imagegc_runtime_up gauge",
            r#"image_garbage_collected_total{reason="age"} 1"#,
            r#"imagegc_freed_bytes_total{reason="age"} 100"#,
        ] {
            assert!(lines.contains(&line), "missing {line:?} in:\n{}", response.body);
        }
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("# HELP image_garbage_collected_total ")),
            "a counter's help is not under its _total name:\n{}",
            response.body
        );
        assert!(
            !lines.iter().any(|l| *l == "# EOF" || l.starts_with("# UNIT ")),
            "OpenMetrics-only lines in the classic format:\n{}",
            response.body
        );
    }
}

#[tokio::test]
async fn head_answers_like_get_without_a_body() {
    let server = start().await;
    let get = get(server.addr, "/metrics").await;

    let head = exchange(server.addr, "HEAD /metrics HTTP/1.1\r\nHost: node\r\n\r\n").await;

    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), get.header("content-type"));
    assert_eq!(head.header("content-length"), get.header("content-length"));
}

#[tokio::test]
async fn healthz_is_ok_while_the_loop_beats() {
    let server = start().await;
    server.health.heartbeat();

    let response = get(server.addr, "/healthz").await;

    assert_eq!(response.status, 200);
    assert_eq!(response.body, "ok\n");
}

#[tokio::test]
async fn healthz_fails_once_the_liveness_window_has_passed() {
    let server = start_with(Health::new(Duration::ZERO)).await;

    let response = get(server.addr, "/healthz").await;

    assert_eq!(response.status, 503);
}

#[tokio::test]
async fn readyz_follows_the_last_contact_with_the_runtime() {
    let server = start().await;

    let before = get(server.addr, "/readyz").await;
    server.health.set_ready(true);
    let after = get(server.addr, "/readyz").await;
    server.health.set_ready(false);
    let lost = get(server.addr, "/readyz").await;

    assert_eq!(before.status, 503);
    assert_eq!(before.body, "runtime not reachable\n");
    assert_eq!(after.status, 200);
    assert_eq!(after.body, "ready\n");
    assert_eq!(lost.status, 503);
}

#[tokio::test]
async fn a_query_string_does_not_change_the_route() {
    let server = start().await;
    assert_eq!(get(server.addr, "/healthz?verbose=1").await.status, 200);
}

#[tokio::test]
async fn other_methods_on_known_paths_are_not_allowed() {
    let server = start().await;

    let post = exchange(
        server.addr,
        "POST /metrics HTTP/1.1\r\nHost: node\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    let put = exchange(
        server.addr,
        "PUT /healthz HTTP/1.1\r\nHost: node\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    let delete = exchange(server.addr, "DELETE /readyz HTTP/1.1\r\nHost: node\r\n\r\n").await;

    for response in [post, put, delete] {
        assert_eq!(response.status, 405, "{response:?}");
        assert_eq!(response.header("allow"), Some("GET, HEAD"));
    }
}

#[tokio::test]
async fn unknown_paths_are_not_found() {
    let server = start().await;
    assert_eq!(get(server.addr, "/nope").await.status, 404);
    assert_eq!(get(server.addr, "/").await.status, 404);
    assert_eq!(get(server.addr, "/metrics/").await.status, 404);
}

#[tokio::test]
async fn a_request_with_a_body_is_refused_and_the_connection_closed() {
    let server = start().await;
    let addr = server.addr;

    let (sized, sized_closed, chunked) = tokio::task::spawn_blocking(move || {
        let mut stream = connect(addr);
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\nContent-Length: 5\r\n\r\nhello")
            .expect("write");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let sized = read_response(&mut reader, false);
        let sized_closed = closed_by_server(&mut stream);

        let mut stream = connect(addr);
        stream
            .write_all(
                b"GET /healthz HTTP/1.1\r\nHost: node\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            )
            .expect("write");
        let chunked = read_response(&mut BufReader::new(stream), false);
        (sized, sized_closed, chunked)
    })
    .await
    .expect("client thread");

    assert_eq!(sized.status, 413);
    assert_eq!(sized.header("connection"), Some("close"));
    assert!(sized_closed, "connection left open after an unread body");
    assert_eq!(chunked.status, 413);
}

#[tokio::test]
async fn a_request_head_at_the_size_limit_gets_431() {
    let server = start().await;
    let mut raw = b"GET /metrics HTTP/1.1\r\nHost: node\r\nX-Filler: ".to_vec();
    raw.resize(MAX_HEADER_BYTES, b'a');

    let response = exchange(server.addr, raw).await;

    assert_eq!(response.status, 431);
}

#[tokio::test]
async fn a_request_head_far_over_the_limit_is_cut_off() {
    let server = start().await;
    let addr = server.addr;

    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = connect(addr);
        let mut raw = b"GET /metrics HTTP/1.1\r\nHost: node\r\nX-Filler: ".to_vec();
        raw.resize(4 * MAX_HEADER_BYTES, b'a');
        raw.extend_from_slice(b"\r\n\r\n");
        // The server may close while we are still writing.
        let _ = stream.write_all(&raw);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        answer
    })
    .await
    .expect("client thread");

    // Either the 431 arrives before the close, or the close resets the
    // connection first because the rest of the head was never read. Never 200.
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431 "),
        "unexpected answer: {answer:?}"
    );
}

#[tokio::test]
async fn too_many_header_fields_get_431() {
    let server = start().await;
    let mut raw = String::from("GET /metrics HTTP/1.1\r\nHost: node\r\n");
    for i in 0..100 {
        raw.push_str(&format!("X-Field-{i}: x\r\n"));
    }
    raw.push_str("\r\n");

    assert_eq!(exchange(server.addr, raw).await.status, 431);
}

#[tokio::test]
async fn keep_alive_serves_several_requests_on_one_connection() {
    let server = start().await;
    let addr = server.addr;

    let statuses = tokio::task::spawn_blocking(move || {
        let mut stream = connect(addr);
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
            .expect("write");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let first = read_response(&mut reader, false).status;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
            .expect("write");
        let second = read_response(&mut reader, false).status;
        [first, second]
    })
    .await
    .expect("client thread");

    assert_eq!(statuses, [200, 200]);
}

#[tokio::test]
async fn a_connection_over_the_limit_closes_the_one_idle_longest() {
    let server = start().await;
    let addr = server.addr;

    let (oldest_closed, newest_answered, extra_answered) = tokio::task::spawn_blocking(move || {
        // Fill every slot with a keep-alive connection the server has accepted
        // (it answered on it), the first one idle longest.
        let mut open = open_idle_keep_alive(addr, MAX_CONNECTIONS);
        std::thread::sleep(Duration::from_millis(50));

        let extra = connect(addr);
        let oldest_closed = closed_by_server(&mut open[0]);
        let ask = |stream: &TcpStream| {
            let mut stream = stream.try_clone().expect("clone");
            stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n").ok()?;
            Some(read_response(&mut BufReader::new(stream), false).status)
        };
        let newest_answered = ask(&open[MAX_CONNECTIONS - 1]);
        let extra_answered = ask(&extra);
        (oldest_closed, newest_answered, extra_answered)
    })
    .await
    .expect("client thread");

    assert!(oldest_closed, "the connection idle longest was kept");
    assert_eq!(
        newest_answered,
        Some(200),
        "a connection that just made a request was closed"
    );
    assert_eq!(extra_answered, Some(200));
}

#[tokio::test]
async fn cancelling_stops_the_server_and_closes_idle_connections() {
    let server = start().await;
    let addr = server.addr;
    let idle = tokio::task::spawn_blocking(move || {
        let mut stream = connect(addr);
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
            .expect("write");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        assert_eq!(read_response(&mut reader, false).status, 200);
        stream
    })
    .await
    .expect("client thread");

    server.shutdown.cancel();
    let result = tokio::time::timeout(IO_TIMEOUT, server.task)
        .await
        .expect("serve returned within the timeout")
        .expect("serve task did not panic");

    assert!(result.is_ok(), "{result:?}");
    let idle_closed = tokio::task::spawn_blocking(move || {
        let mut idle = idle;
        closed_by_server(&mut idle)
    })
    .await
    .expect("client thread");
    assert!(idle_closed, "idle keep-alive connection left open");
    assert!(TcpStream::connect(addr).is_err(), "still accepting after shutdown");
}

/// Opens `count` connections that each send the start of a request head and
/// never finish it (slowloris), and waits until the server has read from each.
fn open_slowloris(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    (0..count)
        .map(|i| {
            let mut stream = connect(addr);
            stream
                .write_all(format!("GET /metrics HTTP/1.1\r\nHost: node\r\nX-Slow-{i}: ").as_bytes())
                .expect("write");
            stream
        })
        .collect()
}

/// Opens `count` keep-alive connections that each completed one request and
/// now sit idle.
fn open_idle_keep_alive(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    (0..count)
        .map(|_| {
            let mut stream = connect(addr);
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
                .expect("write");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            assert_eq!(read_response(&mut reader, false).status, 200);
            stream
        })
        .collect()
}

/// Opens `count` connections that each ask for `/metrics` many times over
/// with a small receive buffer and never read: the answers fill the buffers
/// and the server's writes wait on the client.
fn open_unread(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    use std::os::fd::AsRawFd;
    let requests = "GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n".repeat(40);
    (0..count)
        .map(|_| {
            let mut stream = connect(addr);
            let size: libc::c_int = 4096;
            // SAFETY: setsockopt on a socket this function owns, with a c_int
            // value of the size given.
            let rc = unsafe {
                libc::setsockopt(
                    stream.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&raw const size).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "setsockopt: {}", std::io::Error::last_os_error());
            stream.write_all(requests.as_bytes()).expect("write");
            stream
        })
        .collect()
}

/// One probe on a fresh connection, the way the kubelet sends it; the status,
/// or None when the server closed the connection without answering.
fn probe(addr: SocketAddr) -> Option<u16> {
    send_probe(addr).and_then(probe_status)
}

/// Connects and sends a probe's request, as the kubelet does, at once.
fn send_probe(addr: SocketAddr) -> Option<TcpStream> {
    let mut stream = connect(addr);
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        .ok()?;
    Some(stream)
}

/// The status the server answered a probe with, or None when it closed the
/// connection without answering.
fn probe_status(stream: TcpStream) -> Option<u16> {
    let mut status_line = String::new();
    BufReader::new(stream).read_line(&mut status_line).ok()?;
    status_line.split(' ').nth(1)?.parse().ok()
}

#[tokio::test]
async fn health_probes_are_answered_while_slowloris_connections_fill_every_slot() {
    let server = start().await;
    let addr = server.addr;

    let probes = tokio::task::spawn_blocking(move || {
        let slow = open_slowloris(addr, MAX_CONNECTIONS + 40);
        let probes: Vec<_> = (0..38).map(|_| probe(addr)).collect();
        drop(slow);
        probes
    })
    .await
    .expect("client thread");

    let answered = probes.iter().filter(|status| **status == Some(200)).count();
    assert_eq!(answered, probes.len(), "probes answered: {probes:?}");
}

#[tokio::test]
async fn health_probes_are_answered_while_idle_keep_alive_connections_fill_every_slot() {
    let server = start().await;
    let addr = server.addr;

    let probes = tokio::task::spawn_blocking(move || {
        let idle = open_idle_keep_alive(addr, MAX_CONNECTIONS);
        let slow = open_slowloris(addr, 20);
        let probes: Vec<_> = (0..10).map(|_| probe(addr)).collect();
        drop((idle, slow));
        probes
    })
    .await
    .expect("client thread");

    assert!(probes.iter().all(|status| *status == Some(200)), "probes: {probes:?}");
}

#[tokio::test]
async fn a_connection_that_never_finishes_its_request_head_is_closed() {
    let server = start().await;
    let addr = server.addr;

    let closed = tokio::task::spawn_blocking(move || {
        let mut slow = open_slowloris(addr, 1).pop().expect("one connection");
        // The server's header deadline is longer than the test's socket
        // timeout: read until the server gives up or the guard below does.
        slow.set_read_timeout(Some(HEADER_READ_TIMEOUT * 3)).expect("timeout");
        closed_by_server(&mut slow)
    })
    .await
    .expect("client thread");

    assert!(closed, "a half-sent request head held its connection open");
}

#[tokio::test]
async fn health_probes_are_answered_under_a_flood_of_hundreds_of_connections() {
    let server = start().await;
    let addr = server.addr;
    // Make /metrics a few kilobytes, as on a node.
    for method in ["ListImages", "ListContainers", "ImageFsInfo", "Status", "RemoveImage"] {
        CriCallMetrics::new(&server.metrics).call_ended(method, "OK", Duration::from_millis(3));
    }
    MetricsSink::new(&server.metrics).removed(Reason::Space, 1);
    // The daemon serves on its one thread, which a cycle keeps busy now and
    // then (planning a large listing): connections queue up meanwhile, and
    // a probe waits behind the ones that came before it.
    let (busy, mut busy_rx) = tokio::sync::mpsc::unbounded_channel::<Duration>();
    let busy_task = tokio::spawn(async move {
        while let Some(busy) = busy_rx.recv().await {
            std::thread::sleep(busy);
        }
    });

    let (probes, rounds) = tokio::task::spawn_blocking(move || {
        let idle = open_idle_keep_alive(addr, 100);
        let unread = open_unread(addr, 100);
        let mut slow = open_slowloris(addr, 150);
        let rounds = 30;
        let probes: Vec<_> = (0..rounds)
            .map(|_| {
                busy.send(Duration::from_millis(150)).expect("server runtime");
                std::thread::sleep(Duration::from_millis(20));
                // The kubelet sends its probe as it connects; a hundred
                // connections come right after it.
                let probe = send_probe(addr);
                slow.extend(open_slowloris(addr, 100));
                slow.drain(..slow.len().saturating_sub(400));
                probe.and_then(probe_status)
            })
            .collect();
        drop((idle, unread, slow));
        (probes, rounds)
    })
    .await
    .expect("client thread");
    busy_task.abort();

    let answered = probes.iter().filter(|status| **status == Some(200)).count();
    assert_eq!(
        answered, rounds,
        "probes answered behind 350 open connections and 100 more each time: {probes:?}"
    );
}
