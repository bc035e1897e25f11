//! The `metrics.k8s.io` API: wire formats (JSON objects, Table, protobuf) and, as they
//! land, discovery and request handling. Nothing here reads the store directly: handlers
//! receive what they need from the caller.

pub mod custom;
pub mod discovery;
pub mod document;
pub mod handler;
pub mod negotiate;
pub mod objects;
pub mod openapi;
pub mod proto;
pub mod query;
pub mod request;
pub mod selector;
pub mod table;
pub mod types;
pub mod watch;
