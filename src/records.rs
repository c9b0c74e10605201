//! Per-image records (first seen, last used, size, pinned, names) and how a
//! snapshot of the runtime updates them, following the kubelet's rules:
//!
//! - every listed container, in any state, keeps its image in use and moves
//!   the image's last-used time to now;
//! - an image seen for the first time gets first seen = now, and counts as
//!   last used when first seen until a container uses it;
//! - records of images the runtime no longer lists are dropped after
//!   [`VANISHED_GRACE`]: one empty or partial listing (a runtime restarting,
//!   a pull in progress) must not reset the ages of every image. An image
//!   listed again within the grace gets its history back.
//!
//! Records are persisted by [`crate::state`]; a record loaded from disk is
//! marked `from_history` so the planner knows its times were observed, not
//! invented at start-up.

use std::borrow::Cow;
use std::collections::HashMap as StdHashMap;
use std::collections::hash_map::Entry;
use std::time::SystemTime;

use crate::cri::{Container, Image};
use crate::reference;

/// The maps keyed by image names and ids: foldhash, seeded per process, is
/// several times faster than SipHash on these 70-120 byte keys, and the
/// planner hashes each image's names every cycle.
pub(crate) type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;

/// How long the record of an image the runtime stopped listing is kept, in
/// case the listing was a hiccup: two default cycles. An image imagegc
/// removes itself is forgotten at once.
pub const VANISHED_GRACE: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// What imagegc knows about one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub first_seen: SystemTime,
    pub last_used: SystemTime,
    pub size: u64,
    pub pinned: bool,
    pub tags: Vec<String>,
    pub digests: Vec<String>,
    /// True when the record came from the state file (or survived a cycle
    /// that was itself loaded from it): its times span a previous process.
    pub from_history: bool,
}

/// All records, keyed by image id.
#[derive(Debug, Clone, Default)]
pub struct Records {
    map: HashMap<String, Record>,
    /// Images seen in use by this process. With the records' times (a last
    /// use after the first sighting), whether a container ever used an
    /// image: see [`Records::ever_used`].
    used: HashMap<String, ()>,
    /// Records of images the runtime stopped listing, with when it did:
    /// kept for [`VANISHED_GRACE`] and saved with the others, invisible to
    /// the planner.
    vanished: HashMap<String, (Record, SystemTime)>,
    /// Whether anything other than last-used times changed since the last
    /// save: an image appeared or went, or its size, pin or names changed.
    changed: bool,
}

/// What one listing did to the records, beyond last-used times.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Images seen for the first time.
    pub new_ids: Vec<String>,
    /// Images no longer listed whose records are kept for the grace.
    pub vanished: usize,
    /// Images listed again within the grace: their history is back.
    pub returned: usize,
    /// Records dropped because their image stayed unlisted past the grace.
    pub dropped: usize,
}

