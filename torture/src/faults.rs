//! The fault schedule and each fault. The seed draws two sequences: the storage and process
//! faults, one at a time with quiet time between (so each check knows what it is judging), and
//! the receiver's stalls, which may overlap them (a slow receiver during a stalled heartbeat
//! is what lets two instances deliver one webhook). Each fault is a history line with its start
//! and end; a storage stall also watches `/readyz` on every instance.

use crate::cluster::LaunchMods;
use crate::ctx::{Ctx, Engine};
use crate::model::stale_ready;
use crate::receiver::{Mode, Receiver};
use crate::rng::Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    Kill,
    Pause,
    ReceiverStall,
    PowerLoss,
    DiskStall,
    DiskFull,
    LostStandby,
    RowsHeld,
    ConnCut,
    ClockStep,
    Failover,
}

pub const ALL: [FaultKind; 11] = [
    FaultKind::Kill,
    FaultKind::Pause,
    FaultKind::ReceiverStall,
    FaultKind::PowerLoss,
    FaultKind::DiskStall,
    FaultKind::DiskFull,
    FaultKind::LostStandby,
    FaultKind::RowsHeld,
    FaultKind::ConnCut,
    FaultKind::ClockStep,
    FaultKind::Failover,
];

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::ReceiverStall => "receiver-stall",
            FaultKind::PowerLoss => "power-loss",
            FaultKind::DiskStall => "disk-stall",
            FaultKind::DiskFull => "disk-full",
            FaultKind::LostStandby => "lost-standby",
            FaultKind::RowsHeld => "rows-held",
            FaultKind::ConnCut => "conn-cut",
            FaultKind::ClockStep => "clock-step",
            FaultKind::Failover => "failover",
        }
    }

    pub fn parse(s: &str) -> Option<FaultKind> {
        ALL.iter().copied().find(|k| k.name() == s)
    }

    /// The engine this fault applies to (None: both).
    pub fn engine(self) -> Option<Engine> {
        match self {
            FaultKind::PowerLoss | FaultKind::DiskStall | FaultKind::DiskFull => Some(Engine::Sled),
            FaultKind::LostStandby
            | FaultKind::RowsHeld
            | FaultKind::ConnCut
            | FaultKind::Failover => Some(Engine::Postgres),
            _ => None,
        }
    }

    /// Relative weight in the schedule.
    fn weight(self) -> u32 {
        match self {
            FaultKind::Kill => 3,
            FaultKind::Pause => 4,
            FaultKind::PowerLoss => 2,
            FaultKind::DiskStall => 3,
            FaultKind::DiskFull => 1,
            FaultKind::LostStandby => 4,
            FaultKind::RowsHeld => 6,
            FaultKind::ConnCut => 3,
            FaultKind::ClockStep => 1,
            FaultKind::Failover => 1,
            FaultKind::ReceiverStall => 0,
        }
    }
}

/// One planned fault: the quiet time before it, what, on which instance, how long, and a
/// draw for its variant.
#[derive(Clone, Debug)]
pub struct Planned {
    pub gap_ms: u64,
    pub kind: FaultKind,
    pub target: u64,
    pub dur_ms: u64,
    pub variant: u64,
}

/// The two sequences a seed decides (longer than any run uses: a run stops taking from them).
pub fn schedule(seed: u64, kinds: &[FaultKind]) -> (Vec<Planned>, Vec<Planned>) {
    let mut rng = Rng::stream(seed, "faults", 0);
    let main_kinds: Vec<FaultKind> = kinds
        .iter()
        .copied()
        .filter(|k| *k != FaultKind::ReceiverStall)
        .collect();
    let weights: Vec<u32> = main_kinds.iter().map(|k| k.weight()).collect();
    let mut main = Vec::new();
    if !main_kinds.is_empty() {
        for _ in 0..2000 {
            let kind = main_kinds[rng.weighted(&weights)];
            let dur_ms = match kind {
                FaultKind::Pause => rng.range(1_000, 6_000),
                FaultKind::DiskStall => rng.range(3_000, 20_000),
                FaultKind::LostStandby => rng.range(3_000, 20_000),
                FaultKind::RowsHeld => rng.range(2_000, 8_000),
                FaultKind::ConnCut => rng.range(2_000, 10_000),
                FaultKind::ClockStep => rng.range(20_000, 60_000),
                FaultKind::Kill | FaultKind::PowerLoss => rng.range(0, 2_000),
                _ => 0,
            };
            main.push(Planned {
                gap_ms: rng.range(3_000, 12_000),
                kind,
                target: rng.next_u64(),
                dur_ms,
                variant: rng.next_u64(),
            });
        }
    }
    let mut recv = Vec::new();
    if kinds.contains(&FaultKind::ReceiverStall) {
        let mut r2 = Rng::stream(seed, "receiver-faults", 0);
        for _ in 0..2000 {
            recv.push(Planned {
                gap_ms: r2.range(2_000, 15_000),
                kind: FaultKind::ReceiverStall,
                target: 0,
                dur_ms: r2.range(5_000, 30_000),
                variant: r2.next_u64(),
            });
        }
    }
    (main, recv)
}

