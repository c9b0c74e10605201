//! The CRI v1 gRPC client over a unix socket.
//!
//! Every call carries a deadline (`runtime.timeout`) and every error names
//! the RPC and the endpoint. Responses may be large (a node with tens of
//! thousands of images answers `ListImages` with tens of MiB), so the
//! decoding limit is raised far above gRPC's 4 MiB default.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt as _;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use super::proto::{self, image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient};
use super::{
    Container, ContainerEvent, ContainerState, EventStream, Filesystems, Image, ImageFsUsage, Removed, Runtime,
    RuntimeError, RuntimeStatus, RuntimeVersion,
};
use crate::model::reference::{bare_id, canonical_id};

/// Endpoints tried in order when none is configured: the supported runtimes
/// at their default paths, containerd then CRI-O (cri-dockerd is not
/// supported, so it is never found by chance).
pub const DEFAULT_ENDPOINTS: [&str; 2] = ["unix:///run/containerd/containerd.sock", "unix:///run/crio/crio.sock"];

/// Largest gRPC message accepted from the runtime: 256 MiB, room for
/// ~500,000 images in one `ListImages` answer.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// How long discovery waits for one candidate endpoint's `Version` answer.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(2);

/// A CRI runtime reached over a unix socket.
#[derive(Clone)]
pub struct CriClient {
    endpoint: String,
    /// The per-call deadline in nanoseconds, shared by every clone: a
    /// reload of `runtime.timeout` changes it for the calls that follow
    /// (see [`Runtime::set_timeout`]).
    timeout_nanos: Arc<AtomicU64>,
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    /// The channel `ListImages` is asked on by hand, its answer decoded
    /// into [`Image`]s as it arrives (see `list_images.rs`).
    channel: Channel,
    /// Whether the runtime lists ids as bare hex (CRI-O): imagegc uses
    /// `sha256:<hex>` everywhere and gives the runtime back its own form.
    bare_ids: Arc<AtomicBool>,
    /// Who hears of every call's end: its method, status code and time.
    observer: Option<Arc<dyn CallObserver>>,
}

/// Who hears of every call the client makes to the runtime when it ends:
/// its CRI method, the gRPC status code it ended with, as grpc-go spells it
/// (`"OK"`, `"Unavailable"`; `"DeadlineExceeded"` for a call imagegc gave
/// up on at its deadline, `"Canceled"` for one dropped first), and how long
/// it took. The client measures, since only it sees each call's code (a
/// `NotFound` it turns into an answer, a transport failure it turns into a
/// connection error); what the measure becomes is the observer's (the
/// daemon's metrics count and time it). `GetContainerEvents` ends when the
/// stream is opened.
pub trait CallObserver: Send + Sync {
    /// One call ended.
    fn call_ended(&self, method: &'static str, code: &'static str, took: Duration);
}

/// Parses `unix:///path` (or a bare absolute path) into the socket path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, RuntimeError> {
    let bad = |reason: &str| RuntimeError::BadEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if endpoint.starts_with('/') {
        endpoint
    } else {
        return Err(bad(
            "only unix:// endpoints are supported (for example unix:///run/containerd/containerd.sock)",
        ));
    };
    if !path.starts_with('/') {
        return Err(bad("the socket path must be absolute (unix:///path)"));
    }
    Ok(PathBuf::from(path))
}

/// Creates a client for `endpoint`. The connection is made lazily, on the
/// first call, and re-made after the runtime restarts.
pub fn connect(endpoint: &str, timeout: Duration) -> Result<CriClient, RuntimeError> {
    let path = socket_path(endpoint)?;
    // The URI is a placeholder: the connector below always dials the socket.
    // The call deadline is `CriClient::call`'s alone: a channel timeout of the
    // same length would win the race and report a cancelled call instead.
    let channel = Endpoint::from_static("http://[::1]:50051")
        .connect_timeout(timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }));
    Ok(CriClient {
        endpoint: endpoint.to_string(),
        timeout_nanos: Arc::new(AtomicU64::new(nanos(timeout))),
        runtime: RuntimeServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        image: ImageServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        channel,
        bare_ids: Arc::new(AtomicBool::new(false)),
        observer: None,
    })
}

