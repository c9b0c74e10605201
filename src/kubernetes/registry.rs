//! The size of an image from its registry's manifest
//! (`kubernetes.registry_manifests`, off unless configured), for a pull
//! coming for a pod bound to the node whose repository the node never had
//! (see [`crate::policy::coming`]): the history sizes the others.
//!
//! What is read, and nothing more: the manifest of the reference the pod
//! names (`GET /v2/<path>/manifests/<tag or digest>`), and when that is an
//! index (a multi-platform image) the manifest of this node's platform. Its
//! size is what the runtime reports for a pulled image on containerd: the
//! config and the layers as stored (compressed), the manifests themselves
//! included. No blob is fetched.
//!
//! Access is anonymous: a registry that asks for a bearer token gets the
//! anonymous token flow (Docker Hub, GHCR and most public registries); one
//! that wants credentials is not sized (pull secrets would need RBAC on
//! secrets, which imagegc does not ask for). Docker Hub counts a manifest
//! GET against the node's anonymous pull limit, which is why this is off
//! unless configured, and why each reference is asked at most once in
//! [`KNOWN_FOR`] (a failure: once in [`RETRY_AFTER`]).
//!
//! Every lookup is bounded: [`LOOKUP_TIMEOUT`] for all its requests, no
//! body over [`MAX_BODY`], no redirect followed, one lookup at a time. A
//! registry that lies can only make the estimate wrong: the estimate moves
//! the thresholds in force, never what may be removed (see
//! [`crate::engine::PullSizes`], which ignores an estimate larger than the
//! image filesystem).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::model::reference;

/// How long one lookup may take, all its requests together.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest body read (a manifest, an index, a token): the distribution
/// spec's limit on a manifest registries accept.
pub const MAX_BODY: usize = 4 << 20;

/// How long a size read is believed: a tag may move to a new image.
pub const KNOWN_FOR: Duration = Duration::from_secs(3600);

/// How long after a failed lookup the reference is asked again.
pub const RETRY_AFTER: Duration = Duration::from_secs(600);

/// How many references are remembered (a few hundred bytes each): past it,
/// the one asked longest ago is forgotten.
pub const MAX_REMEMBERED: usize = 1024;

/// How many lookups may wait: more are asked at a later check.
const QUEUE: usize = 64;

/// How many lookups run at once. A registry that does not answer holds a
/// lookup for [`LOOKUP_TIMEOUT`]: a pod stuck on such an image must not hold
/// up the size of the pull the kubelet is starting now. Each lookup reads
/// at most [`MAX_BODY`] at a time: 16 MiB at worst for the four.
const AT_ONCE: usize = 4;

/// What is asked for: an index (or a Docker manifest list), or a manifest.
const ACCEPTED: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// Why a lookup gave no size.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// An image id, or nothing to pull.
    #[error("not a tag or digest reference")]
    NotAReference,
    /// [`LOOKUP_TIMEOUT`] passed.
    #[error("the registry did not answer within {}s", LOOKUP_TIMEOUT.as_secs())]
    TimedOut,
    /// No answer: connection, TLS, or the body.
    #[error("request failed: {0}")]
    Request(String),
    /// An answer other than the manifest.
    #[error("the registry answered {0}")]
    Status(StatusCode),
    /// Anonymous access refused.
    #[error("the registry wants credentials (only anonymous access is used)")]
    Credentials,
    /// A body that is no manifest, index or token.
    #[error("the registry's answer is not a manifest imagegc reads: {0}")]
    Malformed(String),
    /// An index without this node's platform.
    #[error("the index has no manifest for linux/{0}")]
    NoPlatform(&'static str),
}

/// Reads manifests over HTTPS (with the system's roots) or, for a registry
/// `kubernetes.registry_endpoints` sends to an `http://` address, plain
/// HTTP.
#[derive(Clone)]
pub struct Registry {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    endpoints: Arc<HashMap<String, Uri>>,
    arch: &'static str,
}

