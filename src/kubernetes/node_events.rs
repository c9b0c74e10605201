//! Events on this node's Node object: what an operator must know, where
//! they look first (`kubectl describe node`, `kubectl get events`).
//!
//! A [`NodeEventSink`] is one more output of the engine's events: it turns
//! the start of an episode into one [`NodeEvent`] and hands it to a task
//! that posts it, never waiting on the API server (a full queue drops the
//! event and counts it). Reasons, in the kubelet's style:
//! - `FreeDiskSpaceFailed` (Warning): images cannot bring usage to the low
//!   threshold, with the bytes that are not images. The kubelet's own reason
//!   for the same, so alerts written for it keep working after the hand-over.
//! - `ImageGCFailed` (Warning): cycles fail (the kubelet's reason).
//! - `ImageRepullThrash` (Warning): an image imagegc removed was pulled
//!   again within `gc.thrash_window`.
//! - `SandboxImageUnknown` (Warning): no source names the sandbox image, or
//!   the configured one matches no image.
//! - `ImagesRemovedByOthers` (Warning): images went that imagegc did not
//!   ask to remove (the kubelet's own image GC still on, another
//!   collector). An episode starts with the first such removal after
//!   [`OTHERS_QUIET`] without one, and lasts until that long passes
//!   without one; its event names the images and bytes found at its start
//!   (`imagegc_images_removed_by_others_total` counts them all).
//!
//! One event per episode, and at most one per reason every
//! [`MIN_INTERVAL`]. A reason seen again updates the event posted before
//! (its count and last time, as the kubelet's event correlator does) rather
//! than adding one. Removals are not events: they are counted in
//! `image_garbage_collected_total`, and a busy node removes hundreds a day.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Event as KubeEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::engine::sinks::{KubernetesMetrics, NodeEventReason, NodeEventResult};
use crate::engine::{Event, Outcome, Sink};

/// The least time between two events of one reason: an episode that ends
/// and starts again at every cycle is said once per ten minutes (the
/// kubelet's event correlator uses the same window).
pub const MIN_INTERVAL: Duration = Duration::from_secs(600);

/// How long without a removal by others ends their episode: the kubelet
/// collects every 5 minutes, so a kubelet collecting beside imagegc is one
/// episode, not one event per round.
pub const OTHERS_QUIET: Duration = Duration::from_secs(3600);

/// Events waiting for the poster: more are dropped (and counted).
const QUEUE: usize = 16;

/// How long one call to the API server may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The first wait before posting an event again, doubling up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Whether a call may succeed if made again: the API server was busy or
/// unavailable, or could not be reached.
fn transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// The namespace of node events (as the kubelet posts them).
const NAMESPACE: &str = "default";

/// One event to post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// Its reason.
    pub reason: NodeEventReason,
    /// What a person reads.
    pub message: String,
}

/// Which episodes are on, and when each reason was last said.
#[derive(Debug, Default)]
pub struct Episodes {
    unreachable: bool,
    failing: bool,
    sandbox_said: bool,
    /// When the last removal by others was found.
    others_last: Option<Instant>,
    said_at: HashMap<NodeEventReason, Instant>,
}

