//! `ListImages`' answer decoded straight into imagegc's own [`Image`]s:
//! the generated `proto::Image` holds every field of the CRI message (uid,
//! username, the spec and its annotations) and would be converted, and
//! dropped, after the whole answer was decoded; on a node of 100,000 images
//! that second copy was the largest thing the daemon held. Only the fields
//! imagegc reads are kept: id, tags, digests, size, pinned; the others are
//! skipped on the wire. The same decoding rules as prost's own (a repeated
//! field accumulates, a scalar's last value wins, unknown fields are
//! skipped), so the answer reads the same either way (tested against the
//! generated types).

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

use super::Image;
use super::names::Interner;

/// The images of a whole `ListImages` answer (field 1 of
/// `ListImagesResponse`), decoded at once: what the streaming reader
/// (`list_images.rs`) is tested against.
#[cfg(test)]
#[derive(Debug, Default)]
pub(super) struct ListedImages(pub(super) Vec<Image>);

/// One `Image` message, its names as decoded: [`WireImage::into_image`]
/// shares them.
#[derive(Debug, Default)]
pub(super) struct WireImage {
    id: String,
    repo_tags: Vec<String>,
    repo_digests: Vec<String>,
    size: u64,
    pinned: bool,
}

impl WireImage {
    /// Whether the runtime gave it an id: an entry without one names
    /// nothing that could be removed (see [`super::merge_listings`]).
    pub(super) fn has_id(&self) -> bool {
        !self.id.is_empty()
    }

    /// The image, its names taken from `names` where they are unchanged.
    pub(super) fn into_image(self, names: &mut Interner) -> Image {
        Image {
            id: self.id,
            repo_tags: names.names(&self.repo_tags),
            repo_digests: names.names(&self.repo_digests),
            size: self.size,
            pinned: self.pinned,
        }
    }

    #[cfg(test)]
    fn of(image: &Image) -> Self {
        WireImage {
            id: image.id.clone(),
            repo_tags: image.repo_tags.to_vec(),
            repo_digests: image.repo_digests.to_vec(),
            size: image.size,
            pinned: image.pinned,
        }
    }
}

impl Message for WireImage {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        // Decoding only reads; encoding is here for the trait (and tests).
        let image = self;
        if !image.id.is_empty() {
            encoding::string::encode(1, &image.id, buf);
        }
        encoding::string::encode_repeated(2, &image.repo_tags, buf);
        encoding::string::encode_repeated(3, &image.repo_digests, buf);
        if image.size != 0 {
            encoding::uint64::encode(4, &image.size, buf);
        }
        if image.pinned {
            encoding::bool::encode(8, &image.pinned, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let image = self;
        match tag {
            1 => encoding::string::merge(wire_type, &mut image.id, buf, ctx),
            2 => encoding::string::merge_repeated(wire_type, &mut image.repo_tags, buf, ctx),
            3 => encoding::string::merge_repeated(wire_type, &mut image.repo_digests, buf, ctx),
            4 => encoding::uint64::merge(wire_type, &mut image.size, buf, ctx),
            8 => encoding::bool::merge(wire_type, &mut image.pinned, buf, ctx),
            // uid, username, spec: not read.
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let image = self;
        (if image.id.is_empty() {
            0
        } else {
            encoding::string::encoded_len(1, &image.id)
        }) + encoding::string::encoded_len_repeated(2, &image.repo_tags)
            + encoding::string::encoded_len_repeated(3, &image.repo_digests)
            + if image.size != 0 {
                encoding::uint64::encoded_len(4, &image.size)
            } else {
                0
            }
            + if image.pinned {
                encoding::bool::encoded_len(8, &image.pinned)
            } else {
                0
            }
    }

    fn clear(&mut self) {
        *self = WireImage::default();
    }
}

#[cfg(test)]
impl Message for ListedImages {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for image in &self.0 {
            encoding::message::encode(1, &WireImage::of(image), buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag != 1 {
            return encoding::skip_field(wire_type, tag, buf, ctx);
        }
        let mut wire = WireImage::default();
        encoding::message::merge(wire_type, &mut wire, buf, ctx)?;
        self.0.push(wire.into_image(&mut Interner::default()));
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.0
            .iter()
            .map(|image| encoding::message::encoded_len(1, &WireImage::of(image)))
            .sum()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::proto;

    #[test]
    fn an_answer_reads_as_the_generated_types_read_it() {
        let answer = proto::ListImagesResponse {
            images: vec![
                proto::Image {
                    id: "sha256:aa".to_string(),
                    repo_tags: vec!["docker.io/library/a:1".to_string(), "docker.io/library/a:2".to_string()],
                    repo_digests: vec!["docker.io/library/a@sha256:bb".to_string()],
                    size: 1234,
                    uid: Some(proto::Int64Value { value: 7 }),
                    username: "nobody".to_string(),
                    spec: Some(proto::ImageSpec {
                        image: "a".to_string(),
                        annotations: [("k".to_string(), "v".to_string())].into(),
                        ..Default::default()
                    }),
                    pinned: true,
                },
                proto::Image {
                    id: "sha256:cc".to_string(),
                    ..Default::default()
                },
            ],
        };
        let bytes = answer.encode_to_vec();
        let listed = ListedImages::decode(bytes.as_slice()).unwrap();
        let generated: Vec<Image> = answer
            .images
            .into_iter()
            .map(|i| Image {
                id: i.id,
                repo_tags: i.repo_tags.into(),
                repo_digests: i.repo_digests.into(),
                size: i.size,
                pinned: i.pinned,
            })
            .collect();
        assert_eq!(listed.0, generated);
        // And back: what it encodes, the generated types read the same.
        let again = proto::ListImagesResponse::decode(listed.encode_to_vec().as_slice()).unwrap();
        assert_eq!(again.images.len(), 2);
        assert_eq!(again.images[0].repo_tags.len(), 2);
        assert!(again.images[0].pinned);
    }

    #[test]
    fn a_truncated_answer_is_an_error_not_a_panic() {
        let answer = proto::ListImagesResponse {
            images: vec![proto::Image {
                id: "sha256:aa".to_string(),
                repo_tags: vec!["x".repeat(100)],
                ..Default::default()
            }],
        };
        let bytes = answer.encode_to_vec();
        for cut in 0..bytes.len() {
            let _ = ListedImages::decode(&bytes[..cut]);
        }
    }
}