/// Returns a client for the configured endpoint, or for the first of
/// [`DEFAULT_ENDPOINTS`] that answers `Version`.
pub async fn discover(configured: Option<&str>, timeout: Duration) -> Result<CriClient, RuntimeError> {
    if let Some(endpoint) = configured {
        return connect(endpoint, timeout);
    }
    for endpoint in DEFAULT_ENDPOINTS {
        let client = connect(endpoint, DISCOVERY_TIMEOUT.min(timeout))?;
        if client.version().await.is_ok() {
            tracing::debug!(endpoint, "discovered container runtime");
            return connect(endpoint, timeout);
        }
    }
    Err(RuntimeError::NoneAnswered {
        tried: DEFAULT_ENDPOINTS.iter().map(ToString::to_string).collect(),
    })
}

impl CriClient {
    /// The per-call deadline.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_nanos.load(Ordering::Relaxed))
    }

    /// The generated runtime-service client, for calls imagegc itself does not
    /// make (tests start pods and containers through it).
    pub fn runtime_service(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    /// The generated image-service client.
    pub fn image_service(&self) -> ImageServiceClient<Channel> {
        self.image.clone()
    }

    /// Tells `observer` of every call's end (see [`CallObserver`]).
    pub fn observed_by(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Runs one RPC with the deadline, mapping errors to [`RuntimeError`].
    async fn call<T, F>(&self, rpc: &'static str, fut: F) -> Result<T, RuntimeError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        // Told when the call ends, or as cancelled when the caller drops it
        // first (shutdown): the runtime saw it either way.
        let mut record = CallRecord {
            observer: self.observer.as_deref(),
            rpc,
            started: Instant::now(),
            code: tonic::Code::Cancelled,
        };
        let timeout = self.timeout();
        let answer = tokio::time::timeout(timeout, fut).await;
        record.code = match &answer {
            Ok(Ok(_)) => tonic::Code::Ok,
            Ok(Err(status)) => status.code(),
            Err(_) => tonic::Code::DeadlineExceeded,
        };
        drop(record);
        match answer {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(self.rpc_error(rpc, status)),
            Err(_) => Err(RuntimeError::Timeout {
                rpc,
                endpoint: self.endpoint.clone(),
                timeout,
            }),
        }
    }

    fn rpc_error(&self, rpc: &'static str, status: tonic::Status) -> RuntimeError {
        rpc_error(&self.endpoint, rpc, status)
    }
}

/// One call to the runtime, told to the observer when dropped: with its
/// answer's code, or `Canceled` when the caller gave up on it.
struct CallRecord<'m> {
    observer: Option<&'m dyn CallObserver>,
    rpc: &'static str,
    started: Instant,
    code: tonic::Code,
}

impl Drop for CallRecord<'_> {
    fn drop(&mut self) {
        if let Some(observer) = self.observer {
            observer.call_ended(self.rpc, code_name(self.code), self.started.elapsed());
        }
    }
}

/// A duration in nanoseconds, saturating (`u64` holds 584 years; the
/// timeout is at most a day).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// gRPC's name of a status code, as grpc-go and the Prometheus gRPC
/// middlewares spell it in their `grpc_code` label.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

fn rpc_error(endpoint: &str, rpc: &'static str, status: tonic::Status) -> RuntimeError {
    {
        if status.code() == tonic::Code::Unavailable || status.code() == tonic::Code::Unknown && is_transport(&status) {
            return RuntimeError::Connect {
                endpoint: endpoint.to_string(),
                message: format!("{rpc}: {}", transport_message(&status)),
            };
        }
        RuntimeError::Rpc {
            rpc,
            endpoint: endpoint.to_string(),
            status: Box::new(status),
        }
    }
}

