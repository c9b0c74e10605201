//! Generates the CRI v1 client (and the server the test kit's fake runtime
//! serves) from proto/cri.proto.
//! protox compiles the proto in pure Rust, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cri.proto");
    let fds = protox::compile(["proto/cri.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
