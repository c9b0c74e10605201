//! The `fake_runtime` command: a fake CRI runtime on a unix socket, driven
//! by commands on stdin, for scripts that run the real `imagegc` binary
//! against a runtime they control. The test kit's `fake_runtime` binary and
//! the `fake_runtime` example of the imagegc package run [`main`].
//! `deploy/tests/live_prometheus.py` uses it to put a live Prometheus in front
//! of an imagegc whose runtime comes and goes, and whose images are removed
//! and pulled again on cue.
//!
//! ```text
//! fake_runtime SOCKET
//! ```
//!
//! It prints `ready` once it serves, then reads one command a line and
//! answers each with `ok` (or `error: <why>`), so a script can wait for it:
//!
//! - `image NAME SIZE [FILE]`: adds an unused image tagged `NAME`, with the
//!   id `sha256:<NAME as hex, padded>`; removing it deletes `FILE`, so a
//!   removal frees space on the filesystem that holds it.
//! - `containers N`: adds `N` running containers, each in a pod of its own,
//!   spread over the images in the order they were added (the first
//!   container uses the first image, and so on, starting over after the
//!   last). Each names its image as containerd does in `ListContainers`: the
//!   spec image is the image's tag, `image_ref` its id. Container and pod
//!   ids are 64 hex digits, numbered on from the containers already there.
//! - `calls`: answers `ok RPC=N RPC=N ...`, how many times each RPC was
//!   called so far, in the order of their first call, so a script can tell
//!   what one client process asked of the runtime.
//! - `remove-image NAME`: removes the image tagged `NAME` (and its `FILE`)
//!   outside imagegc, as another collector (`crictl rmi`, the kubelet's
//!   image GC) would.
//! - `fail-remove NAME`: `RemoveImage` of that image fails from now on.
//! - `fail-rpc RPC`, `heal-rpc RPC`: every call of the CRI RPC named (as
//!   `ContainerStatus`) fails with `INTERNAL` from now on; answers again.
//!   A container first listed while `ContainerStatus` fails has mounts a
//!   client cannot read.
//! - `image-fs PATH`: `ImageFsInfo` names `PATH` as the image filesystem's
//!   mount point (the default is containerd's snapshotter directory), as a
//!   runtime whose images are on the filesystem at `PATH` would.
//! - `stop`, `start`: stops serving (the runtime is down), serves again.
//! - `quit`: stops and exits.
//!
//! Nothing here is imagegc's own logic: it is [`FakeRuntime`], the fake the
//! integration tests use, behind its real gRPC server.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use imagegc::cri::{Container, ContainerState, Image};

use crate::fake::{FakeRuntime, FakeServer};

/// Runs the command: serves on the socket named by the only argument and
/// reads commands from stdin until `quit` or the end of input.
// Long on purpose: one match arm per command of the script language, which
// reads as the language's reference.
pub fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(socket), None) = (args.next(), args.next()) else {
        eprintln!("usage: fake_runtime SOCKET");
        return ExitCode::from(2);
    };
    let socket = PathBuf::from(socket);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("fake_runtime: cannot start tokio: {err}");
            return ExitCode::FAILURE;
        }
    };

    // Commands come from a thread reading stdin, so the server keeps serving
    // while a script thinks.
    let (send, mut commands) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });

    runtime.block_on(async move {
        let fake = FakeRuntime::new();
        // Image id -> the file its removal deletes.
        let files: Arc<Mutex<HashMap<String, PathBuf>>> = Arc::default();
        let on_remove = Arc::clone(&files);
        fake.on_remove(Some(Arc::new(move |image: &Image| {
            if let Some(file) = on_remove
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&image.id)
            {
                let _ = std::fs::remove_file(file);
            }
        })));
        let mut server: Option<FakeServer> = match fake.clone().serve(&socket).await {
            Ok(server) => Some(server),
            Err(err) => {
                eprintln!("fake_runtime: cannot serve on {}: {err}", socket.display());
                return ExitCode::FAILURE;
            }
        };
        println!("ready");
        while let Some(line) = commands.recv().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            let answer = match words.as_slice() {
                ["image", name, size, rest @ ..] if rest.len() <= 1 => match size.parse::<u64>() {
                    Ok(size) => {
                        let id = image_id(name);
                        if let [file] = rest {
                            files
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .insert(id.clone(), PathBuf::from(file));
                        }
                        fake.add_image(Image {
                            id,
                            repo_tags: vec![(*name).to_owned()].into(),
                            repo_digests: Default::default(),
                            size,
                            pinned: false,
                        });
                        Ok(())
                    }
                    Err(err) => Err(format!("size {size:?}: {err}")),
                },
                ["containers", count] => match count.parse::<usize>() {
                    Ok(count) => add_containers(&fake, count),
                    Err(err) => Err(format!("count {count:?}: {err}")),
                },
                ["calls"] => {
                    println!("ok{}", call_counts(&fake.calls()));
                    continue;
                }
                ["remove-image", name] => match fake.remove_image_by_id(&image_id(name)) {
                    Some(image) => {
                        let file = files
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .remove(&image.id);
                        if let Some(file) = file {
                            let _ = std::fs::remove_file(file);
                        }
                        Ok(())
                    }
                    None => Err(format!("no image {name}")),
                },
                ["fail-remove", name] => {
                    fake.fail_remove(&image_id(name), tonic::Code::Internal);
                    Ok(())
                }
                ["fail-rpc", rpc] => known_rpc(rpc).map(|rpc| {
                    fake.fail_always(rpc, Some(tonic::Status::internal(format!("{rpc} fails (fail-rpc)"))));
                }),
                ["heal-rpc", rpc] => known_rpc(rpc).map(|rpc| fake.fail_always(rpc, None)),
                ["image-fs", path] => {
                    fake.set_image_fs_mount(path);
                    Ok(())
                }
                ["stop"] => {
                    if let Some(server) = server.take() {
                        server.shutdown().await;
                    }
                    Ok(())
                }
                ["start"] if server.is_none() => match fake.clone().serve(&socket).await {
                    Ok(started) => {
                        server = Some(started);
                        Ok(())
                    }
                    Err(err) => Err(format!("cannot serve on {}: {err}", socket.display())),
                },
                ["start"] => Ok(()),
                ["quit"] => break,
                _ => Err(format!("unknown command {line:?}")),
            };
            match answer {
                Ok(()) => println!("ok"),
                Err(why) => println!("error: {why}"),
            }
        }
        if let Some(server) = server.take() {
            server.shutdown().await;
        }
        ExitCode::SUCCESS
    })
}

