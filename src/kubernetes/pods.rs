//! The pods bound to this node, watched: every image such a pod names
//! becomes a keep rule ([`Protections`], reason `pod`) until the pod is gone.
//!
//! The CRI shows a container only once it is created, so between a pod
//! landing on the node and its containers being created (an init container
//! that runs for a minute, volumes that mount slowly, a sandbox that waits)
//! the images it will run look unused to the runtime. The pods' specs say
//! which they are.
//!
//! One watch (`spec.nodeName=<node>`), a cache of the images each pod names
//! (not the pods themselves), no list per cycle. The cycle never waits on it:
//! it reads the latest [`Protections`] from a `tokio::sync::watch` channel.
//! While the API server cannot be watched the last known pods keep
//! protecting for `kubernetes.pods_stale_after`, then only the runtime's
//! containers do, until the watch lists again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::engine::sinks::KubernetesMetrics;
use crate::policy::Protections;
use crate::time::sleep_until_some;

/// The images every pod bound to this node names, by `namespace/name`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodImages {
    pods: BTreeMap<String, Named>,
}

/// What one pod names: every image, and those of them the kubelet may pull
/// for it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Named {
    images: Vec<String>,
    pulled: Vec<String>,
}

impl PodImages {
    /// Notes `pod` as it is now: its images replace what it named before.
    /// Returns whether anything changed.
    pub fn apply(&mut self, pod: &Pod) -> bool {
        let Some(key) = key(pod) else { return false };
        let named = Named {
            images: images_of(pod),
            pulled: pulled_by(pod),
        };
        if self.pods.get(&key) == Some(&named) {
            return false;
        }
        self.pods.insert(key, named);
        true
    }

    /// Forgets `pod`. Returns whether it was known.
    pub fn delete(&mut self, pod: &Pod) -> bool {
        key(pod).is_some_and(|key| self.pods.remove(&key).is_some())
    }

    /// How many pods are known.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether no pod is known.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The pods known, `namespace/name`.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> {
        self.pods.keys().map(String::as_str)
    }

    /// The keep rules: each image a pod names, with the pod; and which of
    /// them no pod will pull.
    pub fn protections(&self) -> Protections {
        let pulled: BTreeSet<&str> = self
            .pods
            .values()
            .flat_map(|named| named.pulled.iter().map(String::as_str))
            .collect();
        Protections {
            references: self
                .pods
                .iter()
                .flat_map(|(pod, named)| named.images.iter().map(move |image| (image.clone(), pod.clone())))
                .collect(),
            never_pulled: self
                .pods
                .values()
                .flat_map(|named| named.images.iter())
                .filter(|image| !pulled.contains(image.as_str()))
                .cloned()
                .collect(),
        }
    }
}

/// `namespace/name`, or `None` for a pod without a name (never from the API
/// server).
fn key(pod: &Pod) -> Option<String> {
    let name = pod.metadata.name.as_deref()?;
    Some(format!(
        "{}/{name}",
        pod.metadata.namespace.as_deref().unwrap_or("default")
    ))
}

/// Every image `pod` names, once each: its containers', init containers' and
/// ephemeral containers' images, its image volumes' references, and the
/// image ids its statuses report (the image a tag resolved to when the
/// container was created: the tag may have moved since).
pub fn images_of(pod: &Pod) -> Vec<String> {
    let mut images: Vec<String> = Vec::new();
    if let Some(spec) = &pod.spec {
        spec_images(spec, |image, _| add_once(&mut images, image));
    }
    if let Some(PodStatus {
        container_statuses,
        init_container_statuses,
        ephemeral_container_statuses,
        ..
    }) = &pod.status
    {
        for status in [
            container_statuses,
            init_container_statuses,
            ephemeral_container_statuses,
        ]
        .into_iter()
        .flatten()
        .flatten()
        {
            // Docker-era statuses write `docker-pullable://` before it.
            let id = status.image_id.trim_start_matches("docker-pullable://").to_owned();
            add_once(&mut images, Some(&id));
        }
    }
    images
}

