//! The state file and its directory going wrong, with the real `imagegc`
//! binary against the fake runtime: a corrupt file is set aside with a
//! warning and believed in nothing (no age removal from its history) while
//! space collection goes on; a missing directory is created 0700; a full or
//! read-only state filesystem costs a warning, never the previous file and
//! never the collection.
//!
//! The image filesystem is a real 1 MiB tmpfs holding one file per image,
//! deleted when the fake runtime removes the image, so imagegc's statvfs
//! sees removals free space exactly as on a node.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use imagegc::cri::Image;
use imagegc::cri::fake::FakeRuntime;
use imagegc::state::{self, StateStore};

use crate::support::{self, ServedOnThread, Tmpfs, container_using, describe, image, imagegc};

const KIB: u64 = 1024;
/// The images a node has: four unused of 200 KiB and one in use of 100 KiB,
/// 88% of the 1 MiB image filesystem. High 50, low 35: three removals reach it.
const UNUSED: [&str; 4] = ["u1", "u2", "u3", "u4"];
const IN_USE: &str = "app";
const TEN_DAYS: Duration = Duration::from_secs(10 * 86_400);

/// A node: the fake runtime served, its image filesystem, a state directory
/// and a configuration file (max age 1m, high 50, low 35, min age 0).
struct Node {
    fake: FakeRuntime,
    served: ServedOnThread,
    _imagefs: Tmpfs,
    state_dir: PathBuf,
    config: PathBuf,
    /// Last: fields drop in order, and the tmpfs must be unmounted before
    /// the directory holding its mount point is removed.
    _dir: tempfile::TempDir,
}

impl Node {
    fn start() -> Node {
        Self::start_with_state_dir(None)
    }

    fn start_with_state_dir(state_dir: Option<PathBuf>) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let imagefs = Tmpfs::mount(&dir.path().join("imagefs"), 1024 * KIB);
        let fake = FakeRuntime::new();
        for (name, size) in UNUSED.iter().map(|n| (*n, 200 * KIB)).chain([(IN_USE, 100 * KIB)]) {
            let image = image(name, size);
            fs::write(layer_file(imagefs.path(), &image), vec![1u8; size as usize]).unwrap();
            fake.add_image(image);
        }
        fake.add_container(container_using("app-1", &image(IN_USE, 0)));
        let root = imagefs.path().to_path_buf();
        fake.on_remove(Some(Arc::new(move |image: &Image| {
            let _ = fs::remove_file(layer_file(&root, image));
        })));
        let served = ServedOnThread::start(fake.clone());
        let state_dir = state_dir.unwrap_or_else(|| dir.path().join("state"));
        let config = dir.path().join("imagegc.toml");
        fs::write(
            &config,
            format!(
                "[runtime]\ntimeout = \"20s\"\n\n[gc]\ninterval = \"1s\"\nusage_poll_interval = \"1s\"\n\
                 high_threshold_percent = 50\nlow_threshold_percent = 35\nmin_age = \"0s\"\nmax_age = \"1m\"\n\
                 image_fs_path = {:?}\n\n[metrics]\nlisten = \"\"\n",
                imagefs.path().display().to_string()
            ),
        )
        .unwrap();
        Node {
            fake,
            served,
            _imagefs: imagefs,
            state_dir,
            config,
            _dir: dir,
        }
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut command = imagegc(&self.config, &self.served.endpoint, &self.state_dir);
        command.args(args);
        command
    }

    /// `imagegc once --output json`.
    fn once(&self) -> Output {
        support::run(&mut self.command(&["once", "--output", "json"]))
    }

    fn state_file(&self) -> PathBuf {
        self.state_dir.join(state::FILE_NAME)
    }

    /// The state file a previous imagegc would have written: every image
    /// first seen and last used ten days ago, saved just now.
    fn old_history(&self) -> Vec<u8> {
        let now = SystemTime::now();
        let long_ago = now - TEN_DAYS;
        let entries = UNUSED
            .iter()
            .chain([&IN_USE])
            .map(|name| support::history(&image(name, 200 * KIB), long_ago, long_ago));
        state::encode(&support::records(entries), now)
    }

    fn write_state(&self, bytes: &[u8]) {
        fs::create_dir_all(&self.state_dir).unwrap();
        fs::write(self.state_file(), bytes).unwrap();
    }

    fn set_aside_files(&self) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(&self.state_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("records.state.corrupt-")
            })
            .collect();
        found.sort();
        found
    }

    fn temporary_files(&self) -> Vec<PathBuf> {
        fs::read_dir(&self.state_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().contains(".tmp"))
            .collect()
    }
}

fn layer_file(root: &Path, image: &Image) -> PathBuf {
    root.join(image.id.trim_start_matches("sha256:"))
}

/// The removals a `once --output json` reports: (image name, reason).
fn removals(output: &Output) -> Vec<(String, String)> {
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not the JSON report ({e}):\n{}", describe(output)));
    json["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let id = r["id"].as_str().unwrap();
            let name = UNUSED
                .iter()
                .chain([&IN_USE])
                .find(|n| image(n, 0).id == id)
                .map_or(id.to_string(), |n| n.to_string());
            (name, r["reason"].as_str().unwrap().to_string())
        })
        .collect()
}

