//! How a container names an image, and which images the containers use:
//! the one place that reads every runtime's way of naming (an id with or
//! without `sha256:`, `image_id`, an `image_ref` that is an id, a digest
//! under any name before the `@`, or a tag; images mounted as volumes; the
//! sandbox images). A cycle matches its listing once, through
//! [`References::matches`], as the records see it
//! ([`crate::records::Records::observe_snapshot`]); the planner reads those
//! matches, so the records (who was used when) and the plan (who is in use
//! now) cannot disagree. No IO.

use std::borrow::Cow;
use std::collections::hash_map::Entry;

use crate::collections::HashMap;
use crate::model::reference;
use crate::model::{Container, Image};

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
        let matches = References::new(containers, &[]).matches(images);
        let mut in_use = InUse::default();
        for (i, image) in images.iter().enumerate() {
            let users = matches.users(i);
            if users.is_empty() {
                continue;
            }
            let ids = users.iter().map(|&c| containers[c as usize].id.as_str());
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

    pub fn len(&self) -> usize {
        self.by_image.len()
    }
}

/// The containers' references to images (and the runtime's sandbox images),
/// ready to tell which of them name which images. Built once per listing
/// from the containers, which are far fewer than the images, so that
/// matching an image costs a few lookups in one small table.
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
///
/// A container that may still start or runs (created, running, or in a
/// state not known) and whose names match no listed image at all (its tag
/// moved and its digest is listed under no image, a listing or an
/// `ImageStatus` that dropped the name it used) keeps every image of the
/// repositories it names: the images it could mean.
pub struct References<'a> {
    forms: Forms<'a>,
    /// The containers, for the repositories of those that may run and
    /// match no listed image (read only then).
    containers: &'a [Container],
}

/// How a reference names its image; see [`References`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Precise = 0,
    Loose = 1,
    Always = 2,
}

/// Whether a container's `image_ref` names one image exactly.
fn is_precise(reference: &str) -> bool {
    reference::is_id(reference) || reference::digest_of(reference).is_some()
}

impl<'a> References<'a> {
    /// The references of `containers`, and the sandbox images (whose
    /// matches [`Matches::sandbox`] reports apart from the containers).
    pub fn new(containers: &'a [Container], sandbox: &[&'a str]) -> Self {
        let sandbox_owner = containers.len();
        let mut references = Vec::with_capacity(containers.len() * 2 + sandbox.len());
        for (i, c) in containers.iter().enumerate() {
            let image_ref = c.image_ref.as_str();
            references.push((i, Kind::Precise, c.image_id.as_str()));
            let ref_kind = if is_precise(image_ref) {
                Kind::Precise
            } else {
                Kind::Loose
            };
            references.push((i, ref_kind, image_ref));
            references.push((i, Kind::Loose, c.image.as_str()));
            references.extend(c.mounted_images.iter().map(|m| (i, Kind::Always, m.as_str())));
        }
        references.extend(
            sandbox
                .iter()
                .enumerate()
                .map(|(k, s)| (sandbox_owner + k, Kind::Always, *s)),
        );
        References {
            forms: Forms::new(references),
            containers,
        }
    }

    /// Matches every image of a listing, in one pass: which containers name
    /// each (by its place in the listing) and whether a sandbox reference
    /// does. The whole listing is needed, not one image: whether a
    /// container's loose name counts depends on whether its precise names
    /// match any listed image.
    pub fn matches<'i, I>(&self, images: I) -> Matches
    where
        I: IntoIterator<Item = &'i Image>,
        I::IntoIter: Clone,
    {
        // Walked twice at most (see `unnamed_repositories`), never copied:
        // a big node's listing is 100,000 images.
        let images = images.into_iter();
        // (image, owner and kind) for every form of every image found in
        // the table; most images of a node are named by no container.
        let mut hits: Vec<(u32, u32)> = Vec::new();
        let mut resolved = vec![false; self.containers.len()];
        let mut named = vec![false; self.containers.len()];
        let mut count = 0u32;
        for image in images.clone() {
            let at = hits.len();
            self.forms.hits(image, |owner| hits.push((count, owner)));
            for &(_, owner) in &hits[at..] {
                let index = (owner >> KIND_BITS) as usize;
                let kind = owner & KIND_MASK;
                if kind == Kind::Precise as u32 {
                    resolved[index] = true;
                }
                if kind != Kind::Always as u32 {
                    named[index] = true;
                }
            }
            count += 1;
        }
        self.unnamed_repositories(images, &named, &mut hits);
        let mut matches = Matches {
            span_of: vec![NO_SPAN; count as usize],
            spans: Vec::new(),
            users: Vec::with_capacity(hits.len()),
        };
        // The hits come image by image: each image's owners, once each,
        // loose names of resolved containers left out.
        let mut users = Vec::new();
        for run in hits.chunk_by(|a, b| a.0 == b.0) {
            users.clear();
            users.extend(run.iter().map(|&(_, owner)| owner).filter_map(|owner| {
                let index = owner >> KIND_BITS;
                let loose = owner & KIND_MASK == Kind::Loose as u32;
                (!(loose && resolved[index as usize])).then_some(index)
            }));
            users.sort_unstable();
            users.dedup();
            let mut sandbox = false;
            while users.last().is_some_and(|&u| u as usize >= self.containers.len()) {
                users.pop();
                sandbox = true;
            }
            if !users.is_empty() || sandbox {
                let start = matches.users.len() as u32;
                matches.users.extend_from_slice(&users);
                matches.span_of[run[0].0 as usize] = matches.spans.len() as u32;
                matches.spans.push(Span {
                    start,
                    end: matches.users.len() as u32,
                    sandbox,
                });
            }
        }
        matches
    }
}

