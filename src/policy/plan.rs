//! The planner: which images a cycle may remove, in which order, and why
//! every other image is kept. Pure: no IO and no clock reads, so every rule
//! is tested table-driven with a fake clock.
//!
//! Why an image is kept is [`Rules::why_kept`]'s to say (see
//! [`super::keep`]): the planner asks it of each image, with what the
//! listing says of the image.
//! Candidates come in the kubelet's order: last used ascending, then first
//! seen ascending (then id, so plans are deterministic); the space
//! candidates then in the order `gc.order` names (see [`super::order`]).

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use crate::collections::HashMap;
pub use crate::model::Reason;
use crate::model::matching;
use crate::model::names::Names;
use crate::model::reference;
use crate::model::{Image, Snapshot};
use crate::records::{ImageFacts, Records};

use super::GcPolicy;
pub use super::candidate::Candidate;
use super::keep::{KeepReason, Rules, Uses, elapsed};
use super::order;

/// Keep rules that come from outside the runtime's listing: the image
/// references of the pods bound to this node, with each pod's
/// `namespace/name` (a pod names its images before the runtime creates its
/// containers). An image any of them names is kept, with
/// [`KeepReason::Pod`], as an image in use is; references match images as
/// containers' references do (tags, digests, `docker.io` normalisation,
/// every runtime's dialect).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protections {
    /// `(image reference, pod)` pairs.
    pub references: Vec<(String, String)>,
    /// The references of `references` the kubelet will not pull: every
    /// pod naming one names it with `imagePullPolicy: Never`, or has ended
    /// (Succeeded or Failed). Kept like the others; no room is made before
    /// a pull of them (see [`crate::policy::coming`]), which never comes.
    pub never_pulled: BTreeSet<String>,
}

impl Protections {
    /// The images of `images` a pod names, by their place, each with the
    /// first pod that names it.
    pub fn pods_naming<'p>(&'p self, images: &[Image]) -> Vec<(usize, &'p str)> {
        if self.references.is_empty() {
            return Vec::new();
        }
        let references: Vec<&str> = self.references.iter().map(|(r, _)| r.as_str()).collect();
        matching::named_by(images, &references)
            .into_iter()
            .map(|(place, r)| (place, self.references[r].1.as_str()))
            .collect()
    }

    /// Nothing held from outside: what a pure CRI agent plans with.
    pub fn none() -> &'static Protections {
        static NONE: Protections = Protections {
            references: Vec::new(),
            never_pulled: BTreeSet::new(),
        };
        &NONE
    }
}

/// An image the cycle keeps, with why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Kept<'a> {
    /// The image id, as the runtime lists it.
    pub id: &'a str,
    /// The image's tags, as the runtime lists them (may be empty).
    pub tags: &'a Names,
    /// The size the runtime reports, in bytes.
    pub size: u64,
    /// Why it is kept; serialized as `reason` and that reason's own fields.
    #[serde(flatten)]
    pub why: KeepReason<'a>,
}

/// The outcome of planning: removals by age, then space candidates in order,
/// and every kept image with its reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan<'a> {
    /// Removed whatever the usage, oldest use first.
    pub age: Vec<Candidate<'a>>,
    /// Removed in this order while usage is above the low threshold.
    pub space: Vec<Candidate<'a>>,
    /// Everything else.
    pub kept: Vec<Kept<'a>>,
    /// Images with no history that would be age candidates, held back until
    /// the collector has run longer than `gc.max_age` (the kubelet's guard).
    pub age_guarded: usize,
    /// The kept images counted, whether `kept` lists them or not.
    pub tally: KeptTally,
}

/// The kept images of a plan, counted: what a cycle needs of them (a
/// cycle's plan counts them without listing them: on a node of 100,000
/// images the list alone is 10 MiB).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeptTally {
    /// In use by a container, or named by a pod bound to this node.
    pub in_use: usize,
    /// Kept whatever the usage (see [`KeepReason::is_protection`]).
    pub protected: usize,
    /// Kept only for being younger than `gc.min_age`: how long until the
    /// first of them may go.
    pub first_young_removable_after: Option<Duration>,
    /// Kept only for being younger than `gc.min_age`: their reported sizes
    /// added up (what they may free once they age; see
    /// [`SpaceOutlook`](super::SpaceOutlook)).
    pub young_bytes: u64,
}

impl<'a> Plan<'a> {
    /// How many kept images are in use by a container, or named by a pod
    /// bound to this node.
    pub fn in_use_count(&self) -> usize {
        self.tally.in_use
    }

    /// How many kept images are kept whatever the usage (pinned, sandbox,
    /// protected, keep-recent; see [`KeepReason::is_protection`]).
    pub fn protected_count(&self) -> usize {
        self.tally.protected
    }

