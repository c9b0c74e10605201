//! The fuzz targets' checks (`fuzz/properties.rs`) on every `cargo test`:
//! the committed seeds (`fuzz/corpus/<target>/`), any crash input kept in
//! `fuzz/artifacts/<target>/`, and a fixed number of seeded mutations of the
//! seeds. A quick stand-in between runs of `scripts/fuzz.sh`, not a
//! replacement: it has no coverage feedback.

use std::fs;
use std::path::{Path, PathBuf};

use crate::fuzz_properties;
use crate::support::XorShift;

const MUTATIONS: usize = 3000;
const SEED: u64 = 0xf022_5eed;
/// Fragments that matter to TOML, YAML and the state format.
const TOKENS: [&[u8]; 24] = [
    b"=",
    b":",
    b"\n",
    b"[",
    b"]",
    b"{",
    b"}",
    b"\"",
    b"'",
    b"-",
    b"#",
    b"%",
    b"*a",
    b"&a ",
    b"!!binary ",
    b"1e309",
    b"-1",
    b"18446744073709551616",
    b"0s",
    b"9999999d",
    b"\xff",
    b"\0",
    b"len=",
    b"crc32=",
];

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut found = Vec::new();
    for dir in [root.join("corpus").join(target), root.join("artifacts").join(target)] {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_file() {
                let bytes = fs::read(&path).unwrap();
                found.push((path, bytes));
            }
        }
    }
    found.sort();
    found
}

fn mutate(rng: &mut XorShift, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.between(1, 8) {
        let at = rng.between(0, out.len() as u64) as usize;
        match rng.between(0, 5) {
            0 if at < out.len() => out[at] ^= 1 << rng.between(0, 7),
            1 => out.insert(at, rng.next_u64() as u8),
            2 if at < out.len() => {
                out.remove(at);
            }
            3 => {
                let token = TOKENS[rng.between(0, TOKENS.len() as u64 - 1) as usize];
                out.splice(at..at, token.iter().copied());
            }
            4 if at < out.len() => {
                let end = (at + rng.between(1, 32) as usize).min(out.len());
                let copy = out[at..end].to_vec();
                out.splice(end..end, copy);
            }
            _ => out.truncate(at),
        }
    }
    out
}

fn replay(target: &str, check: fn(&Path, &[u8])) {
    let dir = tempfile::tempdir().unwrap();
    let inputs = inputs(target);
    assert!(inputs.len() >= 5, "{target}: the seed corpus is missing");
    for (path, bytes) in &inputs {
        let outcome = std::panic::catch_unwind(|| check(dir.path(), bytes));
        assert!(outcome.is_ok(), "{target}: {} fails its check", path.display());
    }
    let mut rng = XorShift::new(SEED);
    for n in 0..MUTATIONS {
        let (path, seed) = &inputs[rng.between(0, inputs.len() as u64 - 1) as usize];
        let input = mutate(&mut rng, seed);
        let outcome = std::panic::catch_unwind(|| check(dir.path(), &input));
        assert!(
            outcome.is_ok(),
            "{target}: mutation {n} of {} fails its check; the input: {:?}",
            path.display(),
            String::from_utf8_lossy(&input)
        );
    }
}

#[test]
fn config_seeds_and_their_mutations_pass_the_fuzz_checks() {
    replay("config", fuzz_properties::config);
}

#[test]
fn state_seeds_and_their_mutations_pass_the_fuzz_checks() {
    replay("state", fuzz_properties::state);
}