impl References<'_> {
    /// Adds to `hits` the images of the repositories that the live
    /// containers no listed image matched (`named` false) name, as their
    /// users; the hits stay in listing order.
    fn unnamed_repositories<'i>(
        &self,
        images: impl Iterator<Item = &'i Image>,
        named: &[bool],
        hits: &mut Vec<(u32, u32)>,
    ) {
        // Normalized only for these: most listings have none.
        let mut owners: HashMap<String, Vec<u32>> = HashMap::default();
        for (i, c) in self.containers.iter().enumerate() {
            if named[i] || !may_run(c) {
                continue;
            }
            let owner = (i as u32) << KIND_BITS | Kind::Always as u32;
            for name in [c.image.as_str(), c.image_ref.as_str(), c.image_id.as_str()] {
                if let Some(repository) = reference::repository_of(name) {
                    let list = owners.entry(repository).or_default();
                    if !list.contains(&owner) {
                        list.push(owner);
                    }
                }
            }
        }
        if owners.is_empty() {
            return;
        }
        let before = hits.len();
        for (place, image) in images.enumerate() {
            for name in image.repo_tags.iter().chain(image.repo_digests.iter()) {
                if let Some(found) = reference::repository_of(name).and_then(|r| owners.get(r.as_str())) {
                    hits.extend(found.iter().map(|&o| (place as u32, o)));
                }
            }
        }
        if hits.len() > before {
            hits.sort_by_key(|&(image, _)| image);
        }
    }
}

/// Whether a container may run its image (created, running, or in a state
/// not known): one that exited keeps what it names, and no more.
fn may_run(container: &Container) -> bool {
    !matches!(container.state, Some(crate::model::ContainerState::Exited))
}

/// What [`References::matches`] found, by each image's place in the listing.
#[derive(Debug, Default)]
pub struct Matches {
    /// Per place in the listing: its span, or [`NO_SPAN`] when nothing
    /// names the image.
    span_of: Vec<u32>,
    /// The matched images, in listing order.
    spans: Vec<Span>,
    /// The users of every matched image, one run each.
    users: Vec<u32>,
}

const NO_SPAN: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    end: u32,
    sandbox: bool,
}

