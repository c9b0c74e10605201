//! How a container names an image, and which images the containers use:
//! the one place that reads every runtime's way of naming (an id with or
//! without `sha256:`, `image_id`, an `image_ref` that is an id, a digest
//! under any name before the `@`, or a tag; images mounted as volumes; the
//! sandbox images). Both the records (who was used when) and the planner
//! (who is in use now) match through [`References`], so they cannot
//! disagree. No IO.

use std::borrow::Cow;
use std::collections::hash_map::Entry;

use crate::cri::{Container, Image};
use crate::records::HashMap;
use crate::reference;

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
}
