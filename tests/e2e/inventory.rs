//! Inventory on a real containerd: which images exist, what they weigh on
//! disk, and which are in use by containers in each state, as CRI reports
//! it and as `imagegc images` prints it.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use imagegc::cri::{ContainerState, Runtime};
use serde_json::Value;

use crate::oci::{BuiltImage, ImageSpec, Layer, new_layer_bytes};
use crate::testbed::{ContainerId, FsUsage, Kind, PAUSE_IMAGE, TestBed, statvfs};

const MIB: u64 = 1024 * 1024;
/// Slack for filesystem comparisons taken moments apart: containerd's
/// metadata database lives on the same filesystem and may grow a little.
const FS_TOLERANCE_BYTES: u64 = 2 * MIB;
const INODE_TOLERANCE: u64 = 64;
/// How long a removed image's space may take to come back: containerd 2.x
/// deletes content and snapshots in the background after RemoveImage.
const SPACE_BACK_TIMEOUT: Duration = Duration::from_secs(10);

async fn imported_images_are_listed_and_shared_layers_are_stored_once(kind: Kind) {
    let bed = TestBed::start(kind, 400).await;
    let before = bed.usage();

    let a = bed
        .import(
            &ImageSpec::new("docker.io/library/app-a:1")
                .layer(Layer::shared_base(16 * MIB))
                .layer(Layer::random(1, 4 * MIB)),
        )
        .await;
    let b = bed
        .import(
            &ImageSpec::new("docker.io/library/app-b:2")
                .layer(Layer::shared_base(16 * MIB))
                .layer(Layer::random(2, 6 * MIB)),
        )
        .await;
    let c = bed
        .import(&ImageSpec::new("docker.io/library/app-c:3").layer(Layer::random(3, 10 * MIB)))
        .await;
    let after = bed.usage();
    let pause = bed.pause_image();

    let images = bed.list_images().await;
    let listed: BTreeSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
    let expected: BTreeSet<&str> = [&a, &b, &c, pause].iter().map(|i| i.id.as_str()).collect();
    assert_eq!(
        listed, expected,
        "CRI lists exactly the imported images and the pause image"
    );
    for built in [&a, &b, &c, pause] {
        let image = images.iter().find(|i| i.id == built.id).unwrap();
        assert_eq!(image.repo_tags, built.names, "tags of {}", built.name());
        assert_eq!(image.repo_digests, built.repo_digests(), "digests of {}", built.name());
        // containerd counts every layer of the image, shared or not, plus
        // the manifest and config; CRI-O the uncompressed layers (the same
        // bytes here: the test layers are uncompressed) and the config.
        let packed = built.layer_bytes() + built.config.size + built.manifest.size;
        if kind.is_containerd() {
            assert_eq!(image.size, packed, "CRI size of {}", built.name());
        } else {
            assert!(
                image.size >= built.layer_bytes() && image.size <= built.layer_bytes() + 64 * 1024,
                "CRI size of {}: {} for {} bytes of layers",
                built.name(),
                image.size,
                built.layer_bytes()
            );
        }
    }

    // containerd stores each new layer twice (content blob and unpacked
    // snapshot), CRI-O once (unpacked); the shared base only once for both
    // images that have it.
    let copies = bed.stored_copies();
    let stored_once = copies * new_layer_bytes(&[&a, &b, &c], &[pause]);
    let stored_per_image = copies
        * [&a, &b, &c]
            .iter()
            .map(|image| new_layer_bytes(&[image], &[pause]))
            .sum::<u64>();
    // Readings taken apart: compared without a subtraction that can wrap.
    let grew = after.used_bytes.saturating_sub(before.used_bytes);
    eprintln!(
        "imported {} MiB of new layers: the filesystem grew {:.1} MiB (expected about {:.1} MiB)",
        stored_once / copies / MIB,
        grew as f64 / MIB as f64,
        stored_once as f64 / MIB as f64
    );
    assert!(
        grew >= stored_once * 95 / 100 && grew <= stored_once * 110 / 100 + 4 * MIB,
        "the filesystem grew {grew} bytes (used {} before the imports, {} after) for {stored_once} bytes \
         of blobs and snapshots",
        before.used_bytes,
        after.used_bytes
    );
    assert!(
        grew + 8 * MIB < stored_per_image,
        "the shared base layer was stored more than once: grew {grew}, storing every image's layers \
         separately would take {stored_per_image}"
    );

    let filesystems = bed.image_fs_info().await;
    assert_eq!(filesystems.len(), 1, "{filesystems:?}");
    let mount_point = Path::new(&filesystems[0].mount_point);
    assert!(
        mount_point.starts_with(bed.image_fs_mount()),
        "ImageFsInfo reports {} outside the test bed's filesystem {}",
        mount_point.display(),
        bed.image_fs_mount().display()
    );
    let image_fs = statvfs(mount_point);
    assert_eq!(image_fs.capacity_bytes, before.capacity_bytes);
    assert!(
        image_fs.capacity_bytes > 350 * MIB && image_fs.capacity_bytes <= 400 * MIB,
        "a 400 MiB filesystem has {} bytes of capacity",
        image_fs.capacity_bytes
    );
}

