//! imagegc: a node-level container image garbage collector for CRI runtimes.
pub mod cli;
pub mod collector;
pub mod config;
pub mod cri;
pub mod daemon;
pub mod fs;
pub mod http;
pub mod journal;
pub mod log;
pub mod metrics;
pub mod policy;
pub mod records;
pub mod reference;
pub mod safe_file;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod time;