/// Equal records hold the same images with the same facts; what changed
/// since the last save is not part of them.
impl PartialEq for Records {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl Eq for Records {}

impl Records {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_map(map: impl IntoIterator<Item = (String, Record)>) -> Self {
        Records {
            map: map.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Records as the state file held them, in a map of the records' own
    /// kind (no rehashing of every id).
    pub(crate) fn from_loaded(map: HashMap<String, Record>) -> Self {
        Records { map, ..Self::default() }
    }

    pub fn get(&self, id: &str) -> Option<&Record> {
        self.map.get(id)
    }

    /// Whether any container is known to have used the image: seen in use
    /// by this process, or last used after it was first seen. An image used
    /// only at its first sighting before a restart reads as never used,
    /// which errs on the side of keeping it (see the planner's rule for a
    /// runtime that does not name its sandbox image).
    pub fn ever_used(&self, id: &str) -> bool {
        self.used.contains_key(id) || self.map.get(id).is_some_and(|r| r.last_used > r.first_seen)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every record, those of images not listed for less than the grace
    /// included: what the state file keeps.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Record)> {
        self.map
            .iter()
            .chain(self.vanished.iter().map(|(id, (record, _))| (id, record)))
    }

    /// Records of images the runtime stopped listing, kept for the grace.
    pub fn vanished_len(&self) -> usize {
        self.vanished.len()
    }

    /// Updates the records from a full listing of images and containers.
    pub fn observe(&mut self, images: &[Image], containers: &[Container], now: SystemTime) -> Observed {
        let mut observed = Observed::default();
        let new_ids = &mut observed.new_ids;
        let references = References::new(images, containers, &[]);
        let mut users = Vec::new();
        let mut listed: HashMap<&str, ()> = HashMap::with_capacity_and_hasher(images.len(), Default::default());
        for image in images {
            listed.insert(image.id.as_str(), ());
            // A listing of an id is enough to mark its one record used.
            references.users(image, &mut users);
            let used = !users.is_empty();
            // Looked up before inserting: the id is copied only for a new
            // record, not for every image every cycle.
            if !self.map.contains_key(image.id.as_str())
                && let Some((record, _)) = self.vanished.remove(image.id.as_str())
            {
                self.changed = true;
                observed.returned += 1;
                self.map.insert(image.id.clone(), record);
            }
            if !self.map.contains_key(image.id.as_str()) {
                self.changed = true;
                new_ids.push(image.id.clone());
                let record = Record {
                    first_seen: now,
                    last_used: now,
                    size: image.size,
                    pinned: image.pinned,
                    tags: Vec::new(),
                    digests: Vec::new(),
                    from_history: false,
                };
                self.map.insert(image.id.clone(), record);
            }
            let record = self.map.get_mut(image.id.as_str()).expect("inserted above");
            if used {
                record.last_used = record.last_used.max(now);
                if !self.used.contains_key(image.id.as_str()) {
                    self.used.insert(image.id.clone(), ());
                }
            }
            if record.size != image.size || record.pinned != image.pinned {
                record.size = image.size;
                record.pinned = image.pinned;
                self.changed = true;
            }
            if record.tags != image.repo_tags {
                record.tags.clone_from(&image.repo_tags);
                self.changed = true;
            }
            if record.digests != image.repo_digests {
                record.digests.clone_from(&image.repo_digests);
                self.changed = true;
            }
        }
        if self.map.len() > listed.len() {
            let gone: Vec<String> = self
                .map
                .keys()
                .filter(|id| !listed.contains_key(id.as_str()))
                .cloned()
                .collect();
            for id in gone {
                let record = self.map.remove(&id).expect("listed above");
                self.vanished.insert(id, (record, now));
                observed.vanished += 1;
            }
            self.changed = true;
        }
        let before = self.vanished.len();
        self.vanished
            .retain(|_, (_, since)| now.duration_since(*since).unwrap_or_default() < VANISHED_GRACE);
        observed.dropped = before - self.vanished.len();
        self.changed |= observed.dropped > 0;
        self.used.retain(|id, _| listed.contains_key(id.as_str()));
        observed
    }

    /// Forgets an image (after it was removed).
    pub fn remove(&mut self, id: &str) {
        self.changed |= self.map.remove(id).is_some() | self.vanished.remove(id).is_some();
    }

    /// Whether anything but last-used times changed since the last
    /// [`Records::saved`].
    pub fn changed(&self) -> bool {
        self.changed
    }

    /// Notes that the records as they are now were saved.
    pub fn saved(&mut self) {
        self.changed = false;
    }

    /// Marks images used now, from a container listing or events between
    /// cycles; images without a record are left for the next full listing.
    pub fn mark_used<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, now: SystemTime) {
        for id in ids {
            if let Some(record) = self.map.get_mut(id) {
                record.last_used = record.last_used.max(now);
                if !self.used.contains_key(id) {
                    self.used.insert(id.to_string(), ());
                }
            }
        }
    }
}

/// Which images are referenced by which containers.
///
/// A container names its image in up to three places (`image_id`,
/// `image_ref`, the spec `image`); each is matched against every image's id,
/// tags and digests, with and without normalization. Any match counts: when
/// in doubt, an image is in use.
#[derive(Debug, Default)]
pub struct InUse<'a> {
    /// Image id → ids of the containers that use it.
    by_image: HashMap<&'a str, Vec<&'a str>>,
}

impl<'a> InUse<'a> {
    pub fn new(images: &'a [Image], containers: &'a [Container]) -> Self {
        let references = References::new(images, containers, &[]);
        let mut in_use = InUse::default();
        let mut users = Vec::new();
        for image in images {
            references.users(image, &mut users);
            if users.is_empty() {
                continue;
            }
            let ids = users.iter().map(|&i| containers[i].id.as_str());
            match in_use.by_image.entry(&image.id) {
                Entry::Vacant(entry) => {
                    entry.insert(ids.collect());
                }
                // The same id listed twice: the union of both.
                Entry::Occupied(mut entry) => {
                    let known = entry.get_mut();
                    known.extend(ids);
                    known.sort_unstable();
                    known.dedup();
                }
            }
        }
        in_use
    }