fn is_transport(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// The innermost cause of a transport failure ("No such file or directory",
/// "Connection refused") is what a person needs.
fn transport_message(status: &tonic::Status) -> String {
    let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(status);
    let mut last = None;
    while let Some(err) = cause {
        last = Some(err.to_string());
        cause = err.source();
    }
    last.unwrap_or_else(|| status.message().to_string())
}

fn image_from_proto(image: proto::Image) -> Image {
    Image {
        id: canonical_id(image.id),
        repo_tags: image.repo_tags.into(),
        repo_digests: image.repo_digests.into(),
        size: image.size,
        pinned: image.pinned,
    }
}

fn container_from_proto(c: proto::Container) -> Container {
    Container {
        id: c.id,
        pod_sandbox_id: c.pod_sandbox_id,
        name: c.metadata.map(|m| m.name).unwrap_or_default(),
        image: c.image.map(|i| i.image).unwrap_or_default(),
        image_ref: canonical_id(c.image_ref),
        image_id: canonical_id(c.image_id),
        state: Some(ContainerState::from_cri(c.state)),
        mounted_images: Vec::new(),
        mounts_unknown: false,
    }
}

/// The images a container status names: its own (spec, ref, id) and those
/// it mounts as volumes.
fn status_images(status: proto::ContainerStatus) -> impl Iterator<Item = String> {
    let own = [
        status.image.map(|i| i.image).unwrap_or_default(),
        canonical_id(status.image_ref),
        canonical_id(status.image_id),
    ];
    own.into_iter()
        .chain(mounted_images(status.mounts))
        .filter(|s| !s.is_empty())
}

fn mounted_images(mounts: Vec<proto::Mount>) -> impl Iterator<Item = String> {
    mounts
        .into_iter()
        .filter_map(|m| m.image)
        .map(|spec| canonical_id(spec.image))
        .filter(|s| !s.is_empty())
}

/// Nanoseconds since the epoch (CRI timestamps) as a time; `None` for 0.
fn from_unix_nanos(nanos: i64) -> Option<SystemTime> {
    u64::try_from(nanos)
        .ok()
        .filter(|n| *n > 0)
        .map(|n| UNIX_EPOCH + Duration::from_nanos(n))
}

/// Annotations that name a pod's sandbox image: containerd 2.x's, then
/// CRI-O's name and its id.
const SANDBOX_IMAGE_ANNOTATIONS: [&str; 3] = [
    "io.kubernetes.cri.podsandbox.image-name",
    "io.kubernetes.cri-o.ImageName",
    "io.kubernetes.cri-o.Image",
];

/// The sandbox image of a pod from its verbose status: the annotations
/// above on the status, else the verbose info's JSON (containerd 2.x:
/// `image` at its top; both runtimes also repeat the annotations in the
/// runtime spec they put there).
pub fn pod_sandbox_image(
    annotations: &std::collections::HashMap<String, String>,
    info: &std::collections::HashMap<String, String>,
) -> Option<String> {
    for key in SANDBOX_IMAGE_ANNOTATIONS {
        if let Some(image) = annotations.get(key).filter(|v| !v.is_empty()) {
            return Some(canonical_id(image.clone()));
        }
    }
    let parsed: Vec<serde_json::Value> = info.values().filter_map(|v| serde_json::from_str(v).ok()).collect();
    for json in &parsed {
        if let Some(serde_json::Value::String(image)) = json.get("image")
            && !image.is_empty()
        {
            return Some(canonical_id(image.clone()));
        }
    }
    SANDBOX_IMAGE_ANNOTATIONS
        .iter()
        .find_map(|key| parsed.iter().find_map(|json| find_key(json, key)))
        .map(canonical_id)
}

impl CriClient {
    /// `ImageStatus` of the image with this id (`verbose`: with its info),
    /// `None` when it is gone. Asked by id: an answer about another image
    /// (a runtime that resolved the id as a name) is no answer about this
    /// one.
    async fn image_status_by_id(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<Option<(Image, std::collections::HashMap<String, String>)>, RuntimeError> {
        let mut client = self.image.clone();
        let asked = if self.bare_ids.load(Ordering::Relaxed) {
            bare_id(id)
        } else {
            id
        };
        let request = proto::ImageStatusRequest {
            image: Some(proto::ImageSpec {
                image: asked.to_string(),
                ..Default::default()
            }),
            verbose,
        };
        match self.call("ImageStatus", client.image_status(request)).await {
            Ok(response) => {
                let info = response.info;
                Ok(response
                    .image
                    .map(image_from_proto)
                    .filter(|image| image.id == id)
                    .map(|image| (image, info)))
            }
            Err(err) if err.is_not_found() => Ok(None),
            Err(err) => Err(err),
        }
    }
}

/// The most layers an image's config may list for imagegc to believe it:
/// Docker and BuildKit refuse more than 127, and a longer list is no image
/// a runtime pulled.
const MAX_LAYERS: usize = 1_000;

/// An image's layers from its verbose `ImageStatus` info: the JSON under
/// `info` (containerd 1.6 and 2.x: `{"chainID", "imageSpec"}`; CRI-O:
/// `{"labels", "imageSpec"}`), `imageSpec.rootfs.diff_ids`. Each must be a
/// digest (`<algorithm>:<lowercase hex>`); an info without them, or with
/// anything else in their place, says nothing (`None`), so that a layer is
/// never shared by mistake.
pub fn layers_from_info(info: &std::collections::HashMap<String, String>) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Info {
        #[serde(rename = "imageSpec")]
        image_spec: Spec,
    }
    #[derive(serde::Deserialize)]
    struct Spec {
        rootfs: RootFs,
    }
    #[derive(serde::Deserialize)]
    struct RootFs {
        diff_ids: Vec<String>,
    }
    let info: Info = serde_json::from_str(info.get("info")?).ok()?;
    let layers = info.image_spec.rootfs.diff_ids;
    (layers.len() <= MAX_LAYERS && layers.iter().all(|layer| is_digest(layer))).then_some(layers)
}

/// `<algorithm>:<hex>`: sha256 with 64 lowercase hex digits, sha512 with
/// 128, as the OCI image spec registers them.
fn is_digest(s: &str) -> bool {
    let hex = match s.split_once(':') {
        Some(("sha256", hex)) if hex.len() == 64 => hex,
        Some(("sha512", hex)) if hex.len() == 128 => hex,
        _ => return false,
    };
    hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Reads the sandbox image from the verbose `Status` info. containerd puts
/// its CRI plugin config (JSON) under `config` with `sandboxImage`; CRI-O
/// reports `pause_image` in some versions. Unknown shapes yield `None`.
pub fn sandbox_image_from_info(info: &std::collections::HashMap<String, String>) -> Option<String> {
    for value in info.values() {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(value) else {
            continue;
        };
        for key in ["sandboxImage", "sandbox_image", "pause_image", "pauseImage"] {
            if let Some(image) = find_key(&json, key) {
                return Some(image);
            }
        }
    }
    None
}

fn find_key(value: &serde_json::Value, key: &str) -> Option<String> {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::String(s)) = map.get(key)
                && !s.is_empty()
            {
                return Some(s.clone());
            }
            map.values().find_map(|v| find_key(v, key))
        }
        _ => None,
    }
}