impl Registry {
    /// A reader with the system's root certificates (`SSL_CERT_FILE` and
    /// `SSL_CERT_DIR` are honoured) and `endpoints`, the address each
    /// registry named there is read at instead of `https://<registry>`.
    /// Without root certificates (a container that mounts none), only
    /// `http://` endpoints can be read: said once here.
    pub fn new(endpoints: HashMap<String, Uri>) -> Result<Registry, rustls::Error> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(LOOKUP_TIMEOUT));
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match builder.with_native_roots() {
            Ok(builder) => builder,
            Err(error) => {
                warn!(
                    error = %error,
                    "no root certificates found (SSL_CERT_FILE, SSL_CERT_DIR, /etc/ssl/certs): registries are read \
                     only at http:// endpoints; mount the node's certificates to read others"
                );
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
            }
        };
        let connector = builder.https_or_http().enable_http1().wrap_connector(http);
        Ok(Registry {
            client: Client::builder(TokioExecutor::new()).build(connector),
            endpoints: Arc::new(endpoints),
            arch: node_arch(),
        })
    }

    /// The size `reference`'s manifest gives (see the module's comment).
    pub async fn size_of(&self, reference: &str) -> Result<u64, LookupError> {
        tokio::time::timeout(LOOKUP_TIMEOUT, self.lookup(reference))
            .await
            .unwrap_or(Err(LookupError::TimedOut))
    }

    async fn lookup(&self, reference: &str) -> Result<u64, LookupError> {
        let (registry, path, wanted) = reference::pull_parts(reference)
            .filter(|(registry, path, wanted)| pullable(registry, path, wanted))
            .ok_or(LookupError::NotAReference)?;
        let base = self.endpoint(&registry);
        let mut token = None;
        let body = self.manifest(&base, &path, &wanted, &mut token).await?;
        let first = parse(&body)?;
        match first {
            Manifest::Image { size } => Ok(size.saturating_add(body.len() as u64)),
            Manifest::Index { manifests } => {
                let digest = manifests
                    .iter()
                    .find(|m| {
                        m.platform
                            .as_ref()
                            .is_some_and(|p| p.os == "linux" && p.architecture == self.arch)
                    })
                    .map(|m| m.digest.clone())
                    .ok_or(LookupError::NoPlatform(self.arch))?;
                if !is_digest(&digest) {
                    return Err(LookupError::Malformed(format!("the index names {digest:?}")));
                }
                let inner = self.manifest(&base, &path, &digest, &mut token).await?;
                match parse(&inner)? {
                    Manifest::Image { size } => Ok(size
                        .saturating_add(inner.len() as u64)
                        .saturating_add(body.len() as u64)),
                    Manifest::Index { .. } => Err(LookupError::Malformed("an index inside an index".into())),
                }
            }
        }
    }

    /// Where `registry` is read: its endpoint, else `https://<registry>`
    /// (Docker Hub's at registry-1.docker.io).
    fn endpoint(&self, registry: &str) -> String {
        if let Some(uri) = self.endpoints.get(registry) {
            return uri.to_string().trim_end_matches('/').to_owned();
        }
        match registry {
            "docker.io" => "https://registry-1.docker.io".to_owned(),
            other => format!("https://{other}"),
        }
    }

    /// Sends a GET without a body; its answer's status and headers.
    async fn send(
        &self,
        request: hyper::http::request::Builder,
    ) -> Result<hyper::Response<hyper::body::Incoming>, LookupError> {
        let request = request
            .body(Empty::new())
            .map_err(|e| LookupError::Request(e.to_string()))?;
        self.client
            .request(request)
            .await
            .map_err(|e| LookupError::Request(error_chain(&e)))
    }

    /// GETs a manifest, with the anonymous token flow when the registry
    /// asks for a bearer token (`token` keeps it for the next request).
    async fn manifest(
        &self,
        base: &str,
        path: &str,
        wanted: &str,
        token: &mut Option<String>,
    ) -> Result<Bytes, LookupError> {
        let url = format!("{base}/v2/{path}/manifests/{wanted}");
        for attempt in 0..2 {
            let mut request = Request::get(url.as_str()).header(ACCEPT, ACCEPTED);
            if let Some(token) = token.as_deref() {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            let response = self.send(request).await?;
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED && attempt == 0 {
                let challenge = response
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(bearer_challenge)
                    .ok_or(LookupError::Credentials)?;
                *token = Some(self.anonymous_token(&challenge, path, base).await?);
                continue;
            }
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                return Err(LookupError::Credentials);
            }
            if !status.is_success() {
                return Err(LookupError::Status(status));
            }
            let body = read_body(response.into_body()).await?;
            return Ok(body);
        }
        Err(LookupError::Credentials)
    }

    /// The anonymous token the challenge's realm gives for pulling `path`.
    async fn anonymous_token(
        &self,
        challenge: &HashMap<String, String>,
        path: &str,
        base: &str,
    ) -> Result<String, LookupError> {
        let realm = challenge
            .get("realm")
            .ok_or_else(|| LookupError::Malformed("a bearer challenge without a realm".into()))?;
        // A token over plain HTTP only from a registry read over plain HTTP.
        if !(realm.starts_with("https://") || (realm.starts_with("http://") && base.starts_with("http://"))) {
            return Err(LookupError::Malformed(format!(
                "the token realm {realm:?} is not https"
            )));
        }
        let scope = challenge
            .get("scope")
            .cloned()
            .unwrap_or_else(|| format!("repository:{path}:pull"));
        let mut url = format!(
            "{realm}{}scope={}",
            if realm.contains('?') { '&' } else { '?' },
            query(&scope)
        );
        if let Some(service) = challenge.get("service") {
            url.push_str("&service=");
            url.push_str(&query(service));
        }
        let response = self.send(Request::get(url.as_str())).await?;
        match response.status() {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => return Err(LookupError::Credentials),
            status if !status.is_success() => return Err(LookupError::Status(status)),
            _ => {}
        }
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let body = read_body(response.into_body()).await?;
        let token: Token = serde_json::from_slice(&body).map_err(|e| LookupError::Malformed(format!("token: {e}")))?;
        let token = token
            .token
            .or(token.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| LookupError::Malformed("no token in the token answer".into()))?;
        // A token that cannot go in a header is refused here, not at the request.
        HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| LookupError::Malformed("a token that is not a header value".into()))?;
        Ok(token)
    }
}

