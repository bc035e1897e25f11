//! kpulse's node agent: reads every cgroup's CPU and memory counters, from eBPF
//! (`iter/cgroup`) or, where eBPF cannot load, from cgroupfs, attributes cgroups to
//! Kubernetes pods and containers, and streams cumulative counters to every aggregator
//! replica.
//!
//! Data flow inside the agent, once per tick ([`run`]): [`probe`] (load, attach, read
//! records) → [`collect`] (records → [`sample::Snapshot`]) → [`attribute`] (cgroup →
//! pod/container via [`cgroup_path`] and a Pod reflector or `--pods-file`; unknown cgroups
//! counted and dropped, partial pods left out) → [`ship`] ([`ship::Tick`] → one bounded,
//! drop-oldest queue per replica → HTTP/2 + TLS stream of `kpulse_wire::stream` frames).
//! [`selfmetrics`] serves the agent's own `/metrics`.
//!
//! It does not compute rates (the aggregator does, from cumulative counters) and does not
//! serve the Metrics API.

pub mod attribute;
pub mod cgroup_path;
pub mod cgroupfs;
pub mod clock;
pub mod collect;
pub mod config;
pub mod dump;
#[doc(hidden)]
pub mod fuzzing;
pub mod kernel_layout;
pub mod layout;
pub mod probe;
pub mod run;
pub mod sample;
pub mod selfmetrics;
pub mod ship;
pub mod starttime;
pub mod window;
