//! Backups taken while the workload and the faults run (`GET /admin/backup`, status and first
//! bytes within the deadline, then progress at least every `STALL_BOUND` and the whole within
//! `BOUND`), and, after the run, each restored into
//! a fresh store (`orderly restore`) and served: every key acknowledged before the backup was
//! requested must replay byte for byte, and every ledger must sum to its balance (one instant).
//! At least one backup taken under load must be restored and checked (`no-backup-checked`).
//! The restore-swap fault restores a copy of one backup and replaces that file with another
//! valid backup between the restore's check of it and its reading it again: the restore must
//! refuse, or restore exactly the backup it checked.

use crate::checks::{direct_replay, list_all, ReplayItem};
use crate::cluster::{Instance, Spawner};
use crate::ctx::{Ctx, Engine, Holder};
use crate::fault_kind::FaultKind;
use crate::rng::Rng;
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicI32;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// A backup that has made no progress for this long (no byte streamed and, on sled, its spool
/// file not grown) never will: a stall, not a slow disk. A sled backup spools the whole store
/// before its first record, which on LazyFS under a loaded machine (about 1 MB/s) takes
/// minutes for an hour's store: a fixed bound on the whole took that for a hang.
const STALL_BOUND: Duration = Duration::from_secs(120);

/// A backup still progressing after this long is reported all the same: no store this
/// harness builds takes that long to copy.
pub const BOUND: Duration = Duration::from_secs(20 * 60);

/// Bytes of this process's backup spool files (sled: created beside the store and unlinked at
/// once, so found through the process's open files).
fn spool_bytes(pid: i32) -> u64 {
    if pid <= 0 {
        return 0;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().contains(".orderly-backup-"))
        })
        .filter_map(|fd| std::fs::metadata(fd.path()).ok())
        .map(|m| m.len())
        .sum()
}

#[derive(Clone, Debug)]
pub struct Backup {
    pub n: usize,
    pub file: PathBuf,
    /// Keys acknowledged before the request was sent are the ones below this.
    pub ack_seq: u64,
    pub sent_ms: u64,
    pub done_ms: u64,
    pub instance: usize,
    pub bytes: u64,
    pub ok: bool,
    /// Taken right after setup and the prefill, before the workload (restore-swap's other
    /// file): not a backup under load.
    pub base: bool,
}

/// The number of the base backup (the scheduled ones count from 0).
pub const BASE_N: usize = 90;

/// The backup taken before the workload starts (restore-swap replaces a file with it).
pub async fn take_base(ctx: &Arc<Ctx>) -> Backup {
    let mut b = take(ctx, BASE_N, 0).await;
    b.base = true;
    b
}