/// Reads at most [`MAX_BODY`] bytes of `body`.
async fn read_body(body: hyper::body::Incoming) -> Result<Bytes, LookupError> {
    Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .map_err(|e| LookupError::Request(format!("reading the answer: {e} (at most {MAX_BODY} bytes are read)")))
}

/// An error and its causes, on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The parameters of a `Bearer` challenge (`realm`, `service`, `scope`);
/// `None` for any other scheme.
fn bearer_challenge(header: &str) -> Option<HashMap<String, String>> {
    let rest = header.trim();
    let (scheme, rest) = rest.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = HashMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().copied() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        params.insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    Some(params)
}

/// `text` escaped for a URL's query.
fn query(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether a reference's parts are what the distribution spec allows: a
/// pod's image is not validated by the API server, and its text goes into
/// a URL here (no `..`, `?`, `#` or `%`).
fn pullable(registry: &str, path: &str, wanted: &str) -> bool {
    let component = |c: &str| {
        let bytes = c.as_bytes();
        !bytes.is_empty()
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes
                .iter()
                .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    let host = !registry.is_empty()
        && registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
    let tag = || {
        let bytes = wanted.as_bytes();
        (1..=128).contains(&bytes.len())
            && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
            && bytes.iter().all(|&b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    };
    host && path.len() <= 255 && path.split('/').all(component) && (is_digest(wanted) || tag())
}

fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// This node's architecture, as image indexes name it.
fn node_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// What a manifest body is, for its size.
#[derive(Debug, PartialEq)]
enum Manifest {
    /// An image's manifest: its config's and layers' sizes.
    Image { size: u64 },
    /// An index: the manifests it names.
    Index { manifests: Vec<Entry> },
}

#[derive(Debug, PartialEq, Deserialize)]
struct Entry {
    digest: String,
    platform: Option<Platform>,
}

#[derive(Debug, PartialEq, Deserialize)]
struct Platform {
    os: String,
    architecture: String,
}

#[derive(Deserialize)]
struct Descriptor {
    size: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Body {
    media_type: Option<String>,
    config: Option<Descriptor>,
    layers: Option<Vec<Descriptor>>,
    manifests: Option<Vec<Entry>>,
}

fn parse(body: &[u8]) -> Result<Manifest, LookupError> {
    let body: Body = serde_json::from_slice(body).map_err(|e| LookupError::Malformed(e.to_string()))?;
    match (body.manifests, body.config, body.layers) {
        (Some(manifests), None, None) => Ok(Manifest::Index { manifests }),
        (None, Some(config), Some(layers)) => Ok(Manifest::Image {
            size: layers
                .iter()
                .fold(config.size, |sum, layer| sum.saturating_add(layer.size)),
        }),
        _ => Err(LookupError::Malformed(format!(
            "neither an index nor an image manifest (media type {})",
            body.media_type.as_deref().unwrap_or("not given")
        ))),
    }
}

/// Starts the task that reads registries' manifests for coming pulls, when
/// `kubernetes.registry_manifests` (with `room_before_pulls`) asks for it.
pub fn start(config: &crate::config::KubernetesConfig, shutdown: &CancellationToken) -> Option<Arc<ManifestSizes>> {
    if !(config.registry_manifests && config.room_before_pulls) {
        return None;
    }
    // Validated at load: every endpoint parses.
    let endpoints = config
        .registry_endpoints
        .iter()
        .filter_map(|(registry, address)| Some((registry.clone(), address.parse().ok()?)))
        .collect();
    let registry = match Registry::new(endpoints) {
        Ok(registry) => registry,
        Err(error) => {
            warn!(error = %error, "cannot read registries (TLS): coming pulls are sized by the node's history only");
            return None;
        }
    };
    info!(
        endpoints = config.registry_endpoints.len(),
        "sizing coming pulls of repositories this node never had by their registry's manifest \
         (kubernetes.registry_manifests; anonymous access)"
    );
    let (sizes, asks) = ManifestSizes::new();
    tokio::spawn(Arc::clone(&sizes).serve(registry, asks, shutdown.clone()));
    Some(sizes)
}

/// What is known of one reference.
#[derive(Debug, Clone, Copy)]
enum Known {
    /// Asked for at that instant, no size known.
    Asked(Instant),
    /// Read at that instant.
    Size(u64, Instant),
    /// Read longer than [`KNOWN_FOR`] ago and asked again at that instant:
    /// the size read is still given meanwhile.
    Refreshing(u64, Instant),
    /// The lookup failed at that instant.
    Failed(Instant),
}

impl Known {
    fn at(self) -> Instant {
        match self {
            Known::Asked(at) | Known::Size(_, at) | Known::Refreshing(_, at) | Known::Failed(at) => at,
        }
    }

    fn waits(self) -> bool {
        matches!(self, Known::Asked(_) | Known::Refreshing(..))
    }
}

/// The sizes read so far and the lookups asked for: what the collector
/// consults at each usage check ([`crate::engine::PullSizes`]); a task
/// ([`ManifestSizes::serve`]) does the lookups, a few at a time.
pub struct ManifestSizes {
    known: Mutex<HashMap<String, Known>>,
    asks: mpsc::Sender<String>,
    answers: watch::Sender<u64>,
}

impl ManifestSizes {
    /// The sizes, and the receiver of the lookups to hand to
    /// [`ManifestSizes::serve`].
    pub fn new() -> (Arc<ManifestSizes>, mpsc::Receiver<String>) {
        let (asks, receiver) = mpsc::channel(QUEUE);
        let sizes = ManifestSizes {
            known: Mutex::new(HashMap::new()),
            asks,
            answers: watch::channel(0).0,
        };
        (Arc::new(sizes), receiver)
    }

    /// Does the lookups asked for, [`AT_ONCE`] at a time, the newest asked
    /// first, until `shutdown`. The pod bound last is the pull the kubelet
    /// is starting now; one asked earlier and still waiting is most likely
    /// on a registry that is slow to answer, or does not.
    pub async fn serve(
        self: Arc<Self>,
        registry: Registry,
        mut asks: mpsc::Receiver<String>,
        shutdown: CancellationToken,
    ) {
        // Dropped on return: the lookups still running are aborted.
        let mut running = tokio::task::JoinSet::new();
        let mut waiting: VecDeque<String> = VecDeque::new();
        let mut open = true;
        loop {
            while running.len() < AT_ONCE
                && let Some(reference) = waiting.pop_back()
            {
                let registry = registry.clone();
                running.spawn(async move {
                    let result = registry.size_of(&reference).await;
                    (reference, result)
                });
            }
            if !open && running.is_empty() {
                return;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                asked = asks.recv(), if open => match asked {
                    Some(reference) => {
                        waiting.push_back(reference);
                        // The oldest waiting is forgotten, to be asked again
                        // at a later check.
                        if waiting.len() > QUEUE
                            && let Some(oldest) = waiting.pop_front()
                        {
                            self.forget(&oldest);
                        }
                    }
                    None => open = false,
                },
                Some(done) = running.join_next(), if !running.is_empty() => match done {
                    Ok((reference, result)) => self.answer(&reference, result),
                    // A lookup that panicked: its reference stays asked, and
                    // is asked again after RETRY_AFTER.
                    Err(error) => warn!(error = %error, "a registry lookup failed"),
                },
            }
        }
    }

    /// Notes the answer of a lookup and wakes who waits on answers.
    fn answer(&self, reference: &str, result: Result<u64, LookupError>) {
        let now = Instant::now();
        let known = match result {
            Ok(size) => {
                info!(image = %reference, size_bytes = size, "coming pull sized by its registry's manifest");
                Known::Size(size, now)
            }
            Err(error) => {
                warn!(
                    image = %reference,
                    error = %error,
                    retry_in_s = RETRY_AFTER.as_secs(),
                    "could not size a coming pull from its registry's manifest: room is not made for it"
                );
                Known::Failed(now)
            }
        };
        self.remember(reference, known);
        self.answers.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Waits until no lookup asked for is unanswered, at most `within`
    /// (`plan`, which shows what the daemon would know).
    pub async fn settled(&self, within: Duration) {
        let mut answers = self.answers.subscribe();
        let waiting = async {
            loop {
                let asked = {
                    let map = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    map.values().any(|known| known.waits())
                };
                if !asked || answers.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(within, waiting).await;
    }

    fn forget(&self, reference: &str) {
        let mut map = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.remove(reference);
    }

    fn remember(&self, reference: &str, known: Known) {
        let mut map = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= MAX_REMEMBERED
            && !map.contains_key(reference)
            && let Some(oldest) = map.iter().min_by_key(|(_, k)| k.at()).map(|(r, _)| r.clone())
        {
            map.remove(&oldest);
        }
        map.insert(reference.to_owned(), known);
    }
}

impl crate::engine::PullSizes for ManifestSizes {
    fn size_of(&self, reference: &str) -> Option<u64> {
        let now = Instant::now();
        let known = {
            let map = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            map.get(reference).copied()
        };
        // A lookup lasts at most LOOKUP_TIMEOUT, but may wait in the queue
        // behind others: one unanswered is asked again only well after.
        let (size, asking) = match known {
            Some(Known::Size(size, at)) if now.duration_since(at) < KNOWN_FOR => return Some(size),
            Some(Known::Size(size, _)) => (Some(size), Known::Refreshing(size, now)),
            Some(Known::Refreshing(size, at)) if now.duration_since(at) < RETRY_AFTER => return Some(size),
            Some(Known::Refreshing(size, _)) => (Some(size), Known::Refreshing(size, now)),
            Some(Known::Failed(at) | Known::Asked(at)) if now.duration_since(at) < RETRY_AFTER => return None,
            Some(Known::Failed(_) | Known::Asked(_)) | None => (None, Known::Asked(now)),
        };
        // Full: asked at a later check. Closed: shutting down.
        if self.asks.try_send(reference.to_owned()).is_ok() {
            debug!(image = %reference, "asking the registry for a coming pull's manifest");
            self.remember(reference, asking);
        }
        size
    }

    fn read_for(&self, image: &crate::model::Image) -> Option<u64> {
        let map = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let read: Vec<(&str, u64)> = map
            .iter()
            .filter_map(|(reference, known)| match *known {
                Known::Size(size, _) | Known::Refreshing(size, _) => Some((reference.as_str(), size)),
                Known::Asked(_) | Known::Failed(_) => None,
            })
            .collect();
        let references: Vec<&str> = read.iter().map(|(reference, _)| *reference).collect();
        crate::model::matching::named_by(std::slice::from_ref(image), &references)
            .first()
            .map(|&(_, r)| read[r].1)
    }

    fn answers(&self) -> Option<watch::Receiver<u64>> {
        Some(self.answers.subscribe())
    }
}

#[cfg(test)]
mod tests;
