//! Both directions, through the binary, one process per open as an upgrade and a downgrade
//! would be: CROSSING_ROWS rows (100,000 unless set; a million for the figures in README.md).
//! CROSSING_COMPRESSED set: every page compressed, as in a store orderly's server creates.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn rows() -> u64 {
    std::env::var("CROSSING_ROWS")
        .ok()
        .and_then(|n| n.replace('_', "").parse().ok())
        .unwrap_or(100_000)
}

/// Runs one step in its own process (at most 20 minutes) and returns its line of figures.
fn step(args: &[&str], dir: &Path) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sled-crossing"))
        .args(&args[..2])
        .arg(dir)
        .args(&args[2..])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the sled-crossing binary starts");
    let started = std::time::Instant::now();
    while child.try_wait().expect("waiting for it").is_none() {
        if started.elapsed() > Duration::from_secs(1200) {
            let _ = child.kill();
            panic!("{args:?} did not end within 20 minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("its output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{args:?} failed: {said}");
    print!("{said}");
    said
}

/// The blob files a step's line reports.
fn blobs(line: &str) -> u64 {
    line.split(", ")
        .find_map(|part| part.strip_suffix(" blob files\n"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

struct Dir(std::path::PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("sled-crossing-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_store_sled_as_published_wrote_is_read_whole_and_extended_by_the_patched_copy_and_then_by_published_sled_again(
) {
    let dir = Dir::new("upgrade");
    let (n, more, most) = (rows(), rows() * 3 / 2, rows() * 2);
    let (to, more_s, most_s, removed) = (
        n.to_string(),
        more.to_string(),
        most.to_string(),
        (n / 5).to_string(),
    );
    step(&["write", "published", "--to", &to], &dir.0);
    step(&["check", "patched", "--rows", &to], &dir.0);
    let extended = step(
        &[
            "write",
            "patched",
            "--from",
            &to,
            "--to",
            &more_s,
            "--remove-below",
            &removed,
            "--generation",
            "2",
        ],
        &dir.0,
    );
    // Compressed, the same pages stay under sled's blob threshold.
    if std::env::var_os("CROSSING_COMPRESSED").is_none() {
        assert!(
            blobs(&extended) > 0,
            "the patched copy's pages of medium rows make blob files"
        );
    }
    step(
        &[
            "check",
            "published",
            "--rows",
            &more_s,
            "--removed",
            &removed,
            "--generation",
            "2",
        ],
        &dir.0,
    );
    step(
        &[
            "write",
            "published",
            "--from",
            &more_s,
            "--to",
            &most_s,
            "--generation",
            "3",
        ],
        &dir.0,
    );
    step(
        &[
            "check",
            "patched",
            "--rows",
            &most_s,
            "--removed",
            &removed,
            "--generation",
            "3",
        ],
        &dir.0,
    );
}

#[test]
fn a_store_the_patched_copy_wrote_is_read_whole_and_extended_by_sled_as_published_and_then_by_the_patched_copy_again(
) {
    let dir = Dir::new("downgrade");
    let (n, more) = (rows(), rows() * 3 / 2);
    let (to, more_s, removed) = (n.to_string(), more.to_string(), (n / 5).to_string());
    let written = step(&["write", "patched", "--to", &to], &dir.0);
    if std::env::var_os("CROSSING_COMPRESSED").is_none() {
        assert!(
            blobs(&written) > 0,
            "the patched copy's pages of medium rows make blob files"
        );
    }
    step(&["check", "published", "--rows", &to], &dir.0);
    step(
        &[
            "write",
            "published",
            "--from",
            &to,
            "--to",
            &more_s,
            "--remove-below",
            &removed,
            "--generation",
            "2",
        ],
        &dir.0,
    );
    step(
        &[
            "check",
            "patched",
            "--rows",
            &more_s,
            "--removed",
            &removed,
            "--generation",
            "2",
        ],
        &dir.0,
    );
}
