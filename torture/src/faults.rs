//! The fault schedule and each fault. The seed draws two sequences: the storage and process
//! faults, one at a time with quiet time between (so each check knows what it is judging), and
//! the receiver's stalls, which may overlap them (a slow receiver during a stalled heartbeat
//! is what lets two instances deliver one webhook). The main sequence starts with a round of
//! every enabled kind once, fitted to the run's duration, so that every run injects each kind.
//! Each fault is a history line with its start and end; a storage stall also watches `/readyz`
//! on every instance. (restore-swap runs among the end's restores: backup.rs.)

use crate::cluster::LaunchMods;
use crate::ctx::{Ctx, Holder};
use crate::damage;
pub use crate::fault_kind::{FaultKind, ALL};
use crate::model::stale_ready;
use crate::receiver::{Mode, Receiver};
use crate::rng::Rng;
use crate::upgrade::Build;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The quiet time between two faults of the main sequence.
pub const GAP_MS: (u64, u64) = (3_000, 12_000);
/// No fault of the weighted draws starts in the run's last this-many ms.
pub const TAIL_MS: u64 = 15_000;

/// What a seed decides for a run: the first round (every main-sequence kind once, in a drawn
/// order), the weighted draws after it, and the receiver's stalls. The draws are longer than
/// any run uses: a run stops taking from them.
pub struct Schedule {
    pub round: Vec<Planned>,
    pub main: Vec<Planned>,
    pub recv: Vec<Planned>,
}

fn draw_one(rng: &mut Rng, kind: FaultKind) -> Planned {
    let (lo, hi) = kind.dur_range();
    let dur_ms = if hi > lo { rng.range(lo, hi) } else { lo };
    Planned {
        gap_ms: rng.range(GAP_MS.0, GAP_MS.1),
        kind,
        target: rng.next_u64(),
        dur_ms,
        variant: rng.next_u64(),
    }
}

pub fn schedule(seed: u64, kinds: &[FaultKind]) -> Schedule {
    let mut rng = Rng::stream(seed, "faults", 0);
    let main_kinds: Vec<FaultKind> = kinds.iter().copied().filter(|k| k.in_main()).collect();
    let weights: Vec<u32> = main_kinds.iter().map(|k| k.weight()).collect();
    let mut main = Vec::new();
    if !main_kinds.is_empty() {
        for _ in 0..2000 {
            let kind = main_kinds[rng.weighted(&weights)];
            main.push(draw_one(&mut rng, kind));
        }
    }
    // The round: every kind once, in an order of its own stream (the draws above stay what
    // they were for a seed).
    let mut r1 = Rng::stream(seed, "fault-round", 0);
    let mut order = main_kinds.clone();
    r1.shuffle(&mut order);
    let round = order.into_iter().map(|k| draw_one(&mut r1, k)).collect();
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
    Schedule { round, main, recv }
}

/// The quiet time before the first fault of the main sequence.
pub fn warmup_ms(duration_ms: u64) -> u64 {
    (duration_ms / 10).clamp(3_000, 15_000)
}

/// The least a round of these kinds takes: each at its shortest gap and duration, with its
/// overhead.
fn round_fixed_ms(kinds: &[FaultKind]) -> u64 {
    kinds
        .iter()
        .map(|k| GAP_MS.0 + k.dur_range().0 + k.overhead_ms())
        .sum()
}

/// The schedule fitted to the duration: the round's gaps and durations scaled down (each
/// toward the bottom of its range, all by one factor) until the round fits between the
/// warm-up and the run's last `TAIL_MS`; the first receiver stall made to fit too. Err: the
/// least duration that would fit.
pub fn fit(s: &mut Schedule, kinds: &[FaultKind], duration_ms: u64) -> Result<(), u64> {
    let need = minimum_duration_ms(kinds);
    if duration_ms < need {
        return Err(need);
    }
    let avail = duration_ms - warmup_ms(duration_ms) - TAIL_MS;
    let round_kinds: Vec<FaultKind> = s.round.iter().map(|p| p.kind).collect();
    let fixed = round_fixed_ms(&round_kinds);
    let var: u64 = s
        .round
        .iter()
        .map(|p| (p.gap_ms - GAP_MS.0) + (p.dur_ms - p.kind.dur_range().0))
        .sum();
    if var > 0 && fixed + var > avail {
        let room = avail.saturating_sub(fixed);
        for p in &mut s.round {
            let lo = p.kind.dur_range().0;
            p.gap_ms = GAP_MS.0 + (p.gap_ms - GAP_MS.0) * room / var;
            p.dur_ms = lo + (p.dur_ms - lo) * room / var;
        }
    }
    if let Some(first) = s.recv.first_mut() {
        // The first stall starts early enough and ends before the run's last TAIL_MS.
        let room = duration_ms.saturating_sub(TAIL_MS + 2_000);
        first.gap_ms = first.gap_ms.min(2_000 + room / 4);
        first.dur_ms = first
            .dur_ms
            .min(duration_ms.saturating_sub(TAIL_MS + first.gap_ms + 1_000))
            .max(FaultKind::ReceiverStall.dur_range().0);
    }
    Ok(())
}

/// The least --duration of any run: a backup taken under load must complete and be checked
/// (and restore-swap needs one).
pub const MIN_RUN_MS: u64 = 30_000;

