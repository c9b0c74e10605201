//! `imagegc images`: the runtime's images with their use, the sandbox
//! images and the image filesystem, as a table or JSON (the JSON shape is
//! documented in README and only ever grows).

use std::path::PathBuf;

use serde::Serialize;

use super::table::{
    ContainerFsView, Table, cell, fs_line, human_bytes, image_bytes_line, printable, short_id, tags_cell, yes_no,
};
use super::{CliError, ExitStatus, Output, out};
use crate::config::Config;
use crate::cri::{CriClient, Runtime};
use crate::engine::{ImageFs, Observer};
use crate::fs::{FsProbe, FsStats, Statvfs};
use crate::model::Snapshot;
use crate::model::matching::InUse;
use crate::model::names::Names;
use crate::policy::{DiskFootprint, ImageBytes};
use crate::store::state::Known;

#[derive(Serialize)]
struct ImagesView<'a> {
    runtime: RuntimeView<'a>,
    sandbox_image: Option<&'a String>,
    sandbox_images: &'a [String],
    image_filesystem: FilesystemView,
    /// The filesystem of containers' writable layers, when the runtime keeps
    /// them apart from its images (a split store); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    container_filesystem: Option<ContainerFsView>,
    /// Why the measured filesystem is not the runtime's image filesystem.
    image_fs_mismatch: Option<&'a str>,
    images: Vec<ImageView<'a>>,
}

#[derive(Serialize)]
struct RuntimeView<'a> {
    endpoint: &'a str,
    name: &'a str,
    version: &'a str,
}

/// The image filesystem as measured, or why it could not be.
#[derive(Serialize)]
#[serde(untagged)]
enum FilesystemView {
    Measured {
        mount_point: PathBuf,
        /// What images take of it, and where the figure comes from.
        image_bytes: Option<ImageBytes>,
        capacity_bytes: u64,
        used_bytes: u64,
        available_bytes: u64,
        usage_percent: u64,
        inodes_total: u64,
        inodes_free: u64,
    },
    Unmeasured {
        mount_point: PathBuf,
        error: String,
    },
}

#[derive(Serialize)]
struct ImageView<'a> {
    id: &'a str,
    tags: &'a Names,
    digests: &'a Names,
    size_bytes: u64,
    pinned: bool,
    in_use: bool,
    containers: &'a [&'a str],
}

/// `images`: the inventory, with in-use marks and the filesystem.
// Long on purpose: the listing, then the table or the JSON, each field
// where it is printed.
pub async fn images(runtime: &CriClient, config: &Config, output: Output) -> Result<ExitStatus, CliError> {
    let version = runtime.version().await?;
    // What the daemon learnt of each container and pod: only those it has
    // not seen cost a call.
    let observation = Observer::knowing(Known::read(&config.state.dir))
        .observe(
            runtime,
            config.gc.image_fs_path.as_deref(),
            config.runtime.sandbox_image.as_deref(),
        )
        .await?;
    let footprint = observation
        .dialect
        .as_ref()
        .map(DiskFootprint::for_dialect)
        .unwrap_or_default();
    let Snapshot {
        images,
        containers,
        sandbox_images,
        ..
    } = observation.snapshot;
    let image_fs = observation.image_fs?;
    let image_fs_mismatch = image_fs.mismatch(&Statvfs);
    let container_fs = ContainerFsView::of(&image_fs, &Statvfs);
    let ImageFs {
        path: mount_point,
        image_bytes: reported,
        ..
    } = image_fs;
    let fs = Statvfs.stats(&mount_point);
    let image_bytes = fs
        .as_ref()
        .ok()
        .map(|s| ImageBytes::new(reported, &images, footprint, s.used_bytes()));
    let in_use = InUse::new(&images, &containers);
    if output == Output::Json {
        let image_filesystem = match &fs {
            Ok(s) => FilesystemView::Measured {
                mount_point,
                image_bytes,
                capacity_bytes: s.capacity_bytes,
                used_bytes: s.used_bytes(),
                available_bytes: s.available(),
                usage_percent: s.usage_percent(),
                inodes_total: s.inodes_total,
                inodes_free: s.inodes_free,
            },
            Err(err) => FilesystemView::Unmeasured {
                mount_point,
                error: err.to_string(),
            },
        };
        out::json(&ImagesView {
            runtime: RuntimeView {
                endpoint: runtime.endpoint(),
                name: &version.runtime_name,
                version: &version.runtime_version,
            },
            sandbox_image: sandbox_images.first(),
            sandbox_images: &sandbox_images,
            image_filesystem,
            container_filesystem: container_fs,
            image_fs_mismatch: image_fs_mismatch.as_deref(),
            images: images
                .iter()
                .map(|i| ImageView {
                    id: &i.id,
                    tags: &i.repo_tags,
                    digests: &i.repo_digests,
                    size_bytes: i.size,
                    pinned: i.pinned,
                    in_use: in_use.is_used(&i.id),
                    containers: in_use.containers(&i.id),
                })
                .collect(),
        })?;
        return Ok(0);
    }
    let mut table = Table::new(["IMAGE ID", "TAGS", "SIZE", "PINNED", "IN USE"]);
    for i in &images {
        let used = in_use.containers(&i.id).len();
        table.row([
            short_id(&i.id),
            tags_cell(&i.repo_tags),
            human_bytes(i.size),
            yes_no(i.pinned),
            if used > 0 {
                format!("yes ({used})")
            } else {
                "no".to_string()
            },
        ]);
    }
    let measured: Option<&FsStats> = fs.as_ref().ok();
    let mismatch = image_fs_mismatch.map_or_else(String::new, |why| format!("warning: {}\n", printable(&why)));
    let images_take = image_bytes.map_or_else(String::new, |b| image_bytes_line(&b, footprint));
    let others = super::table::removed_by_others_line(&config.state.dir, crate::time::Clock::start().now())
        .ok()
        .flatten()
        .unwrap_or_default();
    let container_line = container_fs.as_ref().map_or_else(String::new, ContainerFsView::line);
    let text = format!(
        "runtime: {} {} at {}\n{}{images_take}{container_line}{others}\n{mismatch}{}",
        cell(&version.runtime_name),
        cell(&version.runtime_version),
        runtime.endpoint(),
        fs_line(&mount_point.display().to_string(), measured, config),
        table.render()
    );
    out::text(&text)?;
    Ok(0)
}
