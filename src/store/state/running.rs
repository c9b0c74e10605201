//! `<state dir>/running.json`: what the running `imagegc run` read at start
//! for the keys that only a restart changes, so that `check-config` can say
//! which of a file's changes a reload (SIGHUP) will not apply. Written once
//! the state directory is locked, removed at a clean exit; one left by a
//! process that no longer runs is ignored.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::safe_file::{self, Links};

/// The file's name inside the state directory.
pub const FILE_NAME: &str = "running.json";
/// A larger file is not one imagegc wrote.
const MAX_BYTES: u64 = 64 * 1024;

/// The keys that apply only at start, as a process read them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartOnly {
    /// `runtime.endpoint` (the client is made for it).
    pub runtime_endpoint: Option<String>,
    /// `state.dir` (its lock is held and its records loaded).
    pub state_dir: PathBuf,
    /// `metrics.listen` (the listener is bound).
    pub metrics_listen: Option<String>,
    /// The `[kubernetes]` section (the client, the watch and the event
    /// poster are made for it), as a line of its effective keys. Absent from
    /// files written before it was noted.
    #[serde(default)]
    pub kubernetes: String,
    /// `state.usage_log` (the log's writer is started for it). Absent from
    /// files written before it was noted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_log: Option<bool>,
}

impl StartOnly {
    /// The start-only keys of `config`.
    pub fn of(config: &Config) -> Self {
        StartOnly {
            runtime_endpoint: config.runtime.endpoint.clone(),
            state_dir: config.state.dir.clone(),
            metrics_listen: config.metrics.listen.map(|a| a.to_string()),
            kubernetes: format!("{:?}", config.kubernetes),
            usage_log: Some(config.state.usage_log),
        }
    }

    /// The keys whose value in `new` differs from this one's: what only a
    /// restart applies.
    pub fn restart_keys(&self, new: &StartOnly) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if new.runtime_endpoint != self.runtime_endpoint {
            keys.push("runtime.endpoint");
        }
        if new.state_dir != self.state_dir {
            keys.push("state.dir");
        }
        if new.metrics_listen != self.metrics_listen {
            keys.push("metrics.listen");
        }
        if !self.kubernetes.is_empty() && new.kubernetes != self.kubernetes {
            keys.push("kubernetes");
        }
        if self.usage_log.is_some() && new.usage_log != self.usage_log {
            keys.push("state.usage_log");
        }
        keys
    }
}

/// The running process and what it read at start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    /// Its pid.
    pub pid: u32,
    /// Its start-only keys.
    #[serde(flatten)]
    pub keys: StartOnly,
}

impl Running {
    /// Notes this process as the one running on `config`'s state directory
    /// (best effort: a failure is logged).
    pub fn write(config: &Config) {
        let running = Running {
            pid: std::process::id(),
            keys: StartOnly::of(config),
        };
        let path = config.state.dir.join(FILE_NAME);
        let written = serde_json::to_vec(&running)
            .map_err(std::io::Error::other)
            .and_then(|bytes| safe_file::replace(&path, &bytes, false));
        if let Err(err) = written {
            tracing::warn!(path = %path.display(), error = %err, "could not note the running configuration");
        }
    }

    /// Forgets this process's note (at a clean exit).
    pub fn remove(state_dir: &Path) {
        let _ = std::fs::remove_file(state_dir.join(FILE_NAME));
    }

    /// The process running on `state_dir`, when one noted itself and still
    /// runs.
    pub fn read(state_dir: &Path) -> Option<Running> {
        let bytes = safe_file::read_bounded(&state_dir.join(FILE_NAME), Links::Refuse, MAX_BYTES).ok()?;
        let running: Running = serde_json::from_slice(&bytes).ok()?;
        alive(running.pid).then_some(running)
    }
}

/// Whether a process with this pid runs (in this pid namespace).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_is_read_back_and_a_gone_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.state.dir = dir.path().to_path_buf();
        Running::write(&config);
        let running = Running::read(dir.path()).expect("this process runs");
        assert_eq!(running.pid, std::process::id());
        let mut changed = config.clone();
        changed.runtime.endpoint = Some("unix:///run/crio/crio.sock".to_string());
        changed.metrics.listen = None;
        assert_eq!(
            running.keys.restart_keys(&StartOnly::of(&changed)),
            ["runtime.endpoint", "metrics.listen"]
        );
        std::fs::write(
            dir.path().join(FILE_NAME),
            br#"{"pid":999999999,"runtime_endpoint":null,"state_dir":"/x","metrics_listen":null}"#,
        )
        .unwrap();
        assert_eq!(Running::read(dir.path()), None, "no such process");
        Running::remove(dir.path());
        assert_eq!(Running::read(dir.path()), None);
    }
}
