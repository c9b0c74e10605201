//! `imagegc plan`: what a cycle would do now and why, removing and writing
//! nothing (a corrupt state file is reported and left where it is). Whether
//! a space pass is due and what it must free come from the same
//! [`SpaceTarget`] the collector acts on.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::once::unreachable_text;
use super::table::{ContainerFsView, Table, fs_line, human_bytes, image_bytes_line, printable, short_id, tags_cell};
use super::{CliError, ExitStatus, Output, out};
use crate::config::{Config, Order};
use crate::cri::CriClient;
use crate::engine::{Collector, Restored, Settings};
use crate::fs::{FsProbe, FsStats, Statvfs};
use crate::outputs::metrics::Metrics;
use crate::policy::headroom::HEADROOM_WINDOW;
use crate::policy::{
    self, Candidate, ComingPull, Forecast, ImageBytes, KeepReason, Kept, LargestPull, Plan, Protections, Reason,
    SpaceOutlook, SpaceTarget,
};
use crate::store::state::{Known, StateStore};
use crate::time::{Clock, ago, rfc3339};

#[derive(Serialize)]
struct PlanJson<'a> {
    time: String,
    dry_run: bool,
    /// What looks wrong, as the text form says it on stderr (a node name
    /// that names no node).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
    image_filesystem: Option<FilesystemView<'a>>,
    /// The filesystem of containers' writable layers, when the runtime keeps
    /// them apart from its images (a split store); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    container_filesystem: Option<&'a ContainerFsView>,
    high_threshold_percent: u8,
    low_threshold_percent: u8,
    space_pass: bool,
    bytes_to_free: u64,
    /// The order of the space removals in force: `gc.order`, or the one
    /// `gc.order = "auto"` chose.
    order: &'static str,
    /// With `gc.order = "auto"`: why that order ("auto: reuse: 12 GiB
    /// pulled again over the last 7d, against ...").
    #[serde(skip_serializing_if = "Option::is_none")]
    order_chosen: Option<&'a str>,
    space_unreachable: Option<SpaceOutlook>,
    /// Why no space pass would run: the measured filesystem is not the
    /// runtime's image filesystem.
    image_fs_mismatch: Option<&'a str>,
    /// The free space kept above the kubelet's eviction line for the
    /// largest recent pull (`gc.headroom`) and the pulls coming for pods
    /// bound to the node (`kubernetes.room_before_pulls`), when any.
    #[serde(skip_serializing_if = "Option::is_none")]
    headroom: Option<&'a HeadroomView<'a>>,
    /// What the removals are expected to free on disk together (each
    /// removal's `frees_bytes`): reported sizes by the runtime's footprint,
    /// shared layers counted once where the runtime names them.
    expected_to_free_bytes: u64,
    removals: Vec<serde_json::Value>,
    further_space_candidates: Vec<serde_json::Value>,
    kept: Vec<serde_json::Value>,
}

/// The headroom (see [`crate::policy::Headroom`]) as `plan` shows it.
#[derive(Serialize)]
struct HeadroomView<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    largest_pull: Option<&'a LargestPull>,
    /// What the largest recent pull takes on disk (0 without one).
    bytes_on_disk: u64,
    /// The pulls coming for pods bound to the node, each sized by the
    /// node's largest image of its repository.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    coming_pulls: Vec<ComingView<'a>>,
    /// The coming pulls that would not fit above the kubelet's eviction
    /// line even with every removable image gone: no room is made for
    /// them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cannot_fit: Vec<ComingView<'a>>,
    /// The thresholds in force on this filesystem: the configured ones
    /// when the pull fits between high and the eviction line.
    high_threshold_percent: u8,
    low_threshold_percent: u8,
}

/// A coming pull as `plan` shows it.
#[derive(Serialize)]
struct ComingView<'a> {
    #[serde(flatten)]
    pull: &'a ComingPull,
    /// What it will likely take on disk.
    bytes_on_disk: u64,
}

