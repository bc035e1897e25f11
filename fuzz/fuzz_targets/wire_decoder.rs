//! `wire_decoder`: see `kpulse_wire::fuzzing::wire_decoder` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kpulse_wire::fuzzing::wire_decoder(data));
