//! imagegc: a node-level container image garbage collector for CRI runtimes.
//!
//! # Layout
//!
//! A module depends only on modules listed before it (no import circle),
//! from the leaves to the commands:
//!
//! - Leaves: [`time`] (the clock), [`fs`] (the filesystem probe), `model`
//!   (a removal and its reason), [`health`], [`log`], `collections`,
//!   `reference` (image names as people and runtimes write them),
//!   `safe_file`.
//! - [`config`]: raw files to a validated configuration (TOML or a
//!   KubeletConfiguration), every problem named by its field.
//! - [`cri`]: the runtime boundary: the [`cri::Runtime`] trait and the CRI
//!   v1 client. `matching` reads how a container names an image, in every
//!   runtime's dialect.
//! - [`records`]: first seen and last used per image; the state directory:
//!   [`state`] (the records' file, crash-safe and locked), [`journal`] (the
//!   removals), `pending` (removals whose outcome is not known yet).
//! - [`policy`]: pure: the planner (which images go, in which order, why
//!   every other one stays) and the space walk (when a pass is due and
//!   done), shared by the cycle, its dry run and `plan`.
//! - [`engine`]: the cycle executed: reading the runtime, removals and
//!   their settling, the thrash memory, usage between cycles, and typed
//!   events that sinks turn into [`metrics`], logs and health.
//! - [`sim`]: an image filesystem simulated in memory, and a node's image
//!   usage (synthetic workloads or a trace file) replayed under the planner
//!   and space walk, the kubelet's algorithm or an offline policy, with the
//!   offline lower bound on the bytes pulled again (`imagegc simulate`).
//! - [`usage_log`]: a sink of the engine's events that records what the
//!   node's images and containers do, in the trace format `sim` replays.
//! - `kubernetes` (the `kubernetes` feature): the pods bound to this node,
//!   watched, as keep rules for the policy; events on the Node, as a sink
//!   of the engine's events.
//! - [`daemon`] (the loop and the composition root), [`http`] (metrics and
//!   probes), [`cli`] (each command and what it prints).
//!
//! Where a change goes: a keep rule in `policy::plan`; a runtime quirk in
//! `engine::observe` (or `matching` when it is about names); a metric or a
//! log line in a sink of `engine::events`, fed by an event the engine
//! already sends (or a new variant of it).
//!
//! Test support (fixtures, a fake CRI runtime served over gRPC, real
//! runtimes started for a test) is the workspace's dev crate,
//! crates/imagegc-testkit. docs/development.md lists the files.
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
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
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
pub mod usage_log;