#[derive(Serialize)]
struct FilesystemView<'a> {
    mount_point: &'a PathBuf,
    /// What images take of it, and where the figure comes from.
    image_bytes: ImageBytes,
    capacity_bytes: u64,
    available_bytes: u64,
    usage_percent: u64,
}

/// `plan`: what a cycle would do now.
pub async fn plan(
    runtime: CriClient,
    config: Config,
    (pods, warnings): (&Protections, &[String]),
    output: Output,
) -> Result<ExitStatus, CliError> {
    let clock = Clock::start();
    // Read once: the plan is made, and said, under one order.
    let order = order_in_force(&config);
    let collector = read_only_collector(runtime, &config, pods, clock, order.0);
    #[cfg(feature = "kubernetes")]
    let (mut collector, sizes, _stop_sizes) = with_registry_sizes(collector, &config);
    #[cfg(not(feature = "kubernetes"))]
    let mut collector = collector;
    let listing = collector.observe().await?;
    #[cfg(feature = "kubernetes")]
    if let Some(sizes) = &sizes {
        // Asks for each size not known; then the plan knows them.
        let _ = collector.pulls_waiting(&listing);
        sizes.settled(crate::kubernetes::registry::LOOKUP_TIMEOUT).await;
    }
    let Ok(image_fs) = &listing.image_fs else {
        return Err(listing.image_fs.unwrap_err().into());
    };
    let snapshot = &listing.snapshot;
    let footprint = collector.footprint();
    // Planned after the listing, as a cycle plans: an image first seen by
    // this very listing is not "used at this instant".
    let now = clock.now();
    let fs = Statvfs.stats(&image_fs.path).ok();
    // With `gc.headroom`, the largest recent pull, and with
    // `kubernetes.room_before_pulls` the pulls coming for the pods that
    // fit: what the cycle's thresholds in force make room for.
    let (cycle, pulls) = collector.cycle_plan(&listing, fs.as_ref());
    let plan = &cycle.plan;
    let target = cycle.target();
    let in_force = fs.map_or((target.high_percent(), target.low_percent()), |fs| {
        target.in_force(fs.capacity_bytes)
    });
    // A dry-run cycle's space pass: the age removals counted, not made (a
    // read-only `plan` remembers no removals to hold back).
    let pass = fs.and_then(|fs| {
        cycle.space(
            fs,
            cycle.age_would_free(),
            footprint,
            collector.layers(),
            image_fs.image_bytes,
        )
    });
    let full_outlook = pass.as_ref().map(|pass| pass.outlook);
    let forecast = pass.map(|pass| pass.forecast(|_| false));
    let frees = frees_in_order(
        collector.layers().freeing(&snapshot.images, footprint),
        plan,
        forecast.as_ref(),
    );
    let shown = Shown {
        now,
        warnings,
        plan,
        view: PlanView::new(plan, forecast.as_ref(), fs.as_ref(), target),
        image_fs,
        fs,
        image_bytes: fs.map(|fs| ImageBytes::new(image_fs.image_bytes, &snapshot.images, footprint, fs.used_bytes())),
        footprint,
        container_fs: ContainerFsView::of(image_fs, &Statvfs),
        mismatch: collector.image_fs_mismatch().map(str::to_string),
        headroom: HeadroomView::of(collector.largest_recent_pull(), &pulls, footprint, in_force),
        in_force,
        expected_to_free: frees.iter().fold(0u64, |sum, b| sum.saturating_add(*b)),
        frees,
        once_aged: full_outlook.and_then(|o| o.reached_once_aged()),
        outlook: full_outlook.filter(SpaceOutlook::unreachable),
        order,
    };
    match output {
        Output::Json => out::json(&shown.json(&config))?,
        _ => out::text(&shown.text(&config))?,
    }
    Ok(0)
}

