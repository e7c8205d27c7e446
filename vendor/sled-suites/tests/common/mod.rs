// orderly: upstream refused to compile without sled's `testing` feature. These suites run
// without it on purpose (README.md): `testing` includes `lock_free_delays`, which splits
// leaves above 2 rows instead of orderly's 32. Cargo.toml enables the rest of `testing`.

#[allow(dead_code)]
pub fn setup_logger() {
    use std::io::Write;

    fn tn() -> String {
        std::thread::current().name().unwrap_or("unknown").to_owned()
    }

    #[cfg(feature = "pretty_backtrace")]
    color_backtrace::install();

    let mut builder = env_logger::Builder::new();
    builder
        .format(|buf, record| {
            writeln!(
                buf,
                "{:05} {:20} {:10} {}",
                record.level(),
                tn(),
                record.module_path().unwrap().split("::").last().unwrap(),
                record.args()
            )
        })
        .filter(None, log::LevelFilter::Info);

    if std::env::var("RUST_LOG").is_ok() {
        builder.parse_filters(&std::env::var("RUST_LOG").unwrap());
    }

    let _r = builder.try_init();
}

#[allow(dead_code)]
pub fn cleanup(dir: &str) {
    let dir = std::path::Path::new(dir);
    if dir.exists() {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// orderly: a reopen right after a drop can find the dropped instance's file lock still held
/// (a background thread of sled's holds the file last and lets go a moment later, on sled as
/// published as on orderly's copy). Opens through `open`, retrying while the error is that lock,
/// for at most 5 seconds (CI's machines are loaded, and the lock was seen held past a second).
#[allow(dead_code)]
pub fn retry_while_locked<T>(
    mut open: impl FnMut() -> sled::Result<T>,
) -> sled::Result<T> {
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match open() {
            Err(sled::Error::Io(e))
                if std::time::Instant::now() < deadline
                    && e.to_string().contains("could not acquire lock") =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}
