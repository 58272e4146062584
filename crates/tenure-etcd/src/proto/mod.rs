//! The etcd v3 gRPC API (KV, Watch, Lease, ...), as Rust types and tonic clients.
//!
//! Why the code is checked in: building must not need `protoc`. These files were generated once by
//! `tonic-build` 0.12.3 (client only, `build_server(false)`) from etcd's `rpc.proto`, `kv.proto`
//! and `auth.proto` (API version 3.4/3.5, as shipped in the `etcd-client` 0.14.1 crate); to
//! regenerate, run `tonic_build::configure().build_server(false).out_dir(..).compile_protos(&["rpc.proto"], &[proto_dir])`.
#![allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]

/// Authentication types referenced by the RPC definitions.
pub mod authpb {
    include!("authpb.rs");
}

/// Keys, values and watch events.
pub mod mvccpb {
    include!("mvccpb.rs");
}

/// Requests, responses and clients of the etcd services.
pub mod etcdserverpb {
    include!("etcdserverpb.rs");
}