async fn removing_an_image_over_cri_frees_its_space(kind: Kind) {
    let bed = TestBed::start(kind, 300).await;
    let image = bed
        .import(&ImageSpec::new("docker.io/library/big:1").layer(Layer::random(40, 24 * MIB)))
        .await;
    let before = bed.usage();

    bed.remove_image(&image.id).await;

    // Every runtime here frees the space before RemoveImage returns, once
    // the image's every name is known to CRI: containerd 2.x also names an
    // imported image by its repository digest, a moment after its tags, and
    // a removal before that removed the tags only (the test bed's import now
    // waits for every name). The space then never came back, and the
    // metadata database's own writes on the same filesystem left less
    // available than before: the subtraction below wrapped. Readings taken
    // apart are compared as "at least this much more", never by a
    // subtraction that can wrap, and the space gets a while to come back,
    // should a runtime free it in the background.
    let stored = bed.stored_copies() * new_layer_bytes(&[&image], &[bed.pause_image()]);
    let expected = stored * 95 / 100;
    let gained = |usage: &FsUsage| usage.available_bytes.saturating_sub(before.available_bytes);
    let removed_at = Instant::now();
    let first = bed.usage();
    let mut lowest = first.available_bytes;
    let mut after = first;
    while gained(&after) < expected && removed_at.elapsed() < SPACE_BACK_TIMEOUT {
        tokio::time::sleep(Duration::from_millis(10)).await;
        after = bed.usage();
        lowest = lowest.min(after.available_bytes);
    }
    let change = |usage: &FsUsage| i128::from(usage.available_bytes) - i128::from(before.available_bytes);
    eprintln!(
        "{}: available {:+} bytes right after RemoveImage returned, {:+} at the lowest; {} ms later {:+}",
        kind.name(),
        change(&first),
        i128::from(lowest) - i128::from(before.available_bytes),
        removed_at.elapsed().as_millis(),
        change(&after)
    );
    assert!(
        gained(&after) >= expected,
        "removing {} gave back {:+} bytes within {SPACE_BACK_TIMEOUT:?}, expected about {stored} \
         (available {} before RemoveImage, {} after)",
        image.name(),
        change(&after),
        before.available_bytes,
        after.available_bytes
    );
    while bed.list_image_ids().await.contains(&image.id) {
        assert!(
            removed_at.elapsed() < SPACE_BACK_TIMEOUT,
            "{} is still listed {SPACE_BACK_TIMEOUT:?} after RemoveImage returned",
            image.name()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "{}: no longer listed {} ms after RemoveImage returned",
        kind.name(),
        removed_at.elapsed().as_millis()
    );
}

/// Four images: one with a running container, one with a created (never
/// started) container, one with an exited container, one unused.
struct InUseScenario {
    running: BuiltImage,
    created: BuiltImage,
    exited: BuiltImage,
    unused: BuiltImage,
    running_container: ContainerId,
    created_container: ContainerId,
    exited_container: ContainerId,
}

impl InUseScenario {
    /// Builds the scenario and checks it over CRI: the test bed must really
    /// produce containers in those three states.
    async fn start(bed: &TestBed) -> Self {
        let running = bed.import(&ImageSpec::small("running", 11)).await;
        let created = bed.import(&ImageSpec::small("created", 12)).await;
        let exited = bed.import(&ImageSpec::small("exited", 13)).await;
        let unused = bed.import(&ImageSpec::small("unused", 14)).await;

        let web = bed.run_pod("web").await;
        let running_container = bed.run_container(&web, running.name()).await;
        let created_container = bed.create_container(&web, created.name()).await;
        let batch = bed.run_pod("batch").await;
        let exited_container = bed.run_container(&batch, exited.name()).await;
        bed.stop_container(&exited_container).await;

        let scenario = Self {
            running,
            created,
            exited,
            unused,
            running_container,
            created_container,
            exited_container,
        };
        let containers = bed.list_containers().await;
        assert_eq!(containers.len(), 3, "{containers:#?}");
        for (container, image, state) in [
            (&scenario.running_container, &scenario.running, ContainerState::Running),
            (&scenario.created_container, &scenario.created, ContainerState::Created),
            (&scenario.exited_container, &scenario.exited, ContainerState::Exited),
        ] {
            let listed = containers
                .iter()
                .find(|c| c.id == container.0)
                .unwrap_or_else(|| panic!("container {} is not listed: {containers:#?}", container.0));
            assert_eq!(listed.state, Some(state), "state of the container on {}", image.name());
            assert_eq!(
                listed.image_ref,
                bed.image_ref_of(image),
                "image of the container on {}",
                image.name()
            );
        }
        assert!(
            containers
                .iter()
                .all(|c| c.image_ref != bed.image_ref_of(&scenario.unused)),
            "no container uses {}",
            scenario.unused.name()
        );
        scenario
    }

    fn images(&self) -> [&BuiltImage; 4] {
        [&self.running, &self.created, &self.exited, &self.unused]
    }

    /// The containers expected on each image id.
    fn containers_by_image(&self) -> HashMap<&str, Vec<&str>> {
        HashMap::from([
            (self.running.id.as_str(), vec![self.running_container.as_str()]),
            (self.created.id.as_str(), vec![self.created_container.as_str()]),
            (self.exited.id.as_str(), vec![self.exited_container.as_str()]),
            (self.unused.id.as_str(), vec![]),
        ])
    }
}

async fn containers_in_every_state_are_listed_over_cri(kind: Kind) {
    let bed = TestBed::start(kind, 300).await;
    let scenario = InUseScenario::start(&bed).await;

    // The running container's process is alive: stopping it makes it exit.
    bed.stop_container(&scenario.running_container).await;
    assert_eq!(
        bed.container_state(&scenario.running_container).await,
        Some(ContainerState::Exited)
    );
    // Removing a container or a pod takes its containers off the list.
    bed.remove_container(&scenario.created_container).await;
    assert_eq!(bed.container_state(&scenario.created_container).await, None);
    let pods = bed.list_containers().await;
    let batch = pods
        .iter()
        .find(|c| c.id == scenario.exited_container.0)
        .map(|c| crate::testbed::PodId(c.pod_sandbox_id.clone()))
        .unwrap();
    bed.stop_pod(&batch).await;
    bed.remove_pod(&batch).await;
    assert_eq!(bed.container_state(&scenario.exited_container).await, None);
}

async fn images_command_marks_images_of_containers_in_every_state_in_use(kind: Kind) {
    let bed = TestBed::start(kind, 300).await;
    let scenario = InUseScenario::start(&bed).await;
    let cri_images = bed.list_images().await;
    let version = bed.client().version().await.unwrap();
    let mount_point = bed.image_fs_info().await[0].mount_point.clone();
    let state_dir = tempfile::tempdir().unwrap();

    let fs_before = bed.usage();
    let output = Command::new(env!("CARGO_BIN_EXE_imagegc"))
        .args([
            "images",
            "--runtime-endpoint",
            bed.endpoint(),
            "--output",
            "json",
            "--state-dir",
        ])
        .arg(state_dir.path())
        .output()
        .expect("running imagegc");
    let fs_after = bed.usage();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "imagegc images failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("imagegc images --output json printed no JSON ({e}):\n{stdout}"));

    assert_eq!(report["runtime"]["endpoint"], bed.endpoint());
    assert_eq!(report["runtime"]["name"], version.runtime_name.as_str());
    assert_eq!(
        report["runtime"]["name"],
        if kind.is_containerd() { "containerd" } else { "cri-o" }
    );
    assert_eq!(report["runtime"]["version"], version.runtime_version.as_str());
    assert_eq!(report["sandbox_image"], PAUSE_IMAGE);

    let fs = &report["image_filesystem"];
    assert_eq!(fs["mount_point"], mount_point.as_str());
    assert_eq!(number(&fs["capacity_bytes"]), fs_before.capacity_bytes);
    assert_eq!(number(&fs["inodes_total"]), fs_before.inodes_total);
    assert_between(
        number(&fs["available_bytes"]),
        fs_before,
        fs_after,
        |u| u.available_bytes,
        FS_TOLERANCE_BYTES,
    );
    assert_between(
        number(&fs["used_bytes"]),
        fs_before,
        fs_after,
        |u| u.used_bytes,
        FS_TOLERANCE_BYTES,
    );
    assert_between(
        number(&fs["inodes_free"]),
        fs_before,
        fs_after,
        |u| u.inodes_free,
        INODE_TOLERANCE,
    );
    // The kubelet's arithmetic: 100 - available*100/capacity, in integers
    // (reserved blocks count as used, and usage rounds up).
    let percent = number(&fs["usage_percent"]);
    let kubelet_percent = |u: &FsUsage| 100 - u.available_bytes * 100 / u.capacity_bytes;
    let (a, b) = (kubelet_percent(&fs_before), kubelet_percent(&fs_after));
    assert!(
        (a.min(b)..=a.max(b)).contains(&percent),
        "usage_percent {percent}, statvfs says {a}..{b}"
    );

    let listed = report["images"].as_array().expect("images is an array");
    let by_id: HashMap<&str, &Value> = listed
        .iter()
        .map(|i| (i["id"].as_str().unwrap_or_default(), i))
        .collect();
    assert_eq!(listed.len(), 5, "four images and the pause image: {listed:#?}");
    assert!(
        by_id.contains_key(bed.pause_image().id.as_str()),
        "the pause image is listed"
    );
    let expected_containers = scenario.containers_by_image();
    for built in scenario.images() {
        let image = by_id
            .get(built.id.as_str())
            .unwrap_or_else(|| panic!("{} ({}) is not listed: {listed:#?}", built.name(), built.id));
        let cri = cri_images.iter().find(|i| i.id == built.id).unwrap();
        assert_eq!(strings(&image["tags"]), built.names, "tags of {}", built.name());
        assert_eq!(
            strings(&image["digests"]),
            built.repo_digests(),
            "digests of {}",
            built.name()
        );
        assert_eq!(number(&image["size_bytes"]), cri.size, "size of {}", built.name());
        assert_eq!(image["pinned"], false, "containerd 1.6 pins nothing: {}", built.name());
        let containers = &expected_containers[built.id.as_str()];
        assert_eq!(
            image["in_use"],
            !containers.is_empty(),
            "in_use of {} (containers: {containers:?})",
            built.name()
        );
        let mut listed_containers = strings(&image["containers"]);
        listed_containers.sort();
        assert_eq!(listed_containers, *containers, "containers of {}", built.name());
    }
}

fn number(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("expected a non-negative integer, got {value}"))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("expected an array of strings, got {value}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("expected a string, got {s}"))
                .to_string()
        })
        .collect()
}