/// Sleeps `ms`, waking early when the faults must stop. Returns false if stopped.
async fn nap(ctx: &Ctx, ms: u64) -> bool {
    let until = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < until {
        if ctx.faults_stopping.load(Ordering::SeqCst) {
            return false;
        }
        let left = until
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        tokio::time::sleep(left).await;
    }
    true
}

/// The main sequence, until the run's end (no fault starts in its last 15 s).
pub async fn run_main(ctx: Arc<Ctx>, plan: Vec<Planned>, end_ms: u64) {
    let warmup = (ctx.cfg.duration.as_millis() as u64 / 10).clamp(3_000, 15_000);
    if !nap(&ctx, warmup).await {
        return;
    }
    for p in plan {
        if !nap(&ctx, p.gap_ms).await {
            return;
        }
        if ctx.now_ms() + p.dur_ms + 15_000 > end_ms {
            return;
        }
        let start = ctx.now_ms();
        ctx.fault_begin();
        let (target, info) = run_one(&ctx, &p).await;
        let end = ctx.now_ms();
        ctx.fault_end(10_000);
        ctx.count_fault(p.kind.name());
        ctx.hist.fault(p.kind.name(), &target, start, end, &info);
        println!(
            "torture: {:>7.1}s fault {} {target} ({:.1} s){}",
            start as f64 / 1000.0,
            p.kind.name(),
            (end - start) as f64 / 1000.0,
            if info.is_empty() {
                String::new()
            } else {
                format!(": {info}")
            }
        );
        // Every instance back and ready before the next fault (bounded).
        recover(&ctx).await;
    }
}

/// The receiver's stalls, overlapping the main sequence.
pub async fn run_receiver(ctx: Arc<Ctx>, recv: Arc<Receiver>, plan: Vec<Planned>, end_ms: u64) {
    for p in plan {
        if !nap(&ctx, p.gap_ms).await {
            break;
        }
        if ctx.now_ms() + p.dur_ms + 15_000 > end_ms {
            break;
        }
        let start = ctx.now_ms();
        let (mode, label) = if p.variant % 3 == 0 {
            (Mode::Hold, "no answer")
        } else {
            (Mode::Slow(Duration::from_secs(8)), "answers after 8 s")
        };
        recv.set_mode(mode);
        let _ = nap(&ctx, p.dur_ms).await;
        recv.set_mode(Mode::Normal);
        let end = ctx.now_ms();
        ctx.count_fault("receiver-stall");
        ctx.hist
            .fault("receiver-stall", "receiver", start, end, label);
    }
    recv.set_mode(Mode::Normal);
}

