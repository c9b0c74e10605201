//! End-to-end tests on a real containerd.
//!
//! Each test starts its own containerd on its own small loop-mounted ext4
//! filesystem ([`testbed::TestBed`]), imports images built in the test
//! ([`oci::ImageSpec`]), runs pods and containers over CRI, and checks what
//! imagegc sees and does. They need root and `containerd`, `runc`, `ctr`,
//! `mkfs.ext4`, `losetup` and `gcc`; when any is missing they fail with the
//! reason instead of skipping.

mod chaos;
mod collector;
mod inventory;
mod runtime_restart;
// The support modules offer more than any one set of tests uses.
#[allow(dead_code)]
mod oci;
#[allow(dead_code)]
mod testbed;
