//! A scratch directory for one fuzzing process, removed when libFuzzer
//! exits (it ends with `exit`, which does not drop statics).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove() {
    if let Some(dir) = DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

pub fn dir() -> &'static Path {
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("imagegc-fuzz-")
            .tempdir()
            .expect("a scratch directory")
            .keep();
        // SAFETY: `remove` is a plain function that lives as long as the process.
        unsafe { libc::atexit(remove) };
        dir
    })
}