impl<'a> HeadroomView<'a> {
    /// The largest recent pull and the coming pulls, when there are any,
    /// on disk by `footprint`, with the thresholds `in_force` for them.
    fn of(
        largest: Option<&'a LargestPull>,
        pulls: &'a policy::PullRoom,
        footprint: policy::DiskFootprint,
        in_force: (u8, u8),
    ) -> Option<Self> {
        let view = |coming: &'a [ComingPull]| -> Vec<ComingView<'a>> {
            coming
                .iter()
                .map(|pull| ComingView {
                    pull,
                    bytes_on_disk: pull.bytes_on_disk(footprint),
                })
                .collect()
        };
        let any = largest.is_some() || !pulls.fit.is_empty() || !pulls.cannot_fit.is_empty();
        any.then(|| HeadroomView {
            largest_pull: largest,
            bytes_on_disk: largest.map_or(0, |pull| footprint.on_disk(pull.size_bytes)),
            coming_pulls: view(&pulls.fit),
            cannot_fit: view(&pulls.cannot_fit),
            high_threshold_percent: in_force.0,
            low_threshold_percent: in_force.1,
        })
    }
}

/// What each removal frees, in the order `plan` shows them: the age
/// removals first, as the walk counted them before its own, then the
/// forecast's.
fn frees_in_order(mut freeing: policy::Freeing, plan: &Plan, forecast: Option<&Forecast>) -> Vec<u64> {
    plan.age
        .iter()
        .map(|c| freeing.release(c.id, c.size))
        .chain(forecast.iter().flat_map(|f| f.frees.iter().copied()))
        .collect()
}

/// The order of space removals in force: `gc.order`, or when that is
/// `auto`, the order the daemon chose (`order.json` in the state
/// directory) and why, [`Order::PRIOR`] before it chose one.
fn order_in_force(config: &Config) -> (Order, Option<String>) {
    if config.gc.order != Order::Auto {
        return (config.gc.order, None);
    }
    match crate::daemon::auto::load(&config.state.dir) {
        Ok(Some(saved)) => (
            saved.judgement.order,
            Some(format!("auto: {}", saved.judgement.describe())),
        ),
        Ok(None) => (
            Order::PRIOR,
            Some(format!(
                "auto: {}, until the daemon has judged a day of the node's usage",
                Order::PRIOR.as_str()
            )),
        ),
        Err(e) => (Order::PRIOR, Some(format!("auto: {} ({e})", Order::PRIOR.as_str()))),
    }
}

/// The daemon's collector, writing nothing: its observe, its records, its
/// cycle's plan. What the daemon learnt of each container and pod costs
/// no call.
fn read_only_collector(
    runtime: CriClient,
    config: &Config,
    pods: &Protections,
    clock: Clock,
    order: Order,
) -> Collector<CriClient> {
    let mut settings = Settings::from(config);
    settings.policy = Arc::new(settings.policy.with_order(order));
    let restored = Restored::load_from(
        StateStore::new(&config.state.dir).read_only(),
        &config.state.dir,
        &clock,
        &settings,
    );
    let mut collector = Collector::new(
        runtime,
        settings,
        restored,
        Arc::new(Statvfs),
        Arc::new(Metrics::new()),
        clock,
    )
    .knowing(Known::read(&config.state.dir));
    collector.set_protections(pods.clone());
    collector
}

/// With `kubernetes.registry_manifests`, the collector sizing the pulls
/// coming for pods of repositories the node never had, as the daemon
/// would size them; the lookups stop when the guard is dropped.
#[cfg(feature = "kubernetes")]
fn with_registry_sizes(
    mut collector: Collector<CriClient>,
    config: &Config,
) -> (
    Collector<CriClient>,
    Option<Arc<crate::kubernetes::registry::ManifestSizes>>,
    tokio_util::sync::DropGuard,
) {
    let stop_sizes = tokio_util::sync::CancellationToken::new();
    let sizes = crate::kubernetes::registry::start(&config.kubernetes, &stop_sizes);
    if let Some(sizes) = &sizes {
        collector = collector.with_pull_sizes(Arc::clone(sizes) as Arc<dyn crate::engine::PullSizes>);
    }
    (collector, sizes, stop_sizes.drop_guard())
}

