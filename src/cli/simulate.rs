//! `imagegc simulate`: replays a node's image usage (a synthetic workload,
//! or a trace file) on a simulated disk under imagegc's configuration, the
//! kubelet's algorithm and the offline bound, and prints what each pulls
//! again (see [`crate::sim`]). Talks to no runtime, touches no state.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::table::{Table, human_bytes};
use super::{CliError, ExitStatus, Output, out};
use crate::config::{Config, parse_quantity};
use crate::sim::compare::{Comparison, over_bound, reference_disks};
use crate::sim::trace::Trace;
use crate::sim::workload::{Kind, Sweep};

/// What `simulate` was asked: where the trace comes from, and the disks.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// A synthetic workload (default: every one of them).
    #[arg(long, value_enum, conflicts_with = "log")]
    pub workload: Option<Kind>,
    /// A trace file of JSON lines to replay instead, or the usage log a
    /// node recorded (with its rotated FILE.1; see docs/simulate.md).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// The workload generator's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How many days of the workload to generate.
    #[arg(long, default_value_t = 30)]
    pub days: u64,
    /// The Zipf exponent of CI pipelines' popularity (ci, mixed; default
    /// 0.9, no published figure: sweep 0.6 to 1.2).
    #[arg(long, value_name = "ALPHA", conflicts_with = "log")]
    pub zipf_alpha: Option<f64>,
    /// The share of service deployments rolled back within the hour
    /// (service, mixed; default 0.05, no published figure: sweep 0 to 0.1).
    #[arg(long, value_name = "SHARE", conflicts_with = "log")]
    pub rollback: Option<f64>,
    /// The disk's capacity, as a quantity (`20Gi`, `100G`); repeat for
    /// several. Default: a trace file's recorded capacity, else two disks
    /// sized from the trace (see docs/simulate.md).
    #[arg(long, value_name = "SIZE")]
    pub capacity: Vec<String>,
    /// Percent of the disk taken by other data than images (logs,
    /// volumes, the system).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..100))]
    pub other_percent: u8,
    /// Also write the generated trace to this file (JSON lines).
    #[arg(long, value_name = "FILE", conflicts_with = "log")]
    pub write_trace: Option<PathBuf>,
    /// Also draw the bytes pulled again as an SVG chart in this file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

/// One trace's runs.
#[derive(Serialize)]
struct Run {
    /// The workload's name, or the trace file's path.
    workload: String,
    /// The seed and days, for a synthetic workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    days: Option<u64>,
    images: usize,
    container_starts: usize,
    comparisons: Vec<Comparison>,
}

/// `simulate`: every trace asked for, at every disk size.
pub fn simulate(config: &Config, args: &SimulateArgs) -> Result<ExitStatus, CliError> {
    let mut capacities = Vec::with_capacity(args.capacity.len());
    for text in &args.capacity {
        let bytes = parse_quantity(text.trim()).map_err(|e| CliError::Usage(format!("--capacity: {e}")))?;
        if bytes == 0 {
            return Err(CliError::Usage("--capacity: must be more than 0 bytes".into()));
        }
        capacities.push(bytes);
    }
    if args.zipf_alpha.is_some_and(|a| !(0.0..=5.0).contains(&a)) {
        return Err(CliError::Usage("--zipf-alpha: must be within 0..=5".into()));
    }
    if args.rollback.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err(CliError::Usage("--rollback: must be a share within 0..=1".into()));
    }
    let sweep = Sweep {
        zipf_alpha: args.zipf_alpha,
        rollback: args.rollback,
    };
    let mut traces: Vec<(String, Option<Kind>, Trace)> = Vec::new();
    if let Some(path) = &args.log {
        traces.push((path.display().to_string(), None, read_trace(path)?));
    } else {
        let kinds = args.workload.map_or(Kind::ALL.to_vec(), |k| vec![k]);
        for kind in kinds {
            traces.push((
                kind.name().to_string(),
                Some(kind),
                kind.generate_with(args.seed, args.days, sweep),
            ));
        }
        if let Some(path) = &args.write_trace {
            write_traces(path, &traces)?;
        }
    }
    // The replay reads what the daemon's engine reads of the configuration.
    let settings = crate::engine::Settings::from(config);
    let mut runs = Vec::with_capacity(traces.len());
    for (name, kind, trace) in &traces {
        let disks = if !capacities.is_empty() {
            capacities.clone()
        } else if let (None, Some(capacity)) = (kind, trace.capacity) {
            vec![capacity]
        } else {
            reference_disks(trace, &settings, args.other_percent).to_vec()
        };
        let comparisons = disks
            .iter()
            .map(|&capacity| {
                let other = (u128::from(capacity) * u128::from(args.other_percent) / 100) as u64;
                Comparison::run(trace, capacity, other, &settings)
            })
            .collect();
        runs.push(Run {
            workload: name.clone(),
            seed: kind.map(|_| args.seed),
            days: kind.map(|_| args.days),
            images: trace.images.len(),
            container_starts: trace.starts(),
            comparisons,
        });
    }
    if let Some(path) = &args.plot {
        let groups: Vec<(String, &Comparison)> = runs
            .iter()
            .flat_map(|run| {
                run.comparisons
                    .iter()
                    .map(move |c| (format!("{}, {} disk", run.workload, human_bytes(c.capacity_bytes)), c))
            })
            .collect();
        std::fs::write(path, crate::sim::plot::svg(&groups))
            .map_err(|e| CliError::Other(anyhow::anyhow!("--plot: {}: {e}", path.display())))?;
    }
    match args.output {
        Output::Json => out::json(&serde_json::json!({ "runs": runs }))?,
        Output::Table => out::text(&render(&runs, config))?,
    }
    Ok(0)
}

