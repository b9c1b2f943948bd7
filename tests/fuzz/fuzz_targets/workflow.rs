//! Fuzz target `workflow`: see `svc::fuzzing::workflow` for what it feeds the input to.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| svc::fuzzing::workflow(data));