/// The images the kubelet may pull for `pod`: those its containers and
/// image volumes name without `imagePullPolicy: Never`, while it has not
/// ended (a Succeeded or Failed pod starts no container again).
pub fn pulled_by(pod: &Pod) -> Vec<String> {
    let ended = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .is_some_and(|phase| phase == "Succeeded" || phase == "Failed");
    let mut pulled: Vec<String> = Vec::new();
    if let Some(spec) = pod.spec.as_ref().filter(|_| !ended) {
        spec_images(spec, |image, policy| {
            if policy.map(String::as_str) != Some("Never") {
                add_once(&mut pulled, image);
            }
        });
    }
    pulled
}

/// Calls `visit` with each image `spec` names (containers', init and
/// ephemeral containers', image volumes' references) and its pull policy.
fn spec_images(spec: &PodSpec, mut visit: impl FnMut(Option<&String>, Option<&String>)) {
    let PodSpec {
        containers,
        init_containers,
        ephemeral_containers,
        volumes,
        ..
    } = spec;
    containers
        .iter()
        .chain(init_containers.iter().flatten())
        .for_each(|c| visit(c.image.as_ref(), c.image_pull_policy.as_ref()));
    ephemeral_containers
        .iter()
        .flatten()
        .for_each(|c| visit(c.image.as_ref(), c.image_pull_policy.as_ref()));
    volumes
        .iter()
        .flatten()
        .filter_map(|v| v.image.as_ref())
        .for_each(|i| visit(i.reference.as_ref(), i.pull_policy.as_ref()));
}

/// Adds `image`, trimmed, to `images` unless it is empty or already there.
fn add_once(images: &mut Vec<String>, image: Option<&String>) {
    if let Some(image) = image.map(|i| i.trim()).filter(|i| !i.is_empty())
        && !images.iter().any(|known| known == image)
    {
        images.push(image.to_owned());
    }
}

/// The pods bound to `node`, listed once.
pub async fn list(client: Client, node: &str) -> Result<PodImages, kube::Error> {
    let api: Api<Pod> = Api::all(client);
    let selector = format!("spec.nodeName={node}");
    let mut pods = PodImages::default();
    let mut params = kube::api::ListParams::default().fields(&selector).limit(500);
    loop {
        let page = api.list(&params).await?;
        page.items.iter().for_each(|pod| {
            pods.apply(pod);
        });
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(pods),
        }
    }
}

/// What the watch publishes: the keep rules, and whether the first listing
/// came in.
pub struct PodWatch {
    /// The latest keep rules (see [`crate::engine::Collector::protections_from`]).
    pub protections: watch::Receiver<Arc<Protections>>,
    /// True once the pods were listed (the first time).
    pub synced: watch::Receiver<bool>,
    /// The pods of the latest complete listing, `namespace/name`; `None`
    /// until the first.
    pub listed: watch::Receiver<Option<Vec<String>>>,
}

/// Watches the pods bound to `node` until `shutdown`, in a task of its own.
pub fn spawn(
    client: Client,
    node: &str,
    stale_after: Duration,
    metrics: KubernetesMetrics,
    shutdown: CancellationToken,
) -> PodWatch {
    let (protections_tx, protections) = watch::channel(Arc::new(Protections::default()));
    let (synced_tx, synced) = watch::channel(false);
    let (listed_tx, listed) = watch::channel(None);
    metrics.set_pods_watch_enabled();
    let state = WatchState::new(stale_after, protections_tx, synced_tx, metrics).listed_to(listed_tx);
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .timeout(super::WATCH_TIMEOUT.as_secs() as u32);
    let node = node.to_owned();
    tokio::spawn(async move {
        info!(node, "watching the pods bound to this node");
        watch_pods(api, config, state, shutdown).await;
    });
    PodWatch {
        protections,
        synced,
        listed,
    }
}

