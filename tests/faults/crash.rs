//! SIGKILL at any moment of a save: the state file on disk is always one
//! complete state (the previous or the new one), never a torn one, and
//! temporary files of killed writers do not pile up.
//!
//! The writer is this test binary run again with [`WRITER_ENV`] set: it runs
//! only [`state_writer`], which saves generation after generation through
//! [`StateStore::save`]. Generation `g` has `g % 200 + 1` records, each of
//! size `g`, saved at `g` milliseconds after the epoch, so any mix of two
//! generations is detected.

use std::collections::BTreeSet;
use std::fs;
use std::time::{Duration, Instant, SystemTime};

use imagegc::records::Record;
use imagegc::store::state::{Loaded, StateStore};
use imagegc::time::{from_unix_millis, to_unix_millis};

use crate::support::{XorShift, records, spawn_self};

const WRITER_ENV: &str = "IMAGEGC_FAULTS_STATE_WRITER";
const FROM_ENV: &str = "IMAGEGC_FAULTS_STATE_WRITER_FROM";
const WRITER_TEST: &str = "crash::state_writer";
const ITERATIONS: usize = 250;
/// The seed of the kill delays; `IMAGEGC_FAULTS_SEED` replaces it.
const SEED: u64 = 0x5eed_c0de;

fn generation(g: u64) -> imagegc::records::Records {
    let at = from_unix_millis(g);
    records((0..g % 200 + 1).map(|n| {
        (
            format!("sha256:{n:064x}"),
            Record {
                first_seen: at,
                last_used: at,
                size: g,
                pinned: n % 7 == 0,
                tags: vec![format!(
                    "registry.example.com/a-team/an-application-with-a-long-name-{n}:generation-{g}"
                )]
                .into(),
                digests: vec![format!("registry.example.com/a-team/app-{n}@sha256:{g:064x}")].into(),
                from_history: false,
                ever_used: n % 2 == 0,
                usual_break: None,
            },
        )
    }))
}

/// The child process of [`sigkill_during_saves_never_leaves_a_torn_state`];
/// does nothing unless run by it.
#[test]
fn state_writer() {
    let Ok(dir) = std::env::var(WRITER_ENV) else {
        return;
    };
    let from: u64 = std::env::var(FROM_ENV).unwrap().parse().unwrap();
    let store = StateStore::new(dir);
    for g in from.. {
        store.save(&generation(g), from_unix_millis(g)).unwrap();
    }
}

#[test]
fn sigkill_during_saves_never_leaves_a_torn_state() {
    let seed = std::env::var("IMAGEGC_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED);
    let mut rng = XorShift::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let store = StateStore::new(&state_dir);
    let started = Instant::now();
    let mut latest = 0u64;
    let mut seen = BTreeSet::new();
    let mut fresh = 0;
    let mut most_temporary_files = 0;
    for iteration in 0..ITERATIONS {
        let from = (latest + 1).to_string();
        let mut child = spawn_self(
            WRITER_TEST,
            &[(WRITER_ENV, state_dir.to_str().unwrap()), (FROM_ENV, &from)],
        );
        std::thread::sleep(Duration::from_millis(rng.between(1, 30)));
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();

        let what = format!("iteration {iteration} (seed {seed})");
        match store.load(SystemTime::now(), Duration::MAX) {
            Loaded::Fresh => {
                assert_eq!(latest, 0, "{what}: the state vanished after generation {latest}");
                fresh += 1;
            }
            Loaded::Records { records, saved_at, .. } => {
                let g = to_unix_millis(saved_at);
                assert!(g >= latest, "{what}: the state went back from {latest} to {g}");
                assert_eq!(
                    records.len() as u64,
                    g % 200 + 1,
                    "{what}: generation {g} has a foreign record count"
                );
                assert!(
                    records.iter().all(|(_, r)| r.size == g && r.last_used == saved_at),
                    "{what}: generation {g} holds records of another generation"
                );
                latest = g;
                seen.insert(g);
            }
            Loaded::Corrupt { reason, moved_to } => {
                panic!("{what}: a SIGKILL left a corrupt state file ({reason}), moved to {moved_to:?}")
            }
        }
        if state_dir.exists() {
            let temporary: Vec<String> = fs::read_dir(&state_dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name.contains(".tmp"))
                .collect();
            assert!(
                temporary.len() <= 1,
                "{what}: temporary files pile up after kills: {temporary:?}"
            );
            most_temporary_files = most_temporary_files.max(temporary.len());
        }
    }
    assert!(latest > 0, "no save ever completed: the writer never got going");
    println!(
        "crash: {ITERATIONS} SIGKILLs in {:.1?}, {} distinct complete generations observed (latest {latest}), \
         {fresh} kills before the first save, at most {most_temporary_files} temporary file left, seed {seed}",
        started.elapsed(),
        seen.len()
    );
}
