//! The thrash memory, pure: the images imagegc removed within
//! `gc.thrash_window` (an image that comes back is a re-pull), and the
//! episode in which images cannot bring usage to low (while it lasts, no
//! image removed within the window goes again for space).

use std::time::{Duration, SystemTime};

use crate::model::Image;
use crate::model::names::Names;
use crate::model::reference;
use crate::policy::SpaceOutlook;

/// An image imagegc removed, remembered for `gc.thrash_window`.
#[derive(Debug, Clone)]
struct RecentRemoval {
    at: SystemTime,
    id: String,
    /// Its repository digests when it was removed.
    digests: Vec<String>,
    /// Whether its return was already reported (once per removal).
    repull_reported: bool,
}

impl RecentRemoval {
    /// Whether the image with this id and these repository digests is the
    /// removed image: the same id, or the same manifest digest under any
    /// name (CRI-O drops a registry's port from an old image's digest). A
    /// tag is not an image: a newer image under the removed one's tag is
    /// another image, not a re-pull.
    fn is(&self, id: &str, digests: &Names) -> bool {
        self.id == id
            || digests.iter().filter_map(|d| reference::digest_of(d)).any(|digest| {
                self.digests
                    .iter()
                    .any(|mine| reference::digest_of(mine) == Some(digest))
            })
    }
}

/// A re-pull: a listed image imagegc removed within the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repull {
    /// The image's place in the listing.
    pub index: usize,
    /// How long after its removal it came back.
    pub removed_ago: Duration,
}

/// The removals within the window, and the current episode.
#[derive(Debug, Default)]
pub struct Thrash {
    recent: Vec<RecentRemoval>,
    unreachable: Option<SpaceOutlook>,
}

impl Thrash {
    /// Remembers a removal of `id` (with its repository digests) at `at`.
    pub fn remember(&mut self, at: SystemTime, id: String, digests: Vec<String>) {
        self.recent.push(RecentRemoval {
            at,
            id,
            digests,
            repull_reported: false,
        });
    }

    /// The images of `images` at the places `new` that imagegc removed
    /// within `window` before `now`: each removal is reported once.
    pub fn repulls(&mut self, now: SystemTime, window: Duration, images: &[Image], new: &[usize]) -> Vec<Repull> {
        self.recent
            .retain(|r| now.duration_since(r.at).unwrap_or_default() <= window);
        let mut found = Vec::new();
        if new.is_empty() || self.recent.is_empty() {
            return found;
        }
        for (index, image) in new.iter().filter_map(|&i| Some((i, images.get(i)?))) {
            let Some(removal) = self
                .recent
                .iter_mut()
                .find(|r| !r.repull_reported && r.is(&image.id, &image.repo_digests))
            else {
                continue;
            };
            removal.repull_reported = true;
            found.push(Repull {
                index,
                removed_ago: now.duration_since(removal.at).unwrap_or_default(),
            });
        }
        found
    }

    /// Whether the image with this id and these digests was removed within
    /// `window` before `now`.
    pub fn removed_recently(&self, now: SystemTime, window: Duration, id: &str, digests: &Names) -> bool {
        self.recent
            .iter()
            .any(|r| now.duration_since(r.at).unwrap_or_default() <= window && r.is(id, digests))
    }

    /// The episode in which images cannot bring usage to low, when one is on.
    pub fn unreachable(&self) -> Option<SpaceOutlook> {
        self.unreachable
    }

    /// Notes the space pass's outlook (`None`: low was reached, or no pass
    /// was due). Returns the change of episode, when there is one:
    /// `Some(Some(outlook))` when one starts, `Some(None)` when it ends.
    pub fn note_outlook(&mut self, outlook: Option<SpaceOutlook>) -> Option<Option<SpaceOutlook>> {
        let unreachable = outlook.filter(SpaceOutlook::unreachable);
        let change = match (&self.unreachable, unreachable) {
            (None, Some(o)) => Some(Some(o)),
            (Some(_), None) => Some(None),
            _ => None,
        };
        self.unreachable = unreachable;
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::library_image as image;

    #[test]
    fn a_repull_is_the_same_image_coming_back_once_within_the_window() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let window = Duration::from_secs(3600);
        let mut thrash = Thrash::default();
        let old = image("a", 10);
        thrash.remember(t0, old.id.clone(), old.repo_digests.to_vec());
        let later = t0 + Duration::from_secs(60);
        let listed = vec![image("b", 10), old.clone()];
        let ids = vec![0, 1];
        let found = thrash.repulls(later, window, &listed, &ids);
        assert_eq!(
            found,
            [Repull {
                index: 1,
                removed_ago: Duration::from_secs(60)
            }]
        );
        assert!(thrash.repulls(later, window, &listed, &ids).is_empty(), "reported once");
        assert!(thrash.removed_recently(later, window, &old.id, &Names::default()));
        assert!(!thrash.removed_recently(t0 + window * 2, window, &old.id, &Names::default()));
    }
}
