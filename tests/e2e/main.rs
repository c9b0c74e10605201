//! End-to-end tests on a real containerd.
//!
//! Each test starts its own containerd on its own small loop-mounted ext4
//! filesystem, imports images built in the test ([`oci::ImageSpec`]), runs
//! pods and containers over CRI, and checks what imagegc sees and does.

// The support modules offer more than any one set of tests uses.
#[allow(dead_code)]
mod oci;
