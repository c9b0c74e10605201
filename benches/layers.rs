//! What knowing the images' layers costs (`policy::layers`): the book's
//! memory per image, and building the estimate of what removals free
//! (`Freeing`), which `plan`, a dry run and a hurried pass past the
//! kubelet's eviction line do once per cycle. IMAGES images (default
//! 1,000, 10,000 and 100,000) of five layers each: one of 50 shared bases
//! and four of their own. Memory is VmRSS of this process before and
//! after, so run one size at a time for a clean figure:
//!
//! `cargo bench --bench layers [-- IMAGES]`

use std::time::Instant;

use imagegc::cri::Image;
use imagegc::policy::{DiskFootprint, LayerBook};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn measure(n: usize) {
    let images: Vec<Image> = (0..n)
        .map(|i| Image {
            id: format!("sha256:{i:064x}"),
            repo_tags: Default::default(),
            repo_digests: Default::default(),
            size: 100 << 20,
            pinned: false,
        })
        .collect();
    let before = rss_kib();
    let mut book = LayerBook::default();
    for (i, image) in images.iter().enumerate() {
        let mut layers = vec![format!("sha256:{:064x}", (1u64 << 60) | (i % 50) as u64)];
        layers.extend((0..4).map(|k| format!("sha256:{:064x}", (1u64 << 62) | (i * 4 + k) as u64)));
        book.insert(&image.id, &layers);
    }
    let book_kib = rss_kib().saturating_sub(before);
    let mut times = Vec::new();
    let mut extra_kib = 0;
    for _ in 0..5 {
        let at = rss_kib();
        let started = Instant::now();
        let mut freeing = book.freeing(
            &images,
            DiskFootprint::for_dialect(&imagegc::cri::Dialect::of("containerd")),
        );
        times.push(started.elapsed());
        extra_kib = extra_kib.max(rss_kib().saturating_sub(at));
        let freed = images
            .iter()
            .take(10)
            .fold(0u64, |sum, i| sum.saturating_add(freeing.release(&i.id, i.size)));
        std::hint::black_box(freed);
    }
    times.sort();
    println!(
        "layers/{n}: book {book_kib} KiB ({} B an image); estimate built in {:.1} ms (median of 5, {:.1}-{:.1}), {extra_kib} KiB more while it lives",
        (book_kib * 1024).checked_div(n as u64).unwrap_or(0),
        times[2].as_secs_f64() * 1000.0,
        times[0].as_secs_f64() * 1000.0,
        times[4].as_secs_f64() * 1000.0,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo test --benches` runs it without --bench: once, small.
    if !args.iter().any(|a| a == "--bench") {
        measure(1_000);
        return;
    }
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    for n in sizes {
        measure(n);
    }
}
