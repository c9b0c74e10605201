//! An image's tags or repository digests, held once however many hold
//! them: the listing's [`Image`](super::Image) and the image's record
//! (`records::Record`) share one [`Names`], and a new listing reuses the
//! [`Names`] of the one before wherever the names did not change
//! ([`Interner`]). On a node of 100,000 images with several tags each,
//! a copy per holder was a third of the daemon's memory.

use std::collections::HashSet;
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

type BuildHasher = foldhash::fast::RandomState;

/// Tags or repository digests, in the order the runtime listed them;
/// cloned by a pointer, read as a slice of strings.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Names(Arc<[String]>);

impl Names {
    /// The names as one string each (for an owner that needs a `Vec`).
    pub fn to_vec(&self) -> Vec<String> {
        self.0.to_vec()
    }

    /// Whether these are `names`, in order.
    pub fn is(&self, names: &[String]) -> bool {
        *self.0 == *names
    }

    /// Whether both are the one shared copy (not only equal).
    pub fn shares(&self, other: &Names) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for Names {
    type Target = [String];

    fn deref(&self) -> &[String] {
        &self.0
    }
}

impl std::borrow::Borrow<[String]> for Names {
    fn borrow(&self) -> &[String] {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Names {
    type Item = &'a String;
    type IntoIter = std::slice::Iter<'a, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl From<Vec<String>> for Names {
    fn from(names: Vec<String>) -> Self {
        Names(names.into())
    }
}

impl From<&[String]> for Names {
    fn from(names: &[String]) -> Self {
        Names(names.into())
    }
}

impl<const N: usize> From<[String; N]> for Names {
    fn from(names: [String; N]) -> Self {
        Names(Arc::from(names))
    }
}

impl FromIterator<String> for Names {
    fn from_iter<I: IntoIterator<Item = String>>(names: I) -> Self {
        Names(names.into_iter().collect())
    }
}

impl PartialEq<Vec<String>> for Names {
    fn eq(&self, other: &Vec<String>) -> bool {
        self.is(other)
    }
}

impl<const N: usize> PartialEq<[&str; N]> for Names {
    fn eq(&self, other: &[&str; N]) -> bool {
        self.0.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl serde::Serialize for Names {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter())
    }
}

/// The [`Names`] the last listing held, by content: the next listing
/// takes each image's names from here when they are unchanged, so that the
/// records, which still hold the last listing's, and the new listing hold
/// one copy between them. One set serves both listings (two would be
/// two tables of every name's pointer at the daemon's peak).
#[derive(Debug, Default)]
pub struct Interner {
    names: HashSet<Names, BuildHasher>,
}

impl Interner {
    /// An interner that reuses the names in `previous`.
    pub fn new(previous: HashSet<Names, BuildHasher>) -> Self {
        Interner { names: previous }
    }

    /// `names` as a shared [`Names`]: the one already known when it is
    /// the same, else new.
    pub fn names(&mut self, names: Vec<String>) -> Names {
        if let Some(names) = self.names.get(names.as_slice()) {
            return names.clone();
        }
        let shared = Names::from(names);
        self.names.insert(shared.clone());
        shared
    }

    /// The names still held by anyone (this listing, the records), for
    /// the next listing.
    pub fn into_names(mut self) -> HashSet<Names, BuildHasher> {
        self.names.retain(|names| Arc::strong_count(&names.0) > 1);
        if self.names.len() < self.names.capacity() / 4 {
            self.names.shrink_to_fit();
        }
        self.names
    }
}

/// The names known to this process: the last listing's, and those the
/// state file loaded before any listing. A listing takes them
/// ([`take_known`]) and gives its own back ([`keep_known`]).
static KNOWN: LazyLock<Mutex<HashSet<Names, BuildHasher>>> = LazyLock::new(Mutex::default);

/// `names` as a shared [`Names`], the known one when it is the same: the
/// records loaded from the state file share their names with the first
/// listing this way, which would otherwise hold a second copy of every
/// name during the daemon's first cycle.
pub fn shared(names: Vec<String>) -> Names {
    let mut known = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(names) = known.get(names.as_slice()) {
        return names.clone();
    }
    let names = Names::from(names);
    known.insert(names.clone());
    names
}

/// The known names, for a listing to share (see [`Interner::new`]). A
/// listing at the same time (none in the daemon) finds none.
pub(crate) fn take_known() -> HashSet<Names, BuildHasher> {
    std::mem::take(&mut *KNOWN.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Gives a listing's names back (see [`Interner::into_names`]), with any
/// that became known meanwhile.
pub(crate) fn keep_known(mut names: HashSet<Names, BuildHasher>) {
    let mut known = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
    names.extend(known.drain());
    *known = names;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn unchanged_names_are_the_previous_listings_copy() {
        let mut first = Interner::default();
        let a = first.names(names(&["a:1", "a:2"]));
        let b = first.names(names(&["b:1"]));
        // The same names twice within a listing: one copy.
        assert!(first.names(names(&["b:1"])).shares(&b));
        let mut second = Interner::new(first.into_names());
        let a2 = second.names(names(&["a:1", "a:2"]));
        assert!(a2.shares(&a));
        // Changed (here, reordered) names are new.
        let b2 = second.names(names(&["b:2", "b:1"]));
        assert!(!b2.shares(&b));
        assert_eq!(b2, ["b:2", "b:1"]);
        // Names nobody holds any more are not kept for the next listing.
        drop(b);
        let next = second.into_names();
        assert_eq!(next.len(), 2);
        assert!(!next.contains(names(&["b:1"]).as_slice()));
        assert!(next.contains(names(&["b:2", "b:1"]).as_slice()));
    }

    #[test]
    fn names_read_and_serialize_as_a_list_of_strings() {
        let n = Names::from(names(&["x", "y"]));
        assert_eq!(n.len(), 2);
        assert_eq!(&n[..], ["x", "y"]);
        assert!(n.is(&names(&["x", "y"])) && !n.is(&names(&["y", "x"])));
        assert_eq!(serde_json::to_string(&n).unwrap(), r#"["x","y"]"#);
        assert_eq!(format!("{n:?}"), r#"["x", "y"]"#);
        assert!(Names::default().is_empty());
    }
}
