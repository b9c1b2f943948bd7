//! Fuzz target `query`: see `svc::fuzzing::query` for what it feeds the input to.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| svc::fuzzing::query(data));
