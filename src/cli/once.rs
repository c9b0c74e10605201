//! `imagegc once`: one cycle, then what it did (exit 0, or 3 when the low
//! threshold was not reached).

use std::sync::Arc;

use serde::Serialize;

use super::table::{Table, human_bytes, printable, short_id, tags_cell};
use super::{CliError, ExitStatus, Output, out};
use crate::config::Config;
use crate::cri::CriClient;
use crate::engine::report::{CycleReport, Outcome, Removal};
use crate::engine::{Collector, Settings};
use crate::fs::Statvfs;
use crate::outputs::metrics::Metrics;
use crate::policy::{Protections, SpaceOutlook};
use crate::time::Clock;

#[derive(Serialize)]
struct OnceJson<'a> {
    outcome: &'static str,
    detail: Detail,
    dry_run: bool,
    space_pass: bool,
    usage_percent_before: Option<u64>,
    usage_percent_after: Option<u64>,
    available_bytes_before: Option<u64>,
    available_bytes_after: Option<u64>,
    removed: &'a [Removal],
    failed: Vec<Failed<'a>>,
    kept_because_in_use_at_removal: &'a [String],
    space_unreachable: Option<SpaceOutlook>,
    image_fs_mismatch: Option<&'a str>,
    held_back_after_recent_removal: &'a [String],
    outcome_unknown: &'a [String],
    duration_seconds: f64,
}

/// `null`, what is still missing, or why the cycle failed.
#[derive(Serialize)]
#[serde(untagged)]
enum Detail {
    None,
    LowNotReached { freed_bytes: u64, remaining_bytes: u64 },
    Failure(String),
}

#[derive(Serialize)]
struct Failed<'a> {
    id: &'a str,
    error: &'a str,
}

/// `once`: one cycle.
pub async fn once(
    runtime: CriClient,
    config: Config,
    pods: Protections,
    output: Output,
) -> Result<ExitStatus, CliError> {
    let mut collector = Collector::load(
        runtime,
        Settings::from(&config),
        &config.state.dir,
        Arc::new(Statvfs),
        Arc::new(Metrics::new()),
        Clock::start(),
    );
    collector.set_protections(pods);
    let cancel = tokio_util::sync::CancellationToken::new();
    let report = collector.cycle(&cancel).await;
    if output == Output::Json {
        out::json(&report_json(&report))?;
    } else {
        out::text(&report_text(&report))?;
    }
    match &report.outcome {
        Outcome::Success | Outcome::Interrupted => Ok(0),
        Outcome::LowNotReached { .. } => Ok(super::exit::LOW_NOT_REACHED),
        Outcome::Failed(err) => Err(CliError::Other(anyhow::anyhow!("{err}"))),
    }
}

fn report_json(report: &CycleReport) -> OnceJson<'_> {
    let (outcome, detail) = match &report.outcome {
        Outcome::Success => ("success", Detail::None),
        Outcome::LowNotReached {
            freed_bytes,
            remaining_bytes,
        } => (
            "low_not_reached",
            Detail::LowNotReached {
                freed_bytes: *freed_bytes,
                remaining_bytes: *remaining_bytes,
            },
        ),
        Outcome::Failed(e) => ("failure", Detail::Failure(e.to_string())),
        Outcome::Interrupted => ("interrupted", Detail::None),
    };
    OnceJson {
        outcome,
        detail,
        dry_run: report.dry_run,
        space_pass: report.space_pass,
        usage_percent_before: report.before.map(|s| s.usage_percent()),
        usage_percent_after: report.after.map(|s| s.usage_percent()),
        available_bytes_before: report.before.map(|s| s.available()),
        available_bytes_after: report.after.map(|s| s.available()),
        removed: &report.removed,
        failed: report.failed.iter().map(|(id, error)| Failed { id, error }).collect(),
        kept_because_in_use_at_removal: &report.became_in_use,
        space_unreachable: report.space_unreachable,
        image_fs_mismatch: report.image_fs_mismatch.as_deref(),
        held_back_after_recent_removal: &report.held_back,
        outcome_unknown: &report.unsettled,
        duration_seconds: report.duration.as_secs_f64(),
    }
}

fn report_text(report: &CycleReport) -> String {
    let mut text = String::new();
    if let (Some(b), Some(a)) = (report.before, report.after) {
        text.push_str(&format!(
            "usage: {}% before, {}% after ({} available before, {} after)\n",
            b.usage_percent(),
            a.usage_percent(),
            human_bytes(b.available()),
            human_bytes(a.available())
        ));
    }
    let mut table = Table::new(["IMAGE ID", "TAGS", "REASON", "SIZE", "FREED"]);
    for r in &report.removed {
        table.row([
            short_id(&r.id),
            tags_cell(&r.tags),
            r.reason.as_str().to_string(),
            human_bytes(r.size),
            r.freed_bytes.map_or("-".to_string(), human_bytes),
        ]);
    }
    if table.is_empty() {
        text.push_str("removed nothing\n");
    } else {
        text.push_str(if report.dry_run {
            "would remove (dry run):\n"
        } else {
            "removed:\n"
        });
        text.push_str(&table.render());
    }
    for (id, err) in &report.failed {
        text.push_str(&format!("failed to remove {}: {}\n", short_id(id), printable(err)));
    }
    for id in &report.unsettled {
        text.push_str(&format!(
            "the runtime did not say whether it removed {} (still listed): no further removal for space this cycle\n",
            short_id(id)
        ));
    }
    if let Some(why) = &report.image_fs_mismatch {
        text.push_str(&format!("no space pass: {}\n", printable(why)));
    }
    if let Some(outlook) = &report.space_unreachable {
        text.push_str(&unreachable_text(outlook));
        if !report.held_back.is_empty() {
            text.push_str(&format!(
                "{} image(s) removed within gc.thrash_window left alone\n",
                report.held_back.len()
            ));
        }
    }
    match &report.outcome {
        Outcome::Success => {}
        Outcome::LowNotReached {
            freed_bytes,
            remaining_bytes,
        } => text.push_str(&format!(
            "low threshold not reached: freed {}, {} more needed but no removable image is left\n",
            human_bytes(*freed_bytes),
            human_bytes(*remaining_bytes)
        )),
        Outcome::Failed(e) => text.push_str(&format!("cycle failed: {}\n", printable(&e.to_string()))),
        Outcome::Interrupted => text.push_str("interrupted\n"),
    }
    text
}

/// What `plan` and `once` say when images cannot bring usage to low.
pub fn unreachable_text(outlook: &SpaceOutlook) -> String {
    format!(
        "images cannot bring usage to the low threshold: {} to free, removable images hold at most {}; \
         {} of the filesystem is not images (logs, volumes, writable layers): removing images cannot fix that\n",
        human_bytes(outlook.bytes_to_free),
        human_bytes(outlook.could_free),
        human_bytes(outlook.not_image_bytes)
    )
}
