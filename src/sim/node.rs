//! [`SimNode`]: what a fake node holds, kept once for the three fakes that
//! answer for one: the engine tests' in-process runtime, the test kit's
//! gRPC fake runtime and the invariant harness's attacked node. Its images
//! in the order they came (found by id in constant time, or by a tag or a
//! digest), the layers each is made of (what a verbose `ImageStatus`
//! names), its containers in any state, and the removals the runtime made.
//! How a runtime answers for it (its dialect on the wire, its faults, its
//! hooks) is each fake's own; what a removal gives back is the disk's
//! ([`SimDisk`](super::SimDisk)).

use std::collections::HashMap;

use crate::model::{Container, Image};

/// The images, layers and containers of a fake node, and the removals
/// its runtime made.
#[derive(Debug, Clone, Default)]
pub struct SimNode {
    /// In the order they were first added.
    images: Vec<Image>,
    /// Each image's position in `images`, by id.
    index: HashMap<String, usize>,
    /// The layers (diff ids) of images, by id: none for an image whose
    /// runtime names none.
    layers: HashMap<String, Vec<String>>,
    /// The containers, in the order they were created, in any state.
    pub containers: Vec<Container>,
    /// The images the runtime removed when asked, in order.
    removed: Vec<String>,
}

/// Whether `reference` names `image`: its id, a tag or a digest, exactly.
pub fn names(image: &Image, reference: &str) -> bool {
    image.id == reference
        || image
            .repo_tags
            .iter()
            .chain(&image.repo_digests)
            .any(|r| r == reference)
}

impl SimNode {
    /// The images, in the order they were first added.
    pub fn images(&self) -> &[Image] {
        &self.images
    }

    /// The image of this id.
    pub fn image(&self, id: &str) -> Option<&Image> {
        self.index.get(id).map(|&at| &self.images[at])
    }

    /// The image of this id, to change (a tag it gains).
    pub fn image_mut(&mut self, id: &str) -> Option<&mut Image> {
        self.index.get(id).map(|&at| &mut self.images[at])
    }

    /// The image `reference` names: by its id, else the first a tag or a
    /// digest names.
    pub fn find(&self, reference: &str) -> Option<&Image> {
        self.image(reference)
            .or_else(|| self.images.iter().find(|image| names(image, reference)))
    }

    /// Adds an image, or replaces the image with the same id in its place.
    pub fn add_image(&mut self, image: Image) {
        match self.index.get(&image.id) {
            Some(&at) => self.images[at] = image,
            None => {
                self.index.insert(image.id.clone(), self.images.len());
                self.images.push(image);
            }
        }
    }

    /// The node holds these images now, in this order, and no others.
    pub fn set_images(&mut self, images: Vec<Image>) {
        self.images = Vec::new();
        self.index.clear();
        for image in images {
            self.add_image(image);
        }
    }

    /// Takes the image of this id away, as something other than a removal
    /// the runtime was asked for does (`crictl rmi`, another collector):
    /// not recorded in [`SimNode::removed`].
    pub fn take_image(&mut self, id: &str) -> Option<Image> {
        let at = self.index.remove(id)?;
        let image = self.images.remove(at);
        for (offset, moved) in self.images[at..].iter().enumerate() {
            self.index.insert(moved.id.clone(), at + offset);
        }
        Some(image)
    }

    /// Keeps the images `keep` says, takes the others away (see
    /// [`SimNode::take_image`]).
    pub fn retain_images(&mut self, keep: impl FnMut(&Image) -> bool) {
        self.images.retain(keep);
        self.index = self
            .images
            .iter()
            .enumerate()
            .map(|(at, image)| (image.id.clone(), at))
            .collect();
    }

    /// The runtime removes the image of this id when asked: taken away and
    /// recorded. `None` when there is no such image.
    pub fn remove(&mut self, id: &str) -> Option<Image> {
        let image = self.take_image(id)?;
        self.removed.push(image.id.clone());
        Some(image)
    }

    /// The images the runtime removed when asked, in order.
    pub fn removed(&self) -> &[String] {
        &self.removed
    }

    /// The image of this id is made of these layers (diff ids).
    pub fn set_layers(&mut self, id: &str, layers: Vec<String>) {
        self.layers.insert(id.to_string(), layers);
    }

    /// The layers of the image of this id, while it is on the node; `None`
    /// for a gone image, or one whose layers were never set.
    pub fn layers(&self, id: &str) -> Option<&[String]> {
        self.image(id)?;
        self.layers.get(id).map(Vec::as_slice)
    }

    /// Adds a container, or replaces the container with the same id.
    pub fn add_container(&mut self, container: Container) {
        match self.containers.iter_mut().find(|c| c.id == container.id) {
            Some(existing) => *existing = container,
            None => self.containers.push(container),
        }
    }

    /// A container that refers to `image` by its id (in either form), a
    /// tag or a digest, or as a mounted image volume: what CRI-O checks
    /// before it removes an image.
    pub fn user_of(&self, image: &Image) -> Option<&Container> {
        let bare = image.id.strip_prefix("sha256:").unwrap_or(&image.id);
        let refers = |r: &str| !r.is_empty() && (r.strip_prefix("sha256:").unwrap_or(r) == bare || names(image, r));
        self.containers.iter().find(|c| {
            [&c.image_id, &c.image_ref].iter().any(|r| refers(r)) || c.mounted_images.iter().any(|r| refers(r))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::library_image;

    #[test]
    fn images_are_found_by_id_tag_or_digest_and_keep_their_order_through_removals() {
        let mut node = SimNode::default();
        for id in ["a", "b", "c", "d"] {
            node.add_image(library_image(id, 10));
        }
        let tag = node.images()[2].repo_tags.iter().next().expect("a tag").to_string();
        assert_eq!(node.find(&tag).map(|i| i.id.as_str()), Some("c"));
        assert_eq!(node.find("b").map(|i| i.id.as_str()), Some("b"));
        assert!(node.take_image("b").is_some(), "taken by someone else");
        assert_eq!(node.remove("a").map(|i| i.id), Some("a".to_string()));
        assert!(node.remove("a").is_none(), "removed once");
        assert_eq!(node.removed(), ["a"], "only what the runtime was asked to remove");
        let ids: Vec<&str> = node.images().iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["c", "d"]);
        assert_eq!(
            node.image("d").map(|i| i.id.as_str()),
            Some("d"),
            "found by id after the shift"
        );
        node.set_layers("d", vec!["sha256:l".to_string()]);
        node.add_image(library_image("d", 20));
        assert_eq!(node.images()[1].size, 20, "replaced in place");
        assert_eq!(node.layers("d"), Some(&["sha256:l".to_string()][..]));
        node.retain_images(|i| i.id != "d");
        assert_eq!(node.layers("d"), None, "a gone image has no layers");
        assert_eq!(node.image("c").map(|i| i.id.as_str()), Some("c"));
    }
}