/// What `plan` shows, worked out once for its text and its JSON.
struct Shown<'a> {
    now: SystemTime,
    /// What looks wrong (said on stderr too).
    warnings: &'a [String],
    plan: &'a Plan<'a>,
    view: PlanView,
    image_fs: &'a crate::engine::ImageFs,
    fs: Option<FsStats>,
    image_bytes: Option<ImageBytes>,
    footprint: policy::DiskFootprint,
    container_fs: Option<ContainerFsView>,
    mismatch: Option<String>,
    headroom: Option<HeadroomView<'a>>,
    /// The high and low thresholds in force.
    in_force: (u8, u8),
    /// What each removal shown frees, in order.
    frees: Vec<u64>,
    expected_to_free: u64,
    once_aged: Option<Duration>,
    outlook: Option<SpaceOutlook>,
    /// The order of space removals in force, and with `gc.order = "auto"`
    /// why ([`order_in_force`]).
    order: (Order, Option<String>),
}

impl Shown<'_> {
    /// `plan --output json`.
    fn json<'s>(&'s self, config: &'s Config) -> PlanJson<'s> {
        let (plan, now) = (self.plan, self.now);
        let (order, order_chosen) = (self.order.0, self.order.1.as_deref());
        PlanJson {
            time: rfc3339(now),
            dry_run: config.gc.dry_run,
            warnings: self.warnings,
            image_filesystem: self.fs.zip(self.image_bytes).map(|(s, image_bytes)| FilesystemView {
                mount_point: &self.image_fs.path,
                image_bytes,
                capacity_bytes: s.capacity_bytes,
                available_bytes: s.available(),
                usage_percent: s.usage_percent(),
            }),
            container_filesystem: self.container_fs.as_ref(),
            high_threshold_percent: config.gc.high_threshold_percent,
            low_threshold_percent: config.gc.low_threshold_percent,
            space_pass: self.view.space_pass,
            bytes_to_free: self.view.bytes_to_free,
            order: order.as_str(),
            order_chosen,
            space_unreachable: self.outlook,
            image_fs_mismatch: self.mismatch.as_deref(),
            headroom: self.headroom.as_ref(),
            expected_to_free_bytes: self.expected_to_free,
            removals: plan
                .age
                .iter()
                .chain(self.view.space_expected(plan))
                .zip(&self.frees)
                .map(|(c, frees)| {
                    let mut value = candidate_json(c, order, now);
                    if let Some(object) = value.as_object_mut() {
                        object.insert("frees_bytes".to_string(), (*frees).into());
                    }
                    value
                })
                .collect(),
            further_space_candidates: self
                .view
                .space_further(plan)
                .iter()
                .map(|c| candidate_json(c, order, now))
                .collect(),
            kept: plan.kept.iter().map(|kept| kept_json(kept, now)).collect(),
        }
    }

    /// `plan`'s text.
    fn text(&self, config: &Config) -> String {
        let (plan, now) = (self.plan, self.now);
        let mut text = fs_line(&self.image_fs.path.display().to_string(), self.fs.as_ref(), config);
        if let Some(bytes) = &self.image_bytes {
            text.push_str(&image_bytes_line(bytes, self.footprint));
        }
        if let Some(container_fs) = &self.container_fs {
            text.push_str(&container_fs.line());
        }
        if let Some(why) = &self.mismatch {
            text.push_str(&format!("no space pass: {}\n", printable(why)));
        }
        if let Ok(Some(line)) = super::table::removed_by_others_line(&config.state.dir, now) {
            text.push_str(&line);
        }
        if let Some(view) = &self.headroom {
            text.push_str(&headroom_line(view, config, now));
        }
        text.push_str(&summary(
            plan,
            &self.view,
            self.outlook.as_ref(),
            self.once_aged,
            self.in_force.1,
            config,
        ));
        text.push_str(&removals_text(plan, &self.view, &self.frees, &self.order, now));
        text.push_str(&kept_text(plan));
        let unused_later = if self.view.space_pass { 0 } else { plan.space.len() };
        if unused_later > 0 {
            text.push_str(&format!(
                "\n{unused_later} unused image(s) are candidates once usage reaches {}%\n",
                self.in_force.0
            ));
        }
        text
    }
}