/// Takes `count` backups at times the seed draws over the run; when none of them completed,
/// more until one does (or the run ends).
pub async fn run_schedule(ctx: Arc<Ctx>, count: u32, end_ms: u64) -> Vec<Backup> {
    let mut rng = Rng::stream(ctx.cfg.seed, "backups", 0);
    let total = ctx.cfg.duration.as_millis() as u64;
    let mut at: Vec<u64> = (0..count)
        .map(|_| rng.range(total / 10, total * 85 / 100))
        .collect();
    at.sort_unstable();
    let mut out: Vec<Backup> = Vec::new();
    let mut n = 0;
    for t in at {
        while ctx.now_ms() < t {
            if ctx.stopping.load(Ordering::SeqCst) {
                return out;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if ctx.now_ms() + 5_000 > end_ms {
            break;
        }
        let inst = ctx.cluster.live()[rng.below(ctx.cluster.live().len() as u64) as usize];
        // An instance down or paused by a fault: wait for it (a backup of a dead process
        // proves nothing), once more after a failure it did not cause itself.
        let mut b = None;
        for _ in 0..2 {
            let got = take_when_ready(&ctx, n, inst).await;
            n += 1;
            let again =
                !got.ok && ctx.cluster.instances[inst].disturbed_during(got.sent_ms, got.done_ms);
            b = Some(got);
            if !again || ctx.now_ms() + 5_000 > end_ms {
                break;
            }
        }
        out.extend(b);
    }
    // Every run restores and checks a backup taken under load: until one completes, another.
    let mut tries = 0;
    while !out.iter().any(|b| b.ok)
        && ctx.now_ms() + 5_000 < end_ms
        && !ctx.stopping.load(Ordering::SeqCst)
        && n < BASE_N
    {
        tries += 1;
        let live = ctx.cluster.live();
        let inst = live[rng.below(live.len() as u64) as usize];
        ctx.note(&format!(
            "no backup has completed yet: backup {n} (try {tries} after the schedule)"
        ));
        let got = take_when_ready(&ctx, n, inst).await;
        n += 1;
        out.push(got);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    out
}

/// Waits until instance `inst` is live and ready (a restarted process takes a moment to
/// listen, and a request sent before it does fails at once: seen in a 60-minute run, every
/// retry did), takes the window (no process fault starts on it while the backup streams),
/// and takes the backup.
async fn take_when_ready(ctx: &Arc<Ctx>, n: usize, inst: usize) -> Backup {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    for _ in 0..600 {
        if ctx.stopping.load(Ordering::SeqCst) {
            break;
        }
        let i = &ctx.cluster.instances[inst];
        if i.is_live() {
            let ready = http.get(format!("{}/readyz", i.url())).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (waited, _) = ctx
        .take_window(Holder::Backup, inst, Duration::from_secs(150))
        .await;
    if waited {
        // A process fault held it: the instance was restarted or continued meanwhile.
        for _ in 0..100 {
            let i = &ctx.cluster.instances[inst];
            if i.is_live()
                && http
                    .get(format!("{}/readyz", i.url()))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let b = take(ctx, n, inst).await;
    ctx.release_window(Holder::Backup);
    b
}

async fn take(ctx: &Arc<Ctx>, n: usize, instance: usize) -> Backup {
    let file = ctx.cfg.work.join(format!("backup-{n}.bin"));
    let inst = ctx.cluster.instances[instance].clone();
    let ack_seq = ctx.state.keys.lock().unwrap().ack_seq;
    let sent_ms = ctx.now_ms();
    let mut b = Backup {
        n,
        file: file.clone(),
        ack_seq,
        sent_ms,
        done_ms: 0,
        instance,
        bytes: 0,
        ok: false,
        base: false,
    };
    let http = reqwest::Client::new();
    ctx.count_op("backup");
    let deadline_ms = ctx.cfg.deadline_ms();
    let first_byte = std::sync::atomic::AtomicU64::new(0);
    // Bytes streamed so far (a backup cut off by the bound says how far it came).
    let streamed = std::sync::atomic::AtomicU64::new(0);
    let stream = tokio::time::timeout(BOUND, async {
        let r = http
            .get(format!("{}/admin/backup", inst.url()))
            .header(
                "Authorization",
                format!("Bearer {}", ctx.cluster.admin_token),
            )
            .send()
            .await
            .map_err(|e| format!("no answer: {e}"))?;
        let status = r.status().as_u16();
        let mut r = r;
        let mut f = tokio::fs::File::create(&file)
            .await
            .map_err(|e| e.to_string())?;
        let mut bytes = 0u64;
        while let Some(chunk) = r
            .chunk()
            .await
            .map_err(|e| format!("stream broke after {bytes} bytes: {e}"))?
        {
            if bytes == 0 {
                first_byte.store(ctx.now_ms(), Ordering::SeqCst);
            }
            bytes += chunk.len() as u64;
            streamed.store(bytes, Ordering::Relaxed);
            f.write_all(&chunk).await.map_err(|e| e.to_string())?;
        }
        f.flush().await.map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("status {status}"));
        }
        Ok::<u64, String>(bytes)
    });
    // Progress, watched from outside: bytes streamed, or the spool growing.
    let stalled = async {
        let mut seen = (u64::MAX, u64::MAX);
        let mut since = Instant::now();
        // One read of the spool's size at a time, off the async workers: a stat through a
        // stopped LazyFS blocks until it resumes, and a new one each second would pile up
        // blocked threads. One still blocked counts as no change and is waited on next time.
        let mut probe: Option<tokio::task::JoinHandle<u64>> = None;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let pending = probe.get_or_insert_with(|| {
                let pid = inst.pid();
                tokio::task::spawn_blocking(move || spool_bytes(pid))
            });
            let spooled = match tokio::time::timeout(Duration::from_secs(2), pending).await {
                Ok(done) => {
                    probe = None;
                    done.unwrap_or(seen.1)
                }
                Err(_) => seen.1,
            };
            let now = (streamed.load(Ordering::Relaxed), spooled);
            if now != seen {
                seen = now;
                since = Instant::now();
            } else if since.elapsed() >= STALL_BOUND {
                return now;
            }
        }
    };
    let result = tokio::select! {
        r = stream => r.map_err(|_| format!("not done within {} s", BOUND.as_secs())),
        (bytes, spooled) = stalled => Err(format!(
            "no progress for {} s ({bytes} bytes streamed, {spooled} bytes spooled)",
            STALL_BOUND.as_secs()
        )),
    };
    b.done_ms = ctx.now_ms();
    // docs/contract.md "When the storage is slow": a streamed answer is bounded by its start
    // (status and first bytes within the deadline), whatever became of the rest.
    let first = match first_byte.load(Ordering::SeqCst) {
        0 => b.done_ms,
        t => t,
    };
    ctx.check();
    if first - sent_ms > deadline_ms + 500 && !inst.disturbed_during(sent_ms, first) {
        ctx.violation(
            "backup-start",
            &format!(
                "backup {n} from instance {instance}: {} ms after the request {} (deadline {deadline_ms} ms)",
                first - sent_ms,
                if first_byte.load(Ordering::SeqCst) == 0 { "and still no byte" } else { "its first bytes came" }
            ),
        );
    }
    let disturbed = inst.disturbed_during(sent_ms, b.done_ms);
    match result {
        Ok(Ok(bytes)) => {
            b.bytes = bytes;
            b.ok = true;
            ctx.note(&format!(
                "backup {n}: {bytes} bytes from instance {instance} in {} ms",
                b.done_ms - sent_ms
            ));
        }
        Ok(Err(e)) => ctx.note(&format!(
            "backup {n} from instance {instance} failed after {} ms: {e}{}",
            b.done_ms - sent_ms,
            if disturbed {
                " (instance disturbed)"
            } else {
                ""
            }
        )),
        Err(why) => {
            ctx.check();
            if disturbed {
                ctx.note(&format!(
                    "backup {n}: {why}, instance {instance} disturbed meanwhile"
                ));
            } else {
                ctx.violation("backup-bound", &format!("backup {n} from instance {instance}: {why} (sent at {sent_ms} ms, the first byte at {} ms)", first_byte.load(Ordering::SeqCst)));
            }
        }
    }
    let line = serde_json::json!({"t": "backup", "n": n, "i": instance, "s": sent_ms, "e": b.done_ms, "ok": b.ok, "bytes": b.bytes, "ack_seq": ack_seq});
    ctx.hist.op(line);
    b
}

/// Restores every backup taken and checks it, one after another; then restore-swap, when the
/// run has it.
pub async fn verify_all(ctx: &Arc<Ctx>, backups: &[Backup]) {
    let mut counts: HashMap<usize, Value> = HashMap::new();
    let mut checked_under_load = 0;
    for b in backups.iter().filter(|b| b.ok) {
        let t = Instant::now();
        match verify_one(ctx, b).await {
            Ok((summary, c)) => {
                let line = format!(
                    "backup {} (asked of instance {} at {:.1} s{}): {summary} ({:.1} s)",
                    name(b),
                    b.instance,
                    b.sent_ms as f64 / 1000.0,
                    if b.base { ", before the workload" } else { "" },
                    t.elapsed().as_secs_f64()
                );
                println!("torture: {line}");
                ctx.note(&line);
                if !b.base {
                    checked_under_load += 1;
                }
                if let Some(c) = c {
                    counts.insert(b.n, c);
                }
            }
            Err(e) => {
                ctx.violation("restore-failed", &format!("backup {}: {e}", name(b)));
            }
        }
    }
    ctx.check();
    if checked_under_load == 0 {
        let under_load: Vec<&Backup> = backups.iter().filter(|b| !b.base).collect();
        ctx.violation(
            "no-backup-checked",
            &format!(
                "no backup taken under load was restored and checked ({} taken, {} complete)",
                under_load.len(),
                under_load.iter().filter(|b| b.ok).count()
            ),
        );
    }
    if ctx.cfg.faults.contains(&FaultKind::RestoreSwap) {
        restore_swap(ctx, backups, &counts).await;
    }
}

fn name(b: &Backup) -> String {
    if b.base {
        "base".into()
    } else {
        b.n.to_string()
    }
}

/// How long a restore may take: 600 s, and 0.5 ms more per key of `--bulk-keys` (every backup
/// carries them): a restore that writes 2,000 records a second, whatever their number, ends
/// within it (one into PostgreSQL wrote 2,659 a second at its start here).
fn restore_bound(bulk_keys: u64) -> Duration {
    Duration::from_secs(600) + Duration::from_micros(bulk_keys.saturating_mul(500))
}

/// A fresh restore target: a directory that does not exist yet (off LazyFS), or a fresh
/// database on the primary (its maintenance URL and name, to drop it after).
async fn fresh_target(
    ctx: &Ctx,
    label: &str,
) -> Result<(Vec<String>, Option<(String, String)>, PathBuf), String> {
    let cfg = &ctx.cfg;
    let d = cfg.work.join(format!("restore-{label}"));
    match cfg.engine {
        Engine::Sled => {
            let _ = std::fs::remove_dir_all(&d);
            Ok((vec!["--data-dir".into(), d.display().to_string()], None, d))
        }
        Engine::Postgres => {
            let pg = ctx.cluster.pg.as_ref().ok_or("no PostgreSQL")?;
            let name = format!("{}_r{label}", pg.db);
            let maint = pg.primary_maint_url();
            let c = crate::pg::connect(&maint).await?;
            c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
                .await
                .map_err(|e| e.to_string())?;
            c.batch_execute(&format!("CREATE DATABASE {name} OWNER {}", crate::pg::ROLE))
                .await
                .map_err(|e| e.to_string())?;
            // Restored and served as the instances' role, like the run's own database.
            Ok((
                vec!["--database-url".into(), pg.primary_role_url(&name)],
                Some((maint, name)),
                d,
            ))
        }
    }
}

async fn drop_target(ctx: &Ctx, db: Option<(String, String)>, dir: &std::path::Path) {
    if let Some((maint, name)) = db {
        if let Ok(c) = crate::pg::connect(&maint).await {
            let _ = c
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        }
    } else if !ctx.cfg.keep {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A server of the run's flags on a restored store (a key replays only where its callbackUrl
/// is still valid); the receiver does not judge what it delivers (main).
async fn serve(ctx: &Ctx, storage: &[String], idx: usize) -> Result<Arc<Instance>, String> {
    let cfg = &ctx.cfg;
    let mut args: Vec<String> = ctx.cluster.spawner.args.clone();
    strip_storage(&mut args);
    args.extend(storage.iter().cloned());
    let sp = Spawner {
        bin: cfg.bin.clone(),
        old_bin: None,
        args,
        log_dir: cfg.work.clone(),
        faketime_lib: cfg.faketime_lib.clone(),
    };
    let inst = Instance::new(idx, ctx.hist.start());
    inst.start(&sp).await?;
    Ok(inst)
}

/// The JSON object of counts `orderly restore` prints as its last line of stdout.
fn printed_counts(stdout: &[u8]) -> Option<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .filter(|v| v.is_object())
}

fn tail(bytes: &[u8], n: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    let v: Vec<&str> = s.lines().rev().take(n).collect();
    v.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Restores one backup into a fresh store, serves it and checks it: a summary, and the counts
/// the restore printed.
async fn verify_one(ctx: &Arc<Ctx>, b: &Backup) -> Result<(String, Option<Value>), String> {
    let cfg = &ctx.cfg;
    let (storage, cleanup_db, dir) = fresh_target(ctx, &name(b)).await?;
    let mut cmd = tokio::process::Command::new(&cfg.bin);
    cmd.arg("restore")
        .arg("--from")
        .arg(&b.file)
        .args(&storage)
        .kill_on_drop(true);
    let bound = restore_bound(cfg.bulk_keys);
    let out = tokio::time::timeout(bound, cmd.output())
        .await
        .map_err(|_| format!("restore did not end within {} s", bound.as_secs()))?
        .map_err(|e| e.to_string())?;
    ctx.check();
    if !out.status.success() {
        return Err(format!(
            "orderly restore exited {}: {}",
            out.status,
            tail(&out.stderr, 3)
        ));
    }
    let counts = printed_counts(&out.stdout);
    let inst = serve(ctx, &storage, 100 + b.n).await?;
    let result = check_restored(ctx, b, &inst.url()).await;
    inst.terminate(Duration::from_secs(35)).await;
    drop_target(ctx, cleanup_db, &dir).await;
    result.map(|s| (s, counts))
}

/// What the swap's watcher saw and did.
#[derive(Debug, Default)]
struct Swap {
    /// The file was replaced (after the restore closed it the first time).
    swapped: bool,
    at_ms: u64,
    /// The restore already had the file open again (the old one) when it was replaced: the
    /// swap came too late to be read.
    reopened_before: bool,
    why_not: String,
}

/// Watches `path` with inotify; when the process that `pid` will hold closes it for the first
/// time (its first pass ended), stops it (SIGSTOP), renames `next` over `path`, looks whether
/// it already holds the old file again, and continues it. Gives up when `stop` is set.
fn watch_and_swap(
    ctx: Arc<Ctx>,
    path: PathBuf,
    next: PathBuf,
    pid: Arc<AtomicI32>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    fd: i32,
) -> Swap {
    let mut out = Swap::default();
    let mut buf = [0u8; 4096];
    let mut opens = 0u32;
    loop {
        if stop.load(Ordering::SeqCst) {
            out.why_not = format!("the restore ended before it closed the file ({opens} opens)");
            break;
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of an inotify descriptor this function owns.
        let r = unsafe { libc::poll(&mut pfd, 1, 100) };
        if r <= 0 {
            continue;
        }
        // SAFETY: reads into a buffer of its own length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if n <= 0 {
            continue;
        }
        let mut off = 0usize;
        let mut closed = false;
        let head = std::mem::size_of::<libc::inotify_event>();
        while off + head <= n as usize {
            // SAFETY: the kernel wrote whole events; read_unaligned copes with the buffer's
            // alignment.
            let ev: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(buf.as_ptr().add(off) as *const _) };
            if ev.mask & libc::IN_OPEN != 0 {
                opens += 1;
            }
            if ev.mask & (libc::IN_CLOSE_NOWRITE | libc::IN_CLOSE_WRITE) != 0 {
                closed = true;
            }
            off += head + ev.len as usize;
        }
        if !closed {
            continue;
        }
        let mut p = pid.load(Ordering::SeqCst);
        for _ in 0..100 {
            if p > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            p = pid.load(Ordering::SeqCst);
        }
        crate::cluster::signal(p, libc::SIGSTOP);
        let renamed = std::fs::rename(&next, &path);
        out.at_ms = ctx.now_ms();
        let old = format!("{} (deleted)", path.display());
        out.reopened_before = std::fs::read_dir(format!("/proc/{p}/fd"))
            .map(|rd| {
                rd.flatten()
                    .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == old))
            })
            .unwrap_or(false);
        crate::cluster::signal(p, libc::SIGCONT);
        match renamed {
            Ok(()) => out.swapped = true,
            Err(e) => out.why_not = format!("rename: {e}"),
        }
        break;
    }
    // SAFETY: closes the descriptor this function was given to own.
    unsafe {
        libc::close(fd);
    }
    out
}

/// restore-swap: `orderly restore --from P`, P a copy of backup A, and backup B (the base
/// backup, taken before the workload: other keys, other counts) renamed over P after the
/// restore's first pass closed it and before its second pass opens it again. The restore must
/// refuse (exit 1, the target left empty) or restore exactly A: the counts it printed are
/// A's (as A's own clean restore printed them) and every key acknowledged before A was asked
/// for replays there. Anything else (B, or a mix) is `restore-swap`.
async fn restore_swap(ctx: &Arc<Ctx>, backups: &[Backup], counts: &HashMap<usize, Value>) {
    let start = ctx.now_ms();
    let mut rng = Rng::stream(ctx.cfg.seed, "restore-swap", 0);
    let under_load: Vec<&Backup> = backups
        .iter()
        .filter(|b| b.ok && !b.base && counts.contains_key(&b.n))
        .collect();
    let pick_b = |a: &Backup| -> Option<&Backup> {
        backups
            .iter()
            .filter(|b| b.ok && b.n != a.n && counts.contains_key(&b.n))
            .filter(|b| counts.get(&b.n) != counts.get(&a.n))
            .min_by_key(|b| (!b.base, b.sent_ms))
    };
    let pair = if under_load.is_empty() {
        None
    } else {
        let a = under_load[rng.below(under_load.len() as u64) as usize];
        pick_b(a).map(|b| (a, b))
    };
    let Some((a, b)) = pair else {
        let why = "no two restored backups with different counts to swap (one under load, another taken at another time): not injected";
        println!("torture: restore-swap: {why}");
        ctx.note(&format!("restore-swap: {why}"));
        return;
    };
    let target_label = format!("backup {} swapped for backup {}", name(a), name(b));
    let (info, violation) = match swap_once(ctx, a, b, counts).await {
        Ok(r) => r,
        Err(e) => (format!("could not run: {e}"), None),
    };
    let end = ctx.now_ms();
    ctx.count_fault("restore-swap");
    ctx.hist
        .fault("restore-swap", &target_label, start, end, &info);
    println!(
        "torture: {:>7.1}s fault restore-swap {target_label} ({:.1} s): {info}",
        start as f64 / 1000.0,
        (end - start) as f64 / 1000.0
    );
    if let Some(v) = violation {
        ctx.violation("restore-swap", &v);
    }
}

/// One swapped restore: the note, and the violation if any.
async fn swap_once(
    ctx: &Arc<Ctx>,
    a: &Backup,
    b: &Backup,
    counts: &HashMap<usize, Value>,
) -> Result<(String, Option<String>), String> {
    let cfg = &ctx.cfg;
    let dir = cfg.work.join("swap");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("backup-{}.bin", name(a)));
    let next = dir.join(format!("next-{}.bin", name(b)));
    std::fs::copy(&a.file, &path).map_err(|e| format!("copying backup {}: {e}", name(a)))?;
    std::fs::copy(&b.file, &next).map_err(|e| format!("copying backup {}: {e}", name(b)))?;
    let (storage, cleanup_db, target_dir) = fresh_target(ctx, "swap").await?;
    // The watch is in place before the restore starts.
    let cpath = std::ffi::CString::new(path.display().to_string()).map_err(|e| e.to_string())?;
    // SAFETY: plain inotify calls on a path this function made.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    if fd < 0 {
        return Err(format!("inotify: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    let wd = unsafe {
        libc::inotify_add_watch(
            fd,
            cpath.as_ptr(),
            libc::IN_OPEN | libc::IN_CLOSE_NOWRITE | libc::IN_CLOSE_WRITE,
        )
    };
    if wd < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closes the descriptor just opened.
        unsafe { libc::close(fd) };
        return Err(format!("inotify watch: {e}"));
    }
    let pid = Arc::new(AtomicI32::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (ctx, path, next, pid, stop) = (
            ctx.clone(),
            path.clone(),
            next.clone(),
            pid.clone(),
            stop.clone(),
        );
        tokio::task::spawn_blocking(move || watch_and_swap(ctx, path, next, pid, stop, fd))
    };
    let mut cmd = tokio::process::Command::new(&cfg.bin);
    cmd.arg("restore")
        .arg("--from")
        .arg(&path)
        .args(&storage)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", cfg.bin.display()))?;
    pid.store(child.id().unwrap_or(0) as i32, Ordering::SeqCst);
    let bound = restore_bound(cfg.bulk_keys);
    let out = tokio::time::timeout(bound, child.wait_with_output()).await;
    stop.store(true, Ordering::SeqCst);
    let swap = watcher.await.map_err(|e| e.to_string())?;
    let out = out
        .map_err(|_| format!("the restore did not end within {} s", bound.as_secs()))?
        .map_err(|e| e.to_string())?;
    ctx.check();
    let when = if !swap.swapped {
        format!("not replaced ({})", swap.why_not)
    } else if swap.reopened_before {
        format!(
            "replaced at {} ms, after the restore had opened it again (too late to be read)",
            swap.at_ms
        )
    } else {
        format!(
            "replaced at {} ms, between the restore's check of it and its second reading",
            swap.at_ms
        )
    };
    let a_counts = counts.get(&a.n).cloned().unwrap_or(Value::Null);
    let b_counts = counts.get(&b.n).cloned().unwrap_or(Value::Null);
    let mut violation = None;
    let outcome;
    if !out.status.success() {
        // A refusal is a right answer if it left nothing behind.
        let inst = serve(ctx, &storage, 150).await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        let accounts = list_all(
            &http,
            &inst.url(),
            &ctx.cluster.admin_token,
            "/admin/accounts",
            "accounts",
        )
        .await;
        inst.terminate(Duration::from_secs(35)).await;
        match accounts {
            Ok(v) if v.is_empty() => {
                outcome = format!(
                    "refused ({}: {}), the target left empty",
                    out.status,
                    tail(&out.stderr, 1)
                );
            }
            Ok(v) => {
                outcome = format!(
                    "refused ({}), yet the target holds {} accounts",
                    out.status,
                    v.len()
                );
                violation = Some(format!(
                    "the restore of backup {} (its file {when}) exited {} and left {} accounts in its target (a refusal must leave it empty)",
                    name(a),
                    out.status,
                    v.len()
                ));
            }
            Err(e) => return Err(format!("reading the refused target: {e}")),
        }
    } else {
        let printed = printed_counts(&out.stdout).unwrap_or(Value::Null);
        // What the target holds: every key acknowledged before A was asked for.
        let inst = serve(ctx, &storage, 150).await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        // A sample: the counts say the most; the keys say what the target holds.
        let mut items: Vec<ReplayItem> = crate::checks::acked_items(ctx, Some(a.ack_seq));
        if items.len() > 2_000 {
            let mut rng = Rng::stream(ctx.cfg.seed, "swap-sample", a.n as u64);
            rng.shuffle(&mut items);
            items.truncate(2_000);
        }
        let n_keys = items.len();
        let (bad, examples) = crate::checks::replay_quietly(ctx, &http, &inst.url(), items).await;
        inst.terminate(Duration::from_secs(35)).await;
        let counts_ok = printed == a_counts;
        let holds = if printed == b_counts && !counts_ok {
            format!(" (backup {}'s)", name(b))
        } else {
            String::new()
        };
        outcome = format!(
            "exited 0, printed counts {}{holds}; {} of {n_keys} keys of backup {} replay",
            if counts_ok {
                "equal to A's"
            } else {
                "other than A's"
            },
            n_keys - bad,
            name(a)
        );
        if !counts_ok || bad > 0 {
            violation = Some(format!(
                "the restore of backup {} (taken at {:.1} s; its file {when} by backup {}, taken at {:.1} s) exited 0 and restored something else: it printed {printed}{holds}, backup {}'s own restore printed {a_counts}; {bad} of {n_keys} keys acknowledged before backup {} was asked for do not replay there{}",
                name(a),
                a.sent_ms as f64 / 1000.0,
                name(b),
                b.sent_ms as f64 / 1000.0,
                name(a),
                name(a),
                if examples.is_empty() { String::new() } else { format!(" (first: {})", examples.join("; ")) }
            ));
        }
    }
    drop_target(ctx, cleanup_db, &target_dir).await;
    if !cfg.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok((format!("its file {when}; the restore {outcome}"), violation))
}

fn strip_storage(args: &mut Vec<String>) {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args.drain(..) {
        if skip {
            skip = false;
            continue;
        }
        if a == "--data-dir" || a == "--database-url" {
            skip = true;
            continue;
        }
        out.push(a);
    }
    *args = out;
}

async fn check_restored(ctx: &Arc<Ctx>, b: &Backup, base: &str) -> Result<String, String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    // Every key acknowledged before the backup was asked for (a sample of the prefill, which
    // the end of the run replays too).
    let mut items: Vec<ReplayItem> = crate::checks::acked_items(ctx, Some(b.ack_seq));
    let cap = 20_000;
    if items.len() > cap {
        let mut rng = Rng::stream(ctx.cfg.seed, "backup-sample", b.n as u64);
        rng.shuffle(&mut items);
        items.truncate(cap);
    }
    let n_keys = items.len();
    let bad = direct_replay(
        ctx,
        &http,
        base,
        items,
        "backup-replay",
        &format!("backup {} restored", name(b)),
    )
    .await;
    // Every ledger sums to its balance there.
    let accounts = list_all(
        &http,
        base,
        &ctx.cluster.admin_token,
        "/admin/accounts",
        "accounts",
    )
    .await?;
    let mut ledgers_bad = 0;
    for a in &accounts {
        let id = a["id"].as_str().unwrap_or("");
        let balance = a["balance"].as_i64().unwrap_or(0);
        let entries = list_all(
            &http,
            base,
            &ctx.cluster.admin_token,
            &format!("/admin/accounts/{id}/transactions"),
            "transactions",
        )
        .await?;
        let sum: i64 = entries
            .iter()
            .map(|e| e["amount"].as_i64().unwrap_or(0))
            .sum();
        ctx.check();
        if sum != balance {
            ledgers_bad += 1;
            ctx.violation(
                "backup-ledger",
                &format!("backup {} restored: account {id}'s ledger sums to {sum}, its balance is {balance} ({} entries)", name(b), entries.len()),
            );
        }
    }
    Ok(format!(
        "restored; {n_keys} keys replayed ({bad} wrong), {} ledgers ({ledgers_bad} wrong)",
        accounts.len()
    ))
}
