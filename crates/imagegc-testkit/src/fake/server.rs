//! [`FakeRuntime::serve`]: the fake behind a tonic server on a unix socket,
//! and [`FakeServer`], the handle that stops or restarts it.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use imagegc::cri::client::MAX_MESSAGE_BYTES;
use imagegc::cri::proto::{image_service_server::ImageServiceServer, runtime_service_server::RuntimeServiceServer};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use super::FakeRuntime;
use super::service::Service;

impl FakeRuntime {
    /// Serves this runtime over a unix socket at `socket` until the returned
    /// handle is shut down or dropped. A stale socket file at that path (left
    /// by a stopped server) is removed first. Keep a clone of the runtime to
    /// change it while it is served.
    pub async fn serve(self, socket: &Path) -> io::Result<FakeServer> {
        let socket = std::path::absolute(socket)?;
        remove_stale_socket(&socket)?;
        let listener = UnixListener::bind(&socket)?;
        let identity = file_identity(&socket)?;
        let stop = CancellationToken::new();
        let service = Service {
            fake: self.clone(),
            stop: stop.clone(),
        };
        let router = tonic::transport::Server::builder()
            .add_service(
                RuntimeServiceServer::new(service.clone())
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                ImageServiceServer::new(service)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            );
        let task = tokio::spawn(
            router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.clone().cancelled_owned()),
        );
        Ok(FakeServer {
            endpoint: format!("unix://{}", socket.display()),
            runtime: self,
            socket,
            identity,
            stop,
            task: Some(task),
        })
    }
}

/// Device and inode, to tell our socket file from one bound later at the same path.
fn file_identity(path: &Path) -> io::Result<(u64, u64)> {
    let metadata = std::fs::symlink_metadata(path)?;
    Ok((metadata.dev(), metadata.ino()))
}

fn remove_stale_socket(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

/// A running fake server. Dropping it stops it without waiting;
/// [`shutdown`](Self::shutdown) stops it and waits.
pub struct FakeServer {
    runtime: FakeRuntime,
    socket: PathBuf,
    endpoint: String,
    identity: (u64, u64),
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl FakeServer {
    /// The endpoint a client connects to: `unix:///path/to/socket`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The socket file's path.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// The runtime being served.
    pub fn runtime(&self) -> &FakeRuntime {
        &self.runtime
    }

    /// Stops the server and waits until it has stopped: no new connections,
    /// delayed calls answered `Unavailable`, event streams ended, every
    /// connection closed. Removes the socket file, so clients then see a
    /// runtime that is down; [`FakeRuntime::serve`] on the same path brings
    /// it back.
    ///
    /// Panics if the server failed, which is a bug in the test setup.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => panic!("fake CRI server on {} failed: {err}", self.endpoint),
                Err(err) => panic!("fake CRI server on {} did not finish: {err}", self.endpoint),
            }
        }
        if file_identity(&self.socket).ok() == Some(self.identity) {
            let _ = std::fs::remove_file(&self.socket);
        }
    }

    /// Stops the server and serves the same runtime on the same socket
    /// again: the runtime going down and coming back.
    pub async fn restart(self) -> io::Result<FakeServer> {
        let runtime = self.runtime.clone();
        let socket = self.socket.clone();
        self.shutdown().await;
        runtime.serve(&socket).await
    }
}

impl std::fmt::Debug for FakeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeServer")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// Stops the server without waiting for it and leaves the socket file,
/// which the next [`FakeRuntime::serve`] on that path replaces.
impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