/// Restarts what is down, continues what is stopped, waits for /readyz 200 everywhere.
/// Returns the instances still not ready after 60 s.
pub async fn recover(ctx: &Arc<Ctx>) -> Vec<usize> {
    for i in &ctx.cluster.instances {
        if i.is_paused() {
            i.resume();
        }
        if !i.is_running() {
            if let Err(e) = i.start(&ctx.cluster.spawner).await {
                ctx.violation("restart-failed", &format!("instance {}: {e}", i.idx));
            }
        }
    }
    if let Some(l) = &ctx.cluster.lazyfs {
        l.cont();
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let mut not_ready = Vec::new();
        for i in &ctx.cluster.instances {
            let ok = http
                .get(format!("{}/readyz", i.url()))
                .send()
                .await
                .map(|r| r.status().is_success())
                .unwrap_or(false);
            if !ok {
                not_ready.push(i.idx);
            }
        }
        if not_ready.is_empty() || Instant::now() > until {
            return not_ready;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs one fault to its end; returns its target and a note for the history.
async fn run_one(ctx: &Arc<Ctx>, p: &Planned) -> (String, String) {
    let n = ctx.cluster.instances.len() as u64;
    let inst = ctx.cluster.instances[(p.target % n) as usize].clone();
    let sp = &ctx.cluster.spawner;
    match p.kind {
        FaultKind::Kill => {
            inst.kill9().await;
            nap(ctx, p.dur_ms).await;
            let t = Instant::now();
            let r = inst.start(sp).await;
            (
                format!("instance {}", inst.idx),
                restart_note(ctx, inst.idx, r, t),
            )
        }
        FaultKind::Pause => {
            inst.pause();
            // A pause is held even when the run is stopping: SIGCONT comes after the nap.
            nap(ctx, p.dur_ms).await;
            inst.resume();
            (format!("instance {}", inst.idx), String::new())
        }
        FaultKind::PowerLoss => {
            let Some(l) = &ctx.cluster.lazyfs else {
                return ("instance 0".into(), "no LazyFS".into());
            };
            inst.kill9().await;
            let cleared = l.clear_cache().await;
            nap(ctx, p.dur_ms).await;
            let t = Instant::now();
            let r = inst.start(sp).await;
            let mut note = restart_note(ctx, inst.idx, r, t);
            if let Err(e) = cleared {
                note = format!("{note}; clear-cache: {e}");
            }
            (format!("instance {}", inst.idx), note)
        }
        FaultKind::DiskStall => {
            let Some(l) = &ctx.cluster.lazyfs else {
                return ("disk".into(), "no LazyFS".into());
            };
            let watch = ReadyWatch::start(ctx);
            l.stop();
            nap(ctx, p.dur_ms).await;
            l.cont();
            watch.ended();
            let note = watch.finish().await;
            ("disk".into(), note)
        }
        FaultKind::DiskFull => disk_full(ctx, &inst).await,
        FaultKind::LostStandby => {
            let Some(pg) = &ctx.cluster.pg else {
                return ("standby".into(), "no PostgreSQL".into());
            };
            let maint = pg.primary_maint_url();
            let healthy = pg.sync_names.lock().unwrap().clone();
            if let Err(e) = crate::pg::set_sync_names(&maint, "torture_ghost").await {
                return ("standby".into(), format!("could not set: {e}"));
            }
            let watch = ReadyWatch::start(ctx);
            nap(ctx, p.dur_ms).await;
            let reset = crate::pg::set_sync_names(&maint, &healthy).await;
            watch.ended();
            let mut note = watch.finish().await;
            if let Err(e) = reset {
                ctx.violation(
                    "harness",
                    &format!("could not reset synchronous_standby_names: {e}"),
                );
                note.push_str(" (reset failed)");
            }
            ("standby".into(), note)
        }
        FaultKind::RowsHeld => {
            let Some(pg) = &ctx.cluster.pg else {
                return ("rows".into(), "no PostgreSQL".into());
            };
            let which_auth = p.variant % 2 == 0;
            let hot = ctx.state.account(crate::setup::HOT).id;
            let target = if which_auth {
                "auth_cache_version".to_string()
            } else {
                format!("balances of {hot}")
            };
            let c = match crate::pg::connect(&pg.primary_db_url()).await {
                Ok(c) => c,
                Err(e) => return (target, format!("could not connect: {e}")),
            };
            let q = if which_auth {
                "SELECT version FROM auth_cache_version FOR UPDATE".to_string()
            } else {
                format!("SELECT available FROM balances WHERE account_id = '{hot}' FOR UPDATE")
            };
            if let Err(e) = c
                .batch_execute(&format!("SET lock_timeout = '10s'; BEGIN; {q}"))
                .await
            {
                return (target, format!("could not take the rows: {e}"));
            }
            let watch = ReadyWatch::start(ctx);
            nap(ctx, p.dur_ms).await;
            let _ = c.batch_execute("ROLLBACK").await;
            drop(c);
            watch.ended();
            (target, watch.finish().await)
        }
        FaultKind::ConnCut => {
            let Some(pg) = &ctx.cluster.pg else {
                return ("connections".into(), "no PostgreSQL".into());
            };
            if p.variant % 2 == 0 {
                for px in &pg.proxies {
                    px.cut_all();
                }
                ("connections".into(), "every open connection reset".into())
            } else {
                for px in &pg.proxies {
                    px.set_blackhole(true);
                }
                let watch = ReadyWatch::start(ctx);
                nap(ctx, p.dur_ms).await;
                for px in &pg.proxies {
                    px.set_blackhole(false);
                }
                watch.ended();
                let note = watch.finish().await;
                ("connections".into(), format!("forwarding stopped; {note}"))
            }
        }
        FaultKind::ClockStep => {
            let offset = if p.variant % 2 == 0 { "+10m" } else { "-10m" };
            let t = Instant::now();
            if let Some(e) = inst.terminate(Duration::from_secs(35)).await {
                check_stop(ctx, inst.idx, &e, t);
            }
            inst.set_mods(LaunchMods {
                faketime: Some(offset.into()),
                ..Default::default()
            });
            let r = inst.start(sp).await;
            let mut note = restart_note(ctx, inst.idx, r, t);
            nap(ctx, p.dur_ms).await;
            let t = Instant::now();
            if let Some(e) = inst.terminate(Duration::from_secs(35)).await {
                check_stop(ctx, inst.idx, &e, t);
            }
            inst.set_mods(LaunchMods::default());
            let r = inst.start(sp).await;
            note = format!(
                "clock {offset} for {} s; {note}; back: {}",
                p.dur_ms / 1000,
                restart_note(ctx, inst.idx, r, t)
            );
            (format!("instance {}", inst.idx), note)
        }
        FaultKind::Failover => {
            let Some(pg) = &ctx.cluster.pg else {
                return ("primary".into(), "no PostgreSQL".into());
            };
            match pg.failover().await {
                Ok(note) => ("primary".into(), note),
                Err(e) => {
                    ctx.violation("harness", &format!("failover could not run: {e}"));
                    ("primary".into(), format!("failed: {e}"))
                }
            }
        }
        FaultKind::ReceiverStall => ("receiver".into(), "on its own track".into()),
    }
}

fn restart_note(ctx: &Ctx, idx: usize, r: Result<(), String>, t: Instant) -> String {
    match r {
        Ok(()) => format!("restarted in {:.1} s", t.elapsed().as_secs_f64()),
        Err(e) => {
            ctx.violation("restart-failed", &format!("instance {idx}: {e}"));
            format!("restart failed: {e}")
        }
    }
}

/// contract §23: a stop is bounded (30 s) whatever the storage does.
fn check_stop(ctx: &Ctx, idx: usize, e: &crate::cluster::Exit, t: Instant) {
    ctx.check();
    let took = t.elapsed();
    if took > Duration::from_secs(31) || e.signal == Some(libc::SIGKILL) {
        ctx.violation(
            "stop-bound",
            &format!(
                "instance {idx}: SIGTERM took {:.1} s (exit {:?}, signal {:?})",
                took.as_secs_f64(),
                e.code,
                e.signal
            ),
        );
    }
}

/// A full disk (contract §20): the instance restarted under a file-size limit a little above its
/// store, writes go on until one is refused, and the process must exit with status 1 within
/// 5 s of the first refusal; then it restarts without the limit (every acknowledged key is
/// checked at the end).
async fn disk_full(ctx: &Arc<Ctx>, inst: &Arc<crate::cluster::Instance>) -> (String, String) {
    let Some(dir) = &ctx.cluster.data_dir else {
        return ("disk".into(), "no data dir".into());
    };
    let biggest = largest_file(dir);
    let limit = biggest + 2 * 1024 * 1024;
    let sp = &ctx.cluster.spawner;
    let t = Instant::now();
    if let Some(e) = inst.terminate(Duration::from_secs(35)).await {
        check_stop(ctx, inst.idx, &e, t);
    }
    inst.set_mods(LaunchMods {
        fsize_limit: Some(limit),
        ..Default::default()
    });
    let started = inst.start(sp).await;
    let mut note = format!("file-size limit {} MiB", limit / (1024 * 1024));
    if let Err(e) = started {
        note = format!("{note}; it did not start under the limit ({e})");
    } else {
        inst.expect_exit();
        inst.arm_failure_watch(ctx.now_ms());
        // Writes go on (the clients); wait for the process to stop by itself.
        let exited = inst.wait_exit(Duration::from_secs(60)).await;
        let first = inst.first_failure();
        match (exited, first, inst.last_exit()) {
            (true, _, Some(e)) => {
                ctx.check();
                let after = first.map(|f| e.at_ms as i64 - f as i64);
                note = format!(
                    "{note}; exited {:?} {} ms after the first refusal",
                    e.code,
                    after.map(|a| a.to_string()).unwrap_or("?".into())
                );
                if e.code != Some(1) {
                    ctx.violation("disk-full-exit", &format!("instance {} stopped on a full disk with status {:?} signal {:?} (want 1)", inst.idx, e.code, e.signal));
                }
                if let Some(a) = after {
                    if a > 5_500 {
                        ctx.violation("disk-full-exit", &format!("instance {} exited {a} ms after its first refused write (want 5 s)", inst.idx));
                    }
                }
            }
            (false, Some(f), _) => {
                ctx.check();
                ctx.violation("disk-full-exit", &format!("instance {} still running {} ms after its first refused write on a full disk", inst.idx, ctx.now_ms() - f));
                inst.kill9().await;
            }
            _ => {
                note = format!("{note}; no write refused within 60 s (not triggered)");
                inst.kill9().await;
            }
        }
        inst.disarm_failure_watch();
    }
    inst.set_mods(LaunchMods::default());
    let t = Instant::now();
    let r = inst.start(sp).await;
    note = format!("{note}; {}", restart_note(ctx, inst.idx, r, t));
    (format!("instance {}", inst.idx), note)
}

fn largest_file(dir: &std::path::Path) -> u64 {
    let mut max = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                max = max.max(m.len());
            }
        }
    }
    max
}