    pub fn is_used(&self, image_id: &str) -> bool {
        self.by_image.contains_key(image_id)
    }

    /// The containers using an image (empty when unused).
    pub fn containers(&self, image_id: &str) -> &[&'a str] {
        self.by_image.get(image_id).map_or(&[], Vec::as_slice)
    }

    pub fn image_ids(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.by_image.keys().copied()
    }

    pub fn len(&self) -> usize {
        self.by_image.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_image.is_empty()
    }
}

/// The containers' references to images (and the runtime's sandbox images),
/// ready to tell which of them name an image. Built once per listing from
/// the containers, which are far fewer than the images, so that each image
/// costs a few lookups in small tables.
///
/// A container names its own image precisely (its `image_id`, or an
/// `image_ref` that is an id or a digest) or loosely (the spec's tag, or an
/// `image_ref` that is a tag). A loose name counts only for a container
/// none of whose precise names matches a listed image: after a tag moved to
/// a newer image, the container still uses the image it was created from,
/// not the one that took the tag. A container with no precise match (its
/// image listed under other names, a runtime that reports only the tag)
/// keeps every image its tag names: when in doubt, in use. Images mounted as
/// volumes, and the sandbox images, always count.
pub struct References<'a> {
    precise: ReferenceSet<'a>,
    loose: ReferenceSet<'a>,
    /// Mounted images (owners: containers) and sandbox images (owners from
    /// `sandbox_owner` on).
    always: ReferenceSet<'a>,
    /// Per container: whether a precise name matched a listed image.
    resolved: Vec<bool>,
    /// The first owner number standing for a sandbox reference: one past
    /// the containers.
    sandbox_owner: usize,
}

/// Whether a container's `image_ref` names one image exactly.
fn is_precise(reference: &str) -> bool {
    reference::is_id(reference) || reference::digest_of(reference).is_some()
}

impl<'a> References<'a> {
    pub fn new<'i>(
        images: impl IntoIterator<Item = &'i Image>,
        containers: &'a [Container],
        sandbox: &[&'a str],
    ) -> Self {
        let sandbox_owner = containers.len();
        let own = containers.iter().enumerate();
        let precise = ReferenceSet::new(own.clone().flat_map(|(i, c)| {
            let image_ref = Some(c.image_ref.as_str()).filter(|r| is_precise(r));
            [(i, c.image_id.as_str())].into_iter().chain(image_ref.map(|r| (i, r)))
        }));
        let loose = ReferenceSet::new(own.clone().flat_map(|(i, c)| {
            let image_ref = Some(c.image_ref.as_str()).filter(|r| !is_precise(r));
            [(i, c.image.as_str())].into_iter().chain(image_ref.map(|r| (i, r)))
        }));
        let always = ReferenceSet::new(
            own.flat_map(|(i, c)| c.mounted_images.iter().map(move |m| (i, m.as_str())))
                .chain(sandbox.iter().enumerate().map(|(k, s)| (sandbox_owner + k, *s))),
        );
        let mut resolved = vec![false; containers.len()];
        if !precise.is_empty() {
            let mut owners = Vec::new();
            for image in images {
                owners.clear();
                precise.owners(image, &mut owners);
                for &owner in &owners {
                    resolved[owner] = true;
                }
            }
        }
        References {
            precise,
            loose,
            always,
            resolved,
            sandbox_owner,
        }
    }