impl Matches {
    fn span(&self, image: usize) -> Option<&Span> {
        self.span_of.get(image).and_then(|&at| self.spans.get(at as usize))
    }

    /// The indices of the containers that name the image at this place of
    /// the listing (ascending, each once; empty when none does).
    pub fn users(&self, image: usize) -> &[u32] {
        self.span(image)
            .map_or(&[], |s| &self.users[s.start as usize..s.end as usize])
    }

    /// Whether a sandbox reference names the image at this place.
    pub fn sandbox(&self, image: usize) -> bool {
        self.span(image).is_some_and(|s| s.sandbox)
    }
}

/// The ids of the images any of `references` names (each once, in listing
/// order), matched the way [`InUse`] matches containers' references.
pub fn images_named<'a, 'r>(images: &'a [Image], references: impl IntoIterator<Item = &'r str>) -> Vec<&'a str> {
    let forms = Forms::new(references.into_iter().map(|r| (0, Kind::Always, r)).collect());
    let mut ids: Vec<&'a str> = Vec::new();
    for image in images {
        let mut named = false;
        forms.hits(image, |_| named = true);
        if named && !ids.contains(&image.id.as_str()) {
            ids.push(&image.id);
        }
    }
    ids
}

/// For each image that some of `references` name, matched the way
/// [`InUse`] matches containers' references: its place in `images` and the
/// place in `references` of the first reference that names it.
pub fn named_by(images: &[Image], references: &[&str]) -> Vec<(usize, usize)> {
    let forms = Forms::of(references);
    let mut named = Vec::new();
    for (place, image) in images.iter().enumerate() {
        let mut first: Option<u32> = None;
        forms.hits(image, |entry| {
            let owner = entry >> KIND_BITS;
            first = Some(first.map_or(owner, |f| f.min(owner)));
        });
        if let Some(owner) = first {
            named.push((place, owner as usize));
        }
    }
    named
}

/// The places in `references` of those that name none of `images`, matched
/// the way [`InUse`] matches containers' references: images not on the
/// node (yet).
pub fn naming_none(images: &[Image], references: &[&str]) -> Vec<usize> {
    let forms = Forms::of(references);
    let mut named = vec![false; references.len()];
    for image in images {
        forms.hits(image, |entry| {
            if let Some(n) = named.get_mut((entry >> KIND_BITS) as usize) {
                *n = true;
            }
        });
    }
    (0..references.len())
        .filter(|&i| !named[i] && !references[i].trim().is_empty())
        .collect()
}

/// Bits of an owner entry that hold its [`Kind`]; the rest is the owner.
const KIND_BITS: u32 = 2;
const KIND_MASK: u32 = (1 << KIND_BITS) - 1;

/// References to images made by some owners (containers, numbered, each
/// reference of a [`Kind`]), in every form that can match: as written,
/// without `sha256:`, by its digest alone, normalized. An image is named by
/// a reference when one of its own forms (its id without `sha256:`, each
/// tag as listed and normalized, each digest) is among them.
///
/// One table for every kind: an image's forms are each looked up once.
struct Forms<'a> {
    /// Form → its owners. Keys are borrowed from the references, except
    /// those normalizing had to build (a familiar `nginx:1`).
    table: HashMap<Cow<'a, str>, Owners>,
    /// Owners past the first of each form, by [`Owners::more`].
    more: Vec<Vec<u32>>,
}

/// The owners of one form (owner and kind packed, see [`KIND_BITS`]): the
/// first, and an index into [`Forms::more`] when there are others. Small,
/// so the table stays in cache.
#[derive(Debug, Clone, Copy)]
struct Owners {
    first: u32,
    more: u32,
}

const NO_MORE: u32 = u32::MAX;

