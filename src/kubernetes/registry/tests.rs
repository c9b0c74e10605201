//! The registry reader against a registry served by the test: the
//! distribution API's answers as Docker Hub's, GHCR's and the reference
//! registry's are (bearer challenge, token, index, manifest), and the
//! faults a registry can have.

use super::*;
use crate::engine::PullSizes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, body::Incoming};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;

type Handler = Arc<dyn Fn(&str, Option<&str>) -> Response<Full<Bytes>> + Send + Sync>;

/// A registry on 127.0.0.1 answering with `handler` (path and query, the
/// Authorization header); the requests it saw, in order.
struct Served {
    address: String,
    seen: Arc<Mutex<Vec<String>>>,
}

async fn serve(handler: Handler) -> Served {
    serve_at(|_| handler).await
}

/// [`serve`], the handler made knowing the registry's address.
async fn serve_at(handler: impl FnOnce(&str) -> Handler) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let handler = handler(&address);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let noted = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = Arc::clone(&handler);
            let noted = Arc::clone(&noted);
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let target = request
                        .uri()
                        .path_and_query()
                        .map_or_else(String::new, |p| p.as_str().to_owned());
                    let auth = request
                        .headers()
                        .get(AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    noted.lock().unwrap().push(target.clone());
                    let response = handler(&target, auth.as_deref());
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Served { address, seen }
}

fn answer(status: u16, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

fn registry_at(address: &str, registry: &str) -> Registry {
    Registry::new(HashMap::from([(registry.to_owned(), address.parse().unwrap())])).unwrap()
}

const AMD64: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const ARM64: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn image_manifest(config: u64, layers: &[u64]) -> String {
    let layers: Vec<String> = layers
        .iter()
        .map(|size| {
            format!(
                r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:{}","size":{size}}}"#,
                "3".repeat(64)
            )
        })
        .collect();
    format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:{}","size":{config}}},"layers":[{}]}}"#,
        "4".repeat(64),
        layers.join(",")
    )
}

fn index() -> String {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
            {{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{ARM64}","size":500,"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}},
            {{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{AMD64}","size":500,"platform":{{"architecture":"amd64","os":"linux"}}}},
            {{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:{}","size":500,"platform":{{"architecture":"unknown","os":"unknown"}}}}
        ]}}"#,
        "5".repeat(64)
    )
}

