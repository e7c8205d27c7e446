//! docs/operations.md "A store's files": a sled store missing a file it needs, or one a newer
//! orderly wrote, is refused by every command with one line naming the file and exit 2, and not
//! one byte of it changes; a store whose newest snapshot is gone still serves every write (sled
//! replays its whole log). The embedded engine's own files: these run on sled whatever the
//! environment (CI's PostgreSQL run leaves them out by name).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use reqwest::StatusCode;

use crate::helpers::{basket, start, TestApp};

/// An uncompressed store written by an orderly from before the layout file (its fixture).
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/sled-0.34.7-store.tar.gz"
);

/// Every file of the store and its bytes.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// `orderly ARGS`: its exit status and what it said on stderr.
fn orderly(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running orderly");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every command that opens a sled store, on `dir`.
fn every_command(dir: &str) -> Vec<Vec<String>> {
    let owned = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        owned(&["serve", "--listen", "127.0.0.1:0", "--data-dir", dir]),
        owned(&["stats", "--data-dir", dir]),
        // The source is opened before the target is tried.
        owned(&[
            "copy",
            "--from-data-dir",
            dir,
            "--to-database-url",
            "postgres://nobody@127.0.0.1:1/none",
        ]),
    ]
}

/// Each command refuses the store in one line naming `file`, exit 2, and leaves it as it was.
fn refused_by_every_command(dir: &Path, file: &str) {
    let before = contents(dir);
    for args in every_command(&dir.display().to_string()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stderr) = orderly(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(file), "{args:?} names {file}: {stderr}");
        assert!(contents(dir) == before, "{args:?} changed the store");
    }
}

fn unpack_fixture(into: &Path) -> PathBuf {
    let status = Command::new("tar")
        .args(["-xzf", FIXTURE, "-C"])
        .arg(into)
        .status()
        .expect("running tar");
    assert!(status.success(), "unpacking {FIXTURE}");
    into.join("db")
}

/// A store this build wrote, with a partner's orders in it, stopped (and opened once more,
/// so that sled wrote a snapshot); the partner's key and the balance its orders left.
async fn a_stopped_store(dir: &Path) -> (String, i64) {
    let data_dir = dir.display().to_string();
    let flags = ["--data-dir", data_dir.as_str()];
    let mut app = start(dir, &flags);
    let partner = app.partner_with_balance(100_000).await;
    for i in 0..20 {
        let resp = app
            .post_order(
                Some(&partner.api_key),
                Some(&format!("k{i}")),
                &basket("prd_uc", 1, "@p"),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let balance = app.balance(&partner.api_key).await;
    stop(&mut app);
    let mut app = app.restart(&flags);
    // Serving: its SIGTERM handler is in place.
    assert_eq!(app.balance(&partner.api_key).await, balance);
    stop(&mut app);
    (partner.api_key, balance)
}

fn stop(app: &mut TestApp) {
    let status = app.signal("TERM", Duration::from_secs(15));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: exit 0");
}

#[test]
fn a_store_from_before_the_layout_file_opens_and_is_given_one() {
    let root = tempfile::tempdir().unwrap();
    let dir = unpack_fixture(root.path());
    assert!(!dir.join("layout").exists());
    let (code, stderr) = orderly(&["stats", "--data-dir", &dir.display().to_string()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.join("layout")).unwrap(),
        "orderly layout 1\n"
    );
}

#[test]
fn a_store_missing_its_conf_is_refused_by_every_command_untouched() {
    let root = tempfile::tempdir().unwrap();
    let dir = unpack_fixture(root.path());
    std::fs::remove_file(dir.join("conf")).unwrap();
    refused_by_every_command(&dir, "conf");
    // Put back, it opens: nothing was written over.
    let root_again = tempfile::tempdir().unwrap();
    let whole = unpack_fixture(root_again.path());
    std::fs::copy(whole.join("conf"), dir.join("conf")).unwrap();
    let (code, stderr) = orderly(&["stats", "--data-dir", &dir.display().to_string()]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_store_whose_conf_was_written_anew_over_it_is_refused_untouched() {
    // What an orderly before this check left of a store that had lost its conf: a new conf
    // saying "compressed" over an uncompressed store.
    let root = tempfile::tempdir().unwrap();
    let dir = unpack_fixture(root.path());
    let fresh = root.path().join("fresh");
    let (code, stderr) = orderly(&["stats", "--data-dir", &fresh.display().to_string()]);
    assert_eq!(code, Some(0), "{stderr}");
    std::fs::copy(fresh.join("conf"), dir.join("conf")).unwrap();
    refused_by_every_command(&dir, "conf");
}

#[tokio::test]
async fn a_store_missing_its_layout_file_is_refused_by_every_command_untouched() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    a_stopped_store(&dir).await;
    std::fs::remove_file(dir.join("layout")).unwrap();
    refused_by_every_command(&dir, "layout");
}

#[tokio::test]
async fn a_store_whose_layout_file_is_cut_short_is_refused_by_every_command_untouched() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    a_stopped_store(&dir).await;
    std::fs::write(dir.join("layout"), "orderly lay").unwrap();
    refused_by_every_command(&dir, "layout");
}

#[tokio::test]
async fn a_store_a_newer_orderly_wrote_is_refused_by_every_command_untouched() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    a_stopped_store(&dir).await;
    std::fs::write(dir.join("layout"), "orderly layout 99\n").unwrap();
    refused_by_every_command(&dir, "newer orderly");
}

/// The snapshot sled reads: the last name in order, as sled sorts them.
fn newest_snapshot(dir: &Path) -> PathBuf {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("snap.")
        })
        .collect();
    names.sort();
    names
        .pop()
        .expect("a stopped and reopened store has a snapshot")
}

