//! A backup file of any bytes, read and checked as `orderly restore` does before it writes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| orderly::fuzzing::backup_file(data));
