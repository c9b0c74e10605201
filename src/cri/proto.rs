//! Generated CRI v1 types, clients and servers (see build.rs and proto/cri.proto).
#![allow(clippy::all, clippy::pedantic, missing_docs)]
tonic::include_proto!("runtime.v1");
