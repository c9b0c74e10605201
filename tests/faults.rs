//! imagegc under faults and bad input. Each test injects one fault and checks
//! what a user would check: nothing wrong removed, nothing lost.
//!
//! - [`hung`]: a runtime that stops answering, call by call;
//! - [`removals`]: removals the runtime refuses;
//! - [`outcomes`]: what really happened to an image, whatever the runtime
//!   answers (slow, lying, already gone, names gained late, ids listed twice,
//!   an empty listing), and a disk that images cannot fix;
//! - [`state_files`]: corrupt, unreadable, missing, full and read-only state
//!   (the real binary, with a tmpfs image filesystem);
//! - [`crash`]: SIGKILL in the middle of saves;
//! - [`clock`]: wall-clock jumps forward and back;
//! - [`scale`]: 50,000 images and 20,000 containers;
//! - [`dialects`]: each runtime's quirks, spoken by the fake;
//! - [`odd_data`]: duplicate, dangling, moved, unknown and absurd runtime data;
//! - [`fuzz_seeds`]: the fuzz targets' checks on their seeds and mutations.
//!
//! Some tests mount tmpfs filesystems and so need root, like the end-to-end
//! tests; they fail with the reason rather than skip.

#[path = "faults/clock.rs"]
mod clock;
#[path = "faults/crash.rs"]
mod crash;
#[path = "faults/dialects.rs"]
mod dialects;
#[path = "../fuzz/properties.rs"]
mod fuzz_properties;
#[path = "faults/fuzz_seeds.rs"]
mod fuzz_seeds;
#[path = "faults/hung.rs"]
mod hung;
#[path = "faults/odd_data.rs"]
mod odd_data;
#[path = "faults/outcomes.rs"]
mod outcomes;
#[path = "faults/removals.rs"]
mod removals;
#[path = "faults/scale.rs"]
mod scale;
#[path = "faults/state_files.rs"]
mod state_files;
#[path = "faults/support.rs"]
mod support;
