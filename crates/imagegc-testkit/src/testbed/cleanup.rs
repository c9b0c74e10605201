//! Dropping a test bed: pods stopped over CRI, the runtime and registry
//! stopped, the shims or conmon processes started for it ended by PID, its
//! cgroups removed, everything under its directory unmounted, the loop
//! device detached and the directory removed.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use imagegc::cri::proto;
use sha2::{Digest, Sha256};

use super::{CALL_TIMEOUT, TestBed};

/// Grace period between SIGTERM and SIGKILL when stopping containerd.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long shims get to exit by themselves once containerd has stopped.
const SHIM_EXIT_GRACE: Duration = Duration::from_secs(2);
/// Where containerd 1.6 shims put their sockets, whatever containerd's state dir.
const SHIM_SOCKET_DIR: &str = "/run/containerd/s";

impl Drop for TestBed {
    fn drop(&mut self) {
        let started = Instant::now();
        // Notes: a cleanup step that needed a fallback. Problems: something
        // left behind, which fails the test.
        let mut notes = Vec::new();
        let mut problems = Vec::new();
        if self.client.is_some()
            && let Err(e) = remove_all_pods(&self.endpoint)
        {
            notes.push(format!("removing pods over CRI: {e}"));
        }
        let pods_removed = started.elapsed();
        // CRI-O stops gracefully only once its clients have hung up.
        self.client = None;
        if let Some(child) = self.containerd.take() {
            stop_process(child, self.kind.name(), &mut notes);
        }
        if let Some((child, _)) = self.registry.take() {
            stop_process(child, "the registry", &mut notes);
        }
        kill_shims(&self.socket, &self.dir, &mut notes, &mut problems);
        remove_cgroups(&self.cgroup_parent, &mut notes, &mut problems);
        let unmounted = unmount_under(&self.dir, &mut problems);
        for device in [self.loop_device.take(), self.container_loop_device.take()]
            .into_iter()
            .flatten()
        {
            detach_loop(&device, &mut problems);
        }
        // Never delete through a mount that is still there.
        if unmounted && let Err(e) = fs::remove_dir_all(&self.dir) {
            problems.push(format!("removing {}: {e}", self.dir.display()));
        }
        eprintln!(
            "testbed {}: cleaned up in {} ms (pods {} ms)",
            self.dir.display(),
            started.elapsed().as_millis(),
            pods_removed.as_millis()
        );
        for note in &notes {
            eprintln!("testbed {}: {note}", self.dir.display());
        }
        if !problems.is_empty() {
            let report = format!(
                "testbed {} cleanup left problems:\n  {}",
                self.dir.display(),
                problems.join("\n  ")
            );
            if std::thread::panicking() {
                eprintln!("{report}");
            } else {
                panic!("{report}");
            }
        }
    }
}

/// Stops and removes every pod over CRI. Drop may run inside the test's
/// runtime, which cannot be blocked on, so this runs on its own thread with
/// its own runtime and its own connection.
fn remove_all_pods(endpoint: &str) -> Result<(), String> {
    let endpoint = endpoint.to_string();
    std::thread::spawn(move || -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("building a runtime for cleanup: {e}"))?;
        runtime.block_on(async {
            let client = imagegc::cri::connect(&endpoint, CALL_TIMEOUT).map_err(|e| e.to_string())?;
            let mut service = client.runtime_service();
            let pods = service
                .list_pod_sandbox(proto::ListPodSandboxRequest { filter: None })
                .await
                .map_err(|s| format!("ListPodSandbox: {s}"))?
                .into_inner()
                .items;
            let mut failures = Vec::new();
            for pod in pods {
                let stop = proto::StopPodSandboxRequest {
                    pod_sandbox_id: pod.id.clone(),
                };
                if let Err(s) = service.stop_pod_sandbox(stop).await {
                    failures.push(format!("StopPodSandbox {}: {s}", pod.id));
                    continue;
                }
                let remove = proto::RemovePodSandboxRequest {
                    pod_sandbox_id: pod.id.clone(),
                };
                if let Err(s) = service.remove_pod_sandbox(remove).await {
                    failures.push(format!("RemovePodSandbox {}: {s}", pod.id));
                }
            }
            if failures.is_empty() {
                Ok(())
            } else {
                Err(failures.join("; "))
            }
        })
    })
    .join()
    .unwrap_or_else(|_| Err("the cleanup thread panicked".to_string()))
}