    /// Counts `kept`, and lists it when `list`.
    fn keep(&mut self, kept: Kept<'a>, list: bool) {
        match kept.why {
            KeepReason::InUse { .. } | KeepReason::Pod { .. } => self.tally.in_use += 1,
            KeepReason::TooYoung { removable_after } => {
                let first = &mut self.tally.first_young_removable_after;
                *first = Some(first.map_or(removable_after, |f| f.min(removable_after)));
                self.tally.young_bytes = self.tally.young_bytes.saturating_add(kept.size);
            }
            _ => self.tally.protected += 1,
        }
        if list {
            self.kept.push(kept);
        }
    }
}

/// Computes the plan. `running_since` is when this process started observing
/// (the kubelet's guard: images it has no history for are not removed by age
/// before the collector has run longer than max age).
pub fn plan<'a>(
    snapshot: &'a Snapshot,
    records: &Records,
    policy: &'a GcPolicy,
    now: SystemTime,
    running_since: SystemTime,
) -> Plan<'a> {
    plan_listed(
        snapshot,
        &records.listed(snapshot),
        policy,
        Protections::none(),
        now,
        running_since,
    )
}

/// [`plan`], from what the records made of this very listing
/// ([`Records::observe_snapshot`] or [`Records::listed`]): the planner
/// itself then matches nothing and looks nothing up.
///
/// # Panics
///
/// When `listed` is not of this snapshot's listing (another length).
pub fn plan_listed<'a>(
    snapshot: &'a Snapshot,
    listed: &ImageFacts,
    policy: &'a GcPolicy,
    protections: &'a Protections,
    now: SystemTime,
    running_since: SystemTime,
) -> Plan<'a> {
    plan_images(snapshot, listed, policy, protections, (now, running_since), true)
}

/// [`plan_listed`] for a cycle: the same candidates, in the same order, and
/// the kept images counted ([`Plan::tally`]) but not listed.
pub fn plan_counting_kept<'a>(
    snapshot: &'a Snapshot,
    listed: &ImageFacts,
    policy: &'a GcPolicy,
    protections: &'a Protections,
    now: SystemTime,
    running_since: SystemTime,
) -> Plan<'a> {
    plan_images(snapshot, listed, policy, protections, (now, running_since), false)
}

fn plan_images<'a>(
    snapshot: &'a Snapshot,
    listed: &ImageFacts,
    policy: &'a GcPolicy,
    protections: &'a Protections,
    (now, running_since): (SystemTime, SystemTime),
    list_kept: bool,
) -> Plan<'a> {
    assert_eq!(listed.len(), snapshot.images.len(), "a plan of another listing");
    let held = held_by_pods(snapshot, protections);
    let sandbox_unknown = snapshot.sandbox_unknown();
    let mounts_unknown = snapshot.containers.iter().any(|c| c.mounts_unknown);
    let matches = &listed.matches;
    let rules: &Rules = &policy.keep;
    let newest = keep_recent(snapshot, listed, rules.keep_recent());
    let max_age = policy.max_age;
    let guard_open = max_age.is_zero() || elapsed(running_since, now) > max_age;

    let mut plan = Plan::default();
    let mut union = Vec::new();
    // One pass over the images, in listing order.
    for (i, image) in snapshot.images.iter().enumerate() {
        // An id listed more than once is planned once, at its first
        // listing, with what all its listings say.
        let mut pinned = image.pinned;
        let place = listed.places[i];
        if place.later {
            continue;
        }
        // Runtimes list each id once: the table of repeats is nearly always
        // empty, and then not looked up.
        let repeats = if listed.repeated.is_empty() {
            None
        } else {
            listed.repeated.get(&i)
        };
        let (users, sandbox): (&[u32], bool) = match repeats {
            None => (matches.users(i), matches.sandbox(i)),
            Some(others) => {
                union.clear();
                let mut sandbox = false;
                for &j in others {
                    union.extend_from_slice(matches.users(j));
                    sandbox |= matches.sandbox(j);
                    pinned |= snapshot.images[j].pinned;
                }
                union.sort_unstable();
                union.dedup();
                (&union, sandbox)
            }
        };
        let uses = Uses {
            containers: users
                .iter()
                .map(|&c| snapshot.containers[c as usize].id.as_str())
                .collect(),
            sandbox,
            pinned,
            newest: if newest.is_empty() {
                None
            } else {
                newest.get(image.id.as_str()).copied()
            },
            mounts_unknown,
            sandbox_unknown,
        };
        let why = rules.why_kept(image, uses, place.history, held.get(&i).copied(), now);
        // An image without a record (listed after the records were updated)
        // is treated as first seen now: the safe reading.
        let (first_seen, last_used, from_history) = place
            .history
            .map_or((now, now, false), |h| (h.first_seen, h.last_used, h.from_history));
        let candidate = |reason| Candidate {
            id: &image.id,
            tags: &image.repo_tags,
            digests: &image.repo_digests,
            size: image.size,
            first_seen,
            last_used,
            reason,
            usual_break: place.history.and_then(|h| h.usual_break),
        };
        if !max_age.is_zero()
            && elapsed(last_used, now) > max_age
            && !why.as_ref().is_some_and(|w| w.holds_against(Reason::Age))
        {
            if from_history || guard_open {
                plan.age.push(candidate(Reason::Age));
                continue;
            }
            plan.age_guarded += 1;
        }
        match why {
            Some(why) => plan.keep(
                Kept {
                    id: &image.id,
                    tags: &image.repo_tags,
                    size: image.size,
                    why,
                },
                list_kept,
            ),
            None => plan.space.push(candidate(Reason::Space)),
        }
    }
    let order =
        |a: &Candidate, b: &Candidate| (a.last_used, a.first_seen, &a.id).cmp(&(b.last_used, b.first_seen, &b.id));
    // The id makes every key distinct: an unstable sort gives the same order.
    plan.age.sort_unstable_by(order);
    plan.space.sort_unstable_by(order);
    let context = order::Context { snapshot, listed, now };
    order::of(policy.order).sort(&mut plan.space, &context);
    plan
}

