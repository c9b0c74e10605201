//! A fake CRI runtime on a unix socket, driven by commands on stdin, for
//! scripts that run the real `imagegc` binary against a runtime they control.
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
//! - `fail-remove NAME`: `RemoveImage` of that image fails from now on.
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

use imagegc::cri::Image;
use imagegc::cri::fake::{FakeRuntime, FakeServer};

fn main() -> ExitCode {
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
                            repo_tags: vec![(*name).to_owned()],
                            repo_digests: Vec::new(),
                            size,
                            pinned: false,
                        });
                        Ok(())
                    }
                    Err(err) => Err(format!("size {size:?}: {err}")),
                },
                ["fail-remove", name] => {
                    fake.fail_remove(&image_id(name), tonic::Code::Internal);
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

/// A stable `sha256:` id for a name: its bytes in hex, padded to 64 digits.
fn image_id(name: &str) -> String {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex:0<64.64}")
}