/// `rpc` if the fake serves a CRI RPC of that name, else why not.
fn known_rpc(rpc: &str) -> Result<&'static str, String> {
    crate::fake::RPCS
        .iter()
        .find(|known| **known == rpc)
        .copied()
        .ok_or_else(|| {
            format!(
                "{rpc:?} is not a CRI RPC the fake serves; expected one of {:?}",
                crate::fake::RPCS
            )
        })
}

/// ` RPC=N` for each RPC in `calls`, in the order of their first call.
fn call_counts(calls: &[String]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for call in calls {
        match counts.iter_mut().find(|(rpc, _)| rpc == call) {
            Some((_, n)) => *n += 1,
            None => counts.push((call, 1)),
        }
    }
    counts.iter().map(|(rpc, n)| format!(" {rpc}={n}")).collect()
}

/// Adds `count` running containers spread over the runtime's images (see
/// the `containers` command).
fn add_containers(fake: &FakeRuntime, count: usize) -> Result<(), String> {
    let images = fake.images();
    if images.is_empty() && count > 0 {
        return Err("no image to run containers from: add images first".to_string());
    }
    let first = fake.containers().len();
    for (n, image) in (first..first + count).zip(images.iter().cycle()) {
        let pod = hex_id(n, 0x706f_6473);
        fake.add_pod(&pod);
        fake.add_container(Container {
            id: hex_id(n, 0x6374_7273),
            pod_sandbox_id: pod,
            name: format!("app{n}"),
            image: image.repo_tags.first().map_or_else(|| image.id.clone(), str::to_owned),
            image_ref: image.id.clone(),
            image_id: String::new(),
            state: Some(ContainerState::Running),
            mounted_images: Vec::new(),
            mounts_unknown: false,
        });
    }
    Ok(())
}

/// A distinct, random-looking 64-hex-digit id for the `n`th container or
/// pod, so ids differ from their first digit as a runtime's random ids do.
fn hex_id(n: usize, salt: u64) -> String {
    // splitmix64's finalizer: a bijection, so distinct `n` give distinct ids.
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let n = n as u64 ^ salt;
    format!(
        "{:016x}{:016x}{:016x}{:016x}",
        mix(n),
        mix(n ^ (1 << 63)),
        mix(n.rotate_left(21)),
        mix(!n)
    )
}

/// A stable `sha256:` id for a name: its bytes in hex, padded to 64 digits.
fn image_id(name: &str) -> String {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex:0<64.64}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_are_spread_over_the_images_as_containerd_names_them() {
        let fake = FakeRuntime::new();
        for name in ["a:1", "b:1", "c:1"] {
            fake.add_image(Image {
                id: image_id(name),
                repo_tags: vec![name.to_owned()].into(),
                repo_digests: Default::default(),
                size: 1,
                pinned: false,
            });
        }
        add_containers(&fake, 4).unwrap();
        add_containers(&fake, 1).unwrap();
        let containers = fake.containers();
        let images: Vec<&str> = containers.iter().map(|c| c.image.as_str()).collect();
        assert_eq!(images, ["a:1", "b:1", "c:1", "a:1", "a:1"]);
        for c in &containers {
            assert_eq!(c.image_ref, image_id(&c.image));
            assert_eq!(c.state, Some(ContainerState::Running));
            assert_eq!(c.id.len(), 64);
            assert!(c.id.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        let mut ids: Vec<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 5, "every container has its own id");
    }

    #[test]
    fn containers_need_an_image() {
        let err = add_containers(&FakeRuntime::new(), 1).unwrap_err();
        assert!(err.contains("no image"), "{err}");
    }

    #[test]
    fn ids_differ_from_their_first_digits() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(|n| hex_id(n, 1)).collect();
        assert_eq!(ids.len(), 10_000);
        let first: std::collections::HashSet<&str> = ids.iter().map(|id| &id[..2]).collect();
        assert!(first.len() > 200, "{} distinct leading bytes", first.len());
    }

    #[test]
    fn an_rpc_is_named_as_the_cri_names_it() {
        assert_eq!(known_rpc("ContainerStatus"), Ok("ContainerStatus"));
        let err = known_rpc("containerstatus").unwrap_err();
        assert!(err.contains("not a CRI RPC"), "{err}");
    }

    #[test]
    fn calls_are_counted_per_rpc_in_order_of_first_call() {
        let calls: Vec<String> = [
            "ListImages",
            "ContainerStatus",
            "ContainerStatus",
            "ListImages",
            "ContainerStatus",
        ]
        .map(String::from)
        .into();
        assert_eq!(call_counts(&calls), " ListImages=2 ContainerStatus=3");
        assert_eq!(call_counts(&[]), "");
    }
}