    /// Sets `users` to the indices of the containers that name `image`
    /// (ascending, each once) and returns whether a sandbox reference
    /// names it.
    pub fn users(&self, image: &Image, users: &mut Vec<usize>) -> bool {
        users.clear();
        self.add_users(image, users)
    }

    /// [`References::users`], adding to `users` rather than replacing it:
    /// for an image id listed more than once, the union of its listings.
    pub fn add_users(&self, image: &Image, users: &mut Vec<usize>) -> bool {
        self.precise.owners(image, users);
        self.always.owners(image, users);
        let loose_from = users.len();
        self.loose.owners(image, users);
        let mut i = loose_from;
        while i < users.len() {
            if self.resolved[users[i]] {
                users.swap_remove(i);
            } else {
                i += 1;
            }
        }
        users.sort_unstable();
        users.dedup();
        let mut sandbox = false;
        while users.last().is_some_and(|&u| u >= self.sandbox_owner) {
            users.pop();
            sandbox = true;
        }
        sandbox
    }
}

/// The ids of the images any of `references` names (each once, in listing
/// order), matched the way [`InUse`] matches containers' references.
pub fn images_named<'a, 'r>(images: &'a [Image], references: impl IntoIterator<Item = &'r str>) -> Vec<&'a str> {
    let references = ReferenceSet::new(references.into_iter().map(|r| (0, r)));
    let mut owners = Vec::new();
    let mut ids: Vec<&'a str> = Vec::new();
    for image in images {
        owners.clear();
        references.owners(image, &mut owners);
        if !owners.is_empty() && !ids.contains(&image.id.as_str()) {
            ids.push(&image.id);
        }
    }
    ids
}

/// References to images made by some owners (containers, numbered), in
/// every form that can match: as written, without `sha256:`, normalized.
/// An image is named by a reference when one of its own forms (its id
/// without `sha256:`, each tag and digest as listed and normalized) is
/// among them.
///
/// The set is built from the references, not from the images: a node runs
/// far fewer containers than it holds images, so matching every image is a
/// few lookups in a small table rather than inserting every image's names
/// into a large one.
struct ReferenceSet<'a> {
    /// Forms found in the references as written (nearly all of them).
    borrowed: HashMap<&'a str, Owners>,
    /// Forms that normalizing had to build (a familiar `nginx:1`).
    built: HashMap<String, Owners>,
    /// Owners past the first of each form, by [`Owners::more`].
    more: Vec<Vec<u32>>,
}

/// The owners of one form: the first, and an index into
/// [`ReferenceSet::more`] when there are others. Small, so the table stays
/// in cache.
#[derive(Debug, Clone, Copy)]
struct Owners {
    first: u32,
    more: u32,
}

const NO_MORE: u32 = u32::MAX;

impl<'a> ReferenceSet<'a> {
    fn is_empty(&self) -> bool {
        self.borrowed.is_empty() && self.built.is_empty()
    }