/// SIGTERM, then SIGKILL after [`STOP_GRACE`].
pub(super) fn stop_process(mut child: Child, what: &str, notes: &mut Vec<String>) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // SAFETY: signalling our own child by its PID.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    notes.push(format!(
        "{what} (pid {}) ignored SIGTERM for {STOP_GRACE:?}; killed",
        child.id()
    ));
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills the monitors started for the runtime, and everything they started,
/// by PID: containerd's shims (their command line carries `-address
/// SOCKET`) and CRI-O's conmon processes (theirs names paths under `dir`).
/// A monitor whose pods were removed exits by itself, so they get
/// [`SHIM_EXIT_GRACE`] first.
fn kill_shims(socket: &Path, dir: &Path, notes: &mut Vec<String>, problems: &mut Vec<String>) {
    let socket = socket.as_os_str().as_bytes();
    let dir = dir.as_os_str().as_bytes();
    let find_shims = |processes: &[Process]| -> Vec<i32> {
        processes
            .iter()
            .filter(|p| {
                p.args.windows(2).any(|w| w[0] == b"-address" && w[1] == socket)
                    || p.args
                        .iter()
                        .any(|a| a.starts_with(dir) && a.get(dir.len()) == Some(&b'/'))
            })
            .map(|p| p.pid)
            .collect()
    };
    let deadline = Instant::now() + SHIM_EXIT_GRACE;
    let (processes, shims) = loop {
        let processes = processes();
        let shims = find_shims(&processes);
        if shims.is_empty() || Instant::now() > deadline {
            break (processes, shims);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if shims.is_empty() {
        return;
    }
    let mut doomed = shims.clone();
    let mut i = 0;
    while i < doomed.len() {
        let parent = doomed[i];
        doomed.extend(processes.iter().filter(|p| p.ppid == parent).map(|p| p.pid));
        i += 1;
    }
    notes.push(format!(
        "shims or monitors {shims:?} were still running after the runtime stopped; killed them and their children"
    ));
    for pid in doomed.iter().rev() {
        // SAFETY: signalling a process found above by PID.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && doomed.iter().any(|pid| alive(*pid)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let survivors: Vec<i32> = doomed.into_iter().filter(|pid| alive(*pid)).collect();
    if !survivors.is_empty() {
        problems.push(format!("processes {survivors:?} survived SIGKILL"));
    }
    // A killed shim cannot remove its socket, which containerd 1.6 puts in a
    // fixed directory shared by every containerd on the machine.
    for shim in processes.iter().filter(|p| shims.contains(&p.pid)) {
        if let Some(path) = shim_socket(socket, &shim.args)
            && let Err(e) = fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            problems.push(format!("removing the shim socket {}: {e}", path.display()));
        }
    }
}

/// The socket a containerd 1.6 shim listens on:
/// `/run/containerd/s/<sha256 of "ADDRESS/NAMESPACE/ID">`.
fn shim_socket(address: &[u8], args: &[Vec<u8>]) -> Option<PathBuf> {
    let flag = |name: &[u8]| args.windows(2).find(|w| w[0] == name).map(|w| w[1].as_slice());
    let mut key = address.to_vec();
    for part in [flag(b"-namespace")?, flag(b"-id")?] {
        key.push(b'/');
        key.extend_from_slice(part);
    }
    Some(PathBuf::from(SHIM_SOCKET_DIR).join(format!("{:x}", Sha256::digest(&key))))
}

/// Removes the test bed's cgroup in every hierarchy, killing (by PID) any
/// process still in it first.
fn remove_cgroups(parent: &str, notes: &mut Vec<String>, problems: &mut Vec<String>) {
    let dirs = cgroup_dirs(parent);
    let pids: BTreeSet<i32> = dirs
        .iter()
        .filter_map(|dir| fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|procs| procs.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<_>>())
        .collect();
    if !pids.is_empty() {
        notes.push(format!("processes {pids:?} were still in cgroup {parent}; killed them"));
        for pid in &pids {
            // SAFETY: signalling a process found in the test bed's cgroup.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
    }
    // A cgroup can be removed once its last process has been reaped.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<PathBuf> = cgroup_dirs(parent)
            .into_iter()
            .filter(|dir| fs::remove_dir(dir).is_err())
            .collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            problems.push(format!("cgroups left behind: {left:?}"));
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every directory at or under `parent` in each mounted cgroup hierarchy,
/// deepest first.
fn cgroup_dirs(parent: &str) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut pending: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let point = mount.split(' ').nth(4)?;
            fs.starts_with("cgroup")
                .then(|| PathBuf::from(unescape_mountinfo(point)))
        })
        .map(|mount| mount.join(parent.trim_start_matches('/')))
        .filter(|dir| dir.is_dir())
        .collect();
    let mut dirs = Vec::new();
    while let Some(dir) = pending.pop() {
        if let Ok(entries) = fs::read_dir(&dir) {
            pending.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        dirs.push(dir);
    }
    dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
    dirs
}

struct Process {
    pid: i32,
    ppid: i32,
    args: Vec<Vec<u8>>,
}

fn processes() -> Vec<Process> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name may contain spaces and parentheses: fields
            // are counted after the last ')'. State, then the parent PID.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args = cmdline.split(|b| *b == 0).map(<[u8]>::to_vec).collect();
            Some(Process { pid, ppid, args })
        })
        .collect()
}

