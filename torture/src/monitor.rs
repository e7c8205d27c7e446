//! What runs beside the workload every second: the watchdog (no answer from a live, unpaused
//! instance for deadline + 5 s is a hang), deaths the harness did not cause, resident memory
//! against `--max-rss`, and writes that stopped completing while no fault was in force.

use crate::ctx::Ctx;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// No write completed for this long while writes were being sent and no fault was in force:
/// the shop has stopped.
const WRITES_STOPPED_MS: u64 = 30_000;

/// Runs until aborted (main stops it after the end-of-run checks).
pub async fn run(ctx: Arc<Ctx>) {
    let n = ctx.cluster.instances.len();
    let mut hang_reported = vec![0u64; n];
    let mut rss_reported = vec![false; n];
    let mut stopped_reported = vec![0u64; n];
    let limit_kib = ctx.cfg.max_rss_mib * 1024;
    let hang_ms = ctx.cfg.deadline_ms() + 5_000;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = ctx.now_ms();
        for (k, i) in ctx.cluster.instances.iter().enumerate() {
            // Deaths: an exit the harness did not cause.
            for e in i.take_unreported_exits() {
                ctx.check();
                let log = ctx.cfg.work.join(format!("instance-{k}.log"));
                let len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
                let tail = crate::cluster::log_tail(&log, len.saturating_sub(4096), 6);
                ctx.violation(
                    "instance-died",
                    &format!(
                        "instance {k} exited by itself at {} ms (code {:?}, signal {:?}): {tail}",
                        e.at_ms, e.code, e.signal
                    ),
                );
                if !ctx.stopping.load(Ordering::SeqCst) {
                    if let Err(err) = i.start(&ctx.cluster.spawner).await {
                        ctx.violation(
                            "restart-failed",
                            &format!("instance {k} after its death: {err}"),
                        );
                    }
                }
            }
            if !i.is_running() {
                continue;
            }
            // Memory.
            let rss = crate::cluster::rss_kib(i.pid());
            i.rss_peak_kib.fetch_max(rss, Ordering::Relaxed);
            ctx.check();
            if rss > limit_kib && !rss_reported[k] {
                rss_reported[k] = true;
                ctx.violation(
                    "memory",
                    &format!(
                        "instance {k}: resident {} MiB, over --max-rss {} MiB",
                        rss / 1024,
                        ctx.cfg.max_rss_mib
                    ),
                );
            } else if rss < limit_kib * 9 / 10 {
                rss_reported[k] = false;
            }
            if !i.is_live() {
                continue;
            }
            // The watchdog: requests in flight, none answered for deadline + 5 s, on a live
            // instance not disturbed meanwhile.
            let (_, oldest_any) = i.oldest_inflight();
            if let Some(oldest) = oldest_any {
                let last = i.last_answer_ms.load(Ordering::Relaxed);
                let since = oldest.max(last).max(i.last_disturbance_end());
                ctx.check();
                if now.saturating_sub(since) > hang_ms
                    && hang_reported[k] != last
                    && !i.disturbed_during(since, now)
                {
                    hang_reported[k] = last;
                    ctx.violation(
                        "hang",
                        &format!("instance {k}: no answer to anything for {} ms while requests waited (oldest sent at {oldest} ms)", now - since),
                    );
                }
            }
            // Writes that stopped completing with no fault to explain it.
            let done = i.last_write_done_ms.load(Ordering::Relaxed);
            let sent = i.last_write_sent_ms.load(Ordering::Relaxed);
            let quiet_since = i
                .last_disturbance_end()
                .max(ctx.quiet_after_ms.load(Ordering::SeqCst));
            let from = done.max(quiet_since);
            if !ctx.faults_busy()
                && sent > from + WRITES_STOPPED_MS
                && now > from + WRITES_STOPPED_MS
                && stopped_reported[k] != done
            {
                stopped_reported[k] = done;
                ctx.check();
                ctx.violation(
                    "writes-stopped",
                    &format!("instance {k}: no write completed for {} ms while writes were sent and no fault was in force", now - from),
                );
            }
        }
    }
}
