//! Fuzz target `routing`: see `svc::fuzzing::routing` for what it feeds the input to.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| svc::fuzzing::routing(data));
