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
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use imagegc::cri::Image;
use imagegc::store::state::{self, StateStore};
use imagegc_testkit::fake::FakeRuntime;

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

    /// A runtime timeout (60 s) longer than the daemon's shutdown grace.
    fn slow_runtime_timeout(&self) {
        let text = fs::read_to_string(&self.config).unwrap();
        fs::write(&self.config, text.replace("timeout = \"20s\"", "timeout = \"60s\"")).unwrap();
    }

    /// A runtime timeout (1 s) that a hung removal outlasts.
    fn short_runtime_timeout(&self) {
        let text = fs::read_to_string(&self.config).unwrap();
        fs::write(&self.config, text.replace("timeout = \"20s\"", "timeout = \"1s\"")).unwrap();
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
                .map_or(id.to_string(), ToString::to_string);
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
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
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
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
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
            // A version no imagegc wrote yet.
            Fault::Bytes(|valid| {
                with_header(valid, |h| {
                    let mut fields: Vec<&str> = h.split(' ').collect();
                    fields[1] = "v999";
                    fields.join(" ")
                })
            }),
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
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
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
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
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
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
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
    // The two images left. The three removed while neither the state nor
    // the journal (nor their pending notes) could be written are found gone
    // by this process (unlisted, and ImageStatus does not find them) with
    // nothing on disk saying imagegc removed them: their records go, as an
    // image someone else removed does (engine::others).
    assert_eq!(state::verify(&fs::read(node.state_file()).unwrap()), Ok(2));
    drop(state_fs);
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
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

// ---------------------------------------------------------------------------
// Special files, a shared or unsafe state directory, the journal, shutdown
// during a removal.

/// The child may use this much address space: a reader that reads a
/// device or a huge file whole fails here rather than taking the machine.
const MEMORY_LIMIT: u64 = 512 << 20;

/// Runs `command` under [`MEMORY_LIMIT`] (`RLIMIT_AS`).
fn run_limited(command: &mut std::process::Command) -> Output {
    use std::os::unix::process::CommandExt;
    command.env("MALLOC_ARENA_MAX", "2");
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: MEMORY_LIMIT,
                rlim_max: MEMORY_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    support::run(command)
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

/// A character device like /dev/zero (1:5), made where the test says.
fn mknod_zero(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 5)) };
    assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `imagegc history --output json`: the images it lists, oldest first.
fn history_images(node: &Node) -> Vec<serde_json::Value> {
    let output = run_limited(&mut node.command(&["history", "--output", "json"]));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    json.as_array().unwrap().clone()
}

