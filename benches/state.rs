//! The cost of persisting the records: `StateStore::save` (encode, write,
//! fsync, rename, fsync the directory) and `StateStore::load` (read, verify,
//! decode) of 10,000 records, and `state::encode` alone, which is the save
//! without the disk.
//!
//! Target: save and load under 10 ms each. The file size is printed on the
//! `state:` line at the end, with the medians.
//!
//! `cargo bench --bench state` (the state file goes to a temporary directory
//! under `$TMPDIR`, so the fsyncs hit that filesystem).

mod common;
use common::{node_history, node_image};
use imagegc_testkit::history;

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::Criterion;
use imagegc::records::Records;
use imagegc::store::state::{self, Loaded, StateStore};

const RECORDS: usize = 10_000;

/// Records as a node with `n` images would have them: one tag and one repo
/// digest each, times spread over a month.
fn records(n: usize, now: SystemTime) -> Records {
    Records::from_map((0..n).map(|i| {
        let (first_seen, last_used) = node_history(i, now);
        history(&node_image(i), first_seen, last_used)
    }))
}

/// The median criterion measured for `state/<name>`, in nanoseconds.
fn median_ns(name: &str) -> Option<f64> {
    let home = std::env::var_os("CRITERION_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
            std::path::PathBuf::from(target).join("criterion")
        });
    let path = home.join("state").join(name).join("new").join("estimates.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn main() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000);
    let records = records(RECORDS, now);
    let dir = tempfile::Builder::new()
        .prefix("imagegc-bench-state-")
        .tempdir()
        .expect("creating a temporary state directory");
    let store = StateStore::new(dir.path().join("state"));
    store.save(&records, now).expect("saving the state");
    let file_bytes = std::fs::metadata(store.path()).expect("the state file").len();
    match store.load(now, Duration::from_secs(300)) {
        Loaded::Records { records: loaded, .. } => assert_eq!(loaded.len(), RECORDS),
        other => panic!("the saved state did not load: {other:?}"),
    }

    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("state");
    group.bench_function("save_10k", |b| b.iter(|| store.save(black_box(&records), now).unwrap()));
    // The loaded records are dropped outside the timing: the daemon loads
    // them once and keeps them.
    group.bench_function("load_10k", |b| {
        b.iter_with_large_drop(|| match store.load(now, Duration::from_secs(300)) {
            Loaded::Records { records, .. } => records,
            other => panic!("{other:?}"),
        });
    });
    group.bench_function("encode_10k", |b| b.iter(|| state::encode(black_box(&records), now)));
    group.finish();
    criterion.final_summary();
    // Under `cargo test` (no --bench) each benchmark ran once, unmeasured.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }

    if let (Some(save), Some(load), Some(encode)) =
        (median_ns("save_10k"), median_ns("load_10k"), median_ns("encode_10k"))
    {
        let verdict = |ns: f64| if ns < 10e6 { "met" } else { "MISSED" };
        println!(
            "state: {RECORDS} records, file {file_bytes} bytes ({:.1} KiB, {:.0} bytes/record); \
             median save {:.2} ms ({}), load {:.2} ms ({}), encode alone {:.2} ms; target < 10 ms each",
            file_bytes as f64 / 1024.0,
            file_bytes as f64 / RECORDS as f64,
            save / 1e6,
            verdict(save),
            load / 1e6,
            verdict(load),
            encode / 1e6,
        );
    }
}
