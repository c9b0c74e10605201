//! What every test of imagegc builds its world from: images and containers
//! as a runtime lists them, records as a previous process saved them, the
//! value of one series in a metrics scrape, and the `imagegc` binary with
//! the flags every process-level test passes.
//!
//! This one file serves the integration tests, the benches and the examples
//! (as the test kit's root) and the library's own unit tests, which compile
//! it as `imagegc::testing` (the library cannot depend on the kit, which
//! depends on it): a fixture means the same thing everywhere. So it names
//! the library as `imagegc` and uses nothing but the library and `std`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::SystemTime;

use imagegc::cri::{Container, Image, proto};
use imagegc::records::{Record, Records};

/// An image with one tag (`registry.example.com/team/<name>:1.0`) and one
/// digest, named after `name`, with the id [`image_id`] gives it.
pub fn image(name: &str, size: u64) -> Image {
    let id = image_id(name);
    Image {
        repo_tags: vec![format!("registry.example.com/team/{name}:1.0")].into(),
        repo_digests: vec![format!("registry.example.com/team/{name}@{id}")].into(),
        id,
        size,
        pinned: false,
    }
}

/// A stable `sha256:` id for a short name: its bytes in hex, padded with
/// zeros (so ids sort like names, and the short ids of names up to six
/// bytes long differ).
pub fn image_id(name: &str) -> String {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex:0<64}")
}

/// An image with the id and the tag given, and a digest of the tag's
/// repository at that id; 1 MB.
pub fn tagged_image(id: &str, tag: &str) -> Image {
    let repository = tag.split(':').next().unwrap_or(tag);
    Image {
        id: id.to_string(),
        repo_tags: vec![tag.to_string()].into(),
        repo_digests: vec![format!("{repository}@{id}")].into(),
        size: 1_000_000,
        pinned: false,
    }
}

/// An image tagged `docker.io/library/<id>:latest`, with no digest: the
/// form a container may name by its familiar `<id>` alone.
pub fn library_image(id: &str, size: u64) -> Image {
    Image {
        id: id.to_string(),
        repo_tags: vec![format!("docker.io/library/{id}:latest")].into(),
        repo_digests: Default::default(),
        size,
        pinned: false,
    }
}

/// What `ListImages` answers for `images` on the wire, to measure its size.
pub fn list_images_response(images: &[Image]) -> proto::ListImagesResponse {
    proto::ListImagesResponse {
        images: images
            .iter()
            .map(|i| proto::Image {
                id: i.id.clone(),
                repo_tags: i.repo_tags.to_vec(),
                repo_digests: i.repo_digests.to_vec(),
                size: i.size,
                ..Default::default()
            })
            .collect(),
    }
}

/// A running container whose spec names `image`'s tag and whose
/// `image_ref` is its id, as containerd reports them.
pub fn container_using(id: &str, image: &Image) -> Container {
    Container {
        id: id.to_string(),
        pod_sandbox_id: format!("pod-{id}"),
        name: id.to_string(),
        image: image.repo_tags.first().unwrap_or_default().to_owned(),
        image_ref: image.id.clone(),
        image_id: String::new(),
        state: None,
        mounted_images: Vec::new(),
        mounts_unknown: false,
    }
}

/// A container that names its image by `reference` alone, both in its spec
/// and in `image_ref`.
pub fn container_naming(id: &str, reference: &str) -> Container {
    Container {
        id: id.to_string(),
        image: reference.to_string(),
        image_ref: reference.to_string(),
        ..Default::default()
    }
}

/// A record of `image` as a previous process would have saved it.
pub fn history(image: &Image, first_seen: SystemTime, last_used: SystemTime) -> (String, Record) {
    (
        image.id.clone(),
        Record {
            first_seen,
            last_used,
            size: image.size,
            pinned: image.pinned,
            tags: image.repo_tags.clone(),
            digests: image.repo_digests.clone(),
            from_history: true,
            ever_used: last_used > first_seen,
            usual_break: None,
        },
    )
}

/// Records made of [`history`] entries.
pub fn records(entries: impl IntoIterator<Item = (String, Record)>) -> Records {
    Records::from_map(entries)
}

/// The value of `series` (its name and labels, exactly as exposed, e.g.
/// `imagegc_runtime_up` or `imagegc_images_removed_total{reason="age"}`)
/// in a scrape of `/metrics`.
pub fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The `imagegc` binary at `binary` (a test passes
/// `env!("CARGO_BIN_EXE_imagegc")`) with the flags every process-level test
/// passes, and none of the environment that would change what it reads or
/// logs: no `IMAGEGC_CONFIG`, `NOTIFY_SOCKET` or `RUST_LOG`.
pub fn imagegc_command(binary: impl AsRef<Path>, config: &Path, endpoint: &str, state_dir: &Path) -> Command {
    let mut command = Command::new(binary.as_ref());
    command
        .env_remove("IMAGEGC_CONFIG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG")
        .arg("--config")
        .arg(config)
        .arg("--runtime-endpoint")
        .arg(endpoint)
        .arg("--state-dir")
        .arg(state_dir)
        .stdin(Stdio::null());
    command
}

/// The names the first cell of each row of README's tables gives, each in
/// backticks (one or several a row: `a`, `b`), labels and all as written:
/// what the reference tables name, for tests that hold them to the code.
pub fn readme_table_names(readme: &str) -> Vec<String> {
    readme
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split(" |").next())
        .flat_map(|cell| {
            format!("`{cell}")
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The first cells of the rows of the first table under the heading
/// `heading` (a whole line, `#### Exit codes`) in `readme`, backticks
/// removed: the table's header and separator left out.
pub fn readme_table_under(readme: &str, heading: &str) -> Vec<String> {
    readme
        .lines()
        .skip_while(|line| line.trim() != heading)
        .skip(1)
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .filter_map(|line| line.trim_start_matches('|').split('|').next())
        .map(|cell| cell.trim().trim_matches('`').to_string())
        .collect()
}
