//! The cost of seeing image volumes: `ListContainers` does not show a
//! container's image mounts, so imagegc asks `ContainerStatus` once per
//! container, when the container is first listed. This bench lists 1,000
//! containers through the collector's usage poll, against the in-process
//! fake CRI runtime on a unix socket (real gRPC, no runtime work behind it):
//!
//! - the first poll: 1,000 new containers, 1,000 `ContainerStatus` calls;
//! - a steady poll: the same containers, no `ContainerStatus` call;
//! - a poll after 50 containers were replaced by new ones: 50 calls.
//!
//! Prints the median and range of `RUNS` runs of each, and the calls made.
//! `cargo bench --bench mounts`.

mod common;
use common::hex;

use std::sync::Arc;
use std::time::{Duration, Instant};

use imagegc::config::Config;
use imagegc::cri::{Container, ContainerState, Image};
use imagegc::engine::{Collector, Settings};
use imagegc::outputs::metrics::Metrics;
use imagegc::sim::SimDisk;
use imagegc::time::Clock;
use imagegc_testkit::fake::FakeRuntime;

const CONTAINERS: usize = 1_000;
const REPLACED: usize = 50;
const RUNS: usize = 5;

fn container(n: usize, generation: u64) -> Container {
    Container {
        id: hex(4 + generation, n as u64),
        pod_sandbox_id: hex(5, n as u64 / 4),
        name: format!("container-{n}"),
        image: format!("registry.example.com/app-{}:1", n % 100),
        image_ref: format!("sha256:{}", hex(1, (n % 100) as u64)),
        state: Some(ContainerState::Running),
        mounted_images: if n.is_multiple_of(10) {
            vec![format!("registry.example.com/data-{}:1", n % 7)]
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

/// One usage poll, timed.
async fn timed<R: imagegc::cri::Runtime>(collector: &mut Collector<R>) -> Duration {
    let started = Instant::now();
    collector.poll_usage().await.unwrap();
    started.elapsed()
}

fn median(mut samples: Vec<Duration>) -> (Duration, Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[0], samples[samples.len() - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut first, mut steady, mut churn) = (Vec::new(), Vec::new(), Vec::new());
    let mut calls = (0, 0, 0);
    for _ in 0..RUNS {
        runtime.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let fake = FakeRuntime::new();
            for i in 0..100u64 {
                fake.add_image(Image {
                    id: format!("sha256:{}", hex(1, i)),
                    repo_tags: vec![format!("registry.example.com/app-{i}:1")].into(),
                    size: 10_000_000,
                    ..Default::default()
                });
            }
            for n in 0..CONTAINERS {
                fake.add_container(container(n, 0));
            }
            let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
            let client = imagegc::cri::connect(&server.endpoint(), Duration::from_secs(30)).unwrap();
            let mut config = Config::default();
            config.state.dir = dir.path().join("state");
            let mut collector = Collector::load(
                client,
                Settings::from(&config),
                &config.state.dir,
                // 1 TiB, half of it free: never a space pass.
                Arc::new(SimDisk::new(1 << 40, 1 << 39)),
                Arc::new(Metrics::new()),
                Clock::start(),
            );
            first.push(timed(&mut collector).await);
            calls.0 = fake.count("ContainerStatus");
            steady.push(timed(&mut collector).await);
            calls.1 = fake.count("ContainerStatus") - calls.0;
            for n in 0..REPLACED {
                fake.remove_container(&container(n, 0).id);
                fake.add_container(container(n, 1));
            }
            churn.push(timed(&mut collector).await);
            calls.2 = fake.count("ContainerStatus") - calls.0 - calls.1;
            server.shutdown().await;
        });
    }
    println!("mounts: usage poll of {CONTAINERS} containers over CRI (fake runtime), {RUNS} runs: median (min-max)");
    for (what, samples, calls) in [
        ("first poll, all containers new", first, calls.0),
        ("steady poll, no container new", steady, calls.1),
        ("poll after 50 containers replaced", churn, calls.2),
    ] {
        let (m, lo, hi) = median(samples);
        println!(
            "mounts: {what}: {:.1} ms ({:.1}-{:.1}), {calls} ContainerStatus calls",
            ms(m),
            ms(lo),
            ms(hi)
        );
    }
}