/// The images pods name (by their place in the listing), each with the
/// first pod that names it; an id listed more than once counts at each
/// place.
fn held_by_pods<'a>(snapshot: &Snapshot, protections: &'a Protections) -> HashMap<usize, &'a str> {
    let mut held: HashMap<usize, &'a str> = protections.pods_naming(&snapshot.images).into_iter().collect();
    if held.is_empty() {
        return held;
    }
    // Every listing of an id is held when one is.
    let by_id: HashMap<&str, &'a str> = held
        .iter()
        .map(|(&place, &pod)| (snapshot.images[place].id.as_str(), pod))
        .collect();
    for (place, image) in snapshot.images.iter().enumerate() {
        if let Some(&pod) = by_id.get(image.id.as_str()) {
            held.entry(place).or_insert(pod);
        }
    }
    held
}

/// For each repository, the newest `keep` images (by first seen, then id)
/// that carry a tag of it: image id → (repository, rank from 1).
fn keep_recent<'a>(snapshot: &'a Snapshot, listed: &ImageFacts, keep: u32) -> HashMap<&'a str, (&'a str, u32)> {
    let mut kept = HashMap::default();
    if keep == 0 {
        return kept;
    }
    let mut by_repo: HashMap<&'a str, Vec<(SystemTime, &'a str)>> = HashMap::default();
    for (image, place) in snapshot.images.iter().zip(&listed.places) {
        let first_seen = place.history.map_or(SystemTime::UNIX_EPOCH, |h| h.first_seen);
        let mut repos: Vec<&str> = image.repo_tags.iter().map(reference::repository).collect();
        repos.sort_unstable();
        repos.dedup();
        for repo in repos {
            by_repo.entry(repo).or_default().push((first_seen, image.id.as_str()));
        }
    }
    for (repo, mut images) in by_repo {
        images.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(a.1)));
        images.dedup_by(|a, b| a.1 == b.1);
        for (rank, (_, id)) in images.into_iter().take(keep as usize).enumerate() {
            kept.entry(id).or_insert((repo, rank as u32 + 1));
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Order};
    use crate::model::Container;
    use crate::policy::order::expected_back;
    use crate::records::Break;
    use crate::testing::{container_naming as container, library_image as image};

    const MIN: Duration = Duration::from_secs(60);

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn config() -> Config {
        let mut c = Config::default();
        c.gc.high_threshold_percent = 90;
        c.gc.low_threshold_percent = 80;
        c.gc.min_age = Duration::ZERO;
        c
    }

    struct World {
        snapshot: Snapshot,
        records: Records,
        config: Config,
        start: SystemTime,
        /// The last listing observed, and what the records made of it.
        observed: Option<(Snapshot, ImageFacts)>,
    }

    impl World {
        fn new(images: Vec<Image>) -> Self {
            World {
                snapshot: Snapshot {
                    images,
                    // A runtime that names its sandbox image.
                    sandbox_images: vec!["registry.k8s.io/pause:3.9".to_string()],
                    ..Default::default()
                },
                records: Records::new(),
                config: config(),
                start: t(0),
                observed: None,
            }
        }
        fn containers(mut self, containers: Vec<Container>) -> Self {
            self.snapshot.containers = containers;
            self
        }
        fn observe(&mut self, at: SystemTime) -> &mut Self {
            let (_, listed) = self.records.observe_snapshot(&self.snapshot, at);
            self.observed = Some((self.snapshot.clone(), listed));
            self
        }
        /// The plan from the records; when nothing was listed since the
        /// last observation, also checks that the plan a cycle makes from
        /// its own observation of the listing is the same.
        fn plan(&self, at: SystemTime) -> Plan<'_> {
            // Made anew at each plan, as tests change the configuration
            // between plans; leaked, as the plan borrows it.
            let policy: &'static GcPolicy = Box::leak(Box::new(GcPolicy::from(&self.config)));
            let plan = plan(&self.snapshot, &self.records, policy, at, self.start);
            if let Some((seen, listed)) = &self.observed
                && seen.images == self.snapshot.images
                && seen.containers == self.snapshot.containers
                && seen.sandbox_images == self.snapshot.sandbox_images
            {
                let cycle = plan_listed(&self.snapshot, listed, policy, Protections::none(), at, self.start);
                assert_eq!(cycle, plan, "the cycle's plan differs from the plan from the records");
                // The daemon's cycle counts the kept images without listing
                // them: the same candidates, and counts that agree with the
                // list.
                let counted = plan_counting_kept(&self.snapshot, listed, policy, Protections::none(), at, self.start);
                assert!(counted.kept.is_empty());
                assert_eq!(
                    (&counted.age, &counted.space, counted.age_guarded, counted.tally),
                    (&plan.age, &plan.space, plan.age_guarded, plan.tally)
                );
            }
            let listed_in_use = plan
                .kept
                .iter()
                .filter(|k| matches!(k.why, KeepReason::InUse { .. } | KeepReason::Pod { .. }))
                .count();
            let listed_protected = plan.kept.iter().filter(|k| k.why.is_protection()).count();
            let first_young = plan
                .kept
                .iter()
                .filter_map(|k| match k.why {
                    KeepReason::TooYoung { removable_after } => Some(removable_after),
                    _ => None,
                })
                .min();
            let young_bytes = plan
                .kept
                .iter()
                .filter(|k| matches!(k.why, KeepReason::TooYoung { .. }))
                .fold(0u64, |sum, k| sum.saturating_add(k.size));
            assert_eq!(
                plan.tally,
                KeptTally {
                    in_use: listed_in_use,
                    protected: listed_protected,
                    first_young_removable_after: first_young,
                    young_bytes,
                }
            );
            plan
        }
    }

    fn ids<'a>(c: &[Candidate<'a>]) -> Vec<&'a str> {
        c.iter().map(|c| c.id).collect()
    }

    fn kept<'a>(p: &'a Plan, id: &str) -> &'a KeepReason<'a> {
        &p.kept
            .iter()
            .find(|k| k.id == id)
            .unwrap_or_else(|| panic!("{id} not kept"))
            .why
    }

    // Scenario 5: one image in use.
    #[test]
    fn image_in_use_is_never_a_candidate() {
        let mut w = World::new(vec![image("0", 1024), image("1", 2048)]).containers(vec![container("c", "1")]);
        w.observe(t(0));
        let p = w.plan(t(10));
        assert_eq!(ids(&p.space), ["0"]);
        assert_eq!(kept(&p, "1").label(), "in-use");
    }

    // Scenario 6: least recently used goes first.
    #[test]
    fn least_recently_used_goes_first() {
        let mut w = World::new(vec![image("0", 1024), image("1", 1024)])
            .containers(vec![container("a", "0"), container("b", "1")]);
        w.observe(t(0));
        w.snapshot.containers = vec![container("b", "1")];
        w.observe(t(10));
        w.snapshot.containers.clear();
        let p = w.plan(t(20));
        assert_eq!(ids(&p.space), ["0", "1"]);
    }

    // Scenario 7: ties broken by first seen. imagegc counts a never-used
    // image as last used when first seen (see the next test for how that
    // differs from the kubelet); on a tie in last use, the older goes first.
    #[test]
    fn ties_in_last_use_are_broken_by_first_seen() {
        let mut w = World::new(vec![image("0", 1024)]).containers(vec![container("c", "0")]);
        w.observe(t(0));
        w.snapshot.images.push(image("1", 2048));
        w.observe(t(5));
        w.snapshot.containers.clear();
        // Image 0 last used at 5 (seen in use at both passes), image 1 first
        // seen at 5 and never used: last used 5 too; first seen breaks the tie.
        let p = w.plan(t(10));
        assert_eq!(ids(&p.space), ["0", "1"]);
        // Same last use, older first seen first.
        let mut w = World::new(vec![image("a", 1), image("b", 1)]);
        w.observe(t(0));
        let p = w.plan(t(1));
        assert_eq!(ids(&p.space), ["a", "b"]);
    }

    // The kubelet's TestFreeSpaceTiesBrokenByDetectedTime: the kubelet gives
    // a never-used image a zero last-used time, so it goes before every
    // image ever used, however recently it was pulled. imagegc counts it as
    // used when first seen: an image pulled ahead of its pods (a pre-pull,
    // a deployment rolling out) is not the first to go.
    #[test]
    fn a_never_used_image_counts_as_last_used_when_first_seen_unlike_the_kubelet() {
        let mut w = World::new(vec![image("used", 1)]).containers(vec![container("c", "used")]);
        w.observe(t(0));
        w.observe(t(10));
        w.snapshot.containers.clear();
        w.snapshot.images.push(image("pulled", 1));
        w.observe(t(20));
        let p = w.plan(t(30));
        // The kubelet's order would be ["pulled", "used"].
        assert_eq!(ids(&p.space), ["used", "pulled"]);
    }

    // Scenario 8: pinned images stay; all pinned frees nothing.
    #[test]
    fn pinned_images_are_kept() {
        let mut pinned = image("1", 1024);
        pinned.pinned = true;
        let mut w = World::new(vec![pinned.clone(), image("2", 1024)]);
        w.observe(t(0));
        let p = w.plan(t(1));
        assert_eq!(ids(&p.space), ["2"]);
        assert_eq!(*kept(&p, "1"), KeepReason::Pinned);
        let mut w = World::new(vec![pinned]);
        w.observe(t(0));
        let p = w.plan(t(1));
        assert!(p.space.is_empty() && p.age.is_empty());
    }

    // Scenario 12: min age.
    #[test]
    fn min_age_keeps_young_images_for_space() {
        let mut w = World::new(vec![image("0", 1)]);
        w.config.gc.min_age = MIN;
        w.observe(t(0));
        let p = w.plan(t(0));
        assert_eq!(*kept(&p, "0"), KeepReason::TooYoung { removable_after: MIN });
        // Age == min age: removable.
        let p = w.plan(t(60));
        assert_eq!(ids(&p.space), ["0"]);
    }

    // Scenario 13: max age, strictly greater.
    #[test]
    fn max_age_removes_images_unused_for_longer() {
        let mut w = World::new(vec![image("0", 1)]).containers(vec![container("c", "0")]);
        w.config.gc.max_age = MIN;
        w.observe(t(0));
        w.snapshot.containers.clear();
        let at = t(60);
        assert!(w.plan(at).age.is_empty());
        let p = w.plan(at + Duration::from_nanos(1));
        assert_eq!(ids(&p.age), ["0"]);
        assert_eq!(p.age[0].reason, Reason::Age);
        // Age candidates are not repeated as space candidates.
        assert!(p.space.is_empty());
        // Max age 0 never removes by age.
        w.config.gc.max_age = Duration::ZERO;
        assert!(w.plan(t(100_000)).age.is_empty());
    }

    #[test]
    fn max_age_keeps_an_image_in_use() {
        let mut w = World::new(vec![image("0", 1)]).containers(vec![container("c", "0")]);
        w.config.gc.max_age = MIN;
        w.observe(t(0));
        let p = w.plan(t(1000));
        assert!(p.age.is_empty());
        assert_eq!(kept(&p, "0").label(), "in-use");
    }

    #[test]
    fn age_guard_holds_images_without_history_until_running_longer_than_max_age() {
        let mut w = World::new(vec![image("0", 1)]);
        w.config.gc.max_age = MIN;
        w.start = t(0);
        // A record that claims an old last use but has no history (for
        // example invented by a corrupt state file) is guarded...
        let mut map = std::collections::HashMap::new();
        map.insert(
            "0".to_string(),
            crate::records::Record {
                first_seen: t(0) - 10 * MIN,
                last_used: t(0) - 10 * MIN,
                size: 1,
                pinned: false,
                tags: Default::default(),
                digests: Default::default(),
                from_history: false,
                ever_used: false,
                usual_break: None,
            },
        );
        w.records = Records::from_map(map.clone());
        let p = w.plan(t(30));
        assert!(p.age.is_empty());
        assert_eq!(p.age_guarded, 1);
        // ...but is still a space candidate,
        assert_eq!(ids(&p.space), ["0"]);
        // and once the collector has run longer than max age, it goes.
        assert_eq!(ids(&w.plan(t(61)).age), ["0"]);
        // With history, it goes at once.
        map.get_mut("0").unwrap().from_history = true;
        w.records = Records::from_map(map);
        assert_eq!(ids(&w.plan(t(30)).age), ["0"]);
    }

    // Scenario 15: removing everything unused still keeps in-use, pinned and
    // too-young images.
    #[test]
    fn everything_unused_still_keeps_protected_kinds() {
        let mut pinned = image("pinned", 1);
        pinned.pinned = true;
        let mut w =
            World::new(vec![image("used", 1), pinned, image("old", 1)]).containers(vec![container("c", "used")]);
        w.config.gc.min_age = MIN;
        w.observe(t(0));
        w.snapshot.images.push(image("young", 1));
        w.observe(t(100));
        let p = w.plan(t(120));
        assert_eq!(ids(&p.space), ["old"]);
        assert_eq!(kept(&p, "used").label(), "in-use");
        assert_eq!(kept(&p, "pinned").label(), "pinned");
        assert_eq!(kept(&p, "young").label(), "too-young");
    }

    #[test]
    fn an_unknown_sandbox_image_keeps_never_used_images_unless_the_runtime_pins() {
        let mut w = World::new(vec![image("pause", 10), image("old", 10), image("fresh", 10)]);
        w.snapshot.sandbox_images.clear();
        w.snapshot.containers = vec![container("c", "old")];
        w.observe(t(0));
        w.snapshot.containers.clear();
        w.observe(t(60));
        let p = w.plan(t(120));
        assert_eq!(ids(&p.space), ["old"], "only the image a container used");
        assert_eq!(kept(&p, "pause"), &KeepReason::SandboxUnknown);
        assert_eq!(kept(&p, "fresh"), &KeepReason::SandboxUnknown);
        // A runtime that pins images pins its sandbox image: pinning protects it.
        w.snapshot.images[0].pinned = true;
        let p = w.plan(t(120));
        assert_eq!(kept(&p, "pause"), &KeepReason::Pinned);
        assert_eq!(ids(&p.space), ["fresh", "old"]);
    }

    #[test]
    fn sandbox_image_is_kept_by_familiar_or_full_name() {
        let mut pause = image("pause", 1);
        pause.repo_tags = vec!["registry.k8s.io/pause:3.9".to_string()].into();
        let mut w = World::new(vec![pause, image("other", 1)]);
        w.snapshot.sandbox_images = vec!["registry.k8s.io/pause:3.9".to_string()];
        w.observe(t(0));
        let p = w.plan(t(1));
        assert_eq!(*kept(&p, "pause"), KeepReason::Sandbox);
        assert_eq!(ids(&p.space), ["other"]);
    }

    #[test]
    fn protect_patterns_are_never_removed() {
        let mut w = World::new(vec![image("nginx", 1), image("redis", 1)]);
        w.config.protect.images = vec!["nginx:*".to_string()];
        w.config.gc.max_age = MIN;
        w.observe(t(0));
        let p = w.plan(t(100_000));
        assert_eq!(*kept(&p, "nginx"), KeepReason::Protected { pattern: "nginx:*" });
        assert_eq!(ids(&p.age), ["redis"]);
    }

    #[test]
    fn an_image_a_pod_names_is_kept_for_the_pod_as_an_image_in_use() {
        let mut w = World::new(vec![image("nginx", 1), image("redis", 1)]);
        w.config.gc.max_age = MIN;
        w.observe(t(0));
        // The pod spec names it as people write it; the runtime lists
        // `docker.io/library/nginx:latest`.
        let pods = Protections {
            references: vec![("nginx".to_string(), "default/web".to_string())],
            ..Default::default()
        };
        let listed = w.records.listed(&w.snapshot);
        let policy = GcPolicy::from(&w.config);
        let p = plan_listed(&w.snapshot, &listed, &policy, &pods, t(100_000), w.start);
        assert_eq!(*kept(&p, "nginx"), KeepReason::Pod { pod: "default/web" });
        assert_eq!(ids(&p.age), ["redis"]);
        assert_eq!(p.in_use_count(), 1);
        // Without the pod, it goes.
        assert_eq!(ids(&w.plan(t(100_000)).age), ["nginx", "redis"]);
    }

    #[test]
    fn protect_patterns_written_as_people_write_image_names_protect() {
        let tagged = |id: &str, tag: &str| Image {
            repo_tags: vec![tag.to_string()].into(),
            ..image(id, 1)
        };
        let patterns = [
            ("nginx", "docker.io/library/nginx:1.27"),
            ("docker.io/nginx:*", "docker.io/library/nginx:1.26"),
            ("index.docker.io/library/nginx:*", "docker.io/library/nginx:1.25"),
            ("registry.k8s.io/kube-proxy", "registry.k8s.io/kube-proxy:v1.31.0"),
            ("bitnami/redis", "docker.io/bitnami/redis:7.4"),
            ("library/nginx:*", "docker.io/library/nginx:1.24"),
        ];
        let images = patterns
            .iter()
            .enumerate()
            .map(|(n, (_, tag))| tagged(&n.to_string(), tag));
        let mut w = World::new(images.chain([tagged("other", "docker.io/library/redis:7")]).collect());
        w.config.gc.max_age = MIN;
        w.observe(t(0));
        for (n, (pattern, _)) in patterns.iter().enumerate() {
            w.config.protect.images = vec![pattern.to_string()];
            let p = w.plan(t(100_000));
            assert_eq!(
                *kept(&p, &n.to_string()),
                KeepReason::Protected { pattern },
                "{pattern}"
            );
            assert!(ids(&p.age).contains(&"other"), "{pattern} protects only its own");
        }
    }

    #[test]
    fn keep_recent_per_repository_keeps_the_newest_by_first_seen() {
        let tagged = |id: &str, tag: &str| Image {
            id: id.to_string(),
            repo_tags: vec![tag.to_string()].into(),
            repo_digests: Default::default(),
            size: 1,
            pinned: false,
        };
        let mut w = World::new(vec![tagged("v1", "ghcr.io/o/app:1")]);
        w.config.protect.keep_recent_per_repository = 2;
        w.observe(t(0));
        w.snapshot.images.push(tagged("v2", "ghcr.io/o/app:2"));
        w.observe(t(10));
        w.snapshot.images.push(tagged("v3", "ghcr.io/o/app:3"));
        w.snapshot.images.push(tagged("other", "ghcr.io/o/other:1"));
        w.observe(t(20));
        let p = w.plan(t(30));
        assert_eq!(ids(&p.space), ["v1"]);
        assert_eq!(
            *kept(&p, "v3"),
            KeepReason::KeepRecent {
                repository: "ghcr.io/o/app",
                rank: 1
            }
        );
        assert_eq!(kept(&p, "v2").label(), "keep-recent");
        assert_eq!(kept(&p, "other").label(), "keep-recent");
    }

    #[test]
    fn superseded_first_puts_older_tags_of_a_repository_before_other_images() {
        let tagged = |id: &str, tag: &str| Image {
            repo_tags: vec![tag.to_string()].into(),
            ..image(id, 1)
        };
        // `other` last used at 0; app v1 used until 10, then v2 pulled.
        let mut w = World::new(vec![
            tagged("other", "ghcr.io/o/other:1"),
            tagged("v1", "ghcr.io/o/app:1"),
        ])
        .containers(vec![container("c", "v1")]);
        w.observe(t(0));
        w.observe(t(10));
        w.snapshot.containers.clear();
        w.snapshot.images.push(tagged("v2", "ghcr.io/o/app:2"));
        w.observe(t(20));
        w.config.gc.order = Order::SupersededFirst;
        assert_eq!(
            ids(&w.plan(t(300)).space),
            ["other", "v1", "v2"],
            "v2 never ran: it supersedes nothing yet (a pre-pull, a rollout not made)"
        );
        // v2 rolled out: it runs after v1 last did.
        w.snapshot.containers = vec![container("c2", "v2")];
        w.observe(t(30));
        w.snapshot.containers.clear();
        w.observe(t(40));
        w.config.gc.order = Order::Lru;
        assert_eq!(ids(&w.plan(t(300)).space), ["other", "v1", "v2"], "least recently used");
        w.config.gc.order = Order::SupersededFirst;
        let p = w.plan(t(300));
        assert_eq!(ids(&p.space), ["v1", "other", "v2"], "v2 superseded v1");
        // Rolled back: v1 runs again after v2 did. The newer tag is the one
        // abandoned, and v1 is the current image: nothing is superseded.
        w.snapshot.containers = vec![container("c3", "v1")];
        w.observe(t(50));
        w.snapshot.containers.clear();
        w.observe(t(60));
        assert_eq!(ids(&w.plan(t(300)).space), ["other", "v2", "v1"], "after a rollback");
        // Nothing superseded: the order is least recently used.
        w.snapshot.images.pop();
        w.observe(t(70));
        assert_eq!(ids(&w.plan(t(300)).space), ["other", "v1"]);
    }

    #[test]
    fn reuse_puts_the_image_expected_back_last_and_superseded_tags_first() {
        let tagged = |id: &str, tag: &str| Image {
            repo_tags: vec![tag.to_string()].into(),
            ..image(id, 1)
        };
        let hour = 3600;
        let now = t(10 * hour);
        // A usual break and its spread, in seconds.
        let record = |id: &str, tag: &str, last_used: u64, usual_break: Option<(u64, u64)>| {
            let (id, mut record) = crate::testing::history(&tagged(id, tag), t(0), t(last_used));
            record.ever_used = true;
            record.usual_break = usual_break.map(|(usual, spread)| {
                Break::from_duration(Duration::from_secs(usual)).with_spread(Some(Duration::from_secs(spread)))
            });
            (id, record)
        };
        let mut w = World::new(vec![
            tagged("job", "ghcr.io/o/job:1"),
            tagged("pipeline", "ghcr.io/o/pipeline:1"),
            tagged("once", "ghcr.io/o/once:1"),
            tagged("stopped", "ghcr.io/o/stopped:1"),
            tagged("old", "ghcr.io/o/app:1"),
            tagged("new", "ghcr.io/o/app:2"),
        ]);
        w.records = Records::from_map(
            [
                // Runs every 2 h, last 90 min ago: back in 30 min.
                record("job", "ghcr.io/o/job:1", 10 * hour - 90 * 60, Some((2 * hour, 0))),
                // Used about every 2 h too, but at random (its breaks stray
                // by 3 h): however long since, back in about the mean of
                // its break and that time, 1 h 45 min.
                record(
                    "pipeline",
                    "ghcr.io/o/pipeline:1",
                    10 * hour - 90 * 60,
                    Some((2 * hour, 3 * hour)),
                ),
                // Used once, an hour ago: as long from now, in an hour.
                record("once", "ghcr.io/o/once:1", 9 * hour, None),
                // Ran every 20 min, but not for 50: stopped, back in 50 min.
                record(
                    "stopped",
                    "ghcr.io/o/stopped:1",
                    10 * hour - 50 * 60,
                    Some((20 * 60, 0)),
                ),
                // An older tag of a repository: superseded by `new`.
                record("old", "ghcr.io/o/app:1", 10 * hour - 10 * 60, None),
                record("new", "ghcr.io/o/app:2", 10 * hour - 5 * 60, None),
            ]
            .map(|(id, mut r)| {
                if id == "new" {
                    r.first_seen = t(hour);
                }
                (id, r)
            }),
        );
        w.observe(now);
        w.config.gc.order = Order::Lru;
        assert_eq!(
            ids(&w.plan(now).space),
            ["job", "pipeline", "once", "stopped", "old", "new"]
        );
        w.config.gc.order = Order::Reuse;
        let p = w.plan(now);
        // Superseded first, then the farthest expected back first.
        assert_eq!(ids(&p.space), ["old", "pipeline", "once", "stopped", "job", "new"]);
        let back = |id: &str| p.space.iter().find(|c| c.id == id).unwrap().expected_back(now);
        assert_eq!(back("job"), t(10 * hour + 30 * 60));
        assert_eq!(back("pipeline"), t(10 * hour + 105 * 60));
        assert_eq!(back("once"), t(11 * hour));
        assert_eq!(back("stopped"), t(10 * hour + 50 * 60));
        // What `plan` says each went by.
        let basis = |id: &str| {
            p.space
                .iter()
                .find(|c| c.id == id)
                .unwrap()
                .expectation(now)
                .1
                .describe()
        };
        assert_eq!(basis("job"), "runs every 2h");
        assert_eq!(basis("pipeline"), "used about every 2h, at random");
        assert_eq!(basis("once"), "unused 1h");
        assert_eq!(basis("stopped"), "unused 50m");
    }

    #[test]
    fn expected_back_is_never_before_now_and_never_overflows() {
        let hour = Duration::from_secs(3600);
        let now = t(100 * 3600);
        let periodic = |d: Duration| Some(Break::from_duration(d).with_spread(Some(Duration::ZERO)));
        // Due an hour ago, within twice its break: one break from now.
        assert_eq!(expected_back(now - hour * 3, periodic(hour * 2), now), now + hour * 2);
        assert_eq!(
            crate::policy::order::expectation(now - hour * 3, periodic(hour * 2), now)
                .1
                .describe(),
            "runs every 2h, late"
        );
        // Due right now: now.
        assert_eq!(expected_back(now - hour * 2, periodic(hour * 2), now), now);
        // A clock behind the record: no time unused.
        assert_eq!(expected_back(now + hour, None, now), now);
        assert_eq!(expected_back(now + hour, periodic(hour), now), now + hour * 2);
        // Absurd breaks, spreads and times saturate instead of panicking.
        for spread in [None, Some(Duration::ZERO), Some(Duration::MAX)] {
            let absurd = Some(Break::from_duration(Duration::MAX).with_spread(spread));
            let _ = expected_back(SystemTime::UNIX_EPOCH, absurd, now);
            let _ = expected_back(now, absurd, now);
            let _ = expected_back(
                SystemTime::UNIX_EPOCH,
                absurd,
                SystemTime::UNIX_EPOCH + Duration::MAX / 2,
            );
        }
    }

    /// How far an image's breaks stray moves its expectation from the
    /// periodic one (its next run) to the random one (about its mean
    /// break from now).
    #[test]
    fn the_spread_of_the_breaks_moves_the_expectation_from_the_next_run_to_a_mean_break_from_now() {
        let minute = Duration::from_secs(60);
        let now = t(100 * 3600);
        let last_used = now - minute * 90;
        let with = |spread: Option<u64>| {
            let b = Break::from_duration(minute * 120).with_spread(spread.map(|m| minute * m as u32));
            crate::policy::order::expectation(last_used, Some(b), now)
        };
        // Every 2 h, last used 90 min ago: periodic, back in 30 min; at
        // random, in the mean of 2 h and 90 min, 105 min.
        assert_eq!(
            with(Some(0)),
            (now + minute * 30, order::Basis::Due { usual: minute * 120 })
        );
        assert_eq!(with(Some(180)).0, now + minute * 105);
        assert_eq!(with(Some(1_000)).0, now + minute * 105);
        assert_eq!(with(Some(180)).1.describe(), "used about every 2h, at random");
        // A spread of 60 min, a third of the way: 55 min, still periodic
        // for a person.
        assert_eq!(with(Some(60)).0, now + minute * 55);
        assert_eq!(with(Some(60)).1, order::Basis::Due { usual: minute * 120 });
        // One break alone, spread not known: two thirds of the way, 80 min.
        assert_eq!(with(None).0, now + minute * 80);
    }

    #[test]
    fn duplicate_image_ids_are_planned_once() {
        let mut w = World::new(vec![image("0", 1), image("0", 1)]);
        w.observe(t(0));
        let p = w.plan(t(1));
        assert_eq!(ids(&p.space), ["0"]);
    }

    #[test]
    fn clock_behind_the_records_counts_as_no_time_passed() {
        let mut w = World::new(vec![image("0", 1)]);
        w.config.gc.max_age = MIN;
        w.config.gc.min_age = MIN;
        w.observe(t(1000));
        // The clock went backwards: nothing is old, nothing is removable.
        let p = w.plan(t(0));
        assert!(p.age.is_empty() && p.space.is_empty());
        assert_eq!(kept(&p, "0").label(), "too-young");
    }
}
