//! Backups taken while the workload and the faults run (`GET /admin/backup`, status and first
//! bytes within the deadline, the whole within `BOUND`), and, after the run, each restored into
//! a fresh store (`orderly restore`) and served: every key acknowledged before the backup was
//! requested must replay byte for byte, and every ledger must sum to its balance (one instant).

use crate::checks::{direct_replay, list_all, ReplayItem};
use crate::cluster::{Instance, Spawner};
use crate::ctx::{Ctx, Engine};
use crate::pg::with_db;
use crate::rng::Rng;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// A backup that has not finished by then never will, for a store of this run's size.
const BOUND: Duration = Duration::from_secs(120);

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
}

/// Takes `count` backups at times the seed draws over the run.
pub async fn run_schedule(ctx: Arc<Ctx>, count: u32, end_ms: u64) -> Vec<Backup> {
    let mut rng = Rng::stream(ctx.cfg.seed, "backups", 0);
    let total = ctx.cfg.duration.as_millis() as u64;
    let mut at: Vec<u64> = (0..count)
        .map(|_| rng.range(total / 10, total * 85 / 100))
        .collect();
    at.sort_unstable();
    let mut out = Vec::new();
    for (n, t) in at.into_iter().enumerate() {
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
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("client");
        for _ in 0..2 {
            // Live is not enough: a restarted process takes a moment to listen, and a retry
            // sent before it does fails at once (seen in a 60-minute run: every retry did).
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
            let got = take(&ctx, n, inst).await;
            let again =
                !got.ok && ctx.cluster.instances[inst].disturbed_during(got.sent_ms, got.done_ms);
            b = Some(got);
            if !again || ctx.now_ms() + 5_000 > end_ms {
                break;
            }
        }
        out.extend(b);
    }
    out
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
    };
    let http = reqwest::Client::new();
    ctx.count_op("backup");
    let deadline_ms = ctx.cfg.deadline_ms();
    let first_byte = std::sync::atomic::AtomicU64::new(0);
    let result = tokio::time::timeout(BOUND, async {
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
            f.write_all(&chunk).await.map_err(|e| e.to_string())?;
        }
        f.flush().await.map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("status {status}"));
        }
        Ok::<u64, String>(bytes)
    })
    .await;
    b.done_ms = ctx.now_ms();
    // contract §23: a streamed answer is bounded by its start (status and first bytes within the
    // deadline), whatever became of the rest.
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
        Err(_) => {
            ctx.check();
            if disturbed {
                ctx.note(&format!(
                    "backup {n}: not done within {} s, instance {instance} disturbed meanwhile",
                    BOUND.as_secs()
                ));
            } else {
                ctx.violation("backup-bound", &format!("backup {n} from instance {instance} did not finish within {} s (sent at {sent_ms} ms)", BOUND.as_secs()));
            }
        }
    }
    let line = serde_json::json!({"t": "backup", "n": n, "i": instance, "s": sent_ms, "e": b.done_ms, "ok": b.ok, "bytes": b.bytes, "ack_seq": ack_seq});
    ctx.hist.op(line);
    b
}

/// Restores every backup taken and checks it, one after another.
pub async fn verify_all(ctx: &Arc<Ctx>, backups: &[Backup]) {
    for b in backups.iter().filter(|b| b.ok) {
        let t = Instant::now();
        match verify_one(ctx, b).await {
            Ok(summary) => {
                let line = format!(
                    "backup {} (asked of instance {} at {:.1} s): {summary} ({:.1} s)",
                    b.n,
                    b.instance,
                    b.sent_ms as f64 / 1000.0,
                    t.elapsed().as_secs_f64()
                );
                println!("torture: {line}");
                ctx.note(&line);
            }
            Err(e) => {
                ctx.violation("restore-failed", &format!("backup {}: {e}", b.n));
            }
        }
    }
}

async fn verify_one(ctx: &Arc<Ctx>, b: &Backup) -> Result<String, String> {
    let cfg = &ctx.cfg;
    // The target: a fresh directory (off LazyFS), or a fresh database on the primary.
    let (storage, cleanup_db): (Vec<String>, Option<(String, String)>) = match cfg.engine {
        Engine::Sled => {
            let d = cfg.work.join(format!("restore-{}", b.n));
            (vec!["--data-dir".into(), d.display().to_string()], None)
        }
        Engine::Postgres => {
            let pg = ctx.cluster.pg.as_ref().ok_or("no PostgreSQL")?;
            let name = format!("{}_r{}", pg.db, b.n);
            let maint = pg.primary_maint_url();
            let c = crate::pg::connect(&maint).await?;
            c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
                .await
                .map_err(|e| e.to_string())?;
            c.batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .map_err(|e| e.to_string())?;
            (
                vec!["--database-url".into(), with_db(&maint, &name)],
                Some((maint, name)),
            )
        }
    };
    let mut cmd = tokio::process::Command::new(&cfg.bin);
    cmd.arg("restore")
        .arg("--from")
        .arg(&b.file)
        .args(&storage)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(600), cmd.output())
        .await
        .map_err(|_| "restore did not end within 600 s".to_string())?
        .map_err(|e| e.to_string())?;
    ctx.check();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "orderly restore exited {}: {}",
            out.status,
            err.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
        ));
    }
    // A server on the restored store, with the run's flags (a key replays only where its
    // callbackUrl is still valid); the receiver stops judging what it delivers (main).
    let mut args: Vec<String> = ctx.cluster.spawner.args.clone();
    strip_storage(&mut args);
    args.extend(storage.iter().cloned());
    let sp = Spawner {
        bin: cfg.bin.clone(),
        args,
        log_dir: cfg.work.clone(),
        faketime_lib: cfg.faketime_lib.clone(),
    };
    let inst = Instance::new(100 + b.n, ctx.hist.start());
    inst.start(&sp).await?;
    let result = check_restored(ctx, b, &inst.url()).await;
    inst.terminate(Duration::from_secs(35)).await;
    if let Some((maint, name)) = cleanup_db {
        if let Ok(c) = crate::pg::connect(&maint).await {
            let _ = c
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        }
    } else if !cfg.keep {
        let _ = std::fs::remove_dir_all(cfg.work.join(format!("restore-{}", b.n)));
    }
    result
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
        &format!("backup {} restored", b.n),
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
                &format!("backup {} restored: account {id}'s ledger sums to {sum}, its balance is {balance} ({} entries)", b.n, entries.len()),
            );
        }
    }
    Ok(format!(
        "restored; {n_keys} keys replayed ({bad} wrong), {} ledgers ({ledgers_bad} wrong)",
        accounts.len()
    ))
}
