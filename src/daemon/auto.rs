//! `gc.order = "auto"` in the daemon: every [`choose::EVERY`] the node's
//! usage log (`<state dir>/usage.jsonl`, what `imagegc simulate --log`
//! replays) is judged by [`choose::judge_window`] on a blocking thread of
//! its own, and the order it chooses is put in force from the next cycle
//! and kept in `<state dir>/order.json`, so that a restart goes on with it
//! (and with the time of the judgement: the next is due one
//! [`choose::EVERY`] after it, not at each start).
//!
//! The replay's disk is the log's: the capacity of its first `disk` line,
//! [`OTHER_PERCENT`] of it taken by other data, as `simulate --log` does
//! by default. A node whose records hold more than [`choose::MAX_IMAGES`]
//! images reads a sample of them from the log (see
//! [`Trace::read_log_sampled`]), so what a judgement holds in memory does
//! not grow with the node.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::{Config, Order};
use crate::safe_file::{self, Links};
use crate::sim::choose::{self, Judgement};
use crate::sim::trace::Trace;

/// The file the order in force is kept in, inside the state directory.
pub const FILE_NAME: &str = "order.json";
/// The share of the disk the replay counts as other data than images, in
/// percent (`imagegc simulate --other-percent`'s default).
pub const OTHER_PERCENT: u64 = 10;
/// After a judgement that failed (no usage log yet, a log that cannot be
/// read), the next try.
const RETRY: Duration = Duration::from_secs(3600);
/// The largest `order.json` read: a judgement is a few hundred bytes.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// A judgement and when it was made: what `order.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    /// When, in seconds since the Unix epoch.
    pub at: u64,
    /// The judgement.
    #[serde(flatten)]
    pub judgement: Judgement,
}

