//! The run's processes as the operating system sees them: the cleanup registry every exit
//! path drains (end of run, Ctrl-C, SIGTERM, a panic), signals, liveness, memory, free ports
//! and the repository's scripts. A leaf, so that the instances (`cluster.rs`) and the storage
//! they run on (`pg.rs`, `lazyfs.rs`, `netns.rs`) can all use it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Cleanup: a registry the exit paths (end of run, Ctrl-C, panic hook) drain.

pub enum Cleanup {
    /// `bash SCRIPT ARGS…` (pg-cluster.sh stop, pgbouncer.sh stop).
    Script(Vec<String>),
    /// A LazyFS mount: continue its process, unmount, then make sure the process is gone.
    LazyFs {
        pid: i32,
        mnt: PathBuf,
    },
    RemoveDir(PathBuf),
    /// A network namespace (netns.rs): `ip netns del NAME`, which takes its veth pairs along.
    NetNs(String),
}

static CLEANUPS: Mutex<Vec<Cleanup>> = Mutex::new(Vec::new());
/// Every child process alive now (instances, restores): killed first on exit.
static LIVE: Mutex<Option<HashSet<i32>>> = Mutex::new(None);
static CLEANED: AtomicBool = AtomicBool::new(false);

pub fn register(c: Cleanup) {
    CLEANUPS.lock().unwrap_or_else(|e| e.into_inner()).push(c);
}

pub fn live_add(pid: i32) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(pid);
}

pub fn live_remove(pid: i32) {
    if let Some(s) = LIVE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        s.remove(&pid);
    }
}

/// Stops every process the run started and removes what it made, once. Synchronous, so the
/// panic hook can call it.
pub fn run_cleanup() {
    if CLEANED.swap(true, Ordering::SeqCst) {
        return;
    }
    let pids: Vec<i32> = LIVE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|s| s.iter().copied().collect())
        .unwrap_or_default();
    for pid in &pids {
        signal(*pid, libc::SIGCONT);
        signal(*pid, libc::SIGKILL);
    }
    let items: Vec<Cleanup> =
        std::mem::take(&mut *CLEANUPS.lock().unwrap_or_else(|e| e.into_inner()));
    for item in items.into_iter().rev() {
        match item {
            Cleanup::Script(args) => {
                let _ = std::process::Command::new("bash")
                    .args(&args)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
            Cleanup::LazyFs { pid, mnt } => {
                signal(pid, libc::SIGCONT);
                let ok = std::process::Command::new("fusermount3")
                    .arg("-u")
                    .arg(&mnt)
                    .stderr(Stdio::null())
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false);
                if !ok {
                    let _ = std::process::Command::new("umount")
                        .arg("-l")
                        .arg(&mnt)
                        .stderr(Stdio::null())
                        .status();
                }
                for _ in 0..50 {
                    if !alive(pid) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                signal(pid, libc::SIGKILL);
            }
            Cleanup::RemoveDir(d) => {
                let _ = std::fs::remove_dir_all(d);
            }
            Cleanup::NetNs(name) => {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", &name])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

pub fn signal(pid: i32, sig: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) with a positive pid of a process this run started.
    unsafe { libc::kill(pid, sig) == 0 }
}

pub fn alive(pid: i32) -> bool {
    // A zombie still answers kill(0); read its state to tell.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Resident memory of a process in KiB (0 when gone).
pub fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// Runs `bash SCRIPT ARGS…`, returns the last line of its stdout.
pub async fn script(
    scripts: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(scripts.join(name)).args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .map_err(|_| format!("{name} {}: no end within 180 s", args.join(" ")))?
        .map_err(|e| format!("{name}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(6).collect();
        return Err(format!(
            "{name} {} exited {}: {}",
            args.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string())
}