fn space_removals_of(names: &[&str]) -> Vec<(String, String)> {
    names.iter().map(|n| (n.to_string(), "space".to_string())).collect()
}

/// Corrupts the header of a valid state file: `edit` gets the header line.
fn with_header(valid: &[u8], edit: impl Fn(&str) -> String) -> Vec<u8> {
    let newline = valid.iter().position(|&b| b == b'\n').unwrap();
    let header = std::str::from_utf8(&valid[..newline]).unwrap();
    let mut out = edit(header).into_bytes();
    out.extend_from_slice(&valid[newline..]);
    out
}

#[test]
fn a_valid_history_is_believed_which_is_what_makes_the_corruption_cases_meaningful() {
    let node = Node::start();
    node.write_state(&node.old_history());
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let age: Vec<(String, String)> = UNUSED.iter().map(|n| (n.to_string(), "age".to_string())).collect();
    assert_eq!(removals(&output), age, "{}", describe(&output));
    assert!(node.set_aside_files().is_empty());
}

#[test]
fn a_corrupt_state_file_is_set_aside_and_believed_in_nothing_while_space_collection_goes_on() {
    enum Fault {
        Bytes(fn(&[u8]) -> Vec<u8>),
        /// A directory where the file should be: reading it fails with EISDIR.
        Directory,
    }
    let cases: [(&str, Fault); 8] = [
        ("truncated", Fault::Bytes(|valid| valid[..valid.len() / 2].to_vec())),
        ("zero-length", Fault::Bytes(|_| Vec::new())),
        (
            "garbage",
            Fault::Bytes(|_| b"\x7fELF\x02\x01\x01\x00 not a state file\n\xff\xfe\x00{}".to_vec()),
        ),
        (
            "wrong version",
            Fault::Bytes(|valid| with_header(valid, |h| h.replacen(" v2 ", " v3 ", 1))),
        ),
        (
            "checksum mismatch, payload intact",
            Fault::Bytes(|valid| {
                with_header(valid, |h| {
                    let (head, crc) = h.split_once("crc32=").unwrap();
                    let wrong = if crc.starts_with("00000000") {
                        "00000001"
                    } else {
                        "00000000"
                    };
                    format!("{head}crc32={wrong}{}", &crc[8..])
                })
            }),
        ),
        (
            "payload altered under a valid header",
            Fault::Bytes(|valid| {
                // The first record's first-seen time, ten days ago, becomes a
                // different, still plausible, time.
                let at = valid.windows(3).position(|w| w == b"\",1").unwrap() + 2;
                let mut altered = valid.to_vec();
                altered[at] = if altered[at] == b'1' { b'2' } else { b'1' };
                altered
            }),
        ),
        (
            "a valid checksum over a payload that is not a state",
            Fault::Bytes(|_| {
                let body = br#"{"saved_at":"yesterday","records":[]}"#;
                let mut out = format!(
                    "imagegc-state v1 crc32={:08x} len={}\n",
                    crc32fast::hash(body),
                    body.len()
                )
                .into_bytes();
                out.extend_from_slice(body);
                out
            }),
        ),
        ("a directory in its place", Fault::Directory),
    ];
    for (name, fault) in cases {
        let node = Node::start();
        let valid = node.old_history();
        let planted = match fault {
            Fault::Bytes(corrupt) => {
                let bytes = corrupt(&valid);
                assert!(state::verify(&bytes).is_err(), "{name}: the case is not corrupt");
                node.write_state(&bytes);
                Some(bytes)
            }
            Fault::Directory => {
                fs::create_dir_all(node.state_file()).unwrap();
                fs::write(node.state_file().join("inside"), b"x").unwrap();
                None
            }
        };

        let output = node.once();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{name}: {}", describe(&output));
        assert!(stderr.contains("WARN"), "{name}: {}", describe(&output));
        assert!(
            stderr.contains("state file is corrupt"),
            "{name}: {}",
            describe(&output)
        );
        // Nothing was removed by age on the strength of the corrupt history,
        // and the space pass freed the disk to the low threshold.
        assert_eq!(
            removals(&output),
            space_removals_of(&["u1", "u2", "u3"]),
            "{name}: {}",
            describe(&output)
        );
        assert!(!node.fake.removed().contains(&image(IN_USE, 0).id));

        let aside = node.set_aside_files();
        assert_eq!(aside.len(), 1, "{name}: set aside once: {aside:?}");
        match planted {
            Some(bytes) => assert_eq!(fs::read(&aside[0]).unwrap(), bytes, "{name}: kept as it was"),
            None => assert!(
                aside[0].join("inside").exists(),
                "{name}: the directory was moved whole"
            ),
        }
        // A fresh, valid state replaced it: the two images left.
        let saved = fs::read(node.state_file()).unwrap();
        assert_eq!(state::verify(&saved), Ok(2), "{name}");
    }
}

