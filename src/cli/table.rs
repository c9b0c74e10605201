//! How the commands draw for people: aligned tables with printable, bounded
//! cells, short ids, sizes in binary units, and the image filesystem line.

use crate::config::Config;
use crate::fs::FsStats;
use crate::policy::{DiskFootprint, ImageBytes, ImageBytesSource};

/// The line that says what images take of the image filesystem, and where
/// the figure comes from.
pub fn image_bytes_line(bytes: &ImageBytes, footprint: DiskFootprint) -> String {
    match bytes.source {
        ImageBytesSource::Runtime => format!(
            "images take {} of it (the runtime's ImageFsInfo)\n",
            human_bytes(bytes.bytes)
        ),
        ImageBytesSource::Listing => format!(
            "images take about {} of it (the listed sizes times {:.1}; the runtime reports no plausible larger figure)\n",
            human_bytes(bytes.bytes),
            footprint.factor()
        ),
    }
}

/// How far back `plan`, `images` and `check-config` look for removals by
/// others.
pub const REMOVED_BY_OTHERS_WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// What the usage log of `state_dir` says others removed in the last
/// [`REMOVED_BY_OTHERS_WINDOW`] before `now`: `Ok(None)` when nothing,
/// an error when the log cannot be read.
pub fn removed_by_others_line(
    state_dir: &std::path::Path,
    now: std::time::SystemTime,
) -> std::io::Result<Option<String>> {
    let since = now
        .checked_sub(REMOVED_BY_OTHERS_WINDOW)
        .unwrap_or(std::time::UNIX_EPOCH);
    let found = crate::usage_log::RemovedByOthers::read(state_dir, since)?;
    Ok(removed_by_others_text(&found))
}

/// "another collector removed 3 images (1.2 GiB) in the last 24 h, the
/// last at …", or `None` when none.
pub fn removed_by_others_text(found: &crate::usage_log::RemovedByOthers) -> Option<String> {
    let last = found.last.filter(|_| found.images > 0)?;
    Some(format!(
        "another collector removed {} image(s) ({}) in the last 24 h, the last at {} (imagegc did not ask for \
         these removals: the kubelet's own image GC, or another collector, runs beside imagegc)\n",
        found.images,
        human_bytes(found.bytes),
        crate::time::rfc3339(last)
    ))
}

/// `sha256:0123456789ab…` → `0123456789ab`.
pub fn short_id(id: &str) -> String {
    crate::model::reference::bare_id(id).chars().take(12).collect()
}

/// A tags column cell: the first tag and how many more (`nginx:1.27 (+2)`),
/// or `<none>` for an untagged image.
pub fn tags_cell<S: AsRef<str>>(tags: impl IntoIterator<Item = S>) -> String {
    let mut names = tags.into_iter();
    match (names.next(), names.count()) {
        (None, _) => "<none>".to_string(),
        (Some(one), 0) => one.as_ref().to_owned(),
        (Some(first), more) => format!("{} (+{more})", first.as_ref()),
    }
}

/// A boolean as a table cell: `yes` or `no`.
pub fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

pub use crate::outputs::human_bytes;

/// The longest cell a table prints, in characters: every real tag, id and
/// time fits; a longer value (a runtime can report anything) is cut with an
/// ellipsis, and the whole value stays in `--output json`.
pub const MAX_CELL_CHARS: usize = 200;

/// `text` safe to print on a terminal: control characters (newlines, escape
/// codes) are written as escapes (`\n`, `\u{1b}`), so a runtime-supplied
/// name can neither forge a line nor drive the terminal.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// A table cell: printable, and at most [`MAX_CELL_CHARS`] characters.
pub fn cell(text: &str) -> String {
    let text = printable(text);
    if text.chars().count() <= MAX_CELL_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_CELL_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Left-aligned columns separated by two spaces; the first row is the header.
/// Cells are made printable and cut to [`MAX_CELL_CHARS`].
pub fn table(rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|row| row.iter().map(|c| cell(c)).collect()).collect();
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell:<width$}", width = widths[c]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// A table under construction: a header and rows, drawn by [`table`].
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with this header row.
    pub fn new<const N: usize>(header: [&str; N]) -> Self {
        Table {
            rows: vec![header.iter().map(ToString::to_string).collect()],
        }
    }

    /// Adds a row; each cell is made printable and bounded when drawn (see
    /// [`cell`]).
    pub fn row(&mut self, cells: impl IntoIterator<Item = String>) {
        self.rows.push(cells.into_iter().collect());
    }

    /// True when only the header is there.
    pub fn is_empty(&self) -> bool {
        self.rows.len() == 1
    }

    /// The table as text: one line per row, the header first, columns
    /// left-aligned and two spaces apart, trailing spaces trimmed.
    pub fn render(&self) -> String {
        table(&self.rows)
    }
}

