//! Fuzz target `webhook`: see `svc::fuzzing::webhook` for what it feeds the input to.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| svc::fuzzing::webhook(data));