/// The watch's loop. A watch that fails is dropped and, after a backoff,
/// started again from a full listing: resuming from the last resource
/// version would bring the changes in without a sign that the cache is
/// whole again, and the cache would be called down until the next relisting
/// (the API server's restart is such a failure). One node's pods are a
/// small listing.
///
/// A listing that takes longer than [`LISTING_TIMEOUT`] (an API server that
/// accepts and never answers, or stops halfway) is such a failure too: the
/// watch is dropped and started again. Each watch request is bounded by the
/// client ([`super::REQUEST_TIMEOUT`] for its answer), and a watch that goes
/// silent by the watcher (its `timeoutSeconds` and a margin).
async fn watch_pods(api: Api<Pod>, config: watcher::Config, mut state: WatchState, shutdown: CancellationToken) {
    let start = || Box::pin(watcher::watcher(api.clone(), config.clone()));
    let mut backoff = watcher::DefaultBackoff::default();
    let mut stream = Some(start());
    let mut retry_at = None;
    // While a listing is under way: when it must be done.
    let mut listed_by = Some(Instant::now() + LISTING_TIMEOUT);
    loop {
        let stale_at = (!state.up && !state.stale).then(|| state.down_since + state.stale_after);
        let failure = tokio::select! {
            () = shutdown.cancelled() => break,
            () = sleep_until_some(stale_at) => {
                state.went_stale();
                None
            }
            () = sleep_until_some(retry_at) => {
                retry_at = None;
                stream = Some(start());
                listed_by = Some(Instant::now() + LISTING_TIMEOUT);
                None
            }
            () = sleep_until_some(listed_by) => Some(format!(
                "the pods bound to this node were not listed within {}",
                humantime::format_duration(LISTING_TIMEOUT)
            )),
            item = next_or_pending(&mut stream) => match item {
                Some(Ok(event)) => {
                    match event {
                        Event::Init => listed_by = Some(Instant::now() + LISTING_TIMEOUT),
                        Event::InitDone => {
                            listed_by = None;
                            backoff.reset();
                        }
                        _ => {}
                    }
                    state.event(event);
                    None
                }
                Some(Err(err)) => Some(err.to_string()),
                None => break,
            },
        };
        if let Some(err) = failure {
            state.failed(&err);
            stream = None;
            listed_by = None;
            let delay = backoff.next().unwrap_or(MAX_RETRY);
            retry_at = Some(Instant::now() + delay);
        }
    }
}

/// How long one listing of the pods (every page) may take before the watch
/// is dropped and started again.
const LISTING_TIMEOUT: Duration = super::REQUEST_TIMEOUT;

/// The longest wait between two attempts to watch (the watcher's own
/// backoff caps at this).
const MAX_RETRY: Duration = Duration::from_secs(30);

/// The stream's next item, or never while there is no stream.
async fn next_or_pending<S: futures_core::Stream + Unpin>(stream: &mut Option<S>) -> Option<S::Item> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// The watch's cache and what it has said.
struct WatchState {
    pods: PodImages,
    /// A listing in progress (after `Init`, until `InitDone`).
    listing: Option<PodImages>,
    /// Listed and watching.
    up: bool,
    down_since: Instant,
    /// The last known pods were dropped for staleness.
    stale: bool,
    stale_after: Duration,
    protections: watch::Sender<Arc<Protections>>,
    synced: watch::Sender<bool>,
    listed: Option<watch::Sender<Option<Vec<String>>>>,
    metrics: KubernetesMetrics,
}

impl WatchState {
    /// Each complete listing's pods go to `listed` too.
    fn listed_to(mut self, listed: watch::Sender<Option<Vec<String>>>) -> Self {
        self.listed = Some(listed);
        self
    }

    /// Nothing listed yet, down since now.
    fn new(
        stale_after: Duration,
        protections: watch::Sender<Arc<Protections>>,
        synced: watch::Sender<bool>,
        metrics: KubernetesMetrics,
    ) -> Self {
        WatchState {
            pods: PodImages::default(),
            listing: None,
            up: false,
            down_since: Instant::now(),
            stale: false,
            stale_after,
            protections,
            synced,
            listed: None,
            metrics,
        }
    }

