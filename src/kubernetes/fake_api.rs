//! An API server for tests, on a local port: each test says what it
//! answers. It reproduces what the client sees of a real one (JSON bodies,
//! a `Status` on failure, a watch held open), not its semantics.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};

/// A response: the body, boxed so that a test may also stream one.
pub type Answer = Response<BoxBody<Bytes, Infallible>>;

/// Serves `respond` on a local port until the test's runtime ends;
/// returns its URL.
pub async fn serve(respond: impl Fn(&Request<Incoming>) -> Answer + Send + Sync + 'static) -> String {
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
                    let response = respond(&request);
                    async move { Ok::<_, Infallible>(response) }
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
