//! The hash map every module keys by image names and ids.

use std::collections::HashMap as StdHashMap;

/// The maps keyed by image names and ids: foldhash, seeded per process, is
/// several times faster than SipHash on these 70-120 byte keys, and the
/// planner hashes each image's names every cycle.
pub(crate) type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;

/// The sets of the same keys, hashed the same way.
pub(crate) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
