//! A backup's records of any bytes, framed with the right header, counts and digest, so that
//! what is fuzzed is what a restore decodes and sums past the digest's check.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| orderly::fuzzing::backup_records(data));