#[tokio::test]
async fn a_store_whose_newest_snapshot_is_cut_short_is_refused_by_every_command_untouched() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    a_stopped_store(&dir).await;
    let snapshot = newest_snapshot(&dir);
    let bytes = std::fs::read(&snapshot).unwrap();
    std::fs::write(&snapshot, &bytes[..bytes.len() / 2]).unwrap();
    let name = snapshot.file_name().unwrap().to_string_lossy().into_owned();
    refused_by_every_command(&dir, &name);
}

#[tokio::test]
async fn a_store_whose_snapshots_are_gone_serves_every_write() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    let (key, balance) = a_stopped_store(&dir).await;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("snap.")
        {
            std::fs::remove_file(path).unwrap();
        }
    }
    let data_dir = dir.display().to_string();
    let app = start(&dir, &["--data-dir", data_dir.as_str()]);
    assert_eq!(app.balance(&key).await, balance);
    assert_eq!(app.orders(&key).await.len(), 20);
    assert_eq!(app.assert_ledger_matches_balance(&key).await, balance);
    for i in 0..20 {
        let replay = app
            .post_order(
                Some(&key),
                Some(&format!("k{i}")),
                &basket("prd_uc", 1, "@p"),
            )
            .await;
        assert_eq!(replay.headers()["Idempotency-Replayed"], "true");
    }
}

/// A stopped store holding an order of 300 KiB of letters that do not compress: sled keeps
/// its page in a file of its own under blobs/. The blob files.
async fn a_stopped_store_with_blobs(dir: &Path) -> Vec<PathBuf> {
    use proptest::prelude::Rng;
    use proptest::test_runner::{RngAlgorithm, TestRng};
    let data_dir = dir.display().to_string();
    let flags = ["--data-dir", data_dir.as_str()];
    let mut app = start(dir, &flags);
    let partner = app.partner_with_balance(100_000).await;
    let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let large: String = (0..300 * 1024)
        .map(|_| char::from(b'a' + (rng.next_u32() % 26) as u8))
        .collect();
    let resp = app
        .post_order(
            Some(&partner.api_key),
            Some("large"),
            &basket("prd_uc", 1, &large),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    stop(&mut app);
    let blobs: Vec<PathBuf> = std::fs::read_dir(dir.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!blobs.is_empty(), "the large order is in blob files");
    blobs
}

#[tokio::test]
async fn a_store_missing_a_blob_file_is_refused_by_every_command_untouched() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    let blobs = a_stopped_store_with_blobs(&dir).await;
    for blob in &blobs {
        let kept = std::fs::read(blob).unwrap();
        std::fs::remove_file(blob).unwrap();
        let name = format!("blobs/{}", blob.file_name().unwrap().to_string_lossy());
        refused_by_every_command(&dir, &name);
        std::fs::write(blob, kept).unwrap();
    }
}

#[tokio::test]
async fn a_store_whose_blob_file_is_cut_short_is_refused_by_every_command_untouched() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    let blobs = a_stopped_store_with_blobs(&dir).await;
    let blob = &blobs[0];
    let bytes = std::fs::read(blob).unwrap();
    std::fs::write(blob, &bytes[..bytes.len() / 2]).unwrap();
    let name = format!("blobs/{}", blob.file_name().unwrap().to_string_lossy());
    refused_by_every_command(&dir, &name);
}

#[tokio::test]
async fn a_snapshot_a_crash_cut_short_while_it_was_written_is_passed_over() {
    // sled writes `snap.N.generating`, syncs it, then renames it: one cut short is a crash in
    // between, and the snapshot before it (or the whole log) is what the store had.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    let (key, balance) = a_stopped_store(&dir).await;
    let snapshot = newest_snapshot(&dir);
    let torn = dir.join(format!(
        "{}.generating",
        snapshot
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace("snap.", "snap.F")
    ));
    std::fs::write(&torn, b"half a snapshot").unwrap();
    let data_dir = dir.display().to_string();
    let app = start(&dir, &["--data-dir", data_dir.as_str()]);
    assert_eq!(app.balance(&key).await, balance);
    assert_eq!(app.assert_ledger_matches_balance(&key).await, balance);
}