/// True while `pid` exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// Lazily unmounts every mount at or under `dir`, deepest first. Returns
/// whether none is left.
fn unmount_under(dir: &Path, problems: &mut Vec<String>) -> bool {
    for _round in 0..5 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return true;
        }
        for mount in mounts {
            let c_path = CString::new(mount.as_os_str().as_bytes()).expect("a path without NUL bytes");
            // SAFETY: `c_path` is NUL-terminated.
            let rc = unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) };
            if rc != 0 {
                let error = std::io::Error::last_os_error();
                if error.raw_os_error() != Some(libc::EINVAL) && error.raw_os_error() != Some(libc::ENOENT) {
                    problems.push(format!("umount {}: {error}", mount.display()));
                }
            }
        }
    }
    let left = mounts_under(dir);
    if !left.is_empty() {
        problems.push(format!("mounts left under {}: {left:?}", dir.display()));
    }
    left.is_empty()
}

/// Mount points at or under `dir` from /proc/self/mountinfo, deepest first
/// (and, at equal depth, the latest mounted first).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<(usize, usize, PathBuf)> = info
        .lines()
        .enumerate()
        .filter_map(|(order, line)| {
            let point = PathBuf::from(unescape_mountinfo(line.split(' ').nth(4)?));
            point
                .starts_with(dir)
                .then(|| (point.components().count(), order, point))
        })
        .collect();
    mounts.sort_by_key(|&(depth, order, _)| std::cmp::Reverse((depth, order)));
    mounts.into_iter().map(|(_, _, point)| point).collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn detach_loop(device: &str, problems: &mut Vec<String>) {
    match Command::new("losetup").args(["-d", device]).output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => problems.push(format!(
            "losetup -d {device}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(e) => problems.push(format!("running losetup -d {device}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo(r"/tmp/plain"), "/tmp/plain");
        assert_eq!(unescape_mountinfo(r"/tmp/back\134slash"), r"/tmp/back\slash");
    }
}