fn journaled_ids(entries: &[serde_json::Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e["image"].as_str().unwrap().to_string())
        .collect()
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_journal_that_is_a_fifo_a_device_or_a_link_is_refused_by_history_without_blocking() {
    type Plant = fn(&Path, &Path);
    let cases: [(&str, Plant, &str); 4] = [
        ("a FIFO", |journal, _| mkfifo(journal), "FIFO"),
        ("a device", |journal, _| mknod_zero(journal), "character device"),
        (
            "a link to /dev/zero",
            |journal, _| std::os::unix::fs::symlink("/dev/zero", journal).unwrap(),
            "symbolic link",
        ),
        (
            "a link to a file elsewhere",
            |journal, elsewhere| {
                fs::write(elsewhere, b"{}\n").unwrap();
                std::os::unix::fs::symlink(elsewhere, journal).unwrap();
            },
            "symbolic link",
        ),
    ];
    for (name, plant, says) in cases {
        let node = Node::start();
        fs::create_dir_all(&node.state_dir).unwrap();
        let journal = node.state_dir.join("removals.jsonl");
        plant(&journal, &node._dir.path().join("elsewhere"));
        let output = run_limited(&mut node.command(&["history"]));
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(1), "{name}: {}", describe(&output));
        assert!(
            stderr.contains(&journal.display().to_string()),
            "{name}: {}",
            describe(&output)
        );
        assert!(stderr.contains(says), "{name}: {}", describe(&output));
    }
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_state_file_that_is_a_fifo_blocks_neither_plan_nor_once() {
    let node = Node::start();
    fs::create_dir_all(&node.state_dir).unwrap();
    mkfifo(&node.state_file());

    let output = run_limited(&mut node.command(&["plan"]));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(stderr_of(&output).contains("FIFO"), "{}", describe(&output));
    assert!(fs::symlink_metadata(node.state_file()).unwrap().file_type().is_fifo());
    assert!(node.set_aside_files().is_empty(), "plan writes nothing");

    let output = run_limited(&mut node.command(&["once", "--output", "json"]));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(
        stderr_of(&output).contains("state file is corrupt"),
        "{}",
        describe(&output)
    );
    assert_eq!(removals(&output), space_removals_of(&["u1", "u2", "u3"]));
    assert_eq!(node.set_aside_files().len(), 1);
    assert_eq!(state::verify(&fs::read(node.state_file()).unwrap()), Ok(2));
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_2_gib_state_file_is_refused_from_its_size_without_being_read() {
    let node = Node::start();
    fs::create_dir_all(&node.state_dir).unwrap();
    // Sparse: no disk, but 2 GiB of memory for a reader that reads first.
    fs::File::create(node.state_file()).unwrap().set_len(2 << 30).unwrap();
    let output = run_limited(&mut node.command(&["once", "--output", "json"]));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let stderr = stderr_of(&output);
    assert!(stderr.contains("state file is corrupt"), "{}", describe(&output));
    assert!(stderr.contains("2147483648 bytes"), "{}", describe(&output));
    assert_eq!(removals(&output), space_removals_of(&["u1", "u2", "u3"]));
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_config_file_that_is_a_fifo_or_a_device_is_a_clear_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("imagegc.toml");
    mkfifo(&fifo);
    let device = dir.path().join("zero.toml");
    mknod_zero(&device);
    for (config, says) in [
        (fifo.as_path(), "FIFO"),
        (device.as_path(), "character device"),
        (Path::new("/dev/zero"), "character device"),
    ] {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_imagegc"));
        command.arg("--config").arg(config).arg("check-config");
        let output = run_limited(&mut command);
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
        assert!(stderr.contains(&config.display().to_string()), "{}", describe(&output));
        assert!(stderr.contains(says), "{}", describe(&output));
    }
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_second_imagegc_on_the_same_state_directory_is_refused_while_plan_still_reads() {
    let node = Node::start();
    let mut daemon = node
        .command(&["run"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first cycle has run once its removals are done and the state saved.
    let deadline = std::time::Instant::now() + support::PATIENCE;
    while node.fake.removed().len() < 3 || !node.state_file().exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon's first cycle did not end"
        );
        assert!(daemon.try_wait().unwrap().is_none(), "the daemon exited");
        std::thread::sleep(Duration::from_millis(20));
    }

    for command in [&["once"][..], &["run"]] {
        let output = support::run(&mut node.command(command));
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(4), "{command:?}: {}", describe(&output));
        assert!(
            stderr.contains(&node.state_dir.display().to_string()),
            "{}",
            describe(&output)
        );
        assert!(stderr.contains("another imagegc"), "{stderr}");
    }
    // `plan` takes no lock: it reads the state the daemon keeps.
    let plan = support::run(&mut node.command(&["plan"]));
    assert_eq!(plan.status.code(), Some(0), "{}", describe(&plan));
    assert!(!stderr_of(&plan).contains("corrupt"), "{}", describe(&plan));
    assert!(node.set_aside_files().is_empty());

    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let output = wait_with_deadline(daemon);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(state::verify(&fs::read(node.state_file()).unwrap()), Ok(2));
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn plan_leaves_a_corrupt_state_file_where_it_is() {
    let node = Node::start();
    let valid = node.old_history();
    let torn = valid[..valid.len() / 2].to_vec();
    node.write_state(&torn);
    let output = support::run(&mut node.command(&["plan"]));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(
        stderr_of(&output).contains("state file is corrupt"),
        "{}",
        describe(&output)
    );
    assert_eq!(fs::read(node.state_file()).unwrap(), torn, "left as it was");
    assert!(node.set_aside_files().is_empty());
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_symlinked_state_directory_root_owns_is_followed_and_history_is_kept() {
    let parent = tempfile::tempdir().unwrap();
    let real = parent.path().join("real");
    fs::create_dir(&real).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
    let link = parent.path().join("state");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let node = Node::start_with_state_dir(Some(link.clone()));
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(
        !stderr_of(&output).contains("could not save state"),
        "{}",
        describe(&output)
    );
    assert_eq!(removals(&output), space_removals_of(&["u1", "u2", "u3"]));
    // Saved through the link, into the directory it names.
    assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(state::verify(&fs::read(real.join(state::FILE_NAME)).unwrap()), Ok(2));
    assert_eq!(history_images(&node).len(), 3);
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_state_directory_others_can_write_or_own_is_refused_naming_the_fix() {
    use std::os::unix::fs::chown;
    type Make = fn(&Path);
    let cases: [(&str, Make); 4] = [
        ("world-writable", |dir| {
            fs::create_dir(dir).unwrap();
            fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).unwrap();
        }),
        ("group-writable", |dir| {
            fs::create_dir(dir).unwrap();
            fs::set_permissions(dir, fs::Permissions::from_mode(0o770)).unwrap();
        }),
        ("owned by another user", |dir| {
            fs::create_dir(dir).unwrap();
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).unwrap();
            chown(dir, Some(1000), Some(1000)).unwrap();
        }),
        ("a link to a world-writable directory", |dir| {
            let target = dir.with_file_name("shared");
            fs::create_dir(&target).unwrap();
            fs::set_permissions(&target, fs::Permissions::from_mode(0o777)).unwrap();
            std::os::unix::fs::symlink(&target, dir).unwrap();
        }),
    ];
    for (name, make) in cases {
        let parent = tempfile::tempdir().unwrap();
        let state_dir = parent.path().join("state");
        make(&state_dir);
        let node = Node::start_with_state_dir(Some(state_dir.clone()));
        // Something another user planted, which a reader would hang on.
        let _ = mkfifo_if_possible(&state_dir.join(state::FILE_NAME));
        for command in [&["once"][..], &["run"], &["plan"], &["history"]] {
            let output = support::run(&mut node.command(command));
            let stderr = stderr_of(&output);
            assert_eq!(
                output.status.code(),
                Some(2),
                "{name}, {command:?}: {}",
                describe(&output)
            );
            assert!(stderr.contains(&state_dir.display().to_string()), "{name}: {stderr}");
            assert!(stderr.contains("chown root:root"), "{name}: {stderr}");
            assert!(stderr.contains("chmod 0700"), "{name}: {stderr}");
        }
        assert!(node.fake.removed().is_empty(), "{name}: nothing removed");
    }
}

fn mkfifo_if_possible(path: &Path) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    unsafe { libc::mkfifo(c.as_ptr(), 0o666) == 0 }
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_torn_journal_line_or_a_stray_byte_costs_only_itself() {
    let node = Node::start();
    fs::create_dir_all(&node.state_dir).unwrap();
    let journal = node.state_dir.join("removals.jsonl");
    let earlier = r#"{"time":"2026-01-01T00:00:00Z","image":"sha256:earlier","tags":[],"digests":[],"reason":"age","size_bytes":1,"freed_bytes":null,"last_used":"2025-01-01T00:00:00Z","first_seen":"2025-01-01T00:00:00Z","dry_run":false}"#;
    let mut planted = format!("{earlier}\n").into_bytes();
    // A line with a byte that is not UTF-8, then half a line (ENOSPC).
    planted.extend_from_slice(b"{\"time\":\"2026-01-02T00:00:00Z\",\"image\":\"\xff\"}\n");
    planted.extend_from_slice(b"{\"time\":\"2026-01-03T00:0");
    fs::write(&journal, &planted).unwrap();

    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(removals(&output), space_removals_of(&["u1", "u2", "u3"]));
    let ids = journaled_ids(&history_images(&node));
    let expected: Vec<String> = ["sha256:earlier".to_string()]
        .into_iter()
        .chain(["u1", "u2", "u3"].map(|n| image(n, 0).id))
        .collect();
    assert_eq!(ids, expected);
    // The table form too.
    let output = support::run(&mut node.command(&["history"]));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

/// Starts `imagegc COMMAND` with every `RemoveImage` hanging for two
/// minutes, and returns once the first removal is under way.
fn spawn_with_a_hung_removal(node: &Node, command: &str, stderr: std::process::Stdio) -> std::process::Child {
    node.fake.delay("RemoveImage", Duration::from_secs(120));
    let child = node
        .command(&[command])
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + support::PATIENCE;
    while node.fake.count("RemoveImage") == 0 {
        assert!(std::time::Instant::now() < deadline, "no removal started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `imagegc run` sent SIGTERM while its first removal hangs longer than the
/// shutdown grace (and inside the runtime timeout); what it printed.
fn sigterm_during_a_hung_removal(node: &Node) -> Output {
    node.slow_runtime_timeout();
    let daemon = spawn_with_a_hung_removal(node, "run", std::process::Stdio::piped());
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    wait_with_deadline(daemon)
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn sigterm_during_a_slow_removal_names_the_image_and_journals_it_at_the_next_start() {
    let node = Node::start();
    let output = sigterm_during_a_hung_removal(&node);
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let u1 = image("u1", 0).id;
    let abandoned = stderr
        .lines()
        .find(|l| l.contains("abandoning it"))
        .unwrap_or_else(|| panic!("no abandon message: {stderr}"));
    assert!(abandoned.contains(&u1), "{abandoned}");

    // The runtime finished the removal after imagegc had gone.
    the_runtime_completes_the_removal_of_u1(&node);
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(
        stderr_of(&output).contains("completed after shutdown"),
        "{}",
        describe(&output)
    );
    let entries = history_images(&node);
    assert_eq!(entries[0]["image"], u1.as_str(), "{entries:?}");
    assert_eq!(entries[0]["note"], "completed after shutdown", "{entries:?}");
    assert_eq!(entries[0]["reason"], "space", "{entries:?}");
    // Then the collection went on as usual.
    assert_eq!(removals(&output), space_removals_of(&["u2", "u3"]));
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_removal_abandoned_and_never_done_by_the_runtime_is_not_journaled() {
    let node = Node::start();
    let output = sigterm_during_a_hung_removal(&node);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));

    // The image is still there: the next start keeps the abandoned attempt
    // pending (the runtime might still carry it out) and journals nothing
    // for it; this cycle removes the image again, and journals that once,
    // which settles both.
    node.fake.delay("RemoveImage", Duration::ZERO);
    assert!(node.state_dir.join("removal-in-flight.json").exists());
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(
        !node.state_dir.join("removal-in-flight.json").exists(),
        "nothing left pending: {}",
        describe(&output)
    );
    let entries = history_images(&node);
    assert_eq!(journaled_ids(&entries), ["u1", "u2", "u3"].map(|n| image(n, 0).id));
    assert!(
        entries
            .iter()
            .all(|e| e.get("note").is_none_or(serde_json::Value::is_null)),
        "{entries:?}"
    );
}

/// The runtime completes, after imagegc is gone, the removal of `u1` that
/// hung: it answers at once again, and the image and its layer are gone.
/// Returns the image's id.
fn the_runtime_completes_the_removal_of_u1(node: &Node) -> String {
    let u1 = image("u1", 0).id;
    node.fake.delay("RemoveImage", Duration::ZERO);
    let removed = node.fake.remove_image_by_id(&u1).unwrap();
    fs::remove_file(layer_file(node._imagefs.path(), &removed)).unwrap();
    u1
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_removal_in_flight_when_imagegc_is_killed_is_journaled_at_the_next_start() {
    let node = Node::start();
    let mut once = spawn_with_a_hung_removal(&node, "once", std::process::Stdio::null());
    once.kill().unwrap();
    once.wait().unwrap();

    // The runtime completed the removal imagegc asked for before it died.
    the_runtime_completes_the_removal_of_u1(&node);
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let entries = history_images(&node);
    assert_eq!(
        journaled_ids(&entries),
        ["u1", "u2", "u3"].map(|n| image(n, 0).id),
        "{entries:?}"
    );
    assert_eq!(entries[0]["note"], "completed after shutdown", "{entries:?}");
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn a_removal_that_timed_out_then_a_kill_is_journaled_once_when_the_next_start_finds_it_gone() {
    let node = Node::start();
    node.short_runtime_timeout();
    // One cycle and no listing after it: the test looks at the file the
    // cycle left, without a listing rewriting it before the kill.
    let text = fs::read_to_string(&node.config).unwrap();
    fs::write(&node.config, text.replace("interval = \"1s\"", "interval = \"1h\"")).unwrap();
    let mut daemon = spawn_with_a_hung_removal(&node, "run", std::process::Stdio::null());
    // RemoveImage times out after 1 s and the image is still listed after
    // its outcome was watched: the removal stays pending, on disk.
    let pending = node.state_dir.join("removal-in-flight.json");
    let deadline = std::time::Instant::now() + support::PATIENCE;
    while !fs::read_to_string(&pending).is_ok_and(|t| t.contains("\"unknown\"")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no removal of unknown outcome was kept"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon.kill().unwrap();
    daemon.wait().unwrap();

    // The runtime finished it after imagegc was killed.
    let u1 = the_runtime_completes_the_removal_of_u1(&node);
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let output = node.once();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let entries = history_images(&node);
    let of_u1: Vec<_> = entries.iter().filter(|e| e["image"] == u1.as_str()).collect();
    assert_eq!(of_u1.len(), 1, "journaled once: {entries:?}");
    assert_eq!(of_u1[0]["note"], "completed after shutdown", "{entries:?}");
    assert!(!pending.exists());
}

#[test]
#[ignore = "needs root (a tmpfs and files of its own): scripts/test.sh runs it"]
fn check_config_says_which_changes_a_reload_of_the_running_daemon_would_not_apply() {
    let node = Node::start();
    let mut daemon = node
        .command(&["run"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let running = node.state_dir.join("running.json");
    let deadline = std::time::Instant::now() + support::PATIENCE;
    while !running.exists() {
        assert!(std::time::Instant::now() < deadline, "the daemon noted nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let check = |node: &Node| {
        let output = support::run(&mut node.command(&["check-config"]));
        assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
        stderr_of(&output)
    };
    assert!(
        check(&node).contains("a reload (SIGHUP) applies every change"),
        "{}",
        check(&node)
    );
    let text = fs::read_to_string(&node.config).unwrap();
    fs::write(
        &node.config,
        text.replace("listen = \"\"", "listen = \"127.0.0.1:9999\""),
    )
    .unwrap();
    let said = check(&node);
    assert!(
        said.contains("only after a restart") && said.contains("metrics.listen"),
        "{said}"
    );
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    daemon.wait().unwrap();
    assert!(!running.exists(), "a clean exit forgets the note");
    assert!(!check(&node).contains("imagegc runs"), "no daemon runs");
}
