//! A large node: 50,000 images with long tags and digests and 20,000
//! containers, served by the fake runtime over gRPC. One full cycle runs
//! (the `ListImages` answer is far over gRPC's 4 MiB default) with a space
//! pass that removes three images, then the planner alone.
//!
//! The work runs in a child process (this test binary again, with
//! [`CHILD_ENV`] set), so that its peak memory (`VmHWM`) is its own and not
//! that of whatever other test ran in the same process.

use std::time::{Duration, Instant};

use imagegc::cri::Snapshot;
use imagegc::cri::{Container, Image, connect};
use imagegc::engine::Outcome;
use imagegc::policy::{self, GcPolicy};
use imagegc::records::Records;
use imagegc_testkit::fake::FakeRuntime;
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::support::{self, DiskEffects, SimDisk, peak_rss_kib, spawn_self};

const CHILD_ENV: &str = "IMAGEGC_FAULTS_SCALE_CHILD";
const TEST: &str = "scale::fifty_thousand_images_and_twenty_thousand_containers";
const IMAGES: usize = 50_000;
const CONTAINERS: usize = 20_000;
const GRPC_DEFAULT_LIMIT: usize = 4 * 1024 * 1024;
/// The whole child, in a debug build on a slow machine.
const CHILD_DEADLINE: Duration = Duration::from_secs(300);

fn big_image(n: usize) -> Image {
    let id = format!("sha256:{n:064x}");
    let repository = format!("registry.example.com/platform-team/a-service-with-a-rather-long-name-{n:05}");
    Image {
        repo_tags: vec![
            format!("{repository}:v1.2.3-build-{n}-0123456789abcdef"),
            format!("{repository}:latest"),
        ]
        .into(),
        repo_digests: vec![format!("{repository}@sha256:{:064x}", n + 1_000_000)].into(),
        id,
        size: 50_000_000 + n as u64,
        pinned: false,
    }
}

fn big_container(n: usize, image: &Image) -> Container {
    Container {
        id: format!("{n:064x}"),
        pod_sandbox_id: format!("{:064x}", n + 5_000_000),
        name: format!("container-{n}"),
        image: image.repo_tags.first().unwrap().to_owned(),
        image_ref: image.id.clone(),
        image_id: String::new(),
        state: None,
        mounted_images: Vec::new(),
        mounts_unknown: false,
    }
}

#[test]
fn fifty_thousand_images_and_twenty_thousand_containers() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    let started = Instant::now();
    let child = spawn_self(TEST, &[(CHILD_ENV, "1")]);
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(CHILD_DEADLINE) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("the scale run took longer than {CHILD_DEADLINE:?}");
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The harness prints its "test ... " prefix on the first figure's line.
    let figures: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.find("scale:").map(|at| &l[at..]))
        .collect();
    assert!(
        output.status.success() && figures.len() >= 4,
        "the scale run failed ({:?}):\n{stdout}",
        output.status
    );
    println!(
        "{}\nscale: child process took {:.1?} in all",
        figures.join("\n"),
        started.elapsed()
    );
}

fn child() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let rss_start = peak_rss_kib();
        let fake = FakeRuntime::new();
        let images: Vec<Image> = (0..IMAGES).map(big_image).collect();
        for (n, image) in images.iter().take(CONTAINERS).enumerate() {
            fake.add_container(big_container(n, image));
        }
        for image in &images {
            fake.add_image(image.clone());
        }
        let list_images_bytes = imagegc_testkit::list_images_response(&images).encoded_len();
        assert!(list_images_bytes > GRPC_DEFAULT_LIMIT, "{list_images_bytes} bytes");
        // 95% used, 80% to reach, 60,000 bytes per unused image: a full
        // space pass, three removals, each re-checking 20,000 containers.
        let disk = SimDisk::new(1_000_000, 50_000);
        for image in &images[CONTAINERS..] {
            disk.occupy(&image.id, 60_000);
        }
        fake.on_remove(Some(disk.free_on_remove()));
        let rss_runtime = peak_rss_kib();

        let dir = tempfile::tempdir().unwrap();
        let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
        let client = connect(&server.endpoint(), Duration::from_secs(120)).unwrap();
        let mut collector = support::collector(client, &disk, &support::config(&dir.path().join("state")));
        let t = Instant::now();
        let report = collector.cycle(&CancellationToken::new()).await;
        let cycle = t.elapsed();
        assert_eq!(report.outcome, Outcome::Success, "{:?}", report.outcome);
        assert!(report.runtime_reached && report.space_pass);
        assert_eq!(report.removed.len(), 3);
        let expected: Vec<String> = images[CONTAINERS..CONTAINERS + 3]
            .iter()
            .map(|i| i.id.clone())
            .collect();
        assert_eq!(
            fake.removed(),
            expected,
            "the first unused images in order, nothing in use"
        );
        assert_eq!(collector.records().len(), IMAGES - 3);
        let rss_cycle = peak_rss_kib();
        server.shutdown().await;

        // The planner alone, on the same listing.
        let snapshot = Snapshot {
            images: fake.images(),
            containers: fake.containers(),
            sandbox_images: vec!["registry.k8s.io/pause:3.9".to_string()],
            sandbox_pods_unread: None,
        };
        let mut records = Records::new();
        let t = Instant::now();
        let at = std::time::SystemTime::now();
        records.observe(&snapshot.images, &snapshot.containers, at);
        let observe = t.elapsed();
        let config = support::config(dir.path());
        let gc_policy = GcPolicy::from(&config);
        let t = Instant::now();
        let plan = policy::plan(&snapshot, &records, &gc_policy, at + Duration::from_secs(1), at);
        let planning = t.elapsed();
        assert_eq!(plan.in_use_count(), CONTAINERS);
        assert_eq!(plan.space.len(), IMAGES - CONTAINERS - 3);
        let rss_end = peak_rss_kib();

        println!(
            "scale: {IMAGES} images, {CONTAINERS} containers; ListImages answer {:.1} MiB (gRPC default limit 4 MiB)",
            list_images_bytes as f64 / (1024.0 * 1024.0)
        );
        println!(
            "scale: one cycle (listing, planning, a space pass removing 3 images, saving {} records) {cycle:.2?}",
            IMAGES - 3
        );
        println!("scale: planner alone: records.observe {observe:.2?}, policy::plan {planning:.2?}");
        println!(
            "scale: peak RSS (VmHWM) at start {} MiB, with the fake runtime's data {} MiB, after the cycle {} MiB, \
             after the planner alone {} MiB (the in-process fake server's copies included)",
            rss_start / 1024,
            rss_runtime / 1024,
            rss_cycle / 1024,
            rss_end / 1024
        );
    });
}
