//! Generates the CRI v1 client (and the server the test kit's fake runtime
//! serves) from proto/cri.proto.
//! protox compiles the proto in pure Rust, so no system `protoc` is needed.
//! Also names the commit the binary is built from (`IMAGEGC_COMMIT`, for
//! `imagegc --version` and `imagegc_build_info`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cri.proto");
    commit();
    let fds = protox::compile(["proto/cri.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}

/// Sets `IMAGEGC_COMMIT`: the environment's `IMAGEGC_COMMIT` when given (a
/// build from a source archive, the release workflow), else the checkout's
/// commit (`git rev-parse`, 12 hex digits, `-dirty` when the tree has
/// changes), else `unknown`.
fn commit() {
    println!("cargo:rerun-if-env-changed=IMAGEGC_COMMIT");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    // Where git keeps this checkout's HEAD and index, and the branches: the
    // same `.git` in a plain clone, apart in a worktree (`.git` is a file
    // there naming its own directory under the main one's).
    let own = git(&["rev-parse", "--path-format=absolute", "--git-dir"]);
    let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]);
    let watched = [
        (own.as_deref(), "HEAD"),
        (own.as_deref(), "index"),
        (common.as_deref(), "refs/heads"),
        (common.as_deref(), "packed-refs"),
    ];
    for (dir, name) in watched {
        let Some(dir) = dir else { continue };
        let path = std::path::Path::new(dir).join(name);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let commit = std::env::var("IMAGEGC_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let head = git(&["rev-parse", "--short=12", "HEAD"]).filter(|h| !h.is_empty())?;
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            Some(if dirty { format!("{head}-dirty") } else { head })
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=IMAGEGC_COMMIT={commit}");
}
