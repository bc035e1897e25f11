//! kpulse's node agent: reads every cgroup's CPU and memory counters, from eBPF
//! (`iter/cgroup`) or, where eBPF cannot load, from cgroupfs, and attributes cgroups to
//! Kubernetes pods and containers.
//!
//! Data flow inside the agent: [`probe`] (load, attach, read records) →
//! [`collect`] (records → [`sample::Snapshot`]) → [`cgroup_path`] (path → pod/container).
//! This crate does not serve metrics or talk to the aggregator yet.

pub mod attribute;
pub mod cgroup_path;
pub mod cgroupfs;
pub mod collect;
pub mod config;
pub mod dump;
pub mod error;
pub mod kernel_layout;
pub mod layout;
pub mod probe;
pub mod sample;
pub mod ship;