    /// From `(owner, reference)` pairs; empty references are skipped.
    fn new(references: impl Iterator<Item = (usize, &'a str)>) -> Self {
        let mut references: Vec<(usize, &'a str)> = references.collect();
        // Owners in ascending order, so a repeat is always the last noted.
        references.sort_by_key(|&(owner, _)| owner);
        let mut set = ReferenceSet {
            // About one form per reference: a tag is one, an id one, an
            // empty reference none.
            borrowed: HashMap::with_capacity_and_hasher(references.len(), Default::default()),
            built: HashMap::default(),
            more: Vec::new(),
        };
        for (owner, reference) in references {
            if reference.is_empty() {
                continue;
            }
            let owner = u32::try_from(owner).expect("fewer than 4 billion containers");
            if reference::is_id(reference) {
                // Images are looked up by their id without `sha256:`, and a
                // tag that is an id likewise.
                set.add(reference::bare_id(reference), owner);
                continue;
            }
            set.add(reference, owner);
            let bare = reference::bare_id(reference);
            if bare != reference {
                set.add(bare, owner);
            }
            // A digest reference names its image by the digest alone,
            // whatever stands before the `@` (CRI-O drops the registry's
            // port there once a tag has moved).
            if let Some(digest) = reference::digest_of(reference) {
                set.add(digest, owner);
            }
            if let Cow::Owned(normalized) = reference::normalized(reference)
                && normalized != bare
            {
                let entry = set.built.entry(normalized).or_insert(Owners {
                    first: owner,
                    more: NO_MORE,
                });
                Self::add_owner(&mut set.more, entry, owner);
            }
        }
        set
    }

    fn add(&mut self, form: &'a str, owner: u32) {
        match self.borrowed.entry(form) {
            Entry::Vacant(entry) => {
                entry.insert(Owners {
                    first: owner,
                    more: NO_MORE,
                });
            }
            Entry::Occupied(mut entry) => Self::add_owner(&mut self.more, entry.get_mut(), owner),
        }
    }

    /// Notes one more owner of a form (owners come in ascending order, so
    /// a repeat is the last one noted).
    fn add_owner(more: &mut Vec<Vec<u32>>, owners: &mut Owners, owner: u32) {
        if owners.more == NO_MORE {
            if owners.first != owner {
                owners.more = more.len() as u32;
                more.push(vec![owner]);
            }
            return;
        }
        let list = &mut more[owners.more as usize];
        if list.last() != Some(&owner) {
            list.push(owner);
        }
    }

    /// Appends the owners of the references that name `image` (possibly
    /// more than once).
    fn owners(&self, image: &Image, out: &mut Vec<usize>) {
        if self.borrowed.is_empty() && self.built.is_empty() {
            return;
        }
        let mut check = |form: &str| {
            // A form can be in both tables: `nginx:1` normalized by one
            // container, written out in full by another.
            let built = if self.built.is_empty() {
                None
            } else {
                self.built.get(form)
            };
            for owners in self.borrowed.get(form).into_iter().chain(built) {
                out.push(owners.first as usize);
                if owners.more != NO_MORE {
                    out.extend(self.more[owners.more as usize].iter().map(|&o| o as usize));
                }
            }
        };
        if !image.id.is_empty() {
            check(reference::bare_id(&image.id));
        }
        for digest in image.repo_digests.iter().filter_map(|d| reference::digest_of(d)) {
            check(digest);
        }
        for name in image.repo_tags.iter().chain(&image.repo_digests) {
            check(name);
            if reference::is_id(name) {
                check(reference::bare_id(name));
            } else if let Cow::Owned(normalized) = reference::normalized(name) {
                check(&normalized);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{container_naming as container, library_image as image};
    use std::time::Duration;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    // KUBELET.md scenario 1: initial detection.
    #[test]
    fn initial_detection() {
        let images = [image("0", 1024), image("1", 2048), image("2", 2048)];
        let containers = [container("c1", "1"), container("c2", "2")];
        let mut records = Records::new();
        records.observe(&images, &containers, t(0));
        assert_eq!(records.len(), 3);
        for id in ["0", "1", "2"] {
            let r = records.get(id).unwrap();
            assert_eq!(r.first_seen, t(0));
            assert_eq!(r.last_used, t(0));
        }
        let in_use = InUse::new(&images, &containers);
        assert!(!in_use.is_used("0"));
        assert!(in_use.is_used("1") && in_use.is_used("2"));
    }

    // Scenario 2: a new image appears in a later pass.
    #[test]
    fn new_image_gets_its_own_first_seen() {
        let mut records = Records::new();
        records.observe(&[image("0", 1)], &[], t(0));
        records.observe(&[image("0", 1), image("1", 1)], &[], t(60));
        assert_eq!(records.get("0").unwrap().first_seen, t(0));
        assert_eq!(records.get("1").unwrap().first_seen, t(60));
    }

    // Scenario 3: a container goes away; last used stays.
    #[test]
    fn last_used_stays_when_the_container_goes() {
        let mut records = Records::new();
        let images = [image("0", 1)];
        records.observe(&images, &[container("c", "0")], t(0));
        records.observe(&images, &[container("c", "0")], t(10));
        records.observe(&images, &[], t(20));
        assert_eq!(records.get("0").unwrap().last_used, t(10));
        assert_eq!(records.get("0").unwrap().first_seen, t(0));
    }

    // Scenario 4: an image disappears; its record is dropped (once it has
    // stayed unlisted for the grace: until then it is only set aside).
    #[test]
    fn records_of_vanished_images_are_dropped() {
        let mut records = Records::new();
        records.observe(&[image("0", 1), image("1", 1)], &[], t(0));
        let observed = records.observe(&[image("1", 1)], &[], t(10));
        assert_eq!(observed.vanished, 1);
        assert!(records.get("0").is_none());
        assert!(records.get("1").is_some());
        let grace = VANISHED_GRACE.as_secs();
        let observed = records.observe(&[image("1", 1)], &[], t(10 + grace));
        assert_eq!(observed.dropped, 1);
        assert_eq!(records.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["1"]);
        // Listed again after the grace: a new image.
        records.observe(&[image("0", 1), image("1", 1)], &[], t(20 + grace));
        assert_eq!(records.get("0").unwrap().first_seen, t(20 + grace));
    }

    #[test]
    fn one_empty_listing_does_not_reset_the_history_of_every_image() {
        let images = [image("0", 1), image("1", 1), image("2", 1)];
        let mut records = Records::new();
        records.observe(&images, &[container("c", "1")], t(0));
        records.observe(&images, &[], t(100));
        let before: Vec<Record> = ["0", "1", "2"].map(|id| records.get(id).unwrap().clone()).into();

        // The runtime answers one listing with no image at all.
        let observed = records.observe(&[], &[], t(200));
        assert_eq!((observed.vanished, observed.dropped), (3, 0));
        assert!(records.get("0").is_none(), "the planner sees only listed images");
        // Saved meanwhile, the set-aside records are in the state.
        assert_eq!(records.iter().count(), 3);

        let observed = records.observe(&images, &[], t(300));
        assert_eq!((observed.returned, observed.new_ids.len()), (3, 0));
        let after: Vec<Record> = ["0", "1", "2"].map(|id| records.get(id).unwrap().clone()).into();
        assert_eq!(after, before, "first seen and last used are what they were");
    }

    #[test]
    fn an_image_imagegc_removed_is_forgotten_at_once() {
        let mut records = Records::new();
        records.observe(&[image("0", 1)], &[], t(0));
        records.remove("0");
        records.observe(&[], &[], t(10));
        records.observe(&[image("0", 1)], &[], t(20));
        assert_eq!(records.get("0").unwrap().first_seen, t(20));
    }

    #[test]
    fn containers_match_by_id_ref_digest_or_familiar_tag() {
        let id = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
        let img = Image {
            id: id.to_string(),
            repo_tags: vec!["docker.io/library/nginx:1.27".to_string()],
            repo_digests: vec![
                "docker.io/library/nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222"
                    .to_string(),
            ],
            size: 1,
            pinned: false,
        };
        let images = [img];
        let by = |c: Container| InUse::new(&images, &[c]).is_used(id);
        assert!(by(Container {
            image_id: id.to_string(),
            ..Default::default()
        }));
        assert!(by(Container {
            image_ref: id.to_string(),
            ..Default::default()
        }));
        // CRI-O style bare id.
        assert!(by(Container {
            image_ref: reference::bare_id(id).to_string(),
            ..Default::default()
        }));
        // CRI-O style digest in image_ref.
        assert!(by(Container {
            image_ref:
                "docker.io/library/nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222"
                    .to_string(),
            ..Default::default()
        }));
        // The familiar tag in the spec.
        assert!(by(Container {
            image: "nginx:1.27".to_string(),
            ..Default::default()
        }));
        assert!(!by(Container {
            image: "nginx:1.28".to_string(),
            image_ref: "sha256:3333333333333333333333333333333333333333333333333333333333333333".to_string(),
            ..Default::default()
        }));
    }

    #[test]
    fn every_container_naming_an_image_is_listed_whichever_form_it_wrote() {
        let images = [image("nginx", 1), image("other", 1)];
        // One familiar name (normalized by imagegc), one in full (as written).
        let containers = [
            container("short", "nginx"),
            container("full", "docker.io/library/nginx:latest"),
            container("again", "nginx:latest"),
        ];
        let in_use = InUse::new(&images, &containers);
        assert_eq!(in_use.containers("nginx"), ["short", "full", "again"]);
        assert!(!in_use.is_used("other"));
        // And the sandbox reference, written short, beside a container.
        let mut users = Vec::new();
        assert!(References::new(&images, &containers[1..2], &["nginx"]).users(&images[0], &mut users));
        assert_eq!(users, [0], "the container `full`");
    }

    #[test]
    fn ids_match_with_or_without_their_prefix_on_either_side() {
        let hex = "ab".repeat(32);
        let prefixed = format!("sha256:{hex}");
        let mut with_prefix = image("x", 1);
        with_prefix.id = prefixed.clone();
        let mut bare = image("y", 1);
        bare.id = hex.clone();
        // A runtime that lists an id among the tags.
        let mut tagged = image("z", 1);
        tagged.repo_tags.push(prefixed.clone());
        for reference in [&prefixed, &hex] {
            for (img, id) in [(&with_prefix, &prefixed), (&bare, &hex), (&tagged, &"z".to_string())] {
                let images = [img.clone()];
                assert!(
                    InUse::new(&images, &[container("c", reference)]).is_used(id),
                    "{reference} should name {id}"
                );
            }
        }
    }

    /// A container names the image it was created from by id; the tag in
    /// its spec has since moved to a newer image, which it does not use.
    #[test]
    fn a_tag_moved_to_a_newer_image_keeps_only_the_one_in_use() {
        let id = |n: u8| format!("sha256:{}", n.to_string().repeat(64));
        let mut old = image("old", 1);
        old.id = id(1);
        old.repo_tags.clear();
        let mut new = image("new", 1);
        new.id = id(2);
        new.repo_tags = vec!["docker.io/library/app:1".to_string()];
        let images = [old, new, image("other", 1)];
        // Created from `app:1` when it was the old image; the tag has moved since.
        let containers = [Container {
            id: "c".to_string(),
            image: "app:1".to_string(),
            image_ref: id(1),
            ..Default::default()
        }];
        let in_use = InUse::new(&images, &containers);
        assert_eq!(in_use.containers(&id(1)), ["c"]);
        assert!(!in_use.is_used(&id(2)));
        assert!(!in_use.is_used("other"));
        assert_eq!(in_use.len(), 1);
        // Had the old image gone, the tag would keep the new one in use:
        // when in doubt, in use.
        let in_use = InUse::new(&images[1..], &containers);
        assert_eq!(in_use.containers(&id(2)), ["c"]);
    }

    #[test]
    fn the_sandbox_reference_is_noted_apart_from_containers() {
        let images = [image("pause", 1), image("app", 1)];
        let containers = [container("c", "app")];
        let references = References::new(&images, &containers, &["pause"]);
        let mut users = Vec::new();
        assert!(references.users(&images[0], &mut users) && users.is_empty());
        assert!(!references.users(&images[1], &mut users) && users == [0]);
        // The same image listed twice: containers from both listings, once each.
        let images = [image("app", 1), image("app", 1)];
        let containers = [container("c1", "app"), container("c2", "docker.io/library/app:latest")];
        assert_eq!(InUse::new(&images, &containers).containers("app"), ["c1", "c2"]);
    }

    #[test]
    fn mark_used_moves_last_used_forward_only() {
        let mut records = Records::new();
        records.observe(&[image("0", 1)], &[], t(100));
        records.mark_used(["0", "unknown"], t(200));
        assert_eq!(records.get("0").unwrap().last_used, t(200));
        records.mark_used(["0"], t(150));
        assert_eq!(records.get("0").unwrap().last_used, t(200));
        assert_eq!(records.len(), 1);
    }
}
