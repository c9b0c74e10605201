//! Simulations of what imagegc acts on, run in process: a disk, and a
//! node's image usage replayed under a collection policy.
//!
//! Test support, only with the `test-util` feature (the test kit turns it
//! on; a release build has neither):
//!
//! - `SimDisk` is an image filesystem that implements [`FsProbe`]: a
//!   capacity, available bytes, and what each image really occupies,
//!   changed by whoever holds it and measured by the collector like a real
//!   one. The engine's tests, the integration tests and the benches
//!   measure it instead of a real disk.
//! - `SimNode` is what a fake node holds (images, their layers,
//!   containers, the removals its runtime made): the engine tests' fake
//!   runtime, the test kit's gRPC fake runtime and the invariant harness
//!   keep this one model.
//!
//! The simulator:
//!
//! - [`trace`]: a node's usage over time (layers, images, container starts
//!   and stops), synthetic or read from a file of JSON lines.
//! - [`workload`]: five seeded generators of synthetic traces (a service
//!   node, a CI runner, a batch node, a mixed node, preview environments),
//!   from published figures where there are any.
//! - [`replay`]: a trace played on a simulated node with simulated time
//!   under imagegc's own planner and space walk, or under the kubelet's
//!   algorithm, counting the bytes pulled again.
//! - [`bound`]: the offline lower bound on those bytes (PFOO-L at layer
//!   granularity); [`compare`]: every policy and the bound on one trace and
//!   disk; [`plot`]: the comparisons as an SVG chart.
//! - [`choose`]: `gc.order = "auto"`, the fixed orders judged by replaying
//!   the recent past, for the daemon and for the replay itself.
//!
//! The replays read what the daemon's engine reads of the configuration
//! ([`crate::engine::Settings`]), nothing else of it.
//!
//! The only IO here is reading traces: through the caller's reader and
//! writer, and the usage log's files (current and rotated) by path
//! ([`trace::Trace::read_log`]), which `simulate --usage-log` and `auto`
//! read. The replay runs on simulated time, with the daemon's own schedule
//! of cycles and usage checks ([`crate::policy::Schedule`]); the disk reads
//! tokio's clock (space that comes back a moment after a removal, another
//! writer by time), which a paused test runtime drives.
//!
//! [`FsProbe`]: crate::fs::FsProbe

pub mod bound;
pub mod choose;
pub mod compare;
#[cfg(any(test, feature = "test-util"))]
mod disk;
#[cfg(any(test, feature = "test-util"))]
mod node;
pub mod plot;
pub mod replay;
pub mod trace;
pub mod workload;

#[cfg(any(test, feature = "test-util"))]
pub use disk::SimDisk;
#[cfg(any(test, feature = "test-util"))]
pub use node::{SimNode, names};
