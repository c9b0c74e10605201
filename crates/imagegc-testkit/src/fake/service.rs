//! The gRPC services: each RPC answered from the fake's shared state,
//! after its call is recorded and its injected delay and failure applied.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use imagegc::cri::proto::{self, image_service_server::ImageService, runtime_service_server::RuntimeService};
use imagegc::cri::{Container, ContainerState, Image};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{CallHook, Dialect, EVENT_BUFFER, EventItem, Events, FakeRuntime, State, names, unix_nanos};

/// The gRPC services, answering from the shared state.
#[derive(Clone)]
pub(super) struct Service {
    pub(super) fake: FakeRuntime,
    pub(super) stop: CancellationToken,
}

impl Service {
    /// Records the call, then applies its injected delay and failure.
    async fn enter(&self, rpc: &'static str) -> Result<(), Status> {
        let (delay, failure, hooks) = {
            let mut state = self.fake.lock();
            state.calls.push(rpc);
            let nth = {
                let count = state.call_counts.entry(rpc).or_insert(0);
                *count += 1;
                *count
            };
            let hooks: Vec<CallHook> = state
                .call_hooks
                .iter()
                .filter(|(r, n, _)| *r == rpc && *n == nth)
                .map(|(_, _, hook)| Arc::clone(hook))
                .collect();
            let queued = state.fail_next.get_mut(rpc).and_then(VecDeque::pop_front);
            let failure = queued.or_else(|| state.fail_always.get(rpc).cloned());
            let delay = state
                .delays_nth
                .iter()
                .find(|(r, n, _)| *r == rpc && *n == nth)
                .map(|&(_, _, delay)| delay)
                .or_else(|| state.delays.get(rpc).copied());
            (delay, failure, hooks)
        };
        if let Some(delay) = delay {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.stop.cancelled() => return Err(Status::unavailable("fake runtime is shutting down")),
            }
        }
        for hook in hooks {
            hook();
        }
        failure.map_or(Ok(()), Err)
    }

    async fn unimplemented<T>(&self, rpc: &'static str) -> Result<Response<T>, Status> {
        self.enter(rpc).await?;
        Err(Status::unimplemented(format!(
            "the fake runtime does not implement {rpc}"
        )))
    }
}

/// `RemoveImage` once the request is accepted: what each runtime does.
fn remove_now(fake: &FakeRuntime, reference: &str) -> Result<Response<proto::RemoveImageResponse>, Status> {
    let (image, effect) = {
        let mut state = fake.lock();
        let found = state.find_image(reference).map(|i| i.id.clone());
        let id = found.as_deref().unwrap_or(reference);
        if let Some(code) = state.fail_remove.get(id) {
            return Err(Status::new(
                *code,
                format!("injected failure removing image {reference:?}"),
            ));
        }
        let Some(id) = found else {
            if state.dialect.is_crio() {
                // CRI-O answers OK for an id it does not have.
                return Ok(Response::new(proto::RemoveImageResponse {}));
            }
            return Err(Status::not_found(format!("image {reference:?} not found")));
        };
        if state.dialect.is_crio()
            && let Some(user) = state.node.image(&id).and_then(|image| state.node.user_of(image))
        {
            return Err(Status::unknown(format!(
                "delete image: image used by {}: image is in use by a container",
                user.id
            )));
        }
        if state.remove_keeps_image {
            return Ok(Response::new(proto::RemoveImageResponse {}));
        }
        let image = state.node.remove(&id).expect("found");
        (image, state.on_remove.clone())
    };
    if let Some(effect) = effect {
        effect(&image);
    }
    Ok(Response::new(proto::RemoveImageResponse {}))
}

