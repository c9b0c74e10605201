//! What the daemon learnt of each container and pod that never changes:
//! the images a container mounts as volumes (one `ContainerStatus` each)
//! and the sandbox image a pod names (one `PodSandboxStatus` each), noted in
//! `containers.json` in the state directory so that `plan` and `images`
//! ask only about containers and pods the daemon has not seen, instead of
//! every one of them again (5,000 calls on a busy node).
//!
//! Best effort and advisory: written without fsync when what the daemon
//! knows changed, read by the read-only commands alone (the daemon asks
//! the runtime itself), a missing, unreadable or malformed file is no file,
//! and an entry for a container that no longer runs is ignored (the ids are
//! the runtime's, never reused).

use crate::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::safe_file::{self, Links};

/// The file's name in the state directory.
pub const FILE_NAME: &str = "containers.json";

/// A node with 5,000 containers notes about 1 MiB; a file larger than this
/// is not read.
const MAX_BYTES: u64 = 64 << 20;

/// What was learnt, by container and by pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    /// Container id → the images it mounts (names and the ids they named
    /// when first read).
    #[serde(default)]
    pub containers: HashMap<String, Vec<String>>,
    /// Pod sandbox id → the sandbox image its status names, if any.
    #[serde(default)]
    pub pods: HashMap<String, Option<String>>,
}

impl Known {
    /// Notes `self` in `state_dir` (replacing the file; not fsynced: a
    /// lost note costs calls, not correctness).
    pub fn write(&self, state_dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        safe_file::replace(&state_dir.join(FILE_NAME), &bytes, false)
    }

    /// What `state_dir` notes; empty when there is no usable note.
    pub fn read(state_dir: &Path) -> Known {
        safe_file::read_bounded(&state_dir.join(FILE_NAME), Links::Refuse, MAX_BYTES)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_reads_back_and_a_bad_one_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Known::read(dir.path()), Known::default());
        let known = Known {
            containers: [("c1".to_string(), vec!["models:v2".to_string(), "sha256:ab".to_string()])]
                .into_iter()
                .collect(),
            pods: [
                ("p1".to_string(), Some("registry.k8s.io/pause:3.10".to_string())),
                ("p2".to_string(), None),
            ]
            .into_iter()
            .collect(),
        };
        known.write(dir.path()).unwrap();
        assert_eq!(Known::read(dir.path()), known);
        std::fs::write(dir.path().join(FILE_NAME), b"{\"containers\": [").unwrap();
        assert_eq!(Known::read(dir.path()), Known::default());
        // A link in its place is not followed.
        std::fs::remove_file(dir.path().join(FILE_NAME)).unwrap();
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, serde_json::to_vec(&known).unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(Known::read(dir.path()), Known::default());
    }
}
