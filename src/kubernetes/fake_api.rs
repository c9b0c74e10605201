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