/// The image filesystem, its usage and the thresholds, on one line.
pub fn fs_line(mount_point: &str, fs: Option<&FsStats>, config: &Config) -> String {
    let mount_point = cell(mount_point);
    match fs {
        Some(s) => format!(
            "image filesystem: {mount_point}: {} used of {} ({}%), {} available; high {}%, low {}%\n",
            human_bytes(s.used_bytes()),
            human_bytes(s.capacity_bytes),
            s.usage_percent(),
            human_bytes(s.available()),
            config.gc.high_threshold_percent,
            config.gc.low_threshold_percent
        ),
        None => format!("image filesystem: {mount_point}: cannot be measured\n"),
    }
}

/// The container filesystem of a split store (KEP-4191), as `images` and
/// `plan` report it beside the image filesystem: measured, never freed.
#[derive(Debug, serde::Serialize)]
pub struct ContainerFsView {
    /// The mount point the runtime names in `container_filesystems`.
    pub mount_point: std::path::PathBuf,
    /// Its size.
    pub capacity_bytes: u64,
    /// Used bytes, as `df` reports them.
    pub used_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// Usage in percent, rounded up as the kubelet does.
    pub usage_percent: u64,
}

impl ContainerFsView {
    /// The container filesystem, when the runtime keeps containers on
    /// another filesystem than its images.
    pub fn of(image_fs: &crate::engine::ImageFs, probe: &dyn crate::fs::FsProbe) -> Option<ContainerFsView> {
        image_fs.container_fs(probe).map(|(mount_point, s)| ContainerFsView {
            mount_point,
            capacity_bytes: s.capacity_bytes,
            used_bytes: s.used_bytes(),
            available_bytes: s.available(),
            usage_percent: s.usage_percent(),
        })
    }

    /// The header line below the image filesystem's.
    pub fn line(&self) -> String {
        format!(
            "container filesystem: {}: {} used of {} ({}%), {} available; containers' writable layers, not freed by \
             removing images\n",
            cell(&self.mount_point.display().to_string()),
            human_bytes(self.used_bytes),
            human_bytes(self.capacity_bytes),
            self.usage_percent,
            human_bytes(self.available_bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_by_others_are_said_with_count_bytes_and_the_last_time() {
        use crate::usage_log::RemovedByOthers;
        assert_eq!(removed_by_others_text(&RemovedByOthers::default()), None);
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        let text = removed_by_others_text(&RemovedByOthers {
            images: 3,
            bytes: 1288490189,
            last: Some(at),
        })
        .unwrap();
        assert!(
            text.starts_with(&format!(
                "another collector removed 3 image(s) (1.2 GiB) in the last 24 h, the last at {}",
                crate::time::rfc3339(at)
            )),
            "{text}"
        );
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(230 * 1024 * 1024), "230.0 MiB");
    }
    #[test]
    fn tables_align_columns() {
        let t = table(&[vec!["A".into(), "BB".into()], vec!["long".into(), "x".into()]]);
        assert_eq!(t, "A     BB\nlong  x\n");
    }

    #[test]
    fn a_cell_of_70000_characters_is_cut_with_an_ellipsis() {
        let tag = format!("registry.test/app:{}", "x".repeat(70_000));
        let t = table(&[vec!["TAGS".into(), "SIZE".into()], vec![tag, "1 KiB".into()]]);
        let row = t.lines().nth(1).unwrap();
        assert_eq!(row.chars().count(), MAX_CELL_CHARS + 2 + "1 KiB".len());
        assert!(row.starts_with("registry.test/app:xxx"));
        assert!(row.contains("x…  1 KiB"));
    }

    #[test]
    fn control_characters_in_cells_are_escaped() {
        let t = table(&[vec!["TAGS".into()], vec!["app:1\u{1b}[2J\nforged row".into()]]);
        assert_eq!(t, "TAGS\napp:1\\u{1b}[2J\\nforged row\n");
    }

    #[test]
    fn short_ids() {
        assert_eq!(
            short_id("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
            "0123456789ab"
        );
    }
}