/// The verbose `ImageStatus` info of an image of these layers, as each
/// runtime writes it: under `info`, the image config beside containerd's
/// `chainID` or CRI-O's `labels`.
fn verbose_image_info(layers: &[String], dialect: Dialect) -> HashMap<String, String> {
    let spec = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "rootfs": { "type": "layers", "diff_ids": layers },
    });
    let info = if dialect.is_crio() {
        serde_json::json!({ "labels": null, "imageSpec": spec })
    } else {
        serde_json::json!({ "chainID": layers.last(), "imageSpec": spec })
    };
    HashMap::from([("info".to_string(), info.to_string())])
}

fn image_to_proto(image: &Image, state: &State) -> proto::Image {
    proto::Image {
        id: state.listed_id(&image.id),
        repo_tags: image.repo_tags.to_vec(),
        repo_digests: image.repo_digests.to_vec(),
        size: image.size,
        pinned: image.pinned,
        ..Default::default()
    }
}

fn state_to_proto(state: Option<ContainerState>) -> proto::ContainerState {
    match state {
        Some(ContainerState::Created) => proto::ContainerState::ContainerCreated,
        Some(ContainerState::Running) => proto::ContainerState::ContainerRunning,
        Some(ContainerState::Exited) => proto::ContainerState::ContainerExited,
        Some(ContainerState::Unknown) | None => proto::ContainerState::ContainerUnknown,
    }
}

fn container_to_proto(container: &Container) -> proto::Container {
    proto::Container {
        id: container.id.clone(),
        pod_sandbox_id: container.pod_sandbox_id.clone(),
        metadata: Some(proto::ContainerMetadata {
            name: container.name.clone(),
            attempt: 0,
        }),
        image: Some(proto::ImageSpec {
            image: container.image.clone(),
            ..Default::default()
        }),
        image_ref: container.image_ref.clone(),
        state: state_to_proto(container.state) as i32,
        image_id: container.image_id.clone(),
        ..Default::default()
    }
}

/// Whether `container` passes a `ListContainers` filter. Fake containers
/// have no labels, so a label selector matches none of them.
pub(super) fn container_matches(container: &Container, filter: &proto::ContainerFilter) -> bool {
    (filter.id.is_empty() || filter.id == container.id)
        && (filter.pod_sandbox_id.is_empty() || filter.pod_sandbox_id == container.pod_sandbox_id)
        && filter
            .state
            .as_ref()
            .is_none_or(|s| s.state == state_to_proto(container.state) as i32)
        && filter.label_selector.is_empty()
}

