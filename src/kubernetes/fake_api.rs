//! An API server for tests, on a local port: each test says what it
//! answers. It reproduces what the client sees of a real one (JSON bodies,
//! a `Status` on failure, a watch held open, a request never answered), not
//! its semantics.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};

/// A response: the body, boxed so that a test may also stream one.
pub type Answer = Response<BoxBody<Bytes, Infallible>>;

/// What the server does with a request.
pub enum Reply {
    /// Answers it.
    Now(Answer),
    /// Reads it and never answers (the connection stays open): an API
    /// server that hangs.
    Never,
}

impl From<Answer> for Reply {
    fn from(answer: Answer) -> Reply {
        Reply::Now(answer)
    }
}

/// Serves `respond` on a local port until the test's runtime ends;
/// returns its URL.
pub async fn serve<R: Into<Reply>>(respond: impl Fn(&Request<Incoming>) -> R + Send + Sync + 'static) -> String {
    let respond = Arc::new(respond);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let respond = Arc::clone(&respond);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let reply = respond(&request).into();
                    async move {
                        match reply {
                            Reply::Now(answer) => Ok::<_, Infallible>(answer),
                            Reply::Never => std::future::pending().await,
                        }
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    url
}

/// A JSON body with this status.
pub fn json(status: u16, body: String) -> Answer {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap()
}

/// What an API server that cannot serve yet answers.
pub fn unavailable() -> Answer {
    json(
        503,
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}"#.to_owned(),
    )
}

/// Keeps a paused clock moving in small steps, so that a test can wait
/// through the client's real timeouts (tens of seconds) in no time while
/// every answer that is on its way still arrives first: a paused clock
/// jumps to the next timer whenever the runtime is idle, even while a
/// socket has bytes in flight, and the next timer is then never further
/// than this.
pub fn keep_time_moving() {
    tokio::spawn(async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    });
}

/// Waits until `done`, checking every 100 ms, for at most 60 s.
pub async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("timed out after 60 s waiting for {what}");
}

/// An API server that lists the pods it is told to, holds each watch
/// open without events, answers 503 to everything while it is down, and
/// never answers a listing while it hangs. It knows the Nodes it is told
/// to, and only node `node-1`'s pods.
pub mod cluster {
    use std::convert::Infallible;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use http_body_util::{BodyExt as _, StreamBody};
    use hyper::body::{Bytes, Frame, Incoming};
    use hyper::{Request, Response};
    use tokio::sync::mpsc;

    use super::{Reply, json, unavailable};

    /// A JSON answer whose body is `frames`, as they come.
    fn streamed(
        frames: impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync + 'static,
    ) -> Reply {
        Response::builder()
            .header("content-type", "application/json")
            .body(StreamBody::new(frames).boxed())
            .unwrap()
            .into()
    }

    #[derive(Default)]
    pub struct FakeApi {
        pub down: AtomicBool,
        /// Listings are read and never answered.
        pub hang_lists: AtomicBool,
        /// Listings are answered with their status and headers, and a body
        /// that never comes (a server that stops halfway).
        pub stall_lists: AtomicBool,
        /// Listings never answered.
        pub hung: AtomicUsize,
        /// Listings answered.
        pub lists: AtomicUsize,
        /// The query of each watch request.
        pub watch_queries: Mutex<Vec<String>>,
        /// The images of the pods a listing returns: pod `default/p<i>`
        /// names the i-th.
        pub images: Mutex<Vec<&'static str>>,
        /// The Nodes that exist.
        pub nodes: Mutex<Vec<&'static str>>,
        watches: Mutex<Vec<mpsc::Sender<Bytes>>>,
    }

    impl FakeApi {
        /// Serves this API server on a port of its own; its URL.
        pub async fn serve(self: &std::sync::Arc<Self>) -> String {
            let api = std::sync::Arc::clone(self);
            super::serve(move |request| api.respond(request)).await
        }

        /// Goes down: every watch held open ends, as when the process
        /// stops, and every request fails until `up`.
        pub fn go_down(&self) {
            self.down.store(true, Ordering::SeqCst);
            self.watches.lock().unwrap().clear();
        }

        pub fn come_up(&self) {
            self.down.store(false, Ordering::SeqCst);
        }

        pub fn respond(&self, request: &Request<Incoming>) -> Reply {
            if self.down.load(Ordering::SeqCst) {
                return unavailable().into();
            }
            if let Some(node) = request.uri().path().strip_prefix("/api/v1/nodes/") {
                return if self.nodes.lock().unwrap().contains(&node) {
                    json(
                        200,
                        format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{node}"}}}}"#),
                    )
                    .into()
                } else {
                    json(
                        404,
                        format!(
                            r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nodes \"{node}\" not found","reason":"NotFound","code":404}}"#
                        ),
                    )
                    .into()
                };
            }
            let query = request.uri().query().unwrap_or_default();
            let node = query
                .split('&')
                .find_map(|pair| pair.strip_prefix("fieldSelector=spec.nodeName%3D"))
                .unwrap_or_else(|| panic!("pods not selected by node: {query}"));
            if query.contains("watch=true") {
                self.watch_queries.lock().unwrap().push(query.to_owned());
                let (tx, rx) = mpsc::channel::<Bytes>(1);
                self.watches.lock().unwrap().push(tx);
                let events = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
                });
                return streamed(events);
            }
            if self.stall_lists.load(Ordering::SeqCst) {
                self.hung.fetch_add(1, Ordering::SeqCst);
                let never = futures_util::stream::pending::<Result<Frame<Bytes>, Infallible>>();
                return streamed(never);
            }
            if self.hang_lists.load(Ordering::SeqCst) {
                self.hung.fetch_add(1, Ordering::SeqCst);
                return Reply::Never;
            }
            let n = self.lists.fetch_add(1, Ordering::SeqCst) + 1;
            let images = if node == "node-1" {
                self.images.lock().unwrap().clone()
            } else {
                Vec::new()
            };
            let items: Vec<String> = images
                .iter()
                .enumerate()
                .map(|(i, image)| {
                    format!(
                        r#"{{"metadata":{{"name":"p{i}","namespace":"default","resourceVersion":"{n}"}},"spec":{{"nodeName":"node-1","containers":[{{"name":"c","image":"{image}"}}]}}}}"#
                    )
                })
                .collect();
            json(
                200,
                format!(
                    r#"{{"apiVersion":"v1","kind":"PodList","metadata":{{"resourceVersion":"{n}"}},"items":[{}]}}"#,
                    items.join(",")
                ),
            )
            .into()
        }
    }
}
