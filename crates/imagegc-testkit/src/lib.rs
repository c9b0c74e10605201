//! Test support for imagegc, shared by its integration tests, benches and
//! examples. Nothing here ships: the imagegc package depends on this crate
//! for development only.
//!
//! - The fixtures, at the crate root ([`image`], [`container_using`],
//!   [`history`], [`metric`], [`imagegc_command`] and the rest): images and
//!   containers as a runtime lists them, records as a previous process saved
//!   them, one series of a metrics scrape. The library's own unit tests
//!   compile the same file (src/fixtures.rs), so a fixture means the same
//!   thing everywhere.
//! - [`fake`]: a fake CRI runtime behind the real gRPC server on a unix
//!   socket, with fault injection, call recording and each runtime's
//!   dialect; [`fake::DiskEffects`] connects its removals to the library's
//!   simulated disk (`imagegc::sim::SimDisk`).
//! - [`process`]: an `imagegc run` child stopped as a node stops a
//!   daemon (SIGTERM, a bounded wait).
//! - [`script`]: the same fake as a command driven on stdin (the
//!   `fake_runtime` binary), for scripts and the deployment checks.
//! - [`testbed`]: a private real runtime (containerd 1.6, containerd 2.x or
//!   CRI-O) on its own small filesystem, for the end-to-end tests, the
//!   benches and the demo (needs root); [`oci`] builds the OCI images it
//!   imports.

mod fixtures;

pub mod fake;
// The test bed and the OCI builder document what is not obvious, not item
// by item.
#[allow(missing_docs)]
pub mod oci;
pub mod process;
pub mod script;
#[allow(missing_docs)]
pub mod testbed;

pub use fixtures::*;

/// A small xorshift generator: reproducible randomness without a crate
/// (the fault tests' mutations, the invariant harness's attacks).
pub struct XorShift(u64);

impl XorShift {
    /// A generator for `seed` (0 counts as 1).
    pub fn new(seed: u64) -> Self {
        XorShift(seed.max(1))
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform enough in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform enough in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    /// One of `items`, or `None` when there is none.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            return None;
        }
        items.get(self.below(items.len() as u64) as usize)
    }

    /// True about `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}
