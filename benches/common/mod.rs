//! What the benches share beyond `imagegc_testkit`: the deterministic node
//! they build their worlds from, the release binary, the choice of cases on
//! the command line, a free port, and the statistics they print. Each bench
//! uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use imagegc::cri::Image;

/// A deterministic 64-hex digest for `n` in namespace `kind` (splitmix64
/// rounds): ids and digests that look like a runtime's, the same every run.
pub fn hex(kind: u64, n: u64) -> String {
    let mut x = kind.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n.wrapping_add(1);
    let mut out = String::with_capacity(64);
    for _ in 0..4 {
        x ^= x >> 30;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        out.push_str(&format!("{x:016x}"));
    }
    out
}

/// Image `i` of a large node: ten versions per repository, twenty
/// repositories per team, a tag and a repo digest each.
pub fn node_image(i: usize) -> Image {
    let (repo, version) = (i / 10, i % 10);
    let name = format!("registry.example.com/team-{}/app-{repo}", repo / 20);
    Image {
        id: format!("sha256:{}", hex(1, i as u64)),
        repo_tags: vec![format!("{name}:v1.2.{version}")].into(),
        repo_digests: vec![format!("{name}@sha256:{}", hex(2, i as u64))].into(),
        size: 50_000_000 + (i as u64 % 97) * 1_000_000,
        pinned: false,
    }
}

/// When image `i` of [`node_image`] was first seen and last used: spread
/// over the last 30 days, in an order unrelated to `i`.
pub fn node_history(i: usize, now: SystemTime) -> (SystemTime, SystemTime) {
    let age = Duration::from_secs((i as u64).wrapping_mul(7919) % (30 * 86_400));
    (now - age - Duration::from_secs(3600), now - age)
}

/// The release build of the daemon, which the process benches run.
pub fn imagegc_binary() -> PathBuf {
    // A binary of one's own (one with symbols under a profiler's wrapper).
    if let Some(binary) = std::env::var_os("IMAGEGC_BENCH_BINARY") {
        return PathBuf::from(binary);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"), PathBuf::from);
    let binary = target.join("release").join("imagegc");
    assert!(
        binary.is_file(),
        "{} is missing: run `cargo build --release --bin imagegc` first (scripts/bench.sh does)",
        binary.display()
    );
    binary
}

/// The cases named on the command line (all when none), or None under
/// `cargo test --all-targets`, which runs bench targets without `--bench`:
/// the benches that start real containerds then only say how to run them.
pub fn selected_cases(bench: &str) -> Option<Vec<String>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("{bench}: starts real containerds; run it with `cargo bench --bench {bench}` (as root)");
        return None;
    }
    Some(args.into_iter().filter(|a| !a.starts_with("--")).collect())
}

/// An address on the loopback nothing listens on now.
pub fn free_local_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
}

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The median (sorts `values`).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The 10th and 90th percentiles.
pub fn spread(values: &[f64]) -> (f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 10], v[v.len() * 9 / 10])
}
