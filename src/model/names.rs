//! An image's tags or repository digests, held once however many hold
//! them: the listing's [`Image`](super::Image) and the image's record
//! (`records::Record`) share one [`Names`], and a new listing reuses the
//! [`Names`] of the one before wherever the names did not change
//! ([`Interner`]). On a node of 100,000 images with several tags each,
//! a copy per holder was a third of the daemon's memory.
//!
//! All of one image's tags (or digests) are one allocation: each name
//! followed by a NUL, in one shared `str`. A `String` per name cost 24
//! bytes and an allocator block of its own, about 20 MiB at 500,000 tags.
//! A name cannot hold a NUL here: a runtime that lists one has it read as
//! U+FFFD (no image reference or keep rule has a NUL; an image is removed
//! by its id, never by a name).

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

type BuildHasher = foldhash::fast::RandomState;

/// What ends each name in [`Names`]' one string.
const END: char = '\0';

/// Tags or repository digests, in the order the runtime listed them;
/// cloned by a pointer, read as an iterator of `&str`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Names(Arc<str>);

/// The names as they are packed: each followed by [`END`].
fn pack<'a>(names: impl IntoIterator<Item = &'a str>, packed: &mut String) {
    packed.clear();
    for name in names {
        if name.contains(END) {
            packed.push_str(&name.replace(END, "\u{FFFD}"));
        } else {
            packed.push_str(name);
        }
        packed.push(END);
    }
}

impl Names {
    fn packed<'a>(names: impl IntoIterator<Item = &'a str>) -> Names {
        let mut packed = String::new();
        pack(names, &mut packed);
        Names(packed.into())
    }

    /// The names, in order.
    pub fn iter(&self) -> std::str::SplitTerminator<'_, char> {
        self.0.split_terminator(END)
    }

    /// How many names there are.
    pub fn len(&self) -> usize {
        self.0.bytes().filter(|b| *b == 0).count()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first name.
    pub fn first(&self) -> Option<&str> {
        self.iter().next()
    }

    /// Whether `name` is one of them.
    pub fn contains(&self, name: &str) -> bool {
        self.iter().any(|n| n == name)
    }

    /// The names as one string each (for an owner that needs a `Vec`).
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }

    /// Whether these are `names`, in order.
    pub fn is<S: AsRef<str>>(&self, names: &[S]) -> bool {
        self.iter().eq(names.iter().map(AsRef::as_ref))
    }

    /// Whether both are the one shared copy (not only equal).
    pub fn shares(&self, other: &Names) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// No names. All share one allocation.
impl Default for Names {
    fn default() -> Self {
        static NONE: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));
        Names(Arc::clone(&NONE))
    }
}

impl std::borrow::Borrow<str> for Names {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Names {
    type Item = &'a str;
    type IntoIter = std::str::SplitTerminator<'a, char>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl From<Vec<String>> for Names {
    fn from(names: Vec<String>) -> Self {
        Names::from(names.as_slice())
    }
}

impl From<&[String]> for Names {
    fn from(names: &[String]) -> Self {
        Names::packed(names.iter().map(String::as_str))
    }
}

impl<const N: usize> From<[String; N]> for Names {
    fn from(names: [String; N]) -> Self {
        Names::from(names.as_slice())
    }
}

impl<const N: usize> From<[&str; N]> for Names {
    fn from(names: [&str; N]) -> Self {
        Names::packed(names)
    }
}

impl FromIterator<String> for Names {
    fn from_iter<I: IntoIterator<Item = String>>(names: I) -> Self {
        Names::from(names.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> FromIterator<&'a str> for Names {
    fn from_iter<I: IntoIterator<Item = &'a str>>(names: I) -> Self {
        Names::packed(names)
    }
}

impl PartialEq<Vec<String>> for Names {
    fn eq(&self, other: &Vec<String>) -> bool {
        self.is(other)
    }
}

impl<const N: usize> PartialEq<[&str; N]> for Names {
    fn eq(&self, other: &[&str; N]) -> bool {
        self.is(other)
    }
}

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl serde::Serialize for Names {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
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
    /// The names being looked up, packed (one buffer for all).
    scratch: String,
}

impl Interner {
    /// An interner that reuses the names in `previous`.
    pub fn new(previous: HashSet<Names, BuildHasher>) -> Self {
        Interner {
            names: previous,
            scratch: String::new(),
        }
    }

    /// `names` as a shared [`Names`]: the one already known when it is
    /// the same, else new.
    pub fn names(&mut self, names: &[String]) -> Names {
        pack(names.iter().map(String::as_str), &mut self.scratch);
        intern(&mut self.names, &self.scratch)
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
pub fn shared(names: &[String]) -> Names {
    let mut packed = String::new();
    pack(names.iter().map(String::as_str), &mut packed);
    intern(&mut KNOWN.lock().unwrap_or_else(PoisonError::into_inner), &packed)
}

/// The [`Names`] packed as `packed` in `set`, added when missing.
fn intern(set: &mut HashSet<Names, BuildHasher>, packed: &str) -> Names {
    if let Some(names) = set.get(packed) {
        return names.clone();
    }
    let names = Names(packed.into());
    set.insert(names.clone());
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
        let a = first.names(&names(&["a:1", "a:2"]));
        let b = first.names(&names(&["b:1"]));
        // The same names twice within a listing: one copy.
        assert!(first.names(&names(&["b:1"])).shares(&b));
        let mut second = Interner::new(first.into_names());
        let a2 = second.names(&names(&["a:1", "a:2"]));
        assert!(a2.shares(&a));
        // Changed (here, reordered) names are new.
        let b2 = second.names(&names(&["b:2", "b:1"]));
        assert!(!b2.shares(&b));
        assert_eq!(b2, ["b:2", "b:1"]);
        // Names nobody holds any more are not kept for the next listing.
        drop(b);
        let next = second.into_names();
        assert_eq!(next.len(), 2);
        assert!(!next.iter().any(|n| n.is(&["b:1"])));
        assert!(next.iter().any(|n| n.is(&["b:2", "b:1"])));
    }

    #[test]
    fn names_read_and_serialize_as_a_list_of_strings() {
        let n = Names::from(names(&["x", "y"]));
        assert_eq!(n.len(), 2);
        assert_eq!(n.iter().collect::<Vec<_>>(), ["x", "y"]);
        assert_eq!(n.first(), Some("x"));
        assert!(n.contains("y") && !n.contains("z"));
        assert!(n.is(&names(&["x", "y"])) && !n.is(&names(&["y", "x"])));
        assert_eq!(serde_json::to_string(&n).unwrap(), r#"["x","y"]"#);
        assert_eq!(format!("{n:?}"), r#"["x", "y"]"#);
        assert!(Names::default().is_empty());
        assert_eq!(Names::default().len(), 0);
    }

    #[test]
    fn empty_names_and_a_nul_in_a_name_read_back() {
        let n = Names::from(names(&["", "a\0b", ""]));
        assert_eq!(n.len(), 3);
        assert_eq!(n.to_vec(), ["", "a\u{FFFD}b", ""]);
        assert_ne!(Names::from(names(&[""])), Names::default());
        let mut interner = Interner::default();
        assert!(interner.names(&names(&["a", "b"])) != interner.names(&names(&["a\0b"])));
    }
}