/// The least --duration that fits one round of `kinds` (and `MIN_RUN_MS`), rounded up to 10 s.
pub fn minimum_duration_ms(kinds: &[FaultKind]) -> u64 {
    let main: Vec<FaultKind> = kinds.iter().copied().filter(|k| k.in_main()).collect();
    let fixed = round_fixed_ms(&main);
    let mut need = MIN_RUN_MS;
    if !main.is_empty() {
        let mut d = fixed + TAIL_MS;
        while d < fixed + TAIL_MS + warmup_ms(d) {
            d += 1_000;
        }
        need = need.max(d);
    }
    if kinds.contains(&FaultKind::ReceiverStall) {
        need = need.max(2_000 + FaultKind::ReceiverStall.dur_range().0 + TAIL_MS + 1_000);
    }
    need.div_ceil(10_000) * 10_000
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

/// Runs one planned fault of the main sequence: history line, printed line, then every
/// instance back and ready.
async fn inject(ctx: &Arc<Ctx>, p: &Planned) {
    let p = &aimed(ctx, p);
    // A process fault waits while a backup streams from its instance (the backup's window).
    let held = p.kind.on_process().then(|| {
        let n = ctx.cluster.instances.len() as u64;
        (p.target % n) as usize
    });
    let mut waited_note = String::new();
    if let Some(idx) = held {
        let t = Instant::now();
        let (waited, taken) = ctx.take_window(Holder::Fault, idx, WINDOW_WAIT).await;
        if waited {
            waited_note = format!(
                " (waited {:.1} s for a backup from instance {idx}{})",
                t.elapsed().as_secs_f64(),
                if taken { "" } else { ", then went ahead" }
            );
        }
    }
    let start = ctx.now_ms();
    ctx.fault_begin();
    let (target, mut info) = run_one(ctx, p).await;
    info.push_str(&waited_note);
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
    recover(ctx).await;
    if held.is_some() {
        ctx.release_window(Holder::Fault);
    }
}

/// The planned fault with its instance: rolling-upgrade swaps the one the roll names next (from
/// what each instance runs now), the other kinds take the draw's.
fn aimed(ctx: &Ctx, p: &Planned) -> Planned {
    let mut p = p.clone();
    if p.kind == FaultKind::RollingUpgrade {
        let builds = ctx.cluster.builds();
        if let Some((idx, _)) = ctx.cluster.roll.lock().unwrap().next(&builds) {
            p.target = idx as u64;
        }
    }
    p
}

/// The longest a process fault waits for a backup streaming from its instance: as long as a
/// backup may take (one that stalls is given up after `backup::STALL_BOUND` and lets it go
/// sooner). A sled backup of an hour's store on LazyFS takes minutes, and a fault that cut
/// every one of them would leave no backup under load to restore.
const WINDOW_WAIT: Duration = crate::backup::BOUND.saturating_add(Duration::from_secs(10));

/// The main sequence: first the round (every kind once, fitted to the run; a round running
/// late takes its gaps at their shortest), then the weighted draws until the run's end (none
/// starts in its last `TAIL_MS`).
pub async fn run_main(ctx: Arc<Ctx>, round: Vec<Planned>, plan: Vec<Planned>, end_ms: u64) {
    let warmup = warmup_ms(ctx.cfg.duration.as_millis() as u64);
    if !nap(&ctx, warmup).await {
        return;
    }
    let t0 = ctx.now_ms();
    let mut planned = 0u64;
    for p in &round {
        let behind = (ctx.now_ms() - t0).saturating_sub(planned);
        let gap = p.gap_ms.saturating_sub(behind).max(GAP_MS.0);
        planned += p.gap_ms + p.dur_ms + p.kind.overhead_ms();
        if !nap(&ctx, gap).await {
            return;
        }
        inject(&ctx, p).await;
    }
    ctx.round_done.store(true, Ordering::SeqCst);
    ctx.note(&format!(
        "the first round of faults ({} kinds) ended at {} ms",
        round.len(),
        ctx.now_ms()
    ));
    for p in plan {
        if !nap(&ctx, p.gap_ms).await {
            return;
        }
        if ctx.now_ms() + p.dur_ms + TAIL_MS > end_ms {
            return;
        }
        inject(&ctx, &p).await;
    }
}

/// The receiver's stalls, overlapping the main sequence.
pub async fn run_receiver(ctx: Arc<Ctx>, recv: Arc<Receiver>, plan: Vec<Planned>, end_ms: u64) {
    for p in plan {
        if !nap(&ctx, p.gap_ms).await {
            break;
        }
        if ctx.now_ms() + p.dur_ms + TAIL_MS > end_ms {
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
            for r in i.take_refusals() {
                ctx.note(&format!("instance {}: {r}", i.idx));
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
            inst.kill9_as(crate::model::Ending::PowerLoss).await;
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
            let _ = ctx.take_window(Holder::Fault, inst.idx, WINDOW_WAIT).await;
            let t = Instant::now();
            if let Some(e) = inst.terminate(Duration::from_secs(35)).await {
                check_stop(ctx, inst.idx, &e, t);
            }
            inst.set_mods(LaunchMods {
                faketime: Some(offset.into()),
                ..Default::default()
            });
            let r = inst.start(sp).await;
            ctx.release_window(Holder::Fault);
            let mut note = restart_note(ctx, inst.idx, r, t);
            nap(ctx, p.dur_ms).await;
            let _ = ctx.take_window(Holder::Fault, inst.idx, WINDOW_WAIT).await;
            let t = Instant::now();
            if let Some(e) = inst.terminate(Duration::from_secs(35)).await {
                check_stop(ctx, inst.idx, &e, t);
            }
            inst.set_mods(LaunchMods::default());
            let r = inst.start(sp).await;
            ctx.release_window(Holder::Fault);
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
        FaultKind::GracefulRestart => graceful_restart(ctx, &inst, p).await,
        FaultKind::RollingUpgrade => rolling_upgrade(ctx, &inst, p).await,
        FaultKind::NetSlow | FaultKind::Partition => network(ctx, inst.idx, p).await,
        FaultKind::HistoryRewind => history_rewind(ctx, p).await,
        FaultKind::DbRestart => db_restart(ctx).await,
        FaultKind::StoreDamage => store_damage(ctx, &inst, p).await,
        FaultKind::ReceiverStall => ("receiver".into(), "on its own track".into()),
        FaultKind::RestoreSwap => ("backups".into(), "among the end's restores".into()),
    }
}

/// net-slow and partition (docs/contract.md "When the storage is slow": for the instance, its
/// database is slow or silent): instance `idx`'s link to PostgreSQL shaped, or its packets to
/// PostgreSQL dropped without a word, for the drawn time, then healed, with the readiness
/// watch on every instance meanwhile (the other instances may wait on rows the cut one holds).
/// Deadlines, the watchdog and the end's checks judge the rest as always.
async fn network(ctx: &Arc<Ctx>, idx: usize, p: &Planned) -> (String, String) {
    let target = format!("instance {idx} <-> PostgreSQL");
    let Some(net) = &ctx.net else {
        return (target, "no network namespaces".into());
    };
    let cut = p.kind == FaultKind::Partition;
    let shape = crate::netns::Shape::draw(p.variant);
    let what = if cut {
        "packets to PostgreSQL dropped".to_string()
    } else {
        format!(
            "link shaped to {} kbit/s, {} ms of queue",
            shape.rate_kbit, shape.latency_ms
        )
    };
    let on = if cut {
        net.partition(idx, true).await
    } else {
        net.slow(idx, Some(shape)).await
    };
    if let Err(e) = on {
        ctx.violation(
            "harness",
            &format!("{} could not start: {e}", p.kind.name()),
        );
        return (target, format!("failed: {e}"));
    }
    let watch = ReadyWatch::start(ctx);
    let t = Instant::now();
    nap(ctx, p.dur_ms).await;
    let healed = if cut {
        net.partition(idx, false).await
    } else {
        net.slow(idx, None).await
    };
    watch.ended();
    let mut note = format!(
        "{what} for {:.1} s; {}",
        t.elapsed().as_secs_f64(),
        watch.finish().await
    );
    if let Err(e) = healed {
        ctx.violation("harness", &format!("{} could not end: {e}", p.kind.name()));
        note.push_str(&format!("; not healed: {e}"));
    }
    (target, note)
}

/// db-restart: PostgreSQL crash-restarted in place under the running instances (the same
/// timeline, nothing acknowledged lost, UNLOGGED tables emptied: for the server its database
/// went back in time, so it forgets what it kept, reloads the keys and holds webhooks a while),
/// then every instance awaited until its /readyz answers 200 again. Every rule holds as always:
/// the end's checks judge what it did.
async fn db_restart(ctx: &Arc<Ctx>) -> (String, String) {
    let target = "database".to_string();
    let Some(pg) = &ctx.cluster.pg else {
        return (target, "no PostgreSQL".into());
    };
    let t = Instant::now();
    let mut note = match pg.crash_restart().await {
        Ok(n) => n,
        Err(e) => {
            ctx.violation("harness", &format!("db-restart could not run: {e}"));
            return (target, format!("failed: {e}"));
        }
    };
    let ready = ready_times(ctx, t, Duration::from_secs(60)).await;
    note.push_str(&format!(
        "; every instance ready again {} s after the stop began",
        ready
    ));
    (target, note)
}

/// Polls /readyz on every instance until each has answered 200 (at most `max`); returns how
/// long after `from` each did, as "[a, b]" ("-" for one that did not).
async fn ready_times(ctx: &Arc<Ctx>, from: Instant, max: Duration) -> String {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("client");
    let n = ctx.cluster.instances.len();
    let mut at: Vec<Option<f64>> = vec![None; n];
    while at.iter().any(|a| a.is_none()) && from.elapsed() < max {
        for (k, i) in ctx.cluster.instances.iter().enumerate() {
            if at[k].is_some() {
                continue;
            }
            let ok = http
                .get(format!("{}/readyz", i.url()))
                .send()
                .await
                .map(|r| r.status().is_success())
                .unwrap_or(false);
            if ok {
                at[k] = Some(from.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let v: Vec<String> = at
        .iter()
        .map(|a| a.map(|s| format!("{s:.1}")).unwrap_or("-".into()))
        .collect();
    format!("[{}]", v.join(", "))
}

/// The two ways a database goes back in time under running instances (docs/contract.md "When the
/// database goes back in time").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RewindVariant {
    /// The standby cut off after replication was made asynchronous, then promoted.
    AsyncStandby,
    /// The primary restored from a base backup to a restore point.
    PointInTime,
}

impl RewindVariant {
    pub fn name(self) -> &'static str {
        match self {
            RewindVariant::AsyncStandby => "async-standby promotion",
            RewindVariant::PointInTime => "point-in-time restore",
        }
    }

    /// The variant a fault's draw asks for (even: an asynchronous standby promoted; odd: a
    /// point-in-time restore), or the other when the run lacks what it needs (a standby; WAL
    /// archiving on the harness's own server). None: neither can run.
    pub fn pick(draw: u64, has_standby: bool, can_pitr: bool) -> Option<RewindVariant> {
        let wanted = if draw % 2 == 0 {
            RewindVariant::AsyncStandby
        } else {
            RewindVariant::PointInTime
        };
        let can = |v: RewindVariant| match v {
            RewindVariant::AsyncStandby => has_standby,
            RewindVariant::PointInTime => can_pitr,
        };
        let other = match wanted {
            RewindVariant::AsyncStandby => RewindVariant::PointInTime,
            RewindVariant::PointInTime => RewindVariant::AsyncStandby,
        };
        [wanted, other].into_iter().find(|v| can(*v))
    }
}

/// How long after the old primary's end an instance may still serve copies it kept from the old
/// history (docs/contract.md "When the database goes back in time": a lease renewed just before the
/// primary died holds for 2 s).
pub const REWIND_LEASE_MS: u64 = 2_000;

/// history-rewind (docs/contract.md "When the database goes back in time"): the database goes back
/// in time under the running instances. The rewind point w0 is when what is acknowledged may start
/// to be lost (replication made asynchronous; the restore point); the workload runs on for the
/// drawn duration; then the primary is lost and the standby that missed the rest is promoted, or
/// the primary is restored to the restore point. The rewind ends (w1) once the promoted or restored
/// server is the only one and no lease of the old history can still hold (`REWIND_LEASE_MS` after
/// the old primary's end): from then on a request can only be answered in the history that remains.
/// From w0 to w1 what is acknowledged may be gone afterwards (the model's `Rewinds`). Then, the
/// fault's tail: a standby rebuilt from the new primary (commits synchronous again), and a sample
/// of the keys revoked before w0 tried on every instance.
async fn history_rewind(ctx: &Arc<Ctx>, p: &Planned) -> (String, String) {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let target = "database".to_string();
    let Some(pg) = &ctx.cluster.pg else {
        return (target, "no PostgreSQL".into());
    };
    let Some(variant) = RewindVariant::pick(p.variant, pg.has_standby(), pg.can_pitr()) else {
        ctx.violation(
            "harness",
            "history-rewind could not run: no standby and no WAL archive",
        );
        return (target, "no way to rewind".into());
    };
    let n = N.fetch_add(1, Ordering::SeqCst) + 1;
    let mut steps: Vec<String> = Vec::new();
    let mut w0: Option<u64> = None;
    let result = match variant {
        RewindVariant::AsyncStandby => rewind_async(ctx, pg, p, &mut w0, &mut steps).await,
        RewindVariant::PointInTime => rewind_pitr(ctx, pg, p, n, &mut w0, &mut steps).await,
    };
    // No copy of the old history served past its leases.
    if let Ok(killed) = &result {
        let until = *killed + Duration::from_millis(REWIND_LEASE_MS);
        if Instant::now() < until {
            tokio::time::sleep_until(until.into()).await;
        }
    }
    let w1 = ctx.now_ms();
    let mut note = variant.name().to_string();
    if let Some(w0) = w0 {
        ctx.state.rewinds.write().unwrap().end(w1);
        note.push_str(&format!(
            ": w0 {w0} ms, w1 {w1} ms ({:.1} s at risk)",
            (w1 - w0) as f64 / 1000.0
        ));
    }
    if !steps.is_empty() {
        note.push_str(&format!("; {}", steps.join(", ")));
    }
    let mut failed = result.err();
    // The tail: a standby again, and what was revoked before the rewind point still refused.
    let rebuild = async {
        let t = Instant::now();
        match pg.rebuild_standby().await {
            Ok(Some(_)) => Ok(format!(
                "a standby rebuilt from the new primary in {:.1} s",
                t.elapsed().as_secs_f64()
            )),
            Ok(None) => Ok(String::new()),
            Err(e) => Err(e),
        }
    };
    let sample = async {
        match w0 {
            Some(w0) => {
                let t = Instant::now();
                let checked = crate::checks::revoked_before_rewind_refused(ctx, w0).await;
                format!("{checked} ({:.1} s)", t.elapsed().as_secs_f64())
            }
            None => String::new(),
        }
    };
    let (rebuilt, checked) = if failed.is_none() {
        tokio::join!(rebuild, sample)
    } else {
        (Ok(String::new()), sample.await)
    };
    match rebuilt {
        Ok(r) if !r.is_empty() => note.push_str(&format!("; after w1: {r}")),
        Ok(_) => {}
        Err(e) => failed = Some(format!("rebuilding the standby: {e}")),
    }
    if !checked.is_empty() {
        note.push_str(&format!("; {checked}"));
    }
    if let Some(e) = failed {
        ctx.violation(
            "harness",
            &format!("history-rewind ({}) could not run: {e}", variant.name()),
        );
        note.push_str(&format!("; failed: {e}"));
    }
    (target, note)
}

/// Times one step of a rewind for its note.
fn step(steps: &mut Vec<String>, what: &str, t: Instant) {
    steps.push(format!("{what} {:.1} s", t.elapsed().as_secs_f64()));
}

/// Returns when the old primary was killed.
async fn rewind_async(
    ctx: &Arc<Ctx>,
    pg: &crate::pg::Pg,
    p: &Planned,
    w0: &mut Option<u64>,
    steps: &mut Vec<String>,
) -> Result<Instant, String> {
    // From the moment commits stop waiting for the standby, what is acknowledged may be lost.
    let at = ctx.now_ms();
    ctx.state.rewinds.write().unwrap().begin(at);
    *w0 = Some(at);
    let t = Instant::now();
    pg.cut_standby().await?;
    step(
        steps,
        "replication made asynchronous and the standby cut off in",
        t,
    );
    let t = Instant::now();
    nap(ctx, p.dur_ms).await;
    step(steps, "the workload ran on for", t);
    let (promoted, killed) = pg.promote_standby().await?;
    steps.push(promoted);
    Ok(killed)
}

/// Returns when the primary was killed.
async fn rewind_pitr(
    ctx: &Arc<Ctx>,
    pg: &crate::pg::Pg,
    p: &Planned,
    n: u64,
    w0: &mut Option<u64>,
    steps: &mut Vec<String>,
) -> Result<Instant, String> {
    let t = Instant::now();
    let backup = pg.base_backup(n).await?;
    step(steps, "base backup", t);
    let name = format!("torture-{n}");
    // Everything acknowledged before the restore point is in the restored history.
    let at = ctx.now_ms();
    ctx.state.rewinds.write().unwrap().begin(at);
    *w0 = Some(at);
    let t = Instant::now();
    pg.restore_point(&name).await?;
    step(steps, &format!("restore point {name} and a WAL switch"), t);
    let t = Instant::now();
    nap(ctx, p.dur_ms).await;
    step(steps, "the workload ran on for", t);
    let t = Instant::now();
    let seg = pg.switch_and_archive().await?;
    step(steps, &format!("WAL switched, {seg} archived in"), t);
    let t = Instant::now();
    let (restored, killed) = pg.restore_primary(&backup, &name).await?;
    steps.push(format!(
        "{restored} ({:.1} s in all)",
        t.elapsed().as_secs_f64()
    ));
    Ok(killed)
}

/// How long graceful-restart waits for a POST of the target process to be on the wire.
const POST_WAIT: Duration = Duration::from_secs(10);

/// A graceful stop while webhook POSTs are on the wire (docs/contract.md "A stop is bounded" and
/// "One piece of work is done by one instance at a time"): the receiver made slow (an override the
/// stall track cannot cancel), the target process's first POST awaited (orders with a callback
/// placed through it if none comes), then SIGTERM (it must end within 30 s and let the POST end:
/// the receiver judges both), a restart, and the receiver back to its track.
async fn graceful_restart(
    ctx: &Arc<Ctx>,
    inst: &Arc<crate::cluster::Instance>,
    p: &Planned,
) -> (String, String) {
    let mut note = graceful_stop(ctx, inst, p).await;
    let t = Instant::now();
    let r = inst.start(&ctx.cluster.spawner).await;
    note = format!("{note}; {}", restart_note(ctx, inst.idx, r, t));
    ctx.receiver.set_override(None);
    (format!("instance {}", inst.idx), note)
}

/// rolling-upgrade (docs/operations.md "Rolling restarts" and "Upgrades"): the instance the roll
/// names is stopped as graceful-restart stops one (its POSTs on the wire, SIGTERM within 30 s),
/// then started on the other build, on the same store or database. A start refused by a store
/// or schema newer than that build knows (exit 2, documented) is followed by the newer build's
/// start (cluster.rs) and said in the note; any other failure to start is `restart-failed`.
async fn rolling_upgrade(
    ctx: &Arc<Ctx>,
    inst: &Arc<crate::cluster::Instance>,
    p: &Planned,
) -> (String, String) {
    let from = inst.build();
    let to = from.other();
    let mut note = graceful_stop(ctx, inst, p).await;
    inst.set_build(to);
    let t = Instant::now();
    let r = inst.start(&ctx.cluster.spawner).await;
    let sp = &ctx.cluster.spawner;
    let file = |b: Build| match (b, &sp.old_bin) {
        (Build::Old, Some(old)) => crate::upgrade::short(old),
        _ => crate::upgrade::short(&sp.bin),
    };
    note = format!(
        "{} build ({}) -> {} build ({}): {note}; {}",
        from.name(),
        file(from),
        to.name(),
        file(to),
        restart_note(ctx, inst.idx, r, t)
    );
    ctx.receiver.set_override(None);
    (format!("instance {}", inst.idx), note)
}

/// The stop of graceful-restart and rolling-upgrade: the receiver made slow (an override the
/// stall track cannot cancel; the caller lifts it once the instance is back), the process's
/// first POST awaited (orders with a callback placed through it if none comes), SIGTERM (it
/// must end within 30 s), and half the time 2 s down. Returns the note so far.
async fn graceful_stop(
    ctx: &Arc<Ctx>,
    inst: &Arc<crate::cluster::Instance>,
    p: &Planned,
) -> String {
    let slow = Duration::from_millis(p.dur_ms.max(1_000));
    ctx.receiver.set_override(Some(Mode::Slow(slow)));
    let gen = inst.gen();
    let http = crate::http::client();
    let waited = Instant::now();
    let mut next_order = waited + Duration::from_secs(1);
    let mut placed = 0u32;
    let mut open = 0;
    while waited.elapsed() < POST_WAIT {
        open = ctx.receiver.on_wire_from(inst.idx, gen);
        if open > 0 {
            break;
        }
        // The workload's callbacks usually come within a moment; if not, orders of our own.
        if Instant::now() >= next_order {
            place_callback_order(ctx, &http, inst.idx).await;
            placed += 1;
            next_order = Instant::now() + Duration::from_millis(700);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waited_s = waited.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut note = if open > 0 {
        format!(
            "receiver answering after {:.1} s; SIGTERM with {open} POST(s) of process {gen} on the wire (after {waited_s:.1} s",
            slow.as_secs_f64()
        )
    } else {
        format!(
            "receiver answering after {:.1} s; no POST of process {gen} opened within {} s: SIGTERM anyway (",
            slow.as_secs_f64(),
            POST_WAIT.as_secs()
        )
    };
    if placed > 0 {
        note.push_str(&format!(
            "{}{placed} orders with a callback placed through it",
            if open > 0 { "; " } else { "" }
        ));
    }
    note.push(')');
    if let Some(e) = inst.terminate(Duration::from_secs(35)).await {
        check_stop(ctx, inst.idx, &e, t);
        note.push_str(&format!(
            "; stopped in {:.1} s (exit {:?})",
            t.elapsed().as_secs_f64(),
            e.code
        ));
    }
    // Half the time the restart waits 2 s, so that the other instances (PostgreSQL) take the
    // deliveries the stopped one handed back, not only its own restart.
    if p.variant % 2 == 1 && ctx.cluster.instances.len() > 1 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        note.push_str("; 2 s down");
    }
    note
}

/// One order with a callback, through instance `idx`, under a key made for the fault and held
/// by the model like any other (the end replays it, the ledger counts it).
async fn place_callback_order(ctx: &Arc<Ctx>, http: &reqwest::Client, idx: usize) {
    use crate::http::{Auth, Req};
    use crate::model::KeyRecord;
    static PLACED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PLACED.fetch_add(1, Ordering::Relaxed);
    let acc = crate::setup::HOT;
    let key = format!("{}-fault-o{n}", crate::setup::run_tag(ctx.cfg.seed));
    let body = serde_json::json!({
        "items": [{"productId": "tp-gem", "quantity": 1}],
        "externalOrderId": key,
        "callbackUrl": ctx.receiver_url(acc),
    });
    let req = Req::new(
        "fault.order",
        reqwest::Method::POST,
        "/b2b/orders",
        idx,
        usize::MAX,
    )
    .auth(Auth::Key(ctx.state.account(acc).client_keys[0].clone()))
    .key(key.clone())
    .json(&body);
    let b = req.body.clone().expect("a body");
    ctx.state.keys.lock().unwrap().on_send(&key, || {
        KeyRecord::new(acc, "order", "POST", "/b2b/orders".into(), b)
    });
    let r = crate::http::send(ctx, http, &req).await;
    crate::workload::judge_keyed(ctx, &key, &r, "order");
}

pub fn restart_note(ctx: &Ctx, idx: usize, r: Result<(), String>, t: Instant) -> String {
    // A refusal of a newer store or schema came before the start that answered.
    let refused: String = ctx.cluster.instances[idx]
        .take_refusals()
        .into_iter()
        .map(|r| format!("{r}; "))
        .collect();
    match r {
        Ok(()) => format!("{refused}restarted in {:.1} s", t.elapsed().as_secs_f64()),
        Err(e) => {
            ctx.violation("restart-failed", &format!("instance {idx}: {e}"));
            format!("{refused}restart failed: {e}")
        }
    }
}

/// docs/contract.md "A stop is bounded": a stop is bounded (30 s) whatever the storage does.
pub fn check_stop(ctx: &Ctx, idx: usize, e: &crate::cluster::Exit, t: Instant) {
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

/// A full disk (docs/contract.md "On sled, a failed flush stops the process"): the instance
/// restarted under a file-size limit a little above its store, writes go on until one is refused,
/// and the process must exit with status 1 within 5 s of the first refusal; then it restarts
/// without the limit (every acknowledged key is checked at the end).
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

/// Watches /readyz on every instance while a storage fault holds and after it ends
/// (docs/contract.md "When the storage is slow"): 503 no later than 5.5 s after writes stopped
/// completing, 200 again within 5 s (+1.5 s for polling and the backlog) of the fault's end.
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

// ---------------------------------------------------------------------------------------------
// store-damage (sled): damage.rs does the file work.

/// How a start on a damaged store ended.
enum Start {
    /// Refused: the judgement is made; the files are put back.
    Refused,
    /// It opened and serves (left running).
    Opened,
    /// It opened where it had to refuse: stopped again, the files put back.
    Accepted,
    /// The harness could not do its part (said as a `harness` violation).
    Broken,
}

/// store-damage's fault: see the module's comment. Returns its target and note.
pub async fn store_damage(
    ctx: &Arc<Ctx>,
    inst: &Arc<crate::cluster::Instance>,
    p: &Planned,
) -> (String, String) {
    let target = format!("instance {}", inst.idx);
    let Some(dir) = ctx.cluster.data_dir.clone() else {
        return (target, "no data dir".into());
    };
    let mut steps: Vec<String> = Vec::new();
    let t = Instant::now();
    if let Some(e) = inst.terminate(Duration::from_secs(35)).await {
        check_stop(ctx, inst.idx, &e, t);
    }
    steps.push(format!("stopped in {:.1} s", t.elapsed().as_secs_f64()));
    let t = Instant::now();
    let h0 = match damage::hash_store(&dir) {
        Ok(h) => h,
        Err(e) => {
            ctx.violation("harness", &format!("store-damage: hashing the store: {e}"));
            return (
                target,
                restart(ctx, inst, steps, &format!("hashing failed: {e}")).await,
            );
        }
    };
    let bytes: u64 = h0.values().map(|v| v.0).sum();
    steps.push(format!(
        "{} files ({} snapshot, {} blob files; {} MiB) hashed in {:.1} s",
        h0.len(),
        h0.keys().filter(|k| damage::snap_lsn(k).is_some()).count(),
        h0.keys().filter(|k| damage::is_blob(k)).count(),
        bytes >> 20,
        t.elapsed().as_secs_f64()
    ));
    let Some((kind, touched)) = damage::pick(p.variant, &h0) else {
        return (target, restart(ctx, inst, steps, "no file to damage").await);
    };
    let what = format!("{} ({})", kind.name(), damage::touched_names(&touched));
    if inst.build() == crate::upgrade::Build::Old {
        steps.push("the damaged start runs --bin".into());
    }
    // A blob file is needed only while a live page points at it (sled removes one once
    // what replaced it is durable, not at once): its removal tells. Before a blob is cut
    // short, the same blob is removed and the start must be refused; a blob whose removal
    // the server opens is no live page's, and nothing is cut.
    if kind == damage::Damage::BlobCut {
        match damaged_start(
            ctx,
            inst,
            &dir,
            damage::Damage::BlobRemoved,
            &touched,
            &h0,
            &mut steps,
        )
        .await
        {
            Start::Refused => {}
            Start::Opened => {
                steps.push(format!(
                    "so {} was not cut",
                    damage::touched_names(&touched)
                ));
                return (target, format!("{what}: {}", steps.join("; ")));
            }
            Start::Accepted | Start::Broken => {
                return (
                    target,
                    format!("{what}: {}", restart(ctx, inst, steps, "").await),
                );
            }
        }
    }
    match damaged_start(ctx, inst, &dir, kind, &touched, &h0, &mut steps).await {
        Start::Opened => (target, format!("{what}: {}", steps.join("; "))),
        Start::Refused | Start::Accepted | Start::Broken => (
            target,
            format!("{what}: {}", restart(ctx, inst, steps, "").await),
        ),
    }
}

/// The normal start after the fault's part; the steps so far and its own, as the note.
async fn restart(
    ctx: &Arc<Ctx>,
    inst: &Arc<crate::cluster::Instance>,
    mut steps: Vec<String>,
    why: &str,
) -> String {
    if !why.is_empty() {
        steps.push(why.to_string());
    }
    let t = Instant::now();
    let r = inst.start(&ctx.cluster.spawner).await;
    steps.push(restart_note(ctx, inst.idx, r, t));
    steps.join("; ")
}

/// One start on the store damaged so: judged, and the files put back unless it opened as it
/// had to (every snapshot removed, or a blob file no live page needed).
async fn damaged_start(
    ctx: &Arc<Ctx>,
    inst: &Arc<crate::cluster::Instance>,
    dir: &std::path::Path,
    kind: damage::Damage,
    touched: &[String],
    h0: &damage::Hashes,
    steps: &mut Vec<String>,
) -> Start {
    let originals = match damage::apply(dir, kind, touched) {
        Ok(o) => o,
        Err(e) => {
            ctx.violation(
                "harness",
                &format!("store-damage: damaging {touched:?}: {e}"),
            );
            return Start::Broken;
        }
    };
    // The store as damaged: what the start must leave as it is if it refuses.
    let mut h1 = h0.clone();
    for rel in touched {
        if kind.removes() {
            h1.remove(rel);
        } else if let Ok(h) = damage::hash_file(&dir.join(rel)) {
            h1.insert(rel.clone(), h);
        }
    }
    let probe = ctx
        .cfg
        .work
        .join(format!("instance-{}.damaged-start.stderr", inst.idx));
    inst.set_mods(LaunchMods {
        probe: Some(probe.clone()),
        ..Default::default()
    });
    let t = Instant::now();
    let r = inst.start(&ctx.cluster.spawner).await;
    inst.set_mods(LaunchMods::default());
    let took = t.elapsed().as_secs_f64();
    let rel = touched.first().cloned().unwrap_or_default();
    ctx.check();
    if r.is_ok() {
        // It opened.
        let stale_blob = kind == damage::Damage::BlobRemoved;
        if kind == damage::Damage::SnapsRemoved || stale_blob {
            steps.push(format!(
                "{} removed: the server opened the store in {took:.1} s{}",
                damage::touched_names(touched),
                if stale_blob {
                    " (no live page needs it, by the server's check: the end's checks judge what it serves)"
                } else {
                    " (sled replayed its log)"
                }
            ));
            return Start::Opened;
        }
        ctx.violation(
            "store-damage-accepted",
            &format!(
                "instance {}: the server opened a store with {} ({}) in {took:.1} s instead of refusing it",
                inst.idx,
                kind.name(),
                damage::touched_names(touched)
            ),
        );
        let t = Instant::now();
        if let Some(e) = inst.terminate(Duration::from_secs(35)).await {
            check_stop(ctx, inst.idx, &e, t);
        }
        steps.push(format!(
            "{}: opened in {took:.1} s (a violation), stopped",
            kind.name()
        ));
        if let Err(e) = damage::put_back(dir, &originals) {
            ctx.violation("harness", &format!("store-damage: putting {rel} back: {e}"));
        }
        return Start::Accepted;
    }
    let exit = inst.last_exit();
    let (code, signal) = exit.map(|e| (e.code, e.signal)).unwrap_or((None, None));
    let stderr = std::fs::read_to_string(&probe).unwrap_or_default();
    // The line, without the directory it names (the fault's line is long enough).
    let first = stderr.lines().next().unwrap_or("");
    let line = match first.split_once(": its ") {
        Some((_, rest)) => format!("its {rest}"),
        None => first.to_string(),
    };
    let line: String = line.chars().take(140).collect();
    let mut wrong = damage::refusal_faults(code, signal, &stderr, &rel);
    let t = Instant::now();
    match damage::hash_store(dir) {
        Ok(h2) => {
            let changed = damage::diff(&h1, &h2);
            if !changed.is_empty() {
                wrong.push(format!(
                    "the refused start changed the store: {}",
                    changed
                        .iter()
                        .take(5)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        Err(e) => {
            ctx.violation("harness", &format!("store-damage: hashing the store: {e}"));
        }
    }
    let hashed = t.elapsed().as_secs_f64();
    if kind == damage::Damage::SnapsRemoved {
        ctx.violation(
            "store-damage-refusal",
            &format!(
                "instance {}: a store whose snapshot files were all removed must open (sled replays its log); it was refused: exit {code:?}: {}",
                inst.idx,
                stderr.trim()
            ),
        );
    } else if !wrong.is_empty() {
        ctx.violation(
            "store-damage-refusal",
            &format!(
                "instance {}: {} ({}): {}; stderr: {:?}",
                inst.idx,
                kind.name(),
                damage::touched_names(touched),
                wrong.join("; "),
                stderr.trim()
            ),
        );
    }
    steps.push(format!(
        "{}: refused in {took:.1} s with exit {} and {} line(s) ({line:?}), the store {} ({hashed:.1} s to hash)",
        kind.name(),
        code.map(|c| c.to_string()).unwrap_or("-".into()),
        stderr.lines().count(),
        if wrong.iter().any(|w| w.starts_with("the refused start changed")) { "changed" } else { "unchanged" }
    ));
    if let Err(e) = damage::put_back(dir, &originals) {
        ctx.violation("harness", &format!("store-damage: putting {rel} back: {e}"));
        return Start::Broken;
    }
    let off = damage::touched_back(dir, h0, &originals);
    if !off.is_empty() {
        ctx.violation(
            "harness",
            &format!(
                "store-damage: the files put back differ: {}",
                off.join(", ")
            ),
        );
        return Start::Broken;
    }
    steps.push("put back".into());
    Start::Refused
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Engine;

    const PG: [FaultKind; 11] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::ReceiverStall,
        FaultKind::LostStandby,
        FaultKind::RowsHeld,
        FaultKind::ConnCut,
        FaultKind::Failover,
        FaultKind::GracefulRestart,
        FaultKind::RestoreSwap,
        FaultKind::HistoryRewind,
        FaultKind::RollingUpgrade,
    ];

    #[test]
    fn a_rewind_takes_the_variant_drawn_or_the_one_the_run_can() {
        use RewindVariant::*;
        assert_eq!(RewindVariant::pick(0, true, true), Some(AsyncStandby));
        assert_eq!(RewindVariant::pick(1, true, true), Some(PointInTime));
        // Through PgBouncer (no standby): the restore.
        assert_eq!(RewindVariant::pick(0, false, true), Some(PointInTime));
        assert_eq!(RewindVariant::pick(1, true, false), Some(AsyncStandby));
        assert_eq!(RewindVariant::pick(3, false, false), None);
        assert_eq!(
            FaultKind::parse("history-rewind"),
            Some(FaultKind::HistoryRewind)
        );
        assert_eq!(FaultKind::HistoryRewind.engine(), Some(Engine::Postgres));
        assert!(FaultKind::HistoryRewind.in_main());
    }

    #[test]
    fn the_round_has_every_main_kind_once() {
        let s = schedule(7, &PG);
        let mut kinds: Vec<FaultKind> = s.round.iter().map(|p| p.kind).collect();
        kinds.sort();
        let mut want: Vec<FaultKind> = PG.iter().copied().filter(|k| k.in_main()).collect();
        want.sort();
        assert_eq!(kinds, want);
        assert!(!s.recv.is_empty());
        // Another seed, another order (the seed draws it).
        let orders: std::collections::HashSet<Vec<FaultKind>> = (0..8)
            .map(|seed| schedule(seed, &PG).round.iter().map(|p| p.kind).collect())
            .collect();
        assert!(orders.len() > 1);
    }

    #[test]
    fn the_round_is_fitted_to_the_duration() {
        let need = minimum_duration_ms(&PG);
        assert_eq!(need % 10_000, 0);
        for d in [need, need + 30_000, 300_000, 600_000] {
            let mut s = schedule(3, &PG);
            fit(&mut s, &PG, d).unwrap();
            let planned: u64 = s
                .round
                .iter()
                .map(|p| p.gap_ms + p.dur_ms + p.kind.overhead_ms())
                .sum();
            assert!(
                warmup_ms(d) + planned + TAIL_MS <= d,
                "duration {d}: the round takes {planned} ms"
            );
            for p in &s.round {
                let (lo, hi) = p.kind.dur_range();
                assert!(p.dur_ms >= lo && p.dur_ms <= hi.max(lo), "{p:?}");
                assert!(p.gap_ms >= GAP_MS.0, "{p:?}");
            }
            let r = &s.recv[0];
            assert!(r.gap_ms + r.dur_ms + TAIL_MS <= d, "{r:?} in {d}");
        }
        let mut s = schedule(3, &PG);
        assert_eq!(fit(&mut s, &PG, need - 1), Err(need));
        // Nothing to fit: a run still needs a backup under load.
        assert_eq!(minimum_duration_ms(&[]), MIN_RUN_MS);
        assert_eq!(minimum_duration_ms(&[FaultKind::RestoreSwap]), MIN_RUN_MS);
    }
}
