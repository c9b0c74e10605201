//! Simulations of what imagegc acts on, run in process: a disk today.
//!
//! [`SimDisk`] is an image filesystem that implements [`FsProbe`]: a
//! capacity, available bytes, and what each image really occupies, changed
//! by whoever holds it and measured by the collector like a real one. The
//! integration tests and the benches measure it instead of a real disk, and
//! a simulation of a node's recorded usage is meant to run on it. It does no
//! IO and reads no clock.
//!
//! [`FsProbe`]: crate::fs::FsProbe

mod disk;

pub use disk::SimDisk;
