//! `fake_runtime SOCKET`: the test kit's fake CRI runtime driven by commands
//! on stdin (crates/imagegc-testkit/src/script.rs says which). The test kit
//! builds the same command as its `fake_runtime` binary; this example keeps
//! `cargo build --example fake_runtime` working for the scripts that use it.

fn main() -> std::process::ExitCode {
    imagegc_testkit::script::main()
}
