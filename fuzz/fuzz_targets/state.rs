//! State files on arbitrary bytes: see `fuzz/properties.rs`.

#![no_main]

#[allow(dead_code)] // each target uses one of the checks
#[path = "../properties.rs"]
mod properties;
#[path = "../scratch.rs"]
mod scratch;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| properties::state(scratch::dir(), data));