    fn event(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.listing = Some(PodImages::default()),
            Event::InitApply(pod) => {
                if let Some(listing) = &mut self.listing {
                    listing.apply(&pod);
                }
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                if !self.up {
                    info!(
                        pods = listed.len(),
                        "pods bound to this node listed: their images are kept"
                    );
                }
                if let Some(sender) = &self.listed {
                    sender.send_replace(Some(listed.keys().map(str::to_owned).collect()));
                }
                self.pods = listed;
                self.up = true;
                self.stale = false;
                self.publish();
                self.synced.send_replace(true);
            }
            Event::Apply(pod) => {
                if self.pods.apply(&pod) {
                    debug!(pod = key(&pod).unwrap_or_default(), "pod bound to this node");
                    self.publish();
                }
            }
            Event::Delete(pod) => {
                if self.pods.delete(&pod) {
                    debug!(pod = key(&pod).unwrap_or_default(), "pod gone from this node");
                    self.publish();
                }
            }
        }
    }

    fn failed(&mut self, err: &str) {
        if self.up {
            warn!(
                error = %err,
                keep_for = %humantime::format_duration(self.stale_after),
                "cannot watch the pods bound to this node: the last known pods keep their images meanwhile"
            );
            self.up = false;
            self.down_since = Instant::now();
        } else {
            debug!(error = %err, "watching the pods bound to this node: still failing");
        }
        self.listing = None;
        self.publish_metrics();
    }

    fn went_stale(&mut self) {
        self.stale = true;
        if !self.pods.is_empty() {
            warn!(
                pods = self.pods.len(),
                after = %humantime::format_duration(self.stale_after),
                "the pods bound to this node could not be watched for kubernetes.pods_stale_after: \
                 only the runtime's containers protect images until the watch returns"
            );
        }
        self.pods = PodImages::default();
        self.publish();
    }

    fn publish(&self) {
        self.protections.send_replace(Arc::new(self.pods.protections()));
        self.publish_metrics();
    }

    fn publish_metrics(&self) {
        self.metrics.set_pods_watch(self.up, self.pods.len(), self.stale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Image;
    use crate::outputs::metrics::Metrics;

    fn image(id: &str, tags: &[&str], digests: &[&str]) -> Image {
        Image {
            id: id.to_owned(),
            repo_tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            repo_digests: digests.iter().map(|d| (*d).to_owned()).collect(),
            size: 1_000_000,
            pinned: false,
        }
    }

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).expect("a pod")
    }

    const STARTING: &str = r#"
