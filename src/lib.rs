//! imagegc: a node-level container image garbage collector for CRI runtimes.
//!
//! # Layout
//!
//! Data flows from the runtime to the removals, each step in one module:
//!
//! - [`cri`]: the runtime boundary (the [`cri::Runtime`] trait, the CRI v1
//!   client); `matching` reads how a container names an image, in every
//!   runtime's dialect.
//! - [`records`]: first seen and last used per image, persisted by [`state`]
//!   (crash-safe, locked) through `safe_file`.
//! - [`policy`]: the pure planner (no IO, no clock): which images go, in
//!   which order, and why every other one stays; `SpaceTarget` and
//!   `SpaceOutlook` say whether a space pass is due and can succeed.
//! - [`collector`]: one cycle, executed; its report (`report`) feeds the
//!   [`journal`], [`metrics`] and the logs.
//! - [`daemon`]: the loop, health and the composition root; [`http`] serves
//!   metrics and probes; [`cli`] is each command and what it prints.
//! - [`config`]: raw files to a validated configuration; [`time`], [`fs`] and
//!   [`log`] are the clock, the filesystem probe and logging.
//! - [`sim`]: an image filesystem simulated in memory, measured through the
//!   same probe as a real one.
//!
//! Test support (fixtures, a fake CRI runtime served over gRPC, real
//! runtimes started for a test) is the workspace's dev crate,
//! crates/imagegc-testkit. README.md's "Development" section lists the files.
pub mod cli;
pub(crate) mod collections;
pub mod config;
pub mod cri;
pub mod daemon;
pub mod engine;
pub mod fs;
pub mod health;
pub mod http;
pub mod journal;
pub mod log;
pub(crate) mod matching;
pub mod metrics;
pub(crate) mod model;
pub(crate) mod pending;
pub mod policy;
pub mod records;
pub(crate) mod reference;
pub(crate) mod safe_file;
pub mod sim;
pub mod state;
// The library's unit tests build images, containers and records with the
// test kit's fixtures, compiled here from the kit's own file: the library
// cannot depend on the kit, which depends on it. The file names the library
// `imagegc`, as every other user of the kit does.
#[cfg(test)]
extern crate self as imagegc;
#[cfg(test)]
#[allow(dead_code)] // each unit test uses a few of the fixtures
#[path = "../crates/imagegc-testkit/src/fixtures.rs"]
mod testing;
pub mod time;