/// `actual` lies between the two readings of `field`, give or take `tolerance`.
fn assert_between(actual: u64, before: FsUsage, after: FsUsage, field: fn(&FsUsage) -> u64, tolerance: u64) {
    let (a, b) = (field(&before), field(&after));
    let (low, high) = (a.min(b).saturating_sub(tolerance), a.max(b) + tolerance);
    assert!(
        (low..=high).contains(&actual),
        "{actual} is outside statvfs's {a}..{b} (tolerance {tolerance})"
    );
}

/// The runtime names each image's layers in its verbose `ImageStatus`:
/// the diff ids of its config (the digests of the uncompressed tars, not
/// of the gzip blobs), lowest first, so that two images on one base name
/// the same first layer; a gone image has none.
async fn the_verbose_image_status_names_each_images_layers(kind: Kind) {
    let bed = TestBed::start(kind, 400).await;
    let a = bed
        .import(
            &ImageSpec::new("docker.io/library/layers-a:1")
                .layer(Layer::shared_base(4 * MIB))
                .layer(Layer::random(11, MIB))
                .gzip(),
        )
        .await;
    let b = bed
        .import(
            &ImageSpec::new("docker.io/library/layers-b:1")
                .layer(Layer::shared_base(4 * MIB))
                .layer(Layer::random(12, MIB))
                .gzip(),
        )
        .await;
    let listed = bed.list_images().await;
    let client = bed.client();
    for built in [&a, &b] {
        let diff_ids: Vec<String> = built.unpacked.iter().map(|tar| tar.digest.clone()).collect();
        assert_ne!(
            diff_ids,
            built.layers.iter().map(|blob| blob.digest.clone()).collect::<Vec<_>>(),
            "gzip layers: the diff ids are not the blobs' digests"
        );
        let id = &listed.iter().find(|i| i.id == built.id).expect("listed").id;
        let layers = client.image_layers(id).await.expect("ImageStatus answers");
        assert_eq!(layers.as_ref(), Some(&diff_ids), "layers of {}", built.name());
    }
    let (la, lb) = (
        client.image_layers(&a.id).await.unwrap().unwrap(),
        client.image_layers(&b.id).await.unwrap().unwrap(),
    );
    // Below the base, every test image has the sleeper's layer.
    assert_eq!(la.len(), lb.len());
    let last = la.len() - 1;
    assert_eq!(la[..last], lb[..last], "the shared layers are the same layers");
    assert_ne!(la[last], lb[last]);
    let gone = format!("sha256:{}", "e".repeat(64));
    assert_eq!(client.image_layers(&gone).await.unwrap(), None);
}

on_every_runtime!(
    imported_images_are_listed_and_shared_layers_are_stored_once,
    the_verbose_image_status_names_each_images_layers,
    removing_an_image_over_cri_frees_its_space,
    containers_in_every_state_are_listed_over_cri,
    images_command_marks_images_of_containers_in_every_state_in_use,
);