#[tonic::async_trait]
impl RuntimeService for Service {
    async fn version(&self, _: Request<proto::VersionRequest>) -> Result<Response<proto::VersionResponse>, Status> {
        self.enter("Version").await?;
        // The name each runtime gives: imagegc reads its disk accounting
        // from it (containerd reports compressed sizes).
        let runtime_name = if self.fake.lock().dialect.is_crio() {
            "cri-o"
        } else {
            "containerd"
        };
        Ok(Response::new(proto::VersionResponse {
            version: "0.1.0".to_string(),
            runtime_name: runtime_name.to_string(),
            runtime_version: env!("CARGO_PKG_VERSION").to_string(),
            runtime_api_version: "v1".to_string(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        _: Request<proto::RunPodSandboxRequest>,
    ) -> Result<Response<proto::RunPodSandboxResponse>, Status> {
        self.unimplemented("RunPodSandbox").await
    }

    async fn stop_pod_sandbox(
        &self,
        _: Request<proto::StopPodSandboxRequest>,
    ) -> Result<Response<proto::StopPodSandboxResponse>, Status> {
        self.unimplemented("StopPodSandbox").await
    }

    async fn remove_pod_sandbox(
        &self,
        _: Request<proto::RemovePodSandboxRequest>,
    ) -> Result<Response<proto::RemovePodSandboxResponse>, Status> {
        self.unimplemented("RemovePodSandbox").await
    }

    async fn list_pod_sandbox(
        &self,
        _: Request<proto::ListPodSandboxRequest>,
    ) -> Result<Response<proto::ListPodSandboxResponse>, Status> {
        self.enter("ListPodSandbox").await?;
        let items = self
            .fake
            .lock()
            .pods
            .iter()
            .map(|(id, _)| proto::PodSandbox {
                id: id.clone(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(proto::ListPodSandboxResponse { items }))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<proto::PodSandboxStatusRequest>,
    ) -> Result<Response<proto::PodSandboxStatusResponse>, Status> {
        self.enter("PodSandboxStatus").await?;
        let request = request.into_inner();
        let state = self.fake.lock();
        let Some((_, pod_image)) = state.pods.iter().find(|(id, _)| *id == request.pod_sandbox_id) else {
            return Err(Status::not_found(format!(
                "pod sandbox {:?} not found",
                request.pod_sandbox_id
            )));
        };
        let mut annotations = HashMap::new();
        let mut info = HashMap::new();
        if let Some(image) = pod_image {
            match state.dialect {
                Dialect::Containerd2 => {
                    annotations.insert("io.kubernetes.cri.podsandbox.image-name".to_string(), image.clone());
                    if request.verbose {
                        info.insert(
                            "info".to_string(),
                            serde_json::json!({ "image": image, "pid": 1 }).to_string(),
                        );
                    }
                }
                Dialect::Crio136 => {
                    annotations.insert("io.kubernetes.cri-o.ImageName".to_string(), image.clone());
                }
                // containerd 1.x: only in the verbose info, among the
                // sandbox's runtime spec annotations.
                Dialect::Containerd => {
                    if request.verbose {
                        let spec = serde_json::json!({
                            "pid": 1,
                            "runtimeSpec": {"annotations": {"io.kubernetes.cri.podsandbox.image-name": image}},
                        });
                        info.insert("info".to_string(), spec.to_string());
                    }
                }
                Dialect::Crio126 => {}
            }
        }
        Ok(Response::new(proto::PodSandboxStatusResponse {
            status: Some(proto::PodSandboxStatus {
                id: request.pod_sandbox_id,
                annotations,
                ..Default::default()
            }),
            info,
        }))
    }

    async fn create_container(
        &self,
        _: Request<proto::CreateContainerRequest>,
    ) -> Result<Response<proto::CreateContainerResponse>, Status> {
        self.unimplemented("CreateContainer").await
    }

    async fn start_container(
        &self,
        _: Request<proto::StartContainerRequest>,
    ) -> Result<Response<proto::StartContainerResponse>, Status> {
        self.unimplemented("StartContainer").await
    }

    async fn stop_container(
        &self,
        _: Request<proto::StopContainerRequest>,
    ) -> Result<Response<proto::StopContainerResponse>, Status> {
        self.unimplemented("StopContainer").await
    }

    async fn remove_container(
        &self,
        _: Request<proto::RemoveContainerRequest>,
    ) -> Result<Response<proto::RemoveContainerResponse>, Status> {
        self.unimplemented("RemoveContainer").await
    }

    async fn list_containers(
        &self,
        request: Request<proto::ListContainersRequest>,
    ) -> Result<Response<proto::ListContainersResponse>, Status> {
        self.enter("ListContainers").await?;
        let filter = request.into_inner().filter.unwrap_or_default();
        let containers = self
            .fake
            .lock()
            .node
            .containers
            .iter()
            .filter(|c| container_matches(c, &filter))
            .map(container_to_proto)
            .collect();
        Ok(Response::new(proto::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<proto::ContainerStatusRequest>,
    ) -> Result<Response<proto::ContainerStatusResponse>, Status> {
        self.enter("ContainerStatus").await?;
        let id = request.into_inner().container_id;
        let state = self.fake.lock();
        let Some(container) = state.node.containers.iter().find(|c| c.id == id) else {
            return Err(Status::not_found(format!("container {id:?} not found")));
        };
        let mounts = container
            .mounted_images
            .iter()
            .map(|image| proto::Mount {
                container_path: "/volume".to_string(),
                image: Some(proto::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(proto::ContainerStatusResponse {
            status: Some(proto::ContainerStatus {
                id: container.id.clone(),
                state: state_to_proto(container.state) as i32,
                image: Some(proto::ImageSpec {
                    image: container.image.clone(),
                    ..Default::default()
                }),
                image_ref: container.image_ref.clone(),
                image_id: container.image_id.clone(),
                mounts,
                ..Default::default()
            }),
            info: HashMap::new(),
        }))
    }

    async fn status(&self, request: Request<proto::StatusRequest>) -> Result<Response<proto::StatusResponse>, Status> {
        self.enter("Status").await?;
        let ready = |kind: &str| proto::RuntimeCondition {
            r#type: kind.to_string(),
            status: true,
            ..Default::default()
        };
        let mut info = HashMap::new();
        let state = self.fake.lock();
        if request.into_inner().verbose {
            let config = match state.dialect {
                Dialect::Containerd => {
                    let mut config = serde_json::json!({ "containerd": { "snapshotter": "overlayfs" } });
                    if let Some(image) = &state.sandbox_image {
                        config["sandboxImage"] = serde_json::Value::String(image.clone());
                    }
                    Some(config)
                }
                // The runtime config only: `sandboxImage` moved to the images
                // plugin, which Status does not report.
                Dialect::Containerd2 => Some(serde_json::json!({
                    "containerd": { "defaultRuntimeName": "runc", "runtimes": { "runc": { "sandboxer": "podsandbox" } } }
                })),
                Dialect::Crio126 => None,
                Dialect::Crio136 => {
                    let mut config = serde_json::json!({ "storageDriver": "overlay", "cgroupDriver": "cgroupfs" });
                    if let Some(image) = &state.sandbox_image {
                        config["sandboxImage"] = serde_json::Value::String(image.clone());
                    }
                    Some(config)
                }
            };
            if let Some(config) = config {
                info.insert("config".to_string(), config.to_string());
            }
        }
        drop(state);
        Ok(Response::new(proto::StatusResponse {
            status: Some(proto::RuntimeStatus {
                conditions: vec![ready("RuntimeReady"), ready("NetworkReady")],
            }),
            info,
        }))
    }

    type GetContainerEventsStream = std::pin::Pin<Box<dyn futures_core::Stream<Item = EventItem> + Send>>;

    async fn get_container_events(
        &self,
        _: Request<proto::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        self.enter("GetContainerEvents").await?;
        let (sender, mut receiver) = mpsc::channel(EVENT_BUFFER);
        {
            let mut state = self.fake.lock();
            match state.events {
                Events::Unimplemented => return Err(Status::unimplemented("unknown method GetContainerEvents")),
                Events::EndAtOnce => {
                    return Ok(Response::new(Box::pin(tokio_stream::empty())));
                }
                Events::Broadcast | Events::Shared => {}
            }
            for event in std::mem::take(&mut state.backlog) {
                let _ = sender.try_send(Ok(event));
            }
            // Subscribed before answering, so every event emitted after the
            // client asked reaches it.
            state.subscribers.push(sender);
        }
        // Like every real runtime: no response (headers) before the first
        // event.
        let first = tokio::select! {
            first = receiver.recv() => first,
            () = self.stop.cancelled() => None,
        };
        let Some(first) = first else {
            return Err(Status::unavailable("fake runtime is shutting down"));
        };
        // Stopping the server ends the stream.
        let stream = futures_util::StreamExt::take_until(
            tokio_stream::StreamExt::chain(tokio_stream::once(first), ReceiverStream::new(receiver)),
            self.stop.clone().cancelled_owned(),
        );
        Ok(Response::new(Box::pin(stream)))
    }
}

#[tonic::async_trait]
impl ImageService for Service {
    async fn list_images(
        &self,
        request: Request<proto::ListImagesRequest>,
    ) -> Result<Response<proto::ListImagesResponse>, Status> {
        self.enter("ListImages").await?;
        let wanted = request
            .into_inner()
            .filter
            .and_then(|f| f.image)
            .map(|spec| spec.image)
            .unwrap_or_default();
        let state = self.fake.lock();
        let images = state
            .node
            .images()
            .iter()
            .chain(&state.extra_listings)
            .filter(|image| wanted.is_empty() || names(image, &wanted))
            .map(|image| image_to_proto(image, &state))
            .collect();
        Ok(Response::new(proto::ListImagesResponse { images }))
    }

    /// Like containerd, an unknown image is answered OK with no image.
    async fn image_status(
        &self,
        request: Request<proto::ImageStatusRequest>,
    ) -> Result<Response<proto::ImageStatusResponse>, Status> {
        self.enter("ImageStatus").await?;
        let request = request.into_inner();
        let reference = request.image.map(|spec| spec.image).unwrap_or_default();
        let state = self.fake.lock();
        let found = state.find_image(&reference);
        let info = match found.and_then(|image| state.node.layers(&image.id)) {
            Some(layers) if request.verbose => verbose_image_info(layers, state.dialect),
            _ => HashMap::new(),
        };
        let image = found.map(|image| image_to_proto(image, &state));
        Ok(Response::new(proto::ImageStatusResponse { image, info }))
    }

    async fn remove_image(
        &self,
        request: Request<proto::RemoveImageRequest>,
    ) -> Result<Response<proto::RemoveImageResponse>, Status> {
        self.enter("RemoveImage").await?;
        let reference = request.into_inner().image.map(|spec| spec.image).unwrap_or_default();
        if reference.is_empty() {
            return Err(Status::invalid_argument("no image reference given"));
        }
        if self.fake.lock().dialect.is_crio() && reference.starts_with("sha256:") {
            // CRI-O reads `sha256:<hex>` as a short name, as 1.36.3 answers.
            return Err(Status::unknown(format!(
                "short-name {reference:?} did not resolve to an alias and no unqualified-search registries are defined"
            )));
        }
        let hook = self.fake.lock().before_remove.clone();
        if let Some(hook) = hook {
            hook(&reference);
        }
        let latency = self.fake.lock().remove_latency;
        match latency {
            // The removal goes on in the runtime whether or not the caller
            // still waits for it.
            Some(latency) => {
                let fake = self.fake.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(latency).await;
                    remove_now(&fake, &reference)
                })
                .await
                .map_err(|err| Status::internal(format!("removal task failed: {err}")))?
            }
            None => remove_now(&self.fake, &reference),
        }
    }

    async fn pull_image(
        &self,
        _: Request<proto::PullImageRequest>,
    ) -> Result<Response<proto::PullImageResponse>, Status> {
        self.unimplemented("PullImage").await
    }

    async fn image_fs_info(
        &self,
        _: Request<proto::ImageFsInfoRequest>,
    ) -> Result<Response<proto::ImageFsInfoResponse>, Status> {
        self.enter("ImageFsInfo").await?;
        let state = self.fake.lock();
        let used = state
            .node
            .images()
            .iter()
            .fold(0u64, |sum, i| sum.saturating_add(i.size));
        Ok(Response::new(proto::ImageFsInfoResponse {
            image_filesystems: vec![proto::FilesystemUsage {
                timestamp: unix_nanos(),
                fs_id: Some(proto::FilesystemIdentifier {
                    mountpoint: state.image_fs_mount.clone(),
                }),
                used_bytes: Some(proto::UInt64Value { value: used }),
                inodes_used: None,
            }],
            container_filesystems: state
                .container_fs_mount
                .iter()
                .map(|mount| proto::FilesystemUsage {
                    timestamp: unix_nanos(),
                    fs_id: Some(proto::FilesystemIdentifier {
                        mountpoint: mount.clone(),
                    }),
                    used_bytes: Some(proto::UInt64Value { value: 0 }),
                    inodes_used: None,
                })
                .collect(),
        }))
    }
}
