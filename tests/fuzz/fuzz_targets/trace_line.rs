//! Fuzz target `trace_line`: see `svc::fuzzing::trace_line` for what it feeds the input to.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| svc::fuzzing::trace_line(data));
