//! A sled store's own files (`conf`, the layout mark, the newest snapshot) of any bytes, read
//! as every command reads them before sled opens the store.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| orderly::fuzzing::store_files_from(data));