metadata: {name: web, namespace: shop}
spec:
  nodeName: node-1
  initContainers: [{name: wait, image: "busybox:1.36"}]
  containers:
    - {name: app, image: nginx}
    - {name: side, image: "registry.example:5000/tools/side@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}
  ephemeralContainers: [{name: debug, image: "nicolaka/netshoot:v0.13"}]
  volumes:
    - {name: models, image: {reference: "quay.io/models/llm:v2"}}
    - {name: scratch, emptyDir: {}}
status:
  containerStatuses:
    - {name: app, image: nginx, imageID: "docker.io/library/nginx@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", ready: false, restartCount: 0}
"#;

    #[test]
    fn every_image_a_pod_names_is_read_once() {
        assert_eq!(
            images_of(&pod(STARTING)),
            [
                "nginx",
                "registry.example:5000/tools/side@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                "busybox:1.36",
                "nicolaka/netshoot:v0.13",
                "quay.io/models/llm:v2",
                "docker.io/library/nginx@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
            ]
        );
    }

    #[test]
    fn a_pods_images_are_matched_as_the_runtime_names_them() {
        let mut pods = PodImages::default();
        assert!(pods.apply(&pod(STARTING)));
        assert!(!pods.apply(&pod(STARTING)), "the same pod again changes nothing");
        let side =
            "registry.example:5000/tools/side@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        let listed: Vec<Image> = vec![
            image("sha256:01", &["docker.io/library/nginx:latest"], &[]),
            image("sha256:02", &["docker.io/library/busybox:1.36"], &[]),
            image("sha256:03", &["quay.io/models/llm:v2"], &[]),
            image("sha256:04", &[], &[side]),
            image("sha256:05", &["docker.io/library/nginx:1.27"], &[]),
            image("sha256:06", &["docker.io/library/busybox:1.37"], &[]),
        ];
        let protections = pods.protections();
        let named: Vec<(usize, &str)> = protections.pods_naming(&listed);
        assert_eq!(
            named,
            [(0, "shop/web"), (1, "shop/web"), (2, "shop/web"), (3, "shop/web")]
        );
    }

    #[test]
    fn images_no_pod_will_pull_are_kept_and_named_so() {
        let mut pods = PodImages::default();
        // Put on the node by hand (the test bed's workloads, air-gapped
        // nodes): the kubelet never pulls them.
        pods.apply(&pod(r#"
metadata: {name: local, namespace: ci}
spec:
  containers:
    - {name: a, image: "local/app:1", imagePullPolicy: Never}
    - {name: b, image: "shared:1", imagePullPolicy: Never}
    - {name: c, image: "pulled:1"}
  volumes:
    - {name: v, image: {reference: "local/model:1", pullPolicy: Never}}
"#));
        // Another pod pulls shared:1.
        pods.apply(&pod(r#"
metadata: {name: other, namespace: ci}
spec:
  containers: [{name: a, image: "shared:1", imagePullPolicy: IfNotPresent}]
"#));
        // A Job's pod that ended starts no container again.
        pods.apply(&pod(r#"
metadata: {name: job-1, namespace: ci}
spec:
  containers: [{name: a, image: "job:1", imagePullPolicy: Always}]
status: {phase: Succeeded}
"#));
        let protections = pods.protections();
        let kept: BTreeSet<&str> = protections.references.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(
            kept,
            BTreeSet::from(["local/app:1", "shared:1", "pulled:1", "local/model:1", "job:1"]),
            "every image named is kept"
        );
        assert_eq!(
            protections.never_pulled,
            BTreeSet::from(["local/app:1".to_owned(), "local/model:1".to_owned(), "job:1".to_owned()])
        );
    }

    #[test]
    fn a_deleted_pod_protects_nothing() {
        let mut pods = PodImages::default();
        pods.apply(&pod(STARTING));
        pods.apply(&pod(
            "metadata: {name: job-1, namespace: ci}\nspec: {containers: [{name: c, image: \"alpine:3\"}]}",
        ));
        assert_eq!(pods.len(), 2);
        assert!(pods.delete(&pod(STARTING)));
        assert!(!pods.delete(&pod(STARTING)));
        let protections = pods.protections();
        let images: Vec<&str> = protections.references.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(images, ["alpine:3"]);
    }

    fn watch_state(stale_after: Duration) -> (WatchState, watch::Receiver<Arc<Protections>>, Arc<Metrics>) {
        let (protections, receiver) = watch::channel(Arc::new(Protections::default()));
        let metrics = Arc::new(Metrics::new());
        let state = WatchState::new(
            stale_after,
            protections,
            watch::channel(false).0,
            KubernetesMetrics::new(&metrics),
        );
        (state, receiver, metrics)
    }

    fn named(receiver: &watch::Receiver<Arc<Protections>>) -> Vec<String> {
        receiver
            .borrow()
            .references
            .iter()
            .map(|(image, _)| image.clone())
            .collect()
    }

    #[tokio::test]
    async fn the_last_known_pods_protect_through_an_outage_until_they_are_stale() {
        let (mut state, receiver, _metrics) = watch_state(Duration::from_secs(3600));
        let web = pod("metadata: {name: web}\nspec: {containers: [{name: c, image: \"web:1\"}]}");
        // A listing protects only once it is complete.
        state.event(Event::Init);
        state.event(Event::InitApply(web.clone()));
        assert!(named(&receiver).is_empty());
        state.event(Event::InitDone);
        assert_eq!(named(&receiver), ["web:1"]);
        assert!(state.up);
        // The API server goes away: the pods stay.
        state.failed("the API server went away");
        assert!(!state.up);
        assert_eq!(named(&receiver), ["web:1"]);
        // Past pods_stale_after they go, and it says so.
        state.went_stale();
        assert!(named(&receiver).is_empty());
        assert!(state.stale);
        // A relisting brings them back, without the pods deleted meanwhile.
        let job = pod("metadata: {name: job}\nspec: {containers: [{name: c, image: \"job:2\"}]}");
        state.event(Event::Init);
        state.event(Event::InitApply(job));
        state.event(Event::InitDone);
        assert_eq!(named(&receiver), ["job:2"]);
        assert!(state.up && !state.stale);
        // Then deletions as they come.
        state.event(Event::Delete(pod("metadata: {name: job}\nspec: {containers: []}")));
        assert!(named(&receiver).is_empty());
    }

    #[test]
    fn a_pod_whose_image_changes_protects_the_new_one() {
        let mut pods = PodImages::default();
        pods.apply(&pod(
            "metadata: {name: a}\nspec: {containers: [{name: c, image: \"app:v1\"}]}",
        ));
        assert!(pods.apply(&pod(
            "metadata: {name: a}\nspec: {containers: [{name: c, image: \"app:v2\"}]}"
        )));
        assert_eq!(
            pods.protections().references,
            [("app:v2".to_owned(), "default/a".to_owned())]
        );
    }

    use crate::kubernetes::fake_api::{self, wait_until};

    /// The pod watch of `node-1` on `api`, served; pods stale after
    /// `stale_after` without a watch. Cancel the token to end it.
    async fn watch_on(
        api: &Arc<fake_api::cluster::FakeApi>,
        stale_after: Duration,
    ) -> (PodWatch, Arc<Metrics>, CancellationToken) {
        let url = api.serve().await;
        let client = super::super::client(kube::Config::new(url.parse().unwrap())).unwrap();
        let metrics = Arc::new(Metrics::new());
        let shutdown = CancellationToken::new();
        let watch = spawn(
            client,
            "node-1",
            stale_after,
            KubernetesMetrics::new(&metrics),
            shutdown.clone(),
        );
        (watch, metrics, shutdown)
    }

    /// The API server restarts while nothing changes on the node: the watch
    /// is whole again once it returns (a relisting, with what changed
    /// meanwhile), not called down until the next relisting.
    #[tokio::test]
    async fn after_the_api_server_returns_the_watch_is_up_again() {
        use std::sync::atomic::Ordering;

        let api = Arc::new(fake_api::cluster::FakeApi::default());
        api.images.lock().unwrap().push("web:1");
        let (watch, metrics, shutdown) = watch_on(&api, Duration::from_secs(3600)).await;
        let up = |metrics: &Metrics| {
            metrics
                .encode()
                .lines()
                .any(|line| line == "imagegc_kubernetes_pods_watch_up 1")
        };
        wait_until("the first listing", || *watch.synced.borrow()).await;
        assert!(up(&metrics));
        assert_eq!(named(&watch.protections), ["web:1"]);

        api.go_down();
        wait_until("the watch down", || !up(&metrics)).await;
        assert_eq!(
            named(&watch.protections),
            ["web:1"],
            "the last known pods keep protecting"
        );
        // A pod is bound meanwhile; the API server returns.
        api.images.lock().unwrap().push("job:2");
        api.come_up();
        wait_until("the watch up again", || up(&metrics)).await;
        assert_eq!(named(&watch.protections), ["web:1", "job:2"]);
        assert_eq!(api.lists.load(Ordering::SeqCst), 2);
        shutdown.cancel();
    }

    /// A watch on a node where nothing changes is quiet for as long as it
    /// is open: the client's bounds must not take that for a hang. It asks
    /// the API server to end it after `WATCH_TIMEOUT` and watches on from
    /// where it was, without listing again.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_watch_stays_up_without_listing_again() {
        use std::sync::atomic::Ordering;

        let api = Arc::new(fake_api::cluster::FakeApi::default());
        api.images.lock().unwrap().push("web:1");
        let (watch, metrics, shutdown) = watch_on(&api, Duration::from_secs(60)).await;
        fake_api::keep_time_moving();
        wait_until("the first listing", || *watch.synced.borrow()).await;
        tokio::time::sleep(Duration::from_secs(15 * 60)).await;
        assert!(metric(&metrics, "imagegc_kubernetes_pods_watch_up 1"));
        assert_eq!(named(&watch.protections), ["web:1"]);
        assert_eq!(api.lists.load(Ordering::SeqCst), 1, "never listed again");
        let watches = api.watch_queries.lock().unwrap().clone();
        assert!(
            (2..=4).contains(&watches.len()),
            "one watch per timeoutSeconds and a margin: {watches:?}"
        );
        assert!(watches.iter().all(|q| q.contains("timeoutSeconds=290")), "{watches:?}");
        shutdown.cancel();
    }

    fn metric(metrics: &Metrics, line: &str) -> bool {
        metrics.encode().lines().any(|l| l == line)
    }

    /// A started watch says so before anything is listed, so that an alert
    /// on a watch that is down fires only where one runs: without
    /// `[kubernetes]` (or `protect_pods`) `imagegc_kubernetes_pods_watch_up`
    /// is 0 too.
    #[tokio::test]
    async fn a_started_watch_says_it_runs_before_the_api_server_answers() {
        let api = Arc::new(fake_api::cluster::FakeApi::default());
        api.go_down();
        let fresh = Metrics::new();
        crate::engine::sinks::register_every_family(&fresh);
        assert!(metric(&fresh, "imagegc_kubernetes_pods_watch_enabled 0"));
        let (_watch, metrics, shutdown) = watch_on(&api, Duration::from_secs(3600)).await;
        assert!(metric(&metrics, "imagegc_kubernetes_pods_watch_enabled 1"));
        assert!(metric(&metrics, "imagegc_kubernetes_pods_watch_up 0"));
        shutdown.cancel();
    }

    /// The API server accepts the listing and never answers it (a control
    /// plane lost without a reset, a load balancer that dropped its state):
    /// the listing is given up, and once the API server answers again the
    /// watch lists anew and is up and current, not stale until a restart.
    #[tokio::test(start_paused = true)]
    async fn a_listing_that_is_never_answered_is_made_again() {
        a_listing_that_hangs_is_made_again(|api| &api.hang_lists).await;
    }

    /// The same with a listing that stops halfway: its status and headers
    /// come, its body never does. The watch's own bound on a listing ends
    /// it, not the connection's read timeout minutes later.
    #[tokio::test(start_paused = true)]
    async fn a_listing_that_stops_halfway_is_made_again() {
        a_listing_that_hangs_is_made_again(|api| &api.stall_lists).await;
    }

    async fn a_listing_that_hangs_is_made_again(
        hang: impl Fn(&fake_api::cluster::FakeApi) -> &std::sync::atomic::AtomicBool,
    ) {
        use std::sync::atomic::Ordering;

        let api = Arc::new(fake_api::cluster::FakeApi::default());
        api.images.lock().unwrap().push("web:1");
        hang(&api).store(true, Ordering::SeqCst);
        let (watch, metrics, shutdown) = watch_on(&api, Duration::from_secs(10)).await;
        fake_api::keep_time_moving();
        wait_until("a listing sent", || api.hung.load(Ordering::SeqCst) == 1).await;
        wait_until("the pods stale", || metric(&metrics, "imagegc_kubernetes_pods_stale 1")).await;

        // The API server answers again (the hung listing stays unanswered).
        hang(&api).store(false, Ordering::SeqCst);
        wait_until("the watch up again", || {
            metric(&metrics, "imagegc_kubernetes_pods_watch_up 1")
        })
        .await;
        assert!(metric(&metrics, "imagegc_kubernetes_pods_stale 0"));
        assert!(metric(&metrics, "imagegc_kubernetes_pods 1"));
        assert!(*watch.synced.borrow());
        assert_eq!(named(&watch.protections), ["web:1"]);
        assert_eq!(api.lists.load(Ordering::SeqCst), 1, "listed anew, once");
        shutdown.cancel();
    }
}
