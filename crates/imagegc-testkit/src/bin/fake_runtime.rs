//! `fake_runtime SOCKET`: a fake CRI runtime driven by commands on stdin
//! (see the test kit's `script` module).

fn main() -> std::process::ExitCode {
    imagegc_testkit::script::main()
}
