//! Generated CRI v1 types, clients and servers (see build.rs and proto/cri.proto).
//!
//! The daemon speaks only through the client ([`super::CriClient`] converts
//! every message into the domain types). The servers are here for the test
//! kit's fake runtime (crates/imagegc-testkit), which serves these same
//! generated types, so the fake and the client cannot drift apart on the
//! wire.
#![allow(clippy::all, clippy::pedantic, missing_docs)]
tonic::include_proto!("runtime.v1");