/// The headroom's line: the largest recent pull and the coming pulls, and
/// whether they lower the thresholds.
fn headroom_line(view: &HeadroomView, config: &Config, now: SystemTime) -> String {
    let mut pulls: Vec<String> = Vec::new();
    if let Some(largest) = view.largest_pull {
        pulls.push(format!(
            "the largest pull of the last {} is {} ({} on disk, {})",
            crate::time::short(HEADROOM_WINDOW),
            super::table::cell(&largest.image),
            human_bytes(view.bytes_on_disk),
            ago(largest.at, now)
        ));
    }
    for coming in &view.coming_pulls {
        let like = coming.pull.like.as_ref().map_or_else(String::new, |seen| {
            format!(", sized {}", super::table::cell(&seen.says()))
        });
        pulls.push(format!(
            "pod {} names {}, not on the node: a pull of about {} on disk{like}",
            super::table::cell(&coming.pull.pod),
            super::table::cell(&coming.pull.image),
            human_bytes(coming.bytes_on_disk),
        ));
    }
    let mut text = String::new();
    if !pulls.is_empty() {
        let pull = pulls.join("; ");
        let what = if view.coming_pulls.is_empty() {
            "it fits"
        } else {
            "room for it is there"
        };
        let (high, low) = (config.gc.high_threshold_percent, config.gc.low_threshold_percent);
        text = if (view.high_threshold_percent, view.low_threshold_percent) == (high, low) {
            format!("headroom: {pull}; {what} between the high threshold and the kubelet's eviction line\n")
        } else {
            format!(
                "headroom: {pull}; it would not fit between the high threshold and the kubelet's eviction line, \
                 so the thresholds in force are {}/{}% (configured {high}/{low}%)\n",
                view.high_threshold_percent, view.low_threshold_percent
            )
        };
    }
    for coming in &view.cannot_fit {
        text.push_str(&format!(
            "cannot fit: pod {} names {}, not on the node: a pull of about {} on disk would not fit above the \
             kubelet's eviction line even with every removable image gone; no room is made for it\n",
            super::table::cell(&coming.pull.pod),
            super::table::cell(&coming.pull.image),
            human_bytes(coming.bytes_on_disk),
        ));
    }
    text
}

/// The lines before the tables: nothing to do, or what the space pass must
/// free and whether images can.
fn summary(
    plan: &Plan,
    view: &PlanView,
    outlook: Option<&SpaceOutlook>,
    once_aged: Option<Duration>,
    low: u8,
    config: &Config,
) -> String {
    let mut text = String::new();
    if plan.age.is_empty() && !view.space_pass {
        text.push_str("nothing to remove now");
        if config.gc.max_age.is_zero() {
            text.push_str(" (usage below the high threshold; age-based removal is off)");
        } else {
            text.push_str(" (usage below the high threshold; no image unused for longer than max age)");
        }
        text.push('\n');
    }
    if view.space_pass {
        text.push_str(&format!(
            "usage is at or above the high threshold: {} to free to reach {}%\n",
            human_bytes(view.bytes_to_free),
            low
        ));
    }
    if let Some(outlook) = outlook {
        text.push_str(&unreachable_text(outlook));
    }
    if let Some(after) = once_aged {
        text.push_str(&format!(
            "removable images cannot reach the low threshold yet: images younger than gc.min_age can once they \
             age (the first in {})\n",
            crate::time::short(after)
        ));
    }
    text
}

