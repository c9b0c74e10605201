//! The daemon under test (`imagegc run`) and its JSON log, read as it grows.

use super::*;

/// The daemon's log as it grows, read by the driver to strike while a
/// removal walk is under way.
pub(crate) struct LogTail {
    pub(crate) path: PathBuf,
    pub(crate) lines: Vec<LogLine>,
    pub(crate) partial: String,
    pub(crate) offset: u64,
}

impl LogTail {
    pub(crate) fn new(path: PathBuf) -> Self {
        LogTail {
            path,
            lines: Vec::new(),
            partial: String::new(),
            offset: 0,
        }
    }

    /// Lines read so far.
    pub(crate) fn len(&self) -> usize {
        self.lines.len()
    }

    pub(crate) fn read(&mut self) {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut file) = fs::File::open(&self.path) else {
            return;
        };
        let mut fresh = String::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() || file.read_to_string(&mut fresh).is_err() {
            return;
        }
        self.offset += fresh.len() as u64;
        self.partial.push_str(&fresh);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            self.lines.push(LogLine::parse(line.trim_end()));
        }
    }

    /// The first re-check logged at or after line `from` whose image `pick`
    /// recognises, reading what the daemon wrote since the last call.
    pub(crate) fn next_check<T>(&mut self, from: usize, pick: impl Fn(&str) -> Option<T>) -> Option<T> {
        self.read();
        self.lines[from.min(self.lines.len())..]
            .iter()
            .filter(|l| l.message == CHECK_MESSAGE)
            .find_map(|l| pick(l.image.as_deref()?))
    }
}

/// An `imagegc run` process with its own directory (configuration, state
/// and captured stderr), logging JSON at debug level. Killed if still
/// running when dropped; its directory is kept when the test fails.
pub struct Daemon {
    pub(crate) child: Option<imagegc_testkit::process::Running>,
    pub(crate) dir: Option<tempfile::TempDir>,
}

impl Daemon {
    /// Starts `imagegc run` against `endpoint` with `config` (TOML).
    pub fn start(endpoint: &str, config: &str) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("imagegc-daemon-")
            .tempdir()
            .expect("creating the daemon's directory");
        let config_path = dir.path().join("imagegc.toml");
        fs::write(&config_path, config).expect("writing the daemon's configuration");
        let stderr = fs::File::create(dir.path().join("stderr.log")).expect("creating the daemon's log");
        let child = imagegc_command(
            env!("CARGO_BIN_EXE_imagegc"),
            &config_path,
            endpoint,
            &dir.path().join("state"),
        )
        .arg("run")
        .args(["--log-format", "json", "--log-level", "debug"])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("starting imagegc run: {e}"));
        Daemon {
            child: Some(imagegc_testkit::process::Running::new(child)),
            dir: Some(dir),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the directory is kept until drop").path()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir().join("state")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir().join("stderr.log")
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(imagegc_testkit::process::Running::is_running)
    }

    /// Sends SIGTERM and waits for the exit; panics with the log's tail when
    /// the daemon does not exit within [`EXIT_TIMEOUT`].
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the daemon was started");
        match child.terminate(EXIT_TIMEOUT) {
            Ok((status, _)) => status,
            Err(within) => panic!(
                "imagegc run did not exit within {within:?} of SIGTERM; last lines of its log:\n{}",
                self.log_tail(30)
            ),
        }
    }

    /// The log so far, one entry per line.
    pub fn log(&self) -> Vec<LogLine> {
        fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .map(LogLine::parse)
            .collect()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// `imagegc history --output json` on the daemon's state directory.
    pub fn history(&self) -> Vec<Value> {
        let output = Command::new(env!("CARGO_BIN_EXE_imagegc"))
            .args(["history", "--output", "json", "--state-dir"])
            .arg(self.state_dir())
            .output()
            .expect("running imagegc history");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "imagegc history failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        match serde_json::from_str(&stdout) {
            Ok(Value::Array(entries)) => entries,
            _ => panic!("imagegc history --output json printed no JSON array:\n{stdout}"),
        }
    }

    /// Keeps the directory (log, state, configuration) after the test and
    /// returns where it is.
    pub fn keep(&mut self) -> String {
        match self.dir.take() {
            Some(dir) => dir.keep().display().to_string(),
            None => "(already kept)".to_string(),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Killed first (dropping it), so that the directory kept is not
        // written to any more.
        drop(self.child.take());
        if std::thread::panicking() && self.dir.is_some() {
            eprintln!(
                "imagegc run's directory (configuration, state, log) kept at {}",
                self.keep()
            );
        }
    }
}

/// One line of the daemon's JSON log.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub time: Option<SystemTime>,
    pub level: String,
    pub message: String,
    pub image: Option<String>,
    pub raw: String,
}

impl LogLine {
    pub(crate) fn parse(raw: &str) -> LogLine {
        let json: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        let message = text(json.get("message"))
            .or_else(|| text(json.pointer("/fields/message")))
            .unwrap_or_default();
        let image = text(json.get("image")).or_else(|| text(json.pointer("/fields/image")));
        LogLine {
            time: json
                .get("timestamp")
                .and_then(Value::as_str)
                .and_then(|t| humantime::parse_rfc3339(t).ok()),
            level: text(json.get("level")).unwrap_or_default(),
            message,
            image,
            raw: raw.to_string(),
        }
    }
}
