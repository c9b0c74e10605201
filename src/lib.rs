//! imagegc: a node-level container image garbage collector for CRI runtimes.
//!
//! # Layout
//!
//! A module depends only on modules declared before it below (no import
//! circle); tests/layering.rs reads every `crate::` path in src/ and holds
//! the code to that order. From the leaves to the commands:
//!
//! - Leaves: [`time`] (the clock), [`fs`] (the filesystem probe),
//!   `collections`, `safe_file`, `model` (the domain types: what a runtime
//!   lists, images, containers and one listing of both; a removal and its reason;
//!   `model::reference`, image names as people and runtimes write them and
//!   the glob patterns of `protect.images`; `model::matching`, how a
//!   container names an image in every runtime's way; `model::Dialect`,
//!   how a runtime speaks where the CRI leaves it open), [`outputs`] (the log's format, the
//!   registry the sinks register their metric families in, health, and the
//!   listener that serves metrics and probes).
//! - [`config`]: raw files to a validated configuration (TOML or a
//!   KubeletConfiguration), every problem named by its field.
//! - [`cri`]: the runtime boundary: the [`cri::Runtime`] trait and the CRI
//!   v1 client.
//! - [`records`]: first seen and last used per image; [`store`], the state
//!   directory: [`store::journal`] (the removals), `store::pending`
//!   (removals whose outcome is not known yet), [`store::state`] (the
//!   records' file, crash-safe and locked).
//! - [`policy`]: pure: the planner (which images go, in which order, why
//!   every other one stays), the space walk (when a pass is due and done)
//!   and the cycle's script over both ([`policy::CyclePlan`]), run by the
//!   daemon's cycle, its dry run, `plan` and `simulate`.
//! - [`engine`]: the cycle executed: reading the runtime, removals and
//!   their settling, the thrash memory, usage between cycles, and typed
//!   events that sinks turn into metrics, logs and health.
//! - [`sim`]: an image filesystem simulated in memory, and a node's image
//!   usage (synthetic workloads or a trace file) replayed under the planner
//!   and space walk, the kubelet's algorithm or an offline policy, with the
//!   offline lower bound on the bytes pulled again (`imagegc simulate`).
//! - [`usage_log`]: a sink of the engine's events that records what the
//!   node's images and containers do, in the trace format `sim` replays.
//! - `kubernetes` (the `kubernetes` feature): the pods bound to this node,
//!   watched, as keep rules for the policy; events on the Node, as a sink
//!   of the engine's events.
//! - [`daemon`] (the loop and the composition root), [`cli`] (each command
//!   and what it prints).
//!
//! Where a change goes: a keep rule in `policy::keep` (the planner and the
//! re-check before each removal both ask it), its key in `config::protect`;
//! a `gc.order` in a file of `policy::order`; a runtime quirk as a fact of
//! `model::Dialect` (decided there from the runtime's `Version` answer)
//! read where it is acted on, how a container names an image in
//! `model::matching` (every runtime's way), a call a runtime answers its
//! own way in `cri` or `engine::observe`; a metric in the sink that sets it, which
//! registers its family (`engine::sinks::metrics` for the engine's events,
//! `engine::sinks::cri_calls` for the CRI client's calls, which the client
//! tells it of, `engine::sinks::kubernetes` for what the `kubernetes`
//! module measures; README's table is checked against the registry); a log
//! line in `engine::sinks`' log sink.
//!
//! Test support (fixtures, a fake CRI runtime served over gRPC, real
//! runtimes started for a test) is the workspace's dev crate,
//! crates/imagegc-testkit. docs/development.md lists the files.
// clippy.toml's rules (the wall clock, blocking sleeps) hold in the
// library; its unit tests read the wall clock as they need.
#![cfg_attr(not(test), warn(clippy::disallowed_methods))]

// In layers, each using only those before it (tests/layering.rs).
// Leaves.
pub mod time;
pub mod fs;
pub(crate) mod collections;
pub(crate) mod safe_file;
pub(crate) mod model;
pub mod outputs;
// Configuration, the runtime and how containers name images.
pub mod config;
pub mod cri;
// Per-image history and the state directory.
pub mod records;
pub mod store;
// The policy, then the engine that executes it.
pub mod policy;
pub mod engine;
pub mod sim;
pub mod usage_log;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
// The daemon and the commands.
pub mod daemon;
pub mod cli;

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