impl Episodes {
    /// The event to post for `event` at `now`, if it starts an episode
    /// and its reason was not said within [`MIN_INTERVAL`].
    pub fn on(&mut self, event: &Event<'_>, now: Instant) -> Option<NodeEvent> {
        let (reason, message) = match event {
            Event::SpaceUnreachable { outlook: Some(o), .. } => {
                if std::mem::replace(&mut self.unreachable, true) {
                    return None;
                }
                let could = if o.could_free == u64::MAX {
                    "an unknown amount (some sizes are not reported)".to_owned()
                } else {
                    format!("{} bytes at most", o.could_free)
                };
                (
                    NodeEventReason::FreeDiskSpaceFailed,
                    format!(
                        "Images cannot bring image filesystem usage down to the low threshold: {} bytes must \
                         be freed, removable images free {could}; {} bytes of the filesystem are not images",
                        o.bytes_to_free, o.not_image_bytes
                    ),
                )
            }
            Event::SpaceUnreachable { outlook: None, .. } => {
                self.unreachable = false;
                return None;
            }
            Event::CycleFinished(report) => match &report.outcome {
                Outcome::Failed(err) => {
                    if std::mem::replace(&mut self.failing, true) {
                        return None;
                    }
                    (
                        NodeEventReason::ImageGCFailed,
                        format!("Image garbage collection failed: {err}"),
                    )
                }
                Outcome::Interrupted => return None,
                Outcome::Success | Outcome::LowNotReached { .. } => {
                    self.failing = false;
                    return None;
                }
            },
            Event::Repulled { image, removed_ago, .. } => (
                NodeEventReason::ImageRepullThrash,
                format!(
                    "Image {} was pulled again {} after imagegc removed it: the disk budget may be too small \
                     for this node's images",
                    image.repo_tags.first().unwrap_or(&image.id),
                    humantime::format_duration(Duration::from_secs(removed_ago.as_secs()))
                ),
            ),
            Event::RemovedByOthers { images, .. } => {
                let last = self.others_last.replace(now);
                if last.is_some_and(|last| now.saturating_duration_since(last) < OTHERS_QUIET) {
                    return None;
                }
                let bytes: u64 = images.iter().map(|i| i.size).sum();
                (
                    NodeEventReason::ImagesRemovedByOthers,
                    format!(
                        "{} image(s) ({bytes} bytes) were removed without imagegc asking: the kubelet's own image \
                         GC (or another collector) runs beside imagegc. Keep imagegc's thresholds below the \
                         kubelet's imageGCHighThresholdPercent, or turn the kubelet's image GC off",
                        images.len()
                    ),
                )
            }
            Event::SandboxUnnamed | Event::SandboxConfiguredUnmatched(_) => {
                if std::mem::replace(&mut self.sandbox_said, true) {
                    return None;
                }
                let message = match event {
                    Event::SandboxConfiguredUnmatched(configured) => format!(
                        "runtime.sandbox_image {configured:?} matches no image: images never used by a \
                         container are kept, as one of them may be the sandbox image"
                    ),
                    _ => "The runtime names no sandbox image: images never used by a container are kept, as \
                          one of them may be the sandbox image (set runtime.sandbox_image)"
                        .to_owned(),
                };
                (NodeEventReason::SandboxImageUnknown, message)
            }
            _ => return None,
        };
        if let Some(at) = self.said_at.get(&reason)
            && now.saturating_duration_since(*at) < MIN_INTERVAL
        {
            return None;
        }
        self.said_at.insert(reason, now);
        Some(NodeEvent { reason, message })
    }
}

/// The engine's events, as events on the Node (see the module).
pub struct NodeEventSink {
    episodes: Mutex<Episodes>,
    queue: mpsc::Sender<NodeEvent>,
    metrics: KubernetesMetrics,
}

impl Sink for NodeEventSink {
    fn emit(&self, event: &Event<'_>) {
        let posted = self
            .episodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .on(event, Instant::now());
        if let Some(event) = posted {
            let reason = event.reason;
            if self.queue.try_send(event).is_err() {
                warn!(
                    reason = reason.as_str(),
                    "node event dropped: the API server is not keeping up"
                );
                self.metrics.node_event(reason, NodeEventResult::Dropped);
            }
        }
    }
}

/// Starts the poster for `node` and returns the sink that feeds it.
pub fn spawn(client: Client, node: &str, metrics: KubernetesMetrics, shutdown: CancellationToken) -> NodeEventSink {
    let (queue, events) = mpsc::channel(QUEUE);
    let poster = Poster {
        api: Api::namespaced(client, NAMESPACE),
        node: node.to_owned(),
        posted: HashMap::new(),
        metrics: metrics.clone(),
    };
    tokio::spawn(poster.run(events, shutdown));
    NodeEventSink {
        episodes: Mutex::new(Episodes::default()),
        queue,
        metrics,
    }
}

/// Posts events, one at a time.
struct Poster {
    api: Api<KubeEvent>,
    node: String,
    /// The event posted for each reason, by name, and its count.
    posted: HashMap<NodeEventReason, (String, i32)>,
    metrics: KubernetesMetrics,
}