/// A trace file, or a log the daemon recorded with its rotated file
/// (`FILE.1`, read first when there is one).
fn read_trace(path: &Path) -> Result<Trace, CliError> {
    Trace::read_log(path).map_err(|e| CliError::Usage(format!("--log: {e}")))
}

fn write_traces(path: &Path, traces: &[(String, Option<Kind>, Trace)]) -> Result<(), CliError> {
    let failed = |e: std::io::Error| CliError::Other(anyhow::anyhow!("--write-trace: {}: {e}", path.display()));
    let mut file = BufWriter::new(File::create(path).map_err(failed)?);
    for (_, _, trace) in traces {
        trace.write(&mut file).map_err(failed)?;
    }
    file.flush().map_err(failed)
}

fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |p| format!("{p:+.0}%"))
}

fn render(runs: &[Run], config: &Config) -> String {
    let mut text = format!(
        "imagegc: high {}% low {}% min age {}s interval {}s; kubelet: the same thresholds and min age, every 300s; \
         bound: PFOO-L on layers, image bytes up to the high threshold on average\n",
        config.gc.high_threshold_percent,
        config.gc.low_threshold_percent,
        config.gc.min_age.as_secs(),
        config.gc.interval.as_secs(),
    );
    for run in runs {
        let mut title = format!(
            "\n{}: {} images, {} container starts",
            run.workload, run.images, run.container_starts
        );
        if let (Some(seed), Some(days)) = (run.seed, run.days) {
            title.push_str(&format!(", seed {seed}, {days} days"));
        }
        text.push_str(&title);
        text.push('\n');
        let mut table = Table::new([
            "DISK",
            "POLICY",
            "RE-PULLED",
            "VS BOUND",
            "IMAGES",
            "REMOVALS",
            "PASSES",
            "SHORT",
            "PEAK",
            "H>HIGH",
            "H>EVICT",
        ]);
        for c in &run.comparisons {
            let disk = human_bytes(c.capacity_bytes);
            for t in &c.policies {
                table.row([
                    disk.clone(),
                    t.policy.clone(),
                    human_bytes(t.repulled_bytes),
                    percent(over_bound(t.repulled_bytes, c.bound.repulled_bytes)),
                    t.repulled_images.to_string(),
                    t.removals.to_string(),
                    t.space_passes.to_string(),
                    t.passes_short.to_string(),
                    format!("{:.0}%", t.peak_usage_percent),
                    format!("{:.1}", t.hours_above_high),
                    format!("{:.1}", t.hours_above_eviction),
                ]);
            }
            table.row([
                disk,
                "bound".to_string(),
                human_bytes(c.bound.repulled_bytes),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        text.push_str(&table.render());
        if let Some(c) = run.comparisons.first() {
            text.push_str(&format!(
                "first pulls {} (every policy), every layer once {}\n",
                human_bytes(c.policies.first().map_or(0, |t| t.first_pull_bytes)),
                human_bytes(c.unique_bytes)
            ));
        }
    }
    text
}