impl Runtime for CriClient {
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn set_timeout(&self, timeout: Duration) {
        self.timeout_nanos.store(nanos(timeout), Ordering::Relaxed);
    }

    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        let mut client = self.runtime.clone();
        let request = proto::VersionRequest {
            version: "v1".to_string(),
        };
        let v = self.call("Version", client.version(request)).await?;
        Ok(RuntimeVersion {
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        })
    }

    async fn status(&self) -> Result<RuntimeStatus, RuntimeError> {
        let mut client = self.runtime.clone();
        let status = self
            .call("Status", client.status(proto::StatusRequest { verbose: true }))
            .await?;
        Ok(RuntimeStatus {
            sandbox_image: sandbox_image_from_info(&status.info),
        })
    }

    async fn list_images(&self) -> Result<Vec<Image>, RuntimeError> {
        let mut images = self
            .call("ListImages", async {
                // The names known to the process, which this listing shares
                // where they are unchanged (see `names.rs`); one that fails
                // leaves the next none to share.
                let known = super::names::take_known();
                let (images, names) =
                    super::list_images::list_images(self.channel.clone(), MAX_MESSAGE_BYTES, known).await?;
                super::names::keep_known(names);
                Ok(tonic::Response::new(images))
            })
            .await?;
        if images.iter().any(|i| i.id.len() == 64) {
            self.bare_ids.store(true, Ordering::Relaxed);
        }
        for image in &mut images {
            image.id = canonical_id(std::mem::take(&mut image.id));
        }
        Ok(super::merge_listings(images))
    }

    async fn list_containers(&self) -> Result<Vec<Container>, RuntimeError> {
        let mut client = self.runtime.clone();
        let response = self
            .call(
                "ListContainers",
                client.list_containers(proto::ListContainersRequest { filter: None }),
            )
            .await?;
        Ok(response.containers.into_iter().map(container_from_proto).collect())
    }

    async fn image_fs_info(&self) -> Result<Vec<ImageFsUsage>, RuntimeError> {
        Ok(self.filesystems().await?.images)
    }

    async fn filesystems(&self) -> Result<Filesystems, RuntimeError> {
        let mut client = self.image.clone();
        let response = self
            .call("ImageFsInfo", client.image_fs_info(proto::ImageFsInfoRequest {}))
            .await?;
        let usage = |fs: proto::FilesystemUsage| ImageFsUsage {
            mount_point: fs.fs_id.map(|id| id.mountpoint).unwrap_or_default(),
            used_bytes: fs.used_bytes.map(|v| v.value),
            inodes_used: fs.inodes_used.map(|v| v.value),
        };
        Ok(Filesystems {
            images: response.image_filesystems.into_iter().map(usage).collect(),
            containers: response.container_filesystems.into_iter().map(usage).collect(),
        })
    }

    async fn remove_image(&self, id: &str) -> Result<Removed, RuntimeError> {
        let mut client = self.image.clone();
        // The id as the runtime listed it.
        let id = if self.bare_ids.load(Ordering::Relaxed) {
            bare_id(id)
        } else {
            id
        };
        let request = proto::RemoveImageRequest {
            image: Some(proto::ImageSpec {
                image: id.to_string(),
                ..Default::default()
            }),
        };
        match self.call("RemoveImage", client.remove_image(request)).await {
            Ok(_) => Ok(Removed::Done),
            Err(err) if err.is_not_found() => Ok(Removed::AlreadyGone),
            Err(err) => Err(err),
        }
    }

    async fn image_status(&self, id: &str) -> Result<Option<Image>, RuntimeError> {
        Ok(self.image_status_by_id(id, false).await?.map(|(image, _)| image))
    }

    async fn image_layers(&self, id: &str) -> Result<Option<Vec<String>>, RuntimeError> {
        Ok(self
            .image_status_by_id(id, true)
            .await?
            .and_then(|(_, info)| layers_from_info(&info)))
    }

    fn container_events(&self) -> EventStream {
        let mut client = self.runtime.clone();
        let endpoint = self.endpoint.clone();
        let observer = self.observer.clone();
        // No deadline: runtimes answer the open only with the first event,
        // which on an idle node may be hours away. The stream is polled in
        // the daemon's loop beside everything else, so waiting costs nothing.
        let opened = async move {
            let request = tonic::Request::new(proto::GetEventsRequest {});
            let started = Instant::now();
            let answer = client.get_container_events(request).await;
            if let Some(observer) = &observer {
                let code = answer.as_ref().map_or_else(tonic::Status::code, |_| tonic::Code::Ok);
                observer.call_ended("GetContainerEvents", code_name(code), started.elapsed());
            }
            match answer {
                Ok(response) => {
                    let endpoint = endpoint.clone();
                    response
                        .into_inner()
                        .map(move |item| match item {
                            Ok(event) => Ok(ContainerEvent {
                                container_id: event.container_id,
                                created_at: from_unix_nanos(event.created_at),
                                images: event.containers_statuses.into_iter().flat_map(status_images).collect(),
                            }),
                            Err(status) => Err(rpc_error(&endpoint, "GetContainerEvents", status)),
                        })
                        .boxed()
                }
                Err(status) => futures_util::stream::once(std::future::ready(Err(rpc_error(
                    &endpoint,
                    "GetContainerEvents",
                    status,
                ))))
                .boxed(),
            }
        };
        Box::pin(futures_util::stream::once(opened).flatten())
    }

    async fn container_mounts(&self, id: &str) -> Result<Vec<String>, RuntimeError> {
        let mut client = self.runtime.clone();
        let request = proto::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        };
        let response = self.call("ContainerStatus", client.container_status(request)).await?;
        Ok(response
            .status
            .map(|s| mounted_images(s.mounts).collect())
            .unwrap_or_default())
    }

    async fn pod_sandboxes(&self) -> Result<Vec<String>, RuntimeError> {
        let mut client = self.runtime.clone();
        let request = proto::ListPodSandboxRequest { filter: None };
        let response = self.call("ListPodSandbox", client.list_pod_sandbox(request)).await?;
        Ok(response.items.into_iter().map(|pod| pod.id).collect())
    }

    async fn pod_sandbox_image(&self, id: &str) -> Result<Option<String>, RuntimeError> {
        let mut client = self.runtime.clone();
        let request = proto::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: true,
        };
        let response = self
            .call("PodSandboxStatus", client.pod_sandbox_status(request))
            .await?;
        let annotations = response.status.map(|s| s.annotations).unwrap_or_default();
        Ok(pod_sandbox_image(&annotations, &response.info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Discovery finds only supported runtimes: a node running cri-dockerd
    /// (not supported) gets "no container runtime answered", not a
    /// collector working through a runtime nobody tested.
    #[test]
    fn discovery_tries_containerd_then_crio_only() {
        assert_eq!(
            DEFAULT_ENDPOINTS,
            ["unix:///run/containerd/containerd.sock", "unix:///run/crio/crio.sock"]
        );
        assert!(!DEFAULT_ENDPOINTS.iter().any(|e| e.contains("dockerd")));
    }

    #[test]
    fn endpoints_must_be_unix_and_absolute() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/run/crio/crio.sock").unwrap(),
            PathBuf::from("/run/crio/crio.sock")
        );
        for bad in ["tcp://127.0.0.1:1234", "unix://relative.sock", "npipe:////./pipe/x", ""] {
            let err = socket_path(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }

    fn info(json: &str) -> std::collections::HashMap<String, String> {
        std::collections::HashMap::from([("info".to_string(), json.to_string())])
    }

    /// containerd (1.6 and 2.x) and CRI-O put the image config under
    /// `info`, beside a chain id or the labels: the diff ids are read from
    /// both shapes, lowest layer first.
    #[test]
    fn layers_are_read_from_the_image_config_of_the_verbose_status() {
        let (a, b) = (
            format!("sha256:{}", "a".repeat(64)),
            format!("sha256:{}", "0b".repeat(32)),
        );
        let containerd = format!(
            r#"{{"chainID":"sha256:{c}","imageSpec":{{"created":"2026-01-01T00:00:00Z","architecture":"amd64","os":"linux","config":{{"Env":["PATH=/bin"]}},"rootfs":{{"type":"layers","diff_ids":["{a}","{b}"]}},"history":[{{"created_by":"COPY / /"}}]}}}}"#,
            c = "c".repeat(64)
        );
        let crio = format!(
            r#"{{"labels":{{"x":"y"}},"imageSpec":{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":["{a}","{b}"]}}}}}}"#
        );
        for json in [containerd, crio] {
            assert_eq!(
                layers_from_info(&info(&json)),
                Some(vec![a.clone(), b.clone()]),
                "{json}"
            );
        }
        // An image with no layer (a config alone) has none, which is known.
        assert_eq!(
            layers_from_info(&info(r#"{"imageSpec":{"rootfs":{"type":"layers","diff_ids":[]}}}"#)),
            Some(vec![])
        );
    }

    /// Anything but a list of digests says nothing: a layer shared by
    /// mistake would make a removal look as if it freed less than it does.
    #[test]
    fn a_verbose_status_without_digests_in_its_rootfs_says_nothing_of_layers() {
        let digest = format!("sha256:{}", "a".repeat(64));
        for bad in [
            String::new(),
            "not json".to_string(),
            "{}".to_string(),
            r#"{"imageSpec":{}}"#.to_string(),
            r#"{"imageSpec":{"rootfs":{"diff_ids":"sha256:x"}}}"#.to_string(),
            format!(r#"{{"imageSpec":{{"rootfs":{{"diff_ids":["{digest}",7]}}}}}}"#),
            format!(r#"{{"imageSpec":{{"rootfs":{{"diff_ids":["{digest}","sha256:ABC"]}}}}}}"#),
            format!(
                r#"{{"imageSpec":{{"rootfs":{{"diff_ids":["{}"]}}}}}}"#,
                digest.to_uppercase()
            ),
            format!(
                r#"{{"imageSpec":{{"rootfs":{{"diff_ids":["md5:{}"]}}}}}}"#,
                "a".repeat(32)
            ),
            format!(
                r#"{{"imageSpec":{{"rootfs":{{"diff_ids":[{}]}}}}}}"#,
                vec![format!("\"{digest}\""); MAX_LAYERS + 1].join(",")
            ),
        ] {
            assert_eq!(layers_from_info(&info(&bad)), None, "{bad}");
        }
        assert_eq!(layers_from_info(&std::collections::HashMap::new()), None);
        let sha512 = format!("sha512:{}", "f".repeat(128));
        assert_eq!(
            layers_from_info(&info(&format!(
                r#"{{"imageSpec":{{"rootfs":{{"diff_ids":["{sha512}"]}}}}}}"#
            ))),
            Some(vec![sha512])
        );
    }

    #[test]
    fn sandbox_image_is_read_from_containerd_config_info() {
        let mut info = std::collections::HashMap::new();
        info.insert("cniconfig".to_string(), "{\"x\":1}".to_string());
        info.insert(
            "config".to_string(),
            r#"{"containerd":{"snapshotter":"overlayfs"},"sandboxImage":"registry.k8s.io/pause:3.6"}"#.to_string(),
        );
        assert_eq!(
            sandbox_image_from_info(&info).as_deref(),
            Some("registry.k8s.io/pause:3.6")
        );
        info.clear();
        info.insert(
            "info".to_string(),
            r#"{"pause_image":"registry.k8s.io/pause:3.9"}"#.to_string(),
        );
        assert_eq!(
            sandbox_image_from_info(&info).as_deref(),
            Some("registry.k8s.io/pause:3.9")
        );
        info.clear();
        info.insert("config".to_string(), "not json".to_string());
        assert_eq!(sandbox_image_from_info(&info), None);
    }
}
