//! What the fuzz targets check, shared with `tests/faults/fuzz_seeds.rs`,
//! which replays the seeds and their mutations on every `cargo test`.
//!
//! [`config`]: the first byte of the input, modulo 4, picks the file name's
//! extension (`0` `.toml`, `1` `.yaml`, `2` `.yml`, `3` `.conf`, which makes
//! imagegc guess the format); the rest is the file. `config::load` must not
//! panic; an error must list at least one problem and every problem must
//! name the file; a configuration that loads, printed back as `check-config`
//! prints it, loads again to the same configuration.
//!
//! [`state`]: an input starting with `J` is a version 1 payload (one JSON
//! object), one starting with `L` a version 2 payload (JSON lines), wrapped
//! in a valid header (right length and CRC-32) so the parsing behind the
//! checksum is exercised; any other input is the whole file. `state::verify` must not
//! panic. A file it accepts must load as records (never be set aside), as
//! many as it counted, with no time in the future and none used before it
//! was first seen, and those records saved again must verify to the same
//! count.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use imagegc::config::{self, Config, Overrides};
use imagegc::store::state::{self, Loaded, StateStore};

const NAMES: [&str; 4] = ["imagegc.toml", "imagegc.yaml", "kubelet.yml", "imagegc.conf"];

/// The fields the TOML schema does not carry.
fn comparable(mut config: Config) -> Config {
    config.source = None;
    config.warnings.clear();
    config.eviction_imagefs_available = None;
    config
}

/// Checks one config input, using files in `dir`.
pub fn config(dir: &Path, data: &[u8]) {
    let Some((&selector, text)) = data.split_first() else {
        return;
    };
    let file: PathBuf = dir.join(NAMES[usize::from(selector) % NAMES.len()]);
    std::fs::write(&file, text).expect("writing the input");
    match config::load(Some(&file), &Overrides::default()) {
        Err(err) => {
            assert!(!err.problems.is_empty(), "an error without a problem");
            let name = file.display().to_string();
            for problem in &err.problems {
                assert_eq!(problem.file, name, "a problem not naming the file: {problem}");
                assert!(!problem.message.is_empty(), "a problem without a message: {problem:?}");
            }
        }
        Ok(loaded) => {
            let printed = loaded.to_toml_string();
            let again_file = dir.join("effective.toml");
            std::fs::write(&again_file, &printed).expect("writing the printed configuration");
            let again = config::load(Some(&again_file), &Overrides::default())
                .unwrap_or_else(|err| panic!("the printed configuration does not load: {err}\n{printed}"));
            assert_eq!(
                comparable(again),
                comparable(loaded),
                "printing and loading changed the configuration:\n{printed}"
            );
        }
    }
}

fn wrapped(version: u32, payload: &[u8]) -> Vec<u8> {
    let mut file = format!(
        "imagegc-state v{version} crc32={:08x} len={}\n",
        crc32fast::hash(payload),
        payload.len()
    )
    .into_bytes();
    file.extend_from_slice(payload);
    file
}

/// Checks one state input, using `dir` as the state directory.
pub fn state(dir: &Path, data: &[u8]) {
    let file = match data.split_first() {
        Some((b'J', payload)) => wrapped(1, payload),
        Some((b'L', payload)) => wrapped(2, payload),
        _ => data.to_vec(),
    };
    let Ok(count) = state::verify(&file) else {
        return;
    };
    let store = StateStore::new(dir);
    std::fs::write(store.path(), &file).expect("writing the input");
    let now = SystemTime::now();
    match store.load(now, Duration::from_secs(300)) {
        Loaded::Records { records, saved_at, .. } => {
            assert_eq!(records.len(), count, "load and verify disagree on the count");
            assert!(saved_at <= now);
            for (id, record) in records.iter() {
                assert!(
                    record.first_seen <= now && record.last_used <= now,
                    "{id}: a time in the future"
                );
                assert!(record.first_seen <= record.last_used, "{id}: used before first seen");
            }
            let again = state::encode(&records, saved_at);
            assert_eq!(state::verify(&again), Ok(count), "saved again, it does not verify");
        }
        other => panic!("a file verify accepts was not loaded: {other:?}"),
    }
}
