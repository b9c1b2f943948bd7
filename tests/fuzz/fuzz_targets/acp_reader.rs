//! Fuzz target `acp_reader`: see `svc::fuzzing::acp_reader` for what it feeds the input to.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| svc::fuzzing::acp_reader(data));
