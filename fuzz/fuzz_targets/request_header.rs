//! `request_header`: see `kpulse_aggregator_api::fuzzing::request_header` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kpulse_aggregator_api::fuzzing::request_header(data));