/// The removals in order, and how many more a short estimate would take.
fn removals_text(
    plan: &Plan,
    view: &PlanView,
    frees: &[u64],
    (order, chosen): &(Order, Option<String>),
    now: SystemTime,
) -> String {
    let order = *order;
    let mut text = String::new();
    let reuse = policy::order::of(order).goes_by_expected_back();
    let mut table = if reuse {
        Table::new([
            "#",
            "IMAGE ID",
            "TAGS",
            "SIZE",
            "FREES",
            "REASON",
            "LAST USED",
            "EXPECTED BACK",
        ])
    } else {
        Table::new(["#", "IMAGE ID", "TAGS", "SIZE", "FREES", "REASON", "LAST USED"])
    };
    for (n, c) in plan.age.iter().chain(view.space_expected(plan)).enumerate() {
        let mut row = vec![
            (n + 1).to_string(),
            short_id(c.id),
            tags_cell(c.tags),
            human_bytes(c.size),
            frees.get(n).map_or_else(|| "-".to_string(), |b| human_bytes(*b)),
            c.reason.as_str().to_string(),
            ago(c.last_used, now),
        ];
        if reuse {
            row.push(match c.reason {
                Reason::Space => {
                    let (at, basis) = c.expectation(now);
                    format!("{} ({})", from_now(at, now), basis.describe())
                }
                Reason::Age => "-".to_string(),
            });
        }
        table.row(row);
    }
    if !table.is_empty() {
        text.push_str("\nwould remove, in this order:\n");
        text.push_str(&table.render());
        if view.space_pass {
            text.push_str(
                "(space removals stop as soon as the measured usage reaches the low threshold; \
                 FREES is the estimate: reported sizes by what the runtime keeps on disk per reported byte, \
                 layers other images share counted once, where the runtime names them)\n",
            );
            text.push_str(&match chosen {
                Some(chosen) => format!(
                    "(space removals in the order gc.order = \"auto\" chose, {}: {}; {chosen})\n",
                    order.as_str(),
                    policy::order::of(order).explain()
                ),
                None => format!(
                    "(space removals in the order of gc.order = \"{}\": {})\n",
                    order.as_str(),
                    policy::order::of(order).explain()
                ),
            });
        }
    }
    let further = view.space_further(plan);
    if view.space_pass && !further.is_empty() {
        text.push_str(&format!(
            "{} further candidate(s) if the estimate falls short\n",
            further.len()
        ));
    }
    text
}

/// "in 3h", "now": how long after `now` a time is.
fn from_now(at: SystemTime, now: SystemTime) -> String {
    match at.duration_since(now) {
        Ok(d) if d.as_secs() > 0 => format!("in {}", crate::time::short(d)),
        _ => "now".to_string(),
    }
}

fn kept_text(plan: &Plan) -> String {
    let mut table = Table::new(["IMAGE ID", "TAGS", "SIZE", "KEPT BECAUSE"]);
    for k in &plan.kept {
        table.row([
            short_id(k.id),
            tags_cell(k.tags),
            human_bytes(k.size),
            k.why.to_string(),
        ]);
    }
    if table.is_empty() {
        String::new()
    } else {
        format!("\nkept:\n{}", table.render())
    }
}

/// A candidate as JSON, with, under an order that goes by it
/// (`gc.order = "reuse"`), when a space candidate is expected back.
fn candidate_json(candidate: &Candidate<'_>, order: Order, now: SystemTime) -> serde_json::Value {
    let mut value = serde_json::to_value(candidate).unwrap_or_default();
    if policy::order::of(order).goes_by_expected_back()
        && candidate.reason == Reason::Space
        && let Some(object) = value.as_object_mut()
    {
        let (at, basis) = candidate.expectation(now);
        object.insert("expected_back".to_string(), serde_json::json!(rfc3339(at)));
        object.insert("expected_back_by".to_string(), serde_json::json!(basis.as_str()));
        if let Some(usual) = basis.usual() {
            object.insert("usual_break_seconds".to_string(), serde_json::json!(usual.as_secs()));
        }
    }
    value
}

/// A kept image as JSON, with `removable_after` (for images too young to
/// remove) as the RFC 3339 time it becomes removable, like every other time
/// printed, rather than a serialized `Duration`.
fn kept_json(kept: &Kept<'_>, now: SystemTime) -> serde_json::Value {
    let mut value = serde_json::to_value(kept).unwrap_or_default();
    if let (KeepReason::TooYoung { removable_after }, Some(object)) = (&kept.why, value.as_object_mut()) {
        let at = now.checked_add(*removable_after).unwrap_or(now);
        object.insert("removable_after".to_string(), serde_json::json!(rfc3339(at)));
    }
    value
}