/// Watches /readyz on every instance while a storage fault holds and after it ends (contract §23):
/// 503 no later than 5.5 s after writes stopped completing, 200 again within 5 s (+1.5 s for
/// polling and the backlog) of the fault's end.
pub struct ReadyWatch {
    ctx: Arc<Ctx>,
    end: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<String>,
}

impl ReadyWatch {
    pub fn start(ctx: &Arc<Ctx>) -> ReadyWatch {
        let end = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let owner = ctx.clone();
        let ctx = ctx.clone();
        let end2 = end.clone();
        let task = tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(1))
                .build()
                .expect("client");
            let n = ctx.cluster.instances.len();
            let mut stale_reported = vec![false; n];
            let mut first_503: Vec<Option<u64>> = vec![None; n];
            let mut recovered: Vec<Option<u64>> = vec![None; n];
            let mut recovery_reported = vec![false; n];
            let fault_start = ctx.now_ms();
            loop {
                let tick = Instant::now();
                let end_ms = end2.load(Ordering::SeqCst);
                let now = ctx.now_ms();
                for (k, i) in ctx.cluster.instances.iter().enumerate() {
                    if !i.is_live() {
                        continue;
                    }
                    let url = format!("{}/readyz", i.url());
                    let sent = ctx.now_ms();
                    let st = http.get(url).send().await.ok().map(|r| r.status().as_u16());
                    let at = ctx.now_ms();
                    ctx.check();
                    if end_ms == 0 {
                        if st != Some(200) && first_503[k].is_none() {
                            first_503[k] = Some(at - fault_start);
                        }
                        if st == Some(200) && !stale_reported[k] {
                            let (oldest_write, _) = i.oldest_inflight();
                            let last = i.last_write_done_ms.load(Ordering::Relaxed);
                            if let Some(stuck) = stale_ready(sent, oldest_write, last, 500) {
                                if !i.disturbed_during(sent.saturating_sub(stuck), at) {
                                    stale_reported[k] = true;
                                    ctx.violation(
                                        "readyz-stale",
                                        &format!("instance {k}: /readyz 200 although no write completed for {stuck} ms while writes waited ({:.1} s into the fault)", (at - fault_start) as f64 / 1000.0),
                                    );
                                }
                            }
                        }
                    } else if recovered[k].is_none() {
                        if st == Some(200) {
                            recovered[k] = Some(at.saturating_sub(end_ms));
                        } else if at > end_ms + 6_500 && !recovery_reported[k] {
                            recovery_reported[k] = true;
                            ctx.violation("readyz-recovery", &format!("instance {k}: /readyz still {:?} {} ms after the storage came back", st, at - end_ms));
                        }
                    }
                }
                if end_ms != 0 {
                    let done = ctx.cluster.instances.iter().enumerate().all(|(k, i)| {
                        !i.is_live() || recovered[k].is_some() || recovery_reported[k]
                    });
                    if done || now > end_ms + 30_000 {
                        break;
                    }
                }
                let spent = tick.elapsed();
                if spent < Duration::from_millis(200) {
                    tokio::time::sleep(Duration::from_millis(200) - spent).await;
                }
            }
            let show = |v: &Vec<Option<u64>>| {
                v.iter()
                    .map(|x| {
                        x.map(|m| format!("{:.1}s", m as f64 / 1000.0))
                            .unwrap_or("-".into())
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            };
            format!(
                "readyz not-200 after [{}], 200 again after [{}]",
                show(&first_503),
                show(&recovered)
            )
        });
        ReadyWatch {
            ctx: owner,
            end,
            task,
        }
    }

    /// The fault's end: from now on the watch waits for 200s.
    pub fn ended(&self) {
        self.end.store(self.ctx.now_ms().max(1), Ordering::SeqCst);
    }

    pub async fn finish(self) -> String {
        self.task
            .await
            .unwrap_or_else(|e| format!("readiness watch failed: {e}"))
    }
}
