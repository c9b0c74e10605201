//! The state directory: what imagegc keeps across restarts, each file
//! crash-safe and each its own module. [`state`]: the records' file (and
//! the lock on the directory, the containers and pods known, the running
//! marker); [`journal`]: one line per removal, which `imagegc history`
//! reads; `pending`: removals whose outcome is not known yet. The
//! records themselves are [`crate::records`]'s; how a file is written
//! safely is `safe_file`'s.

pub mod journal;
pub(crate) mod pending;
pub mod state;
