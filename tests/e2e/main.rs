//! End-to-end tests on real container runtimes: Debian's containerd 1.6,
//! the current containerd 2.x and the current CRI-O.
//!
//! Each scenario is one `async fn(kind: Kind)`, run once per runtime by
//! [`on_every_runtime!`] as `<scenario>::containerd_1_6`,
//! `<scenario>::containerd_2` and `<scenario>::crio` (so `cargo test --test
//! e2e crio` runs the CRI-O suite). Each run starts its own runtime on its
//! own small loop-mounted ext4 filesystem ([`testbed::TestBed`], in
//! `imagegc_testkit`), imports images built in the test ([`oci::ImageSpec`]), runs pods and containers
//! over CRI, and checks what imagegc sees and does. They need root, the
//! runtimes scripts/testbed-runtimes.sh builds, and the tools
//! scripts/testbed-deps.sh installs, so a plain `cargo test` leaves them
//! out (`#[ignore]`, with that reason); `scripts/test.sh` runs them with
//! `--include-ignored`, and there, when anything is missing, they fail with
//! the reason instead of skipping.

/// Runs each named scenario, an `async fn(kind: Kind)`, on every runtime of
/// the matrix: a module per scenario with one test per runtime.
macro_rules! on_every_runtime {
    ($($scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            use crate::testbed::Kind;

            #[tokio::test]
            #[ignore = "needs root and the test bed's runtimes: scripts/test.sh runs it"]
            async fn containerd_1_6() {
                super::$scenario(Kind::Containerd16).await
            }

            #[tokio::test]
            #[ignore = "needs root and the test bed's runtimes: scripts/test.sh runs it"]
            async fn containerd_2() {
                super::$scenario(Kind::Containerd2).await
            }

            #[tokio::test]
            #[ignore = "needs root and the test bed's runtimes: scripts/test.sh runs it"]
            async fn crio() {
                super::$scenario(Kind::Crio).await
            }
        }
    )+};
}

/// Runs each named scenario on the runtimes that support image volumes
/// (CRI `Mount.image`): containerd 2.x and CRI-O.
macro_rules! on_runtimes_with_image_volumes {
    ($($scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            use crate::testbed::Kind;

            #[tokio::test]
            #[ignore = "needs root and the test bed's runtimes: scripts/test.sh runs it"]
            async fn containerd_2() {
                super::$scenario(Kind::Containerd2).await
            }

            #[tokio::test]
            #[ignore = "needs root and the test bed's runtimes: scripts/test.sh runs it"]
            async fn crio() {
                super::$scenario(Kind::Crio).await
            }
        }
    )+};
}

mod chaos;
mod collector;
mod inventory;
mod runtime_restart;

use imagegc_testkit::{oci, testbed};
