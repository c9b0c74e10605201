//! imagegc: a node-level container image garbage collector for CRI runtimes.
pub mod config;
pub mod cri;
pub mod http;
pub mod metrics;