impl Poster {
    async fn run(mut self, mut events: mpsc::Receiver<NodeEvent>, shutdown: CancellationToken) {
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                event = events.recv() => match event {
                    Some(event) => event,
                    None => return,
                },
            };
            let reason = event.reason;
            let result = tokio::select! {
                () = shutdown.cancelled() => return,
                result = tokio::time::timeout(CALL_TIMEOUT, self.post_retrying(&event)) => {
                    result.unwrap_or_else(|_| Err("no answer within 10s".to_owned()))
                }
            };
            match result {
                Ok(name) => {
                    info!(reason = reason.as_str(), event = name, "node event posted");
                    self.metrics.node_event(reason, NodeEventResult::Posted);
                }
                Err(err) => {
                    warn!(reason = reason.as_str(), error = err, "could not post a node event");
                    self.metrics.node_event(reason, NodeEventResult::Failed);
                }
            }
        }
    }

    /// Posts `event`, again after a short wait while the API server says
    /// it is busy or unavailable (429, 5xx) or cannot be reached; the
    /// caller's [`CALL_TIMEOUT`] ends the attempts. (The client does not
    /// retry by itself: see [`super::client`].)
    async fn post_retrying(&mut self, event: &NodeEvent) -> Result<String, String> {
        let mut wait = RETRY_FIRST;
        loop {
            match self.post(event.clone()).await {
                Err(err) if transient(&err) => {
                    debug!(reason = event.reason.as_str(), error = %err, "posting a node event: trying again");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
                result => return result.map_err(|err| err.to_string()),
            }
        }
    }

    /// Updates the event of this reason posted before, or creates one.
    async fn post(&mut self, event: NodeEvent) -> Result<String, kube::Error> {
        let now = Timestamp::now();
        if let Some((name, count)) = self.posted.get(&event.reason).cloned() {
            let patch = serde_json::json!({
                "count": count + 1,
                "lastTimestamp": Time(now),
                "message": event.message,
            });
            match self
                .api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.posted.insert(event.reason, (name.clone(), count + 1));
                    return Ok(name);
                }
                // Events expire (an hour by default): post a new one.
                Err(kube::Error::Api(status)) if status.is_not_found() => {
                    debug!(event = name, "the node event to update has expired");
                }
                Err(err) => return Err(err),
            }
        }
        let name = format!("{}.{:x}", self.node, unix_nanos());
        let object = KubeEvent {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(self.node.clone()),
                // What the kubelet puts there for its own node events.
                uid: Some(self.node.clone()),
                ..ObjectReference::default()
            },
            reason: Some(event.reason.as_str().to_owned()),
            message: Some(event.message),
            type_: Some("Warning".to_owned()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            source: Some(EventSource {
                component: Some("imagegc".to_owned()),
                host: Some(self.node.clone()),
            }),
            reporting_component: Some("imagegc".to_owned()),
            reporting_instance: Some(self.node.clone()),
            ..KubeEvent::default()
        };
        self.api.create(&PostParams::default(), &object).await?;
        self.posted.insert(event.reason, (name.clone(), 1));
        Ok(name)
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "a unique name for a Node event, as the kubelet names its own"
)]
fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{CycleError, CycleReport};
    use crate::policy::{ImageBytes, ImageBytesSource, SpaceOutlook};
    use std::sync::Arc;

    fn outlook() -> SpaceOutlook {
        SpaceOutlook {
            bytes_to_free: 500,
            could_free: 100,
            could_free_once_aged: 0,
            first_aged_after: None,
            not_image_bytes: 9_000,
            image_bytes: ImageBytes {
                bytes: 1_000,
                source: ImageBytesSource::Listing,
            },
        }
    }

    fn unreachable(on: bool) -> Event<'static> {
        Event::SpaceUnreachable {
            outlook: on.then(outlook),
            thrash_window: Duration::from_secs(3600),
        }
    }

    #[test]
    fn images_that_cannot_reach_low_are_said_once_per_episode() {
        let mut episodes = Episodes::default();
        let t0 = Instant::now();
        let first = episodes.on(&unreachable(true), t0).expect("the episode starts");
        assert_eq!(first.reason, NodeEventReason::FreeDiskSpaceFailed);
        assert!(first.message.contains("500 bytes must be freed"), "{}", first.message);
        assert!(
            first.message.contains("9000 bytes of the filesystem are not images"),
            "{}",
            first.message
        );
        // Every cycle of the episode says it again to the engine's sinks.
        for minutes in 1..30 {
            assert_eq!(
                episodes.on(&unreachable(true), t0 + Duration::from_secs(60 * minutes)),
                None
            );
        }
        // It ends, and starts again within the interval: not said.
        assert_eq!(episodes.on(&unreachable(false), t0 + Duration::from_secs(100)), None);
        assert_eq!(episodes.on(&unreachable(true), t0 + Duration::from_secs(120)), None);
        // Later, a new episode is said.
        episodes.on(&unreachable(false), t0 + Duration::from_secs(700));
        assert!(episodes.on(&unreachable(true), t0 + Duration::from_secs(720)).is_some());
    }

    fn removed_by_others(images: &[crate::records::Unlisted]) -> Event<'_> {
        Event::RemovedByOthers {
            images,
            at: SystemTime::UNIX_EPOCH,
        }
    }

    /// The kubelet collecting beside imagegc removes a batch every 5
    /// minutes: one event for the episode, naming the first batch; another
    /// only after an hour without any.
    #[test]
    fn removals_by_others_are_said_once_per_episode() {
        let gone = |id: &str, size| crate::records::Unlisted {
            id: id.into(),
            tags: Default::default(),
            size,
            first_seen: SystemTime::UNIX_EPOCH,
        };
        let batch = [gone("a", 1_000), gone("b", 500)];
        let mut episodes = Episodes::default();
        let t0 = Instant::now();
        let first = episodes.on(&removed_by_others(&batch), t0).expect("the episode starts");
        assert_eq!(first.reason, NodeEventReason::ImagesRemovedByOthers);
        assert!(
            first
                .message
                .starts_with("2 image(s) (1500 bytes) were removed without imagegc asking"),
            "{}",
            first.message
        );
        // The kubelet's next rounds, 5 minutes apart, for two hours.
        for round in 1..=24 {
            let at = t0 + Duration::from_secs(300 * round);
            assert_eq!(episodes.on(&removed_by_others(&batch[..1]), at), None, "round {round}");
        }
        // An hour without one ends it; the next starts a new episode.
        let later = t0 + Duration::from_secs(300 * 24 + 3600);
        let second = episodes
            .on(&removed_by_others(&batch[1..]), later)
            .expect("a new episode");
        assert!(
            second.message.starts_with("1 image(s) (500 bytes)"),
            "{}",
            second.message
        );
    }

    #[test]
    fn failing_cycles_are_said_once_until_a_cycle_succeeds() {
        let mut episodes = Episodes::default();
        let t0 = Instant::now();
        let mut failed = CycleReport::new(false);
        failed.outcome = Outcome::Failed(Arc::new(CycleError::SandboxUnknown("no mount point".into())));
        let ok = CycleReport::new(false);
        let first = episodes.on(&Event::CycleFinished(&failed), t0).expect("said");
        assert_eq!(first.reason, NodeEventReason::ImageGCFailed);
        assert!(first.message.contains("no mount point"), "{}", first.message);
        assert_eq!(episodes.on(&Event::CycleFinished(&failed), t0 + MIN_INTERVAL * 2), None);
        assert_eq!(episodes.on(&Event::CycleFinished(&ok), t0 + MIN_INTERVAL * 2), None);
        assert!(
            episodes
                .on(&Event::CycleFinished(&failed), t0 + MIN_INTERVAL * 3)
                .is_some()
        );
    }

    #[test]
    fn removals_and_other_events_are_not_node_events() {
        let mut episodes = Episodes::default();
        let now = Instant::now();
        assert_eq!(episodes.on(&Event::CycleStarted, now), None);
        assert_eq!(episodes.on(&Event::Progress, now), None);
        assert_eq!(
            episodes.on(&Event::SandboxUnnamed, now).map(|e| e.reason),
            Some(NodeEventReason::SandboxImageUnknown)
        );
        assert_eq!(
            episodes.on(&Event::SandboxUnnamed, now + MIN_INTERVAL * 2),
            None,
            "said once"
        );
    }

    /// The API server answers 503 twice, then takes the event: it is
    /// posted once, within the call's time. A refusal (403) is not tried
    /// again.
    #[tokio::test]
    async fn an_event_is_posted_again_while_the_api_server_is_unavailable() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use crate::kubernetes::fake_api::{json, serve, unavailable};

        let posts = Arc::new(AtomicUsize::new(0));
        let forbid = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let url = {
            let (posts, forbid) = (Arc::clone(&posts), Arc::clone(&forbid));
            serve(move |request| {
                assert_eq!(request.method(), "POST");
                assert_eq!(request.uri().path(), "/api/v1/namespaces/default/events");
                let n = posts.fetch_add(1, Ordering::SeqCst) + 1;
                if forbid.load(Ordering::SeqCst) {
                    return json(
                        403,
                        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}"#
                            .to_owned(),
                    );
                }
                if n <= 2 {
                    return unavailable();
                }
                json(
                    201,
                    r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"node-1.1","namespace":"default"},"involvedObject":{}}"#
                        .to_owned(),
                )
            })
            .await
        };
        let client = super::super::client(kube::Config::new(url.parse().unwrap())).unwrap();
        let mut poster = Poster {
            api: Api::namespaced(client, NAMESPACE),
            node: "node-1".to_owned(),
            posted: HashMap::new(),
            metrics: KubernetesMetrics::new(&crate::outputs::metrics::Metrics::new()),
        };
        let event = NodeEvent {
            reason: NodeEventReason::ImageGCFailed,
            message: "cycles fail".to_owned(),
        };
        let posted = tokio::time::timeout(CALL_TIMEOUT, poster.post_retrying(&event)).await;
        assert!(matches!(posted, Ok(Ok(_))), "{posted:?}");
        assert_eq!(posts.load(Ordering::SeqCst), 3);

        forbid.store(true, Ordering::SeqCst);
        poster.posted.clear();
        let refused = tokio::time::timeout(CALL_TIMEOUT, poster.post_retrying(&event)).await;
        assert!(
            matches!(&refused, Ok(Err(err)) if err.contains("Forbidden")),
            "{refused:?}"
        );
        assert_eq!(posts.load(Ordering::SeqCst), 4, "a refusal is not tried again");
    }
}
