//! `kubelet_resource`: see `kpulse_aggregator_api::fuzzing::kubelet_resource` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kpulse_aggregator_api::fuzzing::kubelet_resource(data));
