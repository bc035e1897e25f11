//! `cgroup_path`: see `kpulse_agent::fuzzing::cgroup_path` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kpulse_agent::fuzzing::cgroup_path(data));
