//! `quantity`: see `kpulse_aggregator_api::fuzzing::quantity` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kpulse_aggregator_api::fuzzing::quantity(data));