/// How a plan meets the current usage, for display: the forecast is the
/// walk a dry-run cycle makes (see [`crate::policy::Walk`]).
struct PlanView {
    space_pass: bool,
    bytes_to_free: u64,
    /// How many space candidates the walk removes.
    expected: usize,
}

impl PlanView {
    fn new(plan: &Plan, forecast: Option<&Forecast>, fs: Option<&FsStats>, target: SpaceTarget) -> Self {
        match (forecast, fs) {
            (Some(forecast), Some(fs)) => PlanView {
                space_pass: true,
                bytes_to_free: target.bytes_to_free(fs),
                expected: plan
                    .space
                    .iter()
                    .position(|c| forecast.removals.last().is_some_and(|last| last.id == c.id))
                    .map_or(0, |i| i + 1),
            },
            _ => PlanView {
                space_pass: false,
                bytes_to_free: 0,
                expected: 0,
            },
        }
    }

    fn space_expected<'p, 'a>(&self, plan: &'p Plan<'a>) -> impl Iterator<Item = &'p Candidate<'a>> + use<'p, 'a> {
        plan.space.iter().take(self.expected)
    }

    fn space_further<'p, 'a>(&self, plan: &'p Plan<'a>) -> &'p [Candidate<'a>] {
        if self.space_pass {
            &plan.space[self.expected..]
        } else {
            &[]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Reason, Walk, total_size};

    #[test]
    fn the_headroom_line_says_whether_the_largest_pull_moves_the_thresholds() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let pull = LargestPull {
            image: "registry.test/train:7".to_string(),
            size_bytes: 5 << 30,
            at: now - Duration::from_secs(3 * 3600),
        };
        let config = Config::default();
        let view = |high, low| HeadroomView {
            largest_pull: Some(&pull),
            bytes_on_disk: 10 << 30,
            coming_pulls: Vec::new(),
            cannot_fit: Vec::new(),
            high_threshold_percent: high,
            low_threshold_percent: low,
        };
        let moved = headroom_line(&view(70, 65), &config, now);
        assert!(moved.contains("registry.test/train:7"), "{moved}");
        assert!(moved.contains("10.0 GiB on disk"), "{moved}");
        assert!(
            moved.contains("thresholds in force are 70/65% (configured 80/75%)"),
            "{moved}"
        );
        let fits = headroom_line(&view(80, 75), &config, now);
        assert!(fits.contains("it fits between the high threshold"), "{fits}");
        assert!(!fits.contains("in force"), "{fits}");
    }

    #[test]
    fn the_headroom_line_names_each_coming_pull_its_pod_and_what_it_was_sized_by() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let pull = ComingPull {
            image: "registry.test/app:2".to_string(),
            pod: "default/app-5f4".to_string(),
            like: Some(policy::coming::PullSize {
                tag: "registry.test/app:1".to_string(),
                size_bytes: 420 << 20,
                at: now,
                from: policy::coming::SizedBy::History,
                manifest_bytes: None,
            }),
        };
        let view = HeadroomView {
            largest_pull: None,
            bytes_on_disk: 0,
            coming_pulls: vec![ComingView {
                pull: &pull,
                bytes_on_disk: 840 << 20,
            }],
            cannot_fit: Vec::new(),
            high_threshold_percent: 28,
            low_threshold_percent: 23,
        };
        let line = headroom_line(&view, &Config::default(), now);
        assert!(
            line.contains(
                "pod default/app-5f4 names registry.test/app:2, not on the node: a pull of about 840.0 MiB on disk, \
                 sized like registry.test/app:1"
            ),
            "{line}"
        );
        assert!(
            line.contains("thresholds in force are 28/23% (configured 80/75%)"),
            "{line}"
        );
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["coming_pulls"][0]["image"], "registry.test/app:2");
        assert_eq!(json["coming_pulls"][0]["like"]["tag"], "registry.test/app:1");
        assert_eq!(json["coming_pulls"][0]["bytes_on_disk"], 840u64 << 20);
        assert_eq!(json["coming_pulls"][0]["like"]["from"], "history");
        assert!(json.get("largest_pull").is_none());
        // A repository the node never had, sized by its registry.
        let pull = ComingPull {
            image: "registry.test/new:1".to_string(),
            pod: "default/new".to_string(),
            like: Some(policy::coming::PullSize {
                tag: "registry.test/new:1".to_string(),
                size_bytes: 420 << 20,
                at: now,
                from: policy::coming::SizedBy::Manifest,
                manifest_bytes: Some(420 << 20),
            }),
        };
        let view = HeadroomView {
            coming_pulls: vec![ComingView {
                pull: &pull,
                bytes_on_disk: 840 << 20,
            }],
            ..view
        };
        let line = headroom_line(&view, &Config::default(), now);
        assert!(
            line.contains("a pull of about 840.0 MiB on disk, sized by its registry's manifest"),
            "{line}"
        );
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["coming_pulls"][0]["like"]["from"], "manifest");
        // One that cannot fit is said as such, and not made room for.
        let view = HeadroomView {
            coming_pulls: Vec::new(),
            cannot_fit: vec![ComingView {
                pull: &pull,
                bytes_on_disk: 840 << 20,
            }],
            high_threshold_percent: 80,
            low_threshold_percent: 75,
            ..view
        };
        let line = headroom_line(&view, &Config::default(), now);
        assert_eq!(
            line,
            "cannot fit: pod default/new names registry.test/new:1, not on the node: a pull of about 840.0 MiB on \
             disk would not fit above the kubelet's eviction line even with every removable image gone; no room is \
             made for it\n"
        );
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["cannot_fit"][0]["image"], "registry.test/new:1");
    }

    #[test]
    fn plan_view_adds_absurd_sizes_without_overflow() {
        let none = crate::cri::Names::default();
        let candidate = |id: &'static str| Candidate {
            id,
            tags: &none,
            digests: &none,
            size: u64::MAX,
            first_seen: SystemTime::UNIX_EPOCH,
            last_used: SystemTime::UNIX_EPOCH,
            reason: Reason::Age,
            usual_break: None,
        };
        let plan = Plan {
            age: vec![candidate("a"), candidate("b")],
            ..Default::default()
        };
        let fs = FsStats {
            capacity_bytes: 100,
            ..Default::default()
        };
        let target = crate::policy::GcPolicy::from(&Config::default()).target;
        let forecast = Forecast::of(
            Walk::estimated(target, fs, &plan.space, total_size(&plan.age), Default::default()),
            |_| false,
        );
        let view = PlanView::new(&plan, Some(&forecast), Some(&fs), target);
        assert!(view.space_pass);
        assert_eq!(view.expected, 0);
    }

    #[test]
    fn plan_sees_a_space_pass_due_on_inodes_as_a_cycle_does() {
        // Bytes at 50%, inodes at 95% against inode thresholds 90/80: the
        // collector runs a space pass; so must the plan say.
        let fs = FsStats {
            capacity_bytes: 1000,
            available_bytes: 500,
            free_bytes: 500,
            inodes_total: 100,
            inodes_free: 5,
            ..FsStats::default()
        };
        let mut config = Config::default();
        config.gc.high_inodes_percent = Some(90);
        config.gc.low_inodes_percent = Some(80);
        let plan = Plan::default();
        let target = crate::policy::GcPolicy::from(&config).target;
        let forecast = Forecast::of(Walk::estimated(target, fs, &plan.space, 0, Default::default()), |_| {
            false
        });
        let view = PlanView::new(&plan, Some(&forecast), Some(&fs), target);
        assert!(view.space_pass, "a cycle would run a space pass on inodes");
        assert!(target.due(&fs), "and the collector's target agrees");
    }
}