#[test]
fn an_unreadable_mode_does_not_stop_root_which_reads_the_file_as_valid() {
    // chmod 000 cannot make the file unreadable to root (CAP_DAC_OVERRIDE);
    // imagegc runs as root on a node, so this is the behaviour there.
    let node = Node::start();
    node.write_state(&node.old_history());
    fs::set_permissions(node.state_file(), fs::Permissions::from_mode(0o000)).unwrap();
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(removals(&output).len(), UNUSED.len(), "{}", describe(&output));
    assert!(removals(&output).iter().all(|(_, reason)| reason == "age"));
    assert!(node.set_aside_files().is_empty());
}

#[test]
fn a_missing_state_directory_is_created_private() {
    let parent = tempfile::tempdir().unwrap();
    let state_dir = parent.path().join("var/lib/imagegc");
    let node = Node::start_with_state_dir(Some(state_dir.clone()));
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(removals(&output), space_removals_of(&["u1", "u2", "u3"]));
    let mode = fs::metadata(&state_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "state directory mode {mode:o}");
    let file_mode = fs::metadata(node.state_file()).unwrap().permissions().mode() & 0o777;
    assert_eq!(file_mode, 0o600, "state file mode {file_mode:o}");
    assert_eq!(state::verify(&fs::read(node.state_file()).unwrap()), Ok(2));
}

#[test]
fn a_full_state_filesystem_costs_a_warning_not_the_previous_state_nor_the_collection() {
    let node = Node::start();
    let state_fs = Tmpfs::mount(&node.state_dir, 64 * KIB);
    // A first run while every image is in use: nothing removed, a state saved.
    let images = node.fake.images();
    for (n, image) in images.iter().enumerate() {
        node.fake.add_container(container_using(&format!("hold-{n}"), image));
    }
    let output = node.once();
    // Exit 3: above the high threshold with nothing removable.
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(removals(&output).is_empty());
    let previous = fs::read(node.state_file()).unwrap();
    assert_eq!(state::verify(&previous), Ok(5));

    // The state filesystem fills up; the images are released.
    let filler = state_fs.fill();
    for n in 0..images.len() {
        node.fake.remove_container(&format!("hold-{n}"));
    }
    let output = node.once();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(stderr.contains("could not save state"), "{}", describe(&output));
    assert!(
        stderr.contains("could not write the removal journal"),
        "{}",
        describe(&output)
    );
    // Collection went on: the disk that matters here is the image disk.
    assert_eq!(removals(&output), space_removals_of(&["u1", "u2", "u3"]));
    // The previous state is intact, byte for byte, and no temporary file is left.
    assert_eq!(fs::read(node.state_file()).unwrap(), previous);
    assert!(node.temporary_files().is_empty(), "{:?}", node.temporary_files());

    // Room again: the next run saves.
    fs::remove_file(filler).unwrap();
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(!String::from_utf8_lossy(&output.stderr).contains("could not save state"));
    // The two images left, and the three removed while neither the state nor
    // the journal could be written: this process only sees them unlisted,
    // so it keeps their history for the grace (records::VANISHED_GRACE).
    assert_eq!(state::verify(&fs::read(node.state_file()).unwrap()), Ok(5));
    drop(state_fs);
}

#[test]
fn a_read_only_state_filesystem_costs_a_warning_per_save_and_the_daemon_keeps_running() {
    let node = Node::start();
    let state_fs = Tmpfs::mount(&node.state_dir, 64 * KIB);
    let store = StateStore::new(&node.state_dir);
    // The previous run's state: the images as seen a minute ago.
    let minute_ago = SystemTime::now() - Duration::from_secs(60);
    let entries = UNUSED
        .iter()
        .chain([&IN_USE])
        .map(|name| support::history(&image(name, 200 * KIB), minute_ago, minute_ago));
    store.save(&support::records(entries), minute_ago).unwrap();
    let previous = fs::read(node.state_file()).unwrap();
    state_fs.remount_read_only();

    // `run`: a cycle at once, then one per second; stopped by SIGTERM.
    let mut child = node
        .command(&["run"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(child.try_wait().unwrap().is_none(), "the daemon exited on its own");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let output = wait_with_deadline(child);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let warnings = stderr.matches("could not save state").count();
    // At least the first cycle's save, a later cycle's, and the one at shutdown.
    assert!(warnings >= 3, "{warnings} save warnings:\n{}", describe(&output));
    assert!(stderr.contains("Read-only file system"), "{}", describe(&output));
    assert!(stderr.contains("stopped"), "{}", describe(&output));
    // It collected all the same, and the previous state is untouched.
    assert_eq!(
        node.fake.removed(),
        ["u1", "u2", "u3"].map(|n| image(n, 0).id),
        "{}",
        describe(&output)
    );
    assert_eq!(fs::read(node.state_file()).unwrap(), previous);
}

fn wait_with_deadline(mut child: std::process::Child) -> Output {
    let deadline = std::time::Instant::now() + support::PATIENCE;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the daemon did not stop within {:?}", support::PATIENCE);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