/// Reads `order.json` from `state_dir`: `None` when there is none (a new
/// node, an order never judged); an error names the file.
pub fn load(state_dir: &Path) -> Result<Option<Saved>, String> {
    let path = state_dir.join(FILE_NAME);
    match safe_file::read_bounded(&path, Links::Refuse, MAX_FILE_BYTES) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes `saved` to `order.json` in `state_dir`, whole or not at all.
pub fn save(state_dir: &Path, saved: &Saved) -> io::Result<()> {
    let bytes = serde_json::to_vec(saved).map_err(io::Error::other)?;
    safe_file::replace(&state_dir.join(FILE_NAME), &bytes, true)
}

/// Judges the usage log of `state_dir` now, from `current`, for a node of
/// about `images` images.
pub fn judge(state_dir: &Path, config: &Config, current: Order, images: usize) -> Result<Judgement, String> {
    let path = state_dir.join(crate::usage_log::FILE_NAME);
    let rate = if images > choose::MAX_IMAGES {
        choose::MAX_IMAGES as f64 / images as f64
    } else {
        1.0
    };
    let trace = Trace::read_log_sampled(&path, rate).map_err(|e| e.to_string())?;
    let Some(capacity) = trace.capacity else {
        return Err(format!("{}: no disk line yet", path.display()));
    };
    // The capacity of the whole disk: the sample's share is taken by
    // judge_window's own scaling.
    let capacity = (capacity as f64 / rate) as u64;
    let other = capacity / 100 * OTHER_PERCENT;
    Ok(choose::judge_sampled(
        &trace,
        trace.duration(),
        capacity,
        other,
        &crate::engine::Settings::from(config),
        current,
        rate,
    ))
}

/// The daemon's side of `auto`: the judgement in force, when the next is
/// due, and the one running.
pub struct Auto {
    state_dir: PathBuf,
    saved: Option<Saved>,
    due: Instant,
    running: Option<JoinHandle<Result<Judgement, String>>>,
}

impl Auto {
    /// From what `state_dir` keeps (a file that cannot be read is said and
    /// taken as none): the next judgement one [`choose::EVERY`] after the
    /// last, or after this start.
    pub fn start(state_dir: &Path, now: SystemTime) -> Self {
        let saved = load(state_dir).unwrap_or_else(|e| {
            tracing::warn!("{e}: gc.order = \"auto\" starts from {}", Order::PRIOR.as_str());
            None
        });
        let every = Duration::from_secs(choose::EVERY);
        let wait = saved.as_ref().map_or(every, |s| {
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(s.at);
            every.saturating_sub(now.duration_since(at).unwrap_or_default())
        });
        Auto {
            state_dir: state_dir.to_path_buf(),
            saved,
            due: Instant::now() + wait,
            running: None,
        }
    }

    /// The order chosen, when one was.
    pub fn order(&self) -> Option<Order> {
        self.saved.as_ref().map(|s| s.judgement.order)
    }

    /// The last judgement, when there was one.
    pub fn saved(&self) -> Option<&Saved> {
        self.saved.as_ref()
    }

    /// When the next judgement is due (`None` while one runs).
    pub fn due(&self) -> Option<Instant> {
        self.running.is_none().then_some(self.due)
    }

    /// Starts a judgement on a blocking thread.
    pub fn begin(&mut self, config: &Config, images: usize) {
        let (dir, config) = (self.state_dir.clone(), config.clone());
        let current = self.order().unwrap_or(Order::PRIOR);
        self.running = Some(tokio::task::spawn_blocking(move || {
            judge(&dir, &config, current, images)
        }));
    }

    /// The running judgement's end: the new judgement, saved (a failure to
    /// save is said, and the judgement holds until a restart), or why there
    /// is none (the next try in an hour). Pending for ever while none runs.
    pub async fn finished(&mut self, now: SystemTime) -> Result<&Saved, String> {
        let Some(running) = self.running.as_mut() else {
            return std::future::pending().await;
        };
        let result = running.await;
        self.running = None;
        let judgement = match result {
            Ok(Ok(judgement)) => judgement,
            Ok(Err(e)) => {
                self.due = Instant::now() + RETRY;
                return Err(e);
            }
            Err(e) => {
                self.due = Instant::now() + RETRY;
                return Err(format!("the judgement stopped: {e}"));
            }
        };
        self.due = Instant::now() + Duration::from_secs(choose::EVERY);
        let saved = Saved {
            at: now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs(),
            judgement,
        };
        if let Err(e) = save(&self.state_dir, &saved) {
            tracing::warn!(
                "{}: {e}: the order chosen is in force, but a restart goes back to the one before",
                self.state_dir.join(FILE_NAME).display()
            );
        }
        Ok(self.saved.insert(saved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::workload::Kind;

    /// A usage log of three days of a preview-environment node on a disk
    /// of `capacity` bytes, as the daemon records one.
    fn write_log(dir: &Path, capacity: u64) {
        let trace = Kind::Preview.generate(3, 3);
        let mut bytes = format!("{{\"at\":0,\"ev\":\"disk\",\"capacity\":{capacity},\"used\":0}}\n").into_bytes();
        trace.write(&mut bytes).unwrap();
        std::fs::write(dir.join(crate::usage_log::FILE_NAME), bytes).unwrap();
    }

    #[tokio::test]
    async fn what_auto_judged_survives_a_restart_and_the_next_judgement_stays_a_day_after_it() {
        let dir = tempfile::tempdir().unwrap();
        write_log(dir.path(), 30_000_000_000);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut auto = Auto::start(dir.path(), now);
        assert_eq!(auto.order(), None, "a new node: nothing judged");
        let every = Duration::from_secs(choose::EVERY);
        assert!(auto.due().unwrap() > Instant::now() + every - Duration::from_secs(60));

        auto.begin(&Config::default(), 100);
        assert_eq!(auto.due(), None, "one judgement at a time");
        let saved = auto.finished(now).await.unwrap().clone();
        assert_eq!(saved.judgement.figures.len(), Order::FIXED.len());
        assert!(
            saved.judgement.figures.iter().any(|f| f.repulled_bytes > 0),
            "{saved:?}"
        );
        assert_eq!(
            saved.judgement.order,
            choose::choose(Order::PRIOR, &saved.judgement.figures)
        );

        // A restart half a day later: the same order and figures, the next
        // judgement half a day on.
        let later = now + every / 2;
        let restarted = Auto::start(dir.path(), later);
        assert_eq!(restarted.saved(), Some(&saved));
        let due = restarted.due().unwrap();
        assert!(due < Instant::now() + every / 2 + Duration::from_secs(60));
        assert!(due > Instant::now() + every / 2 - Duration::from_secs(60));
        // Two days later: due at once.
        let restarted = Auto::start(dir.path(), now + every * 2);
        assert!(restarted.due().unwrap() <= Instant::now() + Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_missing_or_damaged_log_or_file_keeps_the_order_in_force_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut auto = Auto::start(dir.path(), now);
        auto.begin(&Config::default(), 100);
        let err = auto.finished(now).await.unwrap_err();
        assert!(err.contains("usage.jsonl"), "{err}");
        assert_eq!(auto.order(), None);
        assert!(
            auto.due().unwrap() > Instant::now() + RETRY - Duration::from_secs(60),
            "tried again in an hour"
        );

        std::fs::write(dir.path().join(FILE_NAME), b"{\"at\":1,\"order\":\"auto\"").unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(err.contains(FILE_NAME), "{err}");
        assert_eq!(Auto::start(dir.path(), now).order(), None, "taken as none");
        std::fs::write(
            dir.path().join(FILE_NAME),
            b"{\"at\":1,\"order\":\"lru\",\"figures\":[],\"window_secs\":5,\"sampled\":1.0}",
        )
        .unwrap();
        assert_eq!(Auto::start(dir.path(), now).order(), Some(Order::Lru));
    }

    #[test]
    fn a_big_node_judges_a_sample_at_a_disk_scaled_alike() {
        let dir = tempfile::tempdir().unwrap();
        write_log(dir.path(), 30_000_000_000);
        let whole = judge(dir.path(), &Config::default(), Order::PRIOR, 100).unwrap();
        assert_eq!(whole.sampled, 1.0);
        let sample = judge(dir.path(), &Config::default(), Order::PRIOR, choose::MAX_IMAGES * 4).unwrap();
        assert_eq!(sample.sampled, 0.25);
        assert_eq!(sample.figures.len(), whole.figures.len());
    }
}