/// A registry that wants a bearer token (Docker Hub's flow): anonymous
/// tokens from `/token`, an index for `app:1` and a manifest per platform.
fn hub_like(realm: String) -> Handler {
    Arc::new(move |target: &str, auth: Option<&str>| {
        if let Some(query) = target.strip_prefix("/token?") {
            assert!(query.contains("scope=repository:team/app:pull"), "{query}");
            assert!(query.contains("service=registry.test"), "{query}");
            return answer(200, r#"{"token":"anon-1","expires_in":300}"#);
        }
        if auth != Some("Bearer anon-1") {
            return Response::builder()
                .status(401)
                .header(
                    "www-authenticate",
                    format!(r#"Bearer realm="{realm}",service="registry.test",scope="repository:team/app:pull""#),
                )
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
        }
        match target {
            "/v2/team/app/manifests/1" => answer(200, index()),
            t if t == format!("/v2/team/app/manifests/{AMD64}") => {
                answer(200, image_manifest(1_000, &[20_000, 300_000]))
            }
            t if t == format!("/v2/team/app/manifests/{ARM64}") => answer(200, image_manifest(1_000, &[10])),
            _ => answer(404, r#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#),
        }
    })
}

#[tokio::test]
async fn an_index_behind_an_anonymous_token_gives_this_platforms_manifest_size() {
    let served = serve_at(|address| hub_like(format!("{address}/token"))).await;
    let registry = registry_at(&served.address, "registry.test");
    let size = registry.size_of("registry.test/team/app:1").await;
    if node_arch() != "amd64" && node_arch() != "arm64" {
        assert!(matches!(size, Err(LookupError::NoPlatform(_))), "{size:?}");
        return;
    }
    let manifest = if node_arch() == "amd64" {
        image_manifest(1_000, &[20_000, 300_000])
    } else {
        image_manifest(1_000, &[10])
    };
    let layers = if node_arch() == "amd64" { 321_000 } else { 1_010 };
    let expected = layers + manifest.len() as u64 + index().len() as u64;
    assert!(matches!(size, Ok(s) if s == expected), "{size:?} != {expected}");
    let seen = served.seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        4,
        "challenge, token, index, manifest with the same token: {seen:?}"
    );
}

#[tokio::test]
async fn a_plain_manifest_by_tag_or_digest_is_its_config_and_layers() {
    let served = serve(Arc::new(|target: &str, _: Option<&str>| match target {
        "/v2/pull/big/manifests/2"
        | "/v2/pull/big/manifests/sha256:6666666666666666666666666666666666666666666666666666666666666666" => {
            answer(200, image_manifest(700, &[200 << 20]))
        }
        _ => answer(404, "{}"),
    }))
    .await;
    let registry = registry_at(&served.address, "127.0.0.1:5000");
    let body = image_manifest(700, &[200 << 20]).len() as u64;
    for reference in [
        "127.0.0.1:5000/pull/big:2",
        "127.0.0.1:5000/pull/big@sha256:6666666666666666666666666666666666666666666666666666666666666666",
    ] {
        let size = registry.size_of(reference).await;
        assert!(
            matches!(size, Ok(s) if s == 700 + (200 << 20) + body),
            "{reference}: {size:?}"
        );
    }
    assert!(matches!(
        registry.size_of("127.0.0.1:5000/pull/none:1").await,
        Err(LookupError::Status(StatusCode::NOT_FOUND))
    ));
    assert!(matches!(
        registry
            .size_of("sha256:6666666666666666666666666666666666666666666666666666666666666666")
            .await,
        Err(LookupError::NotAReference)
    ));
    // A pod's image is any text: none that would change the URL is read.
    for hostile in [
        "127.0.0.1:5000/pull/../../v2/_catalog:1",
        "127.0.0.1:5000/pull/big?x=1:2",
        "127.0.0.1:5000/pull/big#x:2",
        "127.0.0.1:5000/pull/big:2?n=1",
        "127.0.0.1:5000/pull/Big:2",
        "127.0.0.1:5000/pull/big:%2e%2e",
        "127.0.0.1:5000/pull//big:2",
    ] {
        assert!(
            matches!(registry.size_of(hostile).await, Err(LookupError::NotAReference)),
            "{hostile}"
        );
    }
    assert_eq!(
        served.seen.lock().unwrap().len(),
        3,
        "only the three lookups above were read"
    );
}

#[tokio::test]
async fn faults_of_a_registry_give_no_size() {
    let huge = Bytes::from(vec![b' '; MAX_BODY + 10]);
    let served = serve(Arc::new(move |target: &str, _: Option<&str>| match target {
        "/v2/basic/manifests/1" => Response::builder()
            .status(401)
            .header("www-authenticate", r#"Basic realm="registry""#)
            .body(Full::new(Bytes::new()))
            .unwrap(),
        "/v2/huge/manifests/1" => answer(200, huge.clone()),
        "/v2/garbage/manifests/1" => answer(200, "not json"),
        "/v2/v1/manifests/1" => answer(200, r#"{"schemaVersion":1,"fsLayers":[]}"#),
        "/v2/negative/manifests/1" => answer(200, r#"{"config":{"size":-1},"layers":[]}"#),
        "/v2/nested/manifests/1" => answer(
            200,
            format!(
                r#"{{"manifests":[{{"digest":"{AMD64}","platform":{{"os":"linux","architecture":"{}"}}}}]}}"#,
                node_arch()
            ),
        ),
        t if t.starts_with("/v2/nested/manifests/sha256:") => answer(200, index()),
        "/v2/baddigest/manifests/1" => answer(
            200,
            format!(
                r#"{{"manifests":[{{"digest":"../../x","platform":{{"os":"linux","architecture":"{}"}}}}]}}"#,
                node_arch()
            ),
        ),
        "/v2/moved/manifests/1" => Response::builder()
            .status(307)
            .header("location", "http://elsewhere.example/")
            .body(Full::new(Bytes::new()))
            .unwrap(),
        _ => answer(404, "{}"),
    }))
    .await;
    let registry = registry_at(&served.address, "r.test");
    let size = |name: &'static str| {
        let registry = registry.clone();
        async move { registry.size_of(&format!("r.test/{name}:1")).await }
    };
    assert!(matches!(size("basic").await, Err(LookupError::Credentials)));
    assert!(matches!(size("huge").await, Err(LookupError::Request(_))));
    assert!(matches!(size("garbage").await, Err(LookupError::Malformed(_))));
    assert!(matches!(size("v1").await, Err(LookupError::Malformed(_))));
    assert!(matches!(size("negative").await, Err(LookupError::Malformed(_))));
    assert!(matches!(size("nested").await, Err(LookupError::Malformed(_))));
    assert!(matches!(size("baddigest").await, Err(LookupError::Malformed(_))));
    assert!(matches!(
        size("moved").await,
        Err(LookupError::Status(StatusCode::TEMPORARY_REDIRECT))
    ));
    assert!(
        !served.seen.lock().unwrap().iter().any(|t| t.contains("..")),
        "a digest from the index goes in no path unchecked"
    );
    // Nobody listening.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let gone = registry_at(&closed, "r.test");
    assert!(matches!(
        gone.size_of("r.test/app:1").await,
        Err(LookupError::Request(_))
    ));
}

#[tokio::test]
async fn a_token_realm_over_plain_http_is_refused_for_a_registry_read_over_https() {
    let challenge = bearer_challenge(r#"Bearer realm="http://auth.example/token",service="s""#).unwrap();
    let registry = Registry::new(HashMap::new()).unwrap();
    let refused = registry
        .anonymous_token(&challenge, "team/app", "https://registry.example")
        .await;
    assert!(
        matches!(refused, Err(LookupError::Malformed(ref m)) if m.contains("not https")),
        "{refused:?}"
    );
}

#[test]
fn bearer_challenges_are_read_with_quotes_and_commas() {
    let params = bearer_challenge(
        r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/nginx:pull,push""#,
    )
    .unwrap();
    assert_eq!(params["realm"], "https://auth.docker.io/token");
    assert_eq!(params["service"], "registry.docker.io");
    assert_eq!(params["scope"], "repository:library/nginx:pull,push");
    let params = bearer_challenge(r#"bearer realm=https://ghcr.io/token, service="ghcr.io""#).unwrap();
    assert_eq!(params["realm"], "https://ghcr.io/token");
    assert_eq!(params["service"], "ghcr.io");
    assert!(bearer_challenge(r#"Basic realm="x""#).is_none());
    assert!(bearer_challenge("Bearer").is_none());
    assert_eq!(query("repository:a/b:pull,push"), "repository:a/b:pull%2Cpush");
}

#[test]
fn docker_hub_and_other_registries_are_read_at_their_api_addresses() {
    let registry = Registry::new(HashMap::from([(
        "localhost:5001".to_owned(),
        "http://kind-registry:5000".parse().unwrap(),
    )]))
    .unwrap();
    assert_eq!(registry.endpoint("docker.io"), "https://registry-1.docker.io");
    assert_eq!(registry.endpoint("ghcr.io"), "https://ghcr.io");
    assert_eq!(registry.endpoint("localhost:5001"), "http://kind-registry:5000");
}

#[tokio::test]
async fn sizes_are_asked_once_answered_in_the_background_and_failures_wait() {
    let served = serve(Arc::new(|target: &str, _: Option<&str>| match target {
        "/v2/app/manifests/1" => answer(200, image_manifest(100, &[900])),
        _ => answer(404, "{}"),
    }))
    .await;
    let registry = registry_at(&served.address, "r.test");
    let (sizes, asks) = ManifestSizes::new();
    let mut answers = PullSizes::answers(&*sizes).unwrap();
    let stop = CancellationToken::new();
    // Asked before the task runs: the asks wait for it.
    assert_eq!(sizes.size_of("r.test/app:1"), None);
    assert_eq!(sizes.size_of("r.test/app:1"), None, "asked once");
    assert_eq!(sizes.size_of("r.test/none:1"), None);
    let task = tokio::spawn(Arc::clone(&sizes).serve(registry, asks, stop.clone()));
    sizes.settled(Duration::from_secs(30)).await;
    answers.changed().await.unwrap();
    let body = image_manifest(100, &[900]).len() as u64;
    assert_eq!(sizes.size_of("r.test/app:1"), Some(1_000 + body));
    assert_eq!(sizes.size_of("r.test/none:1"), None, "failed: not asked again at once");
    let mut seen = served.seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        ["/v2/app/manifests/1", "/v2/none/manifests/1"],
        "each reference read once"
    );
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_registry_that_never_answers_does_not_hold_up_another_pods_size() {
    // A pod stuck on an image of a registry that accepts connections and
    // never answers (its lookup waits LOOKUP_TIMEOUT), then a pod whose
    // pull the kubelet starts now, on a registry that answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_address = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut connections = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            connections.push(stream);
        }
    });
    let served = serve(Arc::new(|target: &str, _: Option<&str>| match target {
        "/v2/app/manifests/2" => answer(200, image_manifest(100, &[900])),
        _ => answer(404, "{}"),
    }))
    .await;
    let registry = Registry::new(HashMap::from([
        ("silent.test".to_owned(), silent_address.parse().unwrap()),
        ("r.test".to_owned(), served.address.parse().unwrap()),
    ]))
    .unwrap();
    let (sizes, asks) = ManifestSizes::new();
    let mut answers = PullSizes::answers(&*sizes).unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&sizes).serve(registry, asks, stop.clone()));
    assert_eq!(sizes.size_of("silent.test/stuck:1"), None);
    // The stuck lookup has started (the silent registry took its connection).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sizes.size_of("r.test/app:2"), None);
    let started = Instant::now();
    answers.changed().await.unwrap();
    let body = image_manifest(100, &[900]).len() as u64;
    assert_eq!(
        sizes.size_of("r.test/app:2"),
        Some(1_000 + body),
        "the first answer is the registry that answers, not the one that never does"
    );
    assert!(
        started.elapsed() < LOOKUP_TIMEOUT,
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(
        sizes.size_of("silent.test/stuck:1"),
        None,
        "still waiting on the silent registry"
    );
    stop.cancel();
    task.await.unwrap();
    held.abort();
}

#[test]
fn what_is_remembered_is_bounded() {
    let (sizes, _asks) = ManifestSizes::new();
    for i in 0..MAX_REMEMBERED + 10 {
        sizes.remember(&format!("r.test/app{i}:1"), Known::Failed(Instant::now()));
    }
    assert_eq!(sizes.known.lock().unwrap().len(), MAX_REMEMBERED);
}

#[test]
fn a_size_read_long_ago_is_still_given_while_it_is_read_again_and_a_failure_waits() {
    let (sizes, mut asks) = ManifestSizes::new();
    let long_ago = Instant::now() - KNOWN_FOR - Duration::from_secs(1);
    sizes.remember("r.test/app:1", Known::Size(1_000, long_ago));
    sizes.remember("r.test/fresh:1", Known::Size(2_000, Instant::now()));
    sizes.remember("r.test/failed:1", Known::Failed(Instant::now()));
    sizes.remember("r.test/failed-long-ago:1", Known::Failed(long_ago));
    assert_eq!(sizes.size_of("r.test/app:1"), Some(1_000), "given while read again");
    assert_eq!(sizes.size_of("r.test/app:1"), Some(1_000));
    assert_eq!(sizes.size_of("r.test/fresh:1"), Some(2_000));
    assert_eq!(sizes.size_of("r.test/failed:1"), None);
    assert_eq!(sizes.size_of("r.test/failed-long-ago:1"), None);
    let mut asked = Vec::new();
    while let Ok(reference) = asks.try_recv() {
        asked.push(reference);
    }
    assert_eq!(asked, ["r.test/app:1", "r.test/failed-long-ago:1"], "each asked once");
    // The answer replaces the size; a failure of the new read drops it.
    sizes.answer("r.test/app:1", Ok(1_500));
    assert_eq!(sizes.size_of("r.test/app:1"), Some(1_500));
    sizes.answer("r.test/app:1", Err(LookupError::TimedOut));
    assert_eq!(sizes.size_of("r.test/app:1"), None);
}