impl<'a> Forms<'a> {
    /// From `references`, each its own owner (its place), of [`Kind::Always`].
    fn of(references: &[&'a str]) -> Self {
        Forms::new(
            references
                .iter()
                .enumerate()
                .map(|(i, r)| (i, Kind::Always, *r))
                .collect(),
        )
    }

    /// From `(owner, kind, reference)`; empty references are skipped.
    fn new(mut references: Vec<(usize, Kind, &'a str)>) -> Self {
        // Owners in ascending order, so a repeat is always the last noted.
        references.sort_by_key(|&(owner, kind, _)| (owner, kind as u8));
        let mut forms = Forms {
            // About one form per reference: a tag is one, an id one, an
            // empty reference none.
            table: HashMap::with_capacity_and_hasher(references.len(), Default::default()),
            more: Vec::new(),
        };
        for (owner, kind, reference) in references {
            if reference.is_empty() {
                continue;
            }
            let owner = u32::try_from(owner)
                .ok()
                .filter(|&o| o < 1 << (32 - KIND_BITS))
                .expect("fewer than a billion containers");
            let owner = owner << KIND_BITS | kind as u32;
            if reference::is_id(reference) {
                // Images are looked up by their id without `sha256:`, and a
                // tag that is an id likewise.
                forms.add(Cow::Borrowed(reference::bare_id(reference)), owner);
                continue;
            }
            forms.add(Cow::Borrowed(reference), owner);
            let bare = reference::bare_id(reference);
            if bare != reference {
                forms.add(Cow::Borrowed(bare), owner);
            }
            // A digest reference names its image by the digest alone,
            // whatever stands before the `@` (CRI-O drops the registry's
            // port there once a tag has moved).
            if let Some(digest) = reference::digest_of(reference) {
                forms.add(Cow::Borrowed(digest), owner);
            }
            if let Cow::Owned(normalized) = reference::normalized(reference)
                && normalized != bare
            {
                forms.add(Cow::Owned(normalized), owner);
            }
        }
        forms
    }

    fn add(&mut self, form: Cow<'a, str>, owner: u32) {
        match self.table.entry(form) {
            Entry::Vacant(entry) => {
                entry.insert(Owners {
                    first: owner,
                    more: NO_MORE,
                });
            }
            Entry::Occupied(mut entry) => {
                let owners = entry.get_mut();
                if owners.more == NO_MORE {
                    if owners.first != owner {
                        owners.more = self.more.len() as u32;
                        self.more.push(vec![owner]);
                    }
                    return;
                }
                let list = &mut self.more[owners.more as usize];
                if list.last() != Some(&owner) {
                    list.push(owner);
                }
            }
        }
    }

    /// Calls `hit` with the owners of the references that name `image`
    /// (possibly more than once).
    fn hits(&self, image: &Image, mut hit: impl FnMut(u32)) {
        if self.table.is_empty() {
            return;
        }
        let mut check = |form: &str| {
            if let Some(owners) = self.table.get(form) {
                hit(owners.first);
                if owners.more != NO_MORE {
                    self.more[owners.more as usize].iter().for_each(|&o| hit(o));
                }
            }
        };
        if !image.id.is_empty() {
            check(reference::bare_id(&image.id));
        }
        // A digest is matched by the digest alone: every reference with a
        // digest is in the table under it too, so the name before the `@`,
        // as written or normalized, adds nothing.
        for name in &image.repo_digests {
            match reference::digest_of(name) {
                Some(digest) => check(digest),
                None => check_name(name, &mut check),
            }
        }
        for name in &image.repo_tags {
            check_name(name, &mut check);
        }
    }
}

/// Checks a name as listed, and as an id or normalized when that differs.
fn check_name(name: &str, check: &mut impl FnMut(&str)) {
    check(name);
    if reference::is_id(name) {
        check(reference::bare_id(name));
    } else if let Cow::Owned(normalized) = reference::normalized(name) {
        check(&normalized);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{container_naming as container, library_image as image};

    #[test]
    fn containers_match_by_id_ref_digest_or_familiar_tag() {
        let id = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
        let img = Image {
            id: id.to_string(),
            repo_tags: vec!["docker.io/library/nginx:1.27".to_string()].into(),
            repo_digests: vec![
                "docker.io/library/nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222"
                    .to_string(),
            ]
            .into(),
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
            state: Some(crate::model::ContainerState::Exited),
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
        let matches = References::new(&containers[1..2], &["nginx"]).matches(&images);
        assert!(matches.sandbox(0));
        assert_eq!(matches.users(0), [0], "the container `full`");
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
        tagged.repo_tags = tagged
            .repo_tags
            .iter()
            .map(str::to_owned)
            .chain([prefixed.clone()])
            .collect();
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
        old.repo_tags = Default::default();
        let mut new = image("new", 1);
        new.id = id(2);
        new.repo_tags = vec!["docker.io/library/app:1".to_string()].into();
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

    /// A container that may run and whose names match no listed image (a
    /// tag moved and its digest listed nowhere, a name the runtime dropped)
    /// keeps every image of the repository it names; one that exited, only
    /// what it names.
    #[test]
    fn a_live_container_naming_nothing_listed_keeps_every_image_of_its_repository() {
        let id = |n: u8| format!("sha256:{}", n.to_string().repeat(64));
        let mut one = image("one", 1);
        one.id = id(1);
        one.repo_tags = vec!["registry.test/team/app:1".to_string()].into();
        let mut two = image("two", 1);
        two.id = id(2);
        two.repo_tags = Default::default();
        two.repo_digests = vec![format!("registry.test/team/app@sha256:{}", "d".repeat(64))].into();
        let images = [one, two, image("other", 1)];
        let naming = |state| Container {
            id: "c".to_string(),
            image: "registry.test/team/app:3".to_string(),
            image_ref: format!("registry.test/team/app@sha256:{}", "e".repeat(64)),
            state,
            ..Default::default()
        };
        for state in [
            Some(crate::model::ContainerState::Running),
            Some(crate::model::ContainerState::Created),
            Some(crate::model::ContainerState::Unknown),
            None,
        ] {
            let containers = [naming(state)];
            let in_use = InUse::new(&images, &containers);
            assert_eq!(in_use.containers(&id(1)), ["c"], "{state:?}");
            assert_eq!(in_use.containers(&id(2)), ["c"], "{state:?}");
            assert!(!in_use.is_used("other"), "{state:?}");
        }
        let exited = naming(Some(crate::model::ContainerState::Exited));
        assert_eq!(InUse::new(&images, std::slice::from_ref(&exited)).len(), 0);
        // Named by a familiar tag, the repository is the normalized one.
        let familiar = [image("nginx", 1), image("redis", 1)];
        let by_tag = container("c", "nginx:1.27");
        let in_use = InUse::new(&familiar, std::slice::from_ref(&by_tag));
        assert!(in_use.is_used("nginx") && !in_use.is_used("redis"));
        // One whose name matches a listed image keeps that one alone.
        let matched = [naming(Some(crate::model::ContainerState::Running))];
        let mut listed = images.to_vec();
        listed[0].repo_tags = vec!["registry.test/team/app:3".to_string()].into();
        let in_use = InUse::new(&listed, &matched);
        assert_eq!(in_use.containers(&id(1)), ["c"]);
        assert!(!in_use.is_used(&id(2)));
        // An id names one image, never a repository.
        let by_id = container("c", &id(9));
        assert_eq!(InUse::new(&images, std::slice::from_ref(&by_id)).len(), 0);
    }

    #[test]
    fn the_sandbox_reference_is_noted_apart_from_containers() {
        let images = [image("pause", 1), image("app", 1)];
        let containers = [container("c", "app")];
        let matches = References::new(&containers, &["pause"]).matches(&images);
        assert!(matches.sandbox(0) && matches.users(0).is_empty());
        assert!(!matches.sandbox(1) && matches.users(1) == [0]);
        // The same image listed twice: containers from both listings, once each.
        let images = [image("app", 1), image("app", 1)];
        let containers = [container("c1", "app"), container("c2", "docker.io/library/app:latest")];
        assert_eq!(InUse::new(&images, &containers).containers("app"), ["c1", "c2"]);
    }
}
