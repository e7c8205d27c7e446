//! orderly-torture: flags, one run (storage and instances up, setup, prefill, the clients, the
//! faults, the backups, the monitors; then heal, end checks, restores), and the summary.
//! Exit 0: no violation; 1: at least one; 2: bad usage, or the harness itself could not run.

mod backup;
mod checks;
mod cluster;
mod ctx;
mod damage;
mod engine;
mod fault_kind;
mod faults;
mod history;
mod http;
mod lazyfs;
mod model;
mod monitor;
mod netns;
mod pg;
mod procs;
mod proxy;
mod receiver;
mod rng;
mod setup;
mod state;
mod upgrade;
mod workload;

use clap::Parser;
use cluster::{Cluster, Instance, Spawner};
use ctx::{Config, Ctx, Engine, Tally};
use faults::FaultKind;
use history::History;
use lazyfs::LazyFs;
use pg::Pg;
use rng::Rng;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A seeded random workload with faults against the real orderly binary, checked against a
/// small model of what every answer implies.
#[derive(Parser, Debug)]
#[command(name = "orderly-torture", version)]
struct Args {
    /// The orderly binary under test.
    #[arg(
        long,
        env = "ORDERLY_TORTURE_BIN",
        default_value = "target/release/orderly"
    )]
    bin: PathBuf,
    /// An earlier orderly build for rolling-upgrade: the instances start on it, and the fault
    /// swaps them one by one to --bin and back (without it rolling-upgrade is SKIPPED).
    #[arg(long, env = "ORDERLY_TORTURE_OLD_BIN")]
    old_bin: Option<PathBuf>,
    /// sled (one instance) or postgres (one to three instances on one database).
    #[arg(long, env = "ORDERLY_TORTURE_ENGINE", default_value = "sled")]
    engine: String,
    /// Instances on one PostgreSQL database (sled: always 1).
    #[arg(long, env = "ORDERLY_TORTURE_INSTANCES", default_value_t = 1)]
    instances: usize,
    /// How long the clients run (setup, prefill, end checks and restores come on top).
    #[arg(long, env = "ORDERLY_TORTURE_DURATION", default_value = "3m")]
    duration: String,
    /// Decides the workload mix, every client's choices and the fault schedule (default:
    /// drawn at random and printed).
    #[arg(long, env = "ORDERLY_TORTURE_SEED")]
    seed: Option<u64>,
    /// Comma list of faults (kill, pause, receiver-stall, power-loss, disk-stall, disk-full,
    /// lost-standby, rows-held, conn-cut, clock-step, failover, graceful-restart,
    /// restore-swap, history-rewind, rolling-upgrade, net-slow, partition, db-restart,
    /// store-damage), `all`, or `none`.
    /// Default: every fault the engine and the machine support.
    #[arg(long, env = "ORDERLY_TORTURE_FAULTS")]
    faults: Option<String>,
    /// Concurrent clients.
    #[arg(long, env = "ORDERLY_TORTURE_CLIENTS", default_value_t = 16)]
    clients: usize,
    /// postgres: a maintenance URL of a server to create a fresh database in (default: a
    /// throwaway cluster started with scripts/pg-cluster.sh).
    #[arg(long, env = "ORDERLY_TORTURE_DATABASE_URL")]
    database_url: Option<String>,
    /// postgres: PgBouncer in transaction mode between the instances and the server.
    #[arg(long, env = "ORDERLY_TORTURE_POOLER")]
    pooler: bool,
    /// The history file (default: torture-<seed>.jsonl in the temp directory).
    #[arg(long, env = "ORDERLY_TORTURE_HISTORY")]
    history: Option<PathBuf>,
    /// Run again what a history file's first line says (seed, engine, instances, faults,
    /// duration and the drawn settings).
    #[arg(long)]
    replay: Option<PathBuf>,
    /// Passed to the server as --request-deadline.
    #[arg(long, env = "ORDERLY_TORTURE_REQUEST_DEADLINE", default_value = "10s")]
    request_deadline: String,
    /// Resident memory bound per instance, in MiB.
    #[arg(
        long = "max-rss",
        env = "ORDERLY_TORTURE_MAX_RSS",
        default_value_t = 1024
    )]
    max_rss: u64,
    /// How long the end waits for webhook deliveries to settle (none pending or retrying)
    /// before it checks them: a delivery still retrying is left out of the end's checks.
    #[arg(long, env = "ORDERLY_TORTURE_SETTLE", default_value = "90s")]
    settle: String,
    /// Keep the work directory (data, logs, backups).
    #[arg(long, env = "ORDERLY_TORTURE_KEEP")]
    keep: bool,
    /// The repository's scripts/ (pg-cluster.sh, pgbouncer.sh, lazyfs.sh); default: found
    /// beside the binary's repository or this harness's.
    #[arg(long, env = "ORDERLY_TORTURE_SCRIPTS")]
    scripts: Option<PathBuf>,
    /// A built LazyFS binary (scripts/lazyfs.sh build DIR prints it): power-loss and
    /// disk-stall need it.
    #[arg(long, env = "LAZYFS_BIN")]
    lazyfs: Option<PathBuf>,
    /// libfaketime, for clock-step.
    #[arg(
        long,
        env = "ORDERLY_TORTURE_FAKETIME_LIB",
        default_value = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
    )]
    faketime_lib: PathBuf,
    /// postgres: --database-pool-size of each instance (default: drawn by the seed).
    #[arg(long, env = "ORDERLY_TORTURE_DATABASE_POOL_SIZE")]
    database_pool_size: Option<u32>,
    /// Orders placed as fast as possible before the run (default: drawn by the seed), so a
    /// backup's walk takes seconds.
    #[arg(long, env = "ORDERLY_TORTURE_PREFILL")]
    prefill: Option<u64>,
    /// Backups taken during the run (default: drawn by the seed).
    #[arg(long, env = "ORDERLY_TORTURE_BACKUPS")]
    backups: Option<u32>,
    /// sled: the instance's --cache-mb (default: the server's own, 32). At 1 a store of a
    /// few hundred thousand orders is read back from disk page by page under the faults.
    #[arg(long, env = "ORDERLY_TORTURE_CACHE_MB")]
    cache_mb: Option<u64>,
    /// The share of orders (0 to 1) whose delivery data is 3 to 8 KiB rather than a few bytes:
    /// their answers and rows are that large, and pages of them pass sled's blob threshold
    /// (default 0: the draws of a seed are those of a run without it).
    #[arg(long, env = "ORDERLY_TORTURE_MEDIUM_ORDERS", default_value_t = 0.0)]
    medium_orders: f64,
    /// postgres: API keys written straight into the database (as postgres, triggers off) before
    /// the workload, so that every instance meets that many when it reads every key again (a
    /// history-rewind, a db-restart, its own start).
    #[arg(long, env = "ORDERLY_TORTURE_BULK_KEYS", default_value_t = 0)]
    bulk_keys: u64,
    /// The operation mix: balanced, orders, keys, admin, webhooks, near-limits (default: drawn
    /// by the seed).
    #[arg(long, env = "ORDERLY_TORTURE_PROFILE")]
    profile: Option<String>,
    /// Print what the seed draws (settings, the first faults) and exit, running nothing.
    #[arg(long)]
    dry_run: bool,
}

fn usage(msg: &str) -> ! {
    eprintln!("orderly-torture: {msg}");
    std::process::exit(2);
}

fn cannot_run(msg: &str) -> ! {
    println!("torture: the harness could not run: {msg}");
    cluster::run_cleanup();
    std::process::exit(2);
}

/// net-slow and partition cannot run here: SKIPPED, with why.
fn skip_network(faults: &mut Vec<FaultKind>, skipped: &mut Vec<(String, String)>, why: &str) {
    for k in faults.iter().filter(|k| k.in_netns()) {
        skipped.push((k.name().into(), why.to_string()));
    }
    faults.retain(|k| !k.in_netns());
}

/// A network namespace per instance (netns.rs), and PostgreSQL's proxies listening where the
/// namespaces reach the host.
async fn network(p: &Pg, instances: usize) -> Result<netns::Net, String> {
    let n = netns::Net::build(instances, std::process::id()).await?;
    for px in &p.proxies {
        px.listen_also(n.db_host())
            .await
            .map_err(|e| format!("a proxy on {}: {e}", n.db_host()))?;
    }
    Ok(n)
}

fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut b).is_ok() {
            return u64::from_le_bytes(b) >> 1;
        }
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    (t ^ u64::from(std::process::id())) >> 1
}

fn find_scripts(given: Option<PathBuf>, bin: &Path) -> Option<PathBuf> {
    if let Some(g) = given {
        return Some(g);
    }
    let mut candidates = Vec::new();
    if let Ok(b) = bin.canonicalize() {
        candidates.extend(b.ancestors().map(|a| a.join("scripts")));
    }
    if let Ok(me) = std::env::current_exe() {
        candidates.extend(me.ancestors().map(|a| a.join("scripts")));
    }
    if let Ok(cwd) = std::env::current_dir() {
        candidates.extend(cwd.ancestors().map(|a| a.join("scripts")));
    }
    candidates
        .into_iter()
        .find(|c| c.join("pg-cluster.sh").exists())
}

/// Settings the seed draws when no flag gives them.
struct Drawn {
    profile: String,
    pool_size: u32,
    prefill: u64,
    backups: u32,
}

fn draw(seed: u64, engine: Engine, args: &Args) -> Drawn {
    let mut rng = Rng::stream(seed, "config", 0);
    let mix = setup::Mix::draw(seed);
    // near-limits judges answers that only builds with the fixes of the edges give: with an
    // earlier build in the run (--old-bin), a seed that draws it runs balanced instead.
    let profile = args.profile.clone().unwrap_or_else(|| {
        match mix.profile {
            "near-limits" if args.old_bin.is_some() => "balanced",
            p => p,
        }
        .to_string()
    });
    let pool_draw = *rng.pick(&[4u32, 4, 8, 16, 32]);
    let pool_size =
        args.database_pool_size
            .unwrap_or(if profile == "admin" { 4 } else { pool_draw });
    let prefill_draw = match engine {
        Engine::Sled if profile == "keys" => *rng.pick(&[150_000u64, 200_000, 250_000]),
        Engine::Sled => *rng.pick(&[0u64, 0, 20_000, 60_000]),
        Engine::Postgres => *rng.pick(&[0u64, 5_000, 20_000]),
    };
    let prefill = args.prefill.unwrap_or(prefill_draw);
    let b = if profile == "keys" {
        rng.range(4, 8)
    } else {
        rng.range(2, 5)
    } as u32;
    let backups = args.backups.unwrap_or(b);
    Drawn {
        profile,
        pool_size,
        prefill,
        backups,
    }
}

#[tokio::main]
async fn main() {
    let mut args = Args::parse();
    // --replay: the first line of a history decides everything it recorded.
    let mut replay_faults: Option<Vec<String>> = None;
    if let Some(path) = &args.replay {
        let first = history::read_first_line(path).unwrap_or_else(|e| usage(&e));
        let get_u = |k: &str| first[k].as_u64();
        args.seed = get_u("seed");
        args.engine = first["engine"].as_str().unwrap_or("sled").to_string();
        args.instances = get_u("instances").unwrap_or(1) as usize;
        args.duration = format!("{}ms", get_u("duration_ms").unwrap_or(180_000));
        args.request_deadline = format!("{}ms", get_u("deadline_ms").unwrap_or(10_000));
        args.clients = get_u("clients").unwrap_or(16) as usize;
        args.pooler = first["pooler"].as_bool().unwrap_or(false);
        args.database_pool_size = get_u("pool_size").map(|x| x as u32);
        args.prefill = get_u("prefill");
        args.backups = get_u("backups").map(|x| x as u32);
        args.cache_mb = get_u("cache_mb");
        args.medium_orders = first["medium_orders"].as_f64().unwrap_or(0.0);
        args.bulk_keys = get_u("bulk_keys").unwrap_or(0);
        args.profile = first["profile"].as_str().map(str::to_string);
        if args.bin == Path::new("target/release/orderly") {
            if let Some(b) = first["bin"].as_str() {
                args.bin = PathBuf::from(b);
            }
        }
        if args.old_bin.is_none() {
            args.old_bin = first["old_bin"].as_str().map(PathBuf::from);
        }
        replay_faults = first["faults"].as_array().map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        });
    }
    let engine = match args.engine.as_str() {
        "sled" => Engine::Sled,
        "postgres" | "postgresql" | "pg" => Engine::Postgres,
        e => usage(&format!("--engine {e}: sled or postgres")),
    };
    let instances = match engine {
        Engine::Sled if args.instances != 1 => usage("--instances: sled runs one instance"),
        Engine::Sled => 1,
        Engine::Postgres if !(1..=3).contains(&args.instances) => usage("--instances: 1 to 3"),
        Engine::Postgres => args.instances,
    };
    if args.clients == 0 || args.clients > 512 {
        usage("--clients: 1 to 512");
    }
    if args.pooler && engine != Engine::Postgres {
        usage("--pooler is for --engine postgres");
    }
    if args.bulk_keys > 0 && engine != Engine::Postgres {
        usage("--bulk-keys is for --engine postgres");
    }
    if let Some(p) = &args.profile {
        if p == "near-limits" && args.old_bin.is_some() {
            usage("--profile near-limits judges what only builds since the edges were fixed answer; the earlier build of --old-bin has not got them: drop one of the two");
        }
        if !setup::PROFILES.contains(&p.as_str()) {
            usage(&format!(
                "--profile {p}: one of {}",
                setup::PROFILES.join(", ")
            ));
        }
    }
    if !(0.0..=1.0).contains(&args.medium_orders) {
        usage("--medium-orders: a share from 0 to 1");
    }
    let duration = humantime::parse_duration(&args.duration)
        .unwrap_or_else(|e| usage(&format!("--duration: {e}")));
    let settle = humantime::parse_duration(&args.settle)
        .unwrap_or_else(|e| usage(&format!("--settle: {e}")));
    let deadline = humantime::parse_duration(&args.request_deadline)
        .unwrap_or_else(|e| usage(&format!("--request-deadline: {e}")));
    if !args.bin.exists() {
        usage(&format!(
            "--bin {}: no such file (build it: cargo build --release)",
            args.bin.display()
        ));
    }
    let bin = args.bin.canonicalize().unwrap_or(args.bin.clone());
    let old_bin = args.old_bin.as_ref().map(|o| {
        if !o.exists() {
            usage(&format!("--old-bin {}: no such file", o.display()));
        }
        o.canonicalize().unwrap_or(o.clone())
    });
    let seed = args.seed.unwrap_or_else(random_seed);
    let scripts = find_scripts(args.scripts.clone(), &bin)
        .unwrap_or_else(|| usage("no scripts/ directory found: give --scripts DIR"));

    // The faults asked for; the engine's and the machine's limits make SKIPPED lines.
    let requested: Vec<FaultKind> = match (&replay_faults, args.faults.as_deref()) {
        (Some(list), _) => list.iter().filter_map(|f| FaultKind::parse(f)).collect(),
        (None, None) | (None, Some("all")) => faults::ALL
            .iter()
            .copied()
            .filter(|k| k.engine().is_none_or(|e| e == engine))
            .collect(),
        (None, Some("none")) | (None, Some("")) => Vec::new(),
        (None, Some(list)) => list
            .split(',')
            .map(|f| {
                FaultKind::parse(f.trim())
                    .unwrap_or_else(|| usage(&format!("--faults: unknown fault {f:?}")))
            })
            .collect(),
    };
    let mut skipped: Vec<(String, String)> = Vec::new();
    let mut faults: Vec<FaultKind> = Vec::new();
    for k in requested {
        if let Some(e) = k.engine() {
            if e != engine {
                skipped.push((k.name().into(), format!("not on {}", engine.name())));
                continue;
            }
        }
        if !faults.contains(&k) {
            faults.push(k);
        }
    }
    // What the machine lacks, known before anything starts (the rest is found while the
    // storage is set up, and only shrinks the list).
    if faults.contains(&FaultKind::ClockStep) && !args.faketime_lib.exists() {
        faults.retain(|k| *k != FaultKind::ClockStep);
        skipped.push((
            "clock-step".into(),
            format!("no libfaketime at {}", args.faketime_lib.display()),
        ));
    }
    if faults.contains(&FaultKind::RollingUpgrade) && old_bin.is_none() {
        faults.retain(|k| *k != FaultKind::RollingUpgrade);
        skipped.push((
            "rolling-upgrade".into(),
            "no --old-bin (an earlier build to start the instances on and swap with --bin)".into(),
        ));
    }
    // The earlier build serves only when its fault runs.
    let old_bin = old_bin.filter(|_| faults.contains(&FaultKind::RollingUpgrade));
    if faults.iter().any(|k| k.in_netns()) {
        if let Some(why) = netns::missing().await {
            skip_network(&mut faults, &mut skipped, &why);
        }
    }
    if engine == Engine::Sled && args.lazyfs.is_none() {
        for k in [FaultKind::PowerLoss, FaultKind::DiskStall] {
            if let Some(p) = faults.iter().position(|x| *x == k) {
                faults.remove(p);
                skipped.push((k.name().into(), "LazyFS not given (--lazyfs PATH or LAZYFS_BIN; scripts/lazyfs.sh build DIR prints it)".into()));
            }
        }
    }
    // Every enabled kind is injected at least once: the first round of the main sequence has
    // each, fitted to the duration; a duration too short for it is refused here.
    let duration_ms = duration.as_millis() as u64;
    let minimum = faults::minimum_duration_ms(&faults);
    if duration_ms < minimum && !args.dry_run {
        usage(&format!(
            "--duration {}: too short for one round of the enabled faults ({}) and a backup under load: it needs at least {}",
            humantime::format_duration(duration),
            faults.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
            humantime::format_duration(Duration::from_millis(minimum))
        ));
    }
    let drawn = draw(seed, engine, &args);
    if args.dry_run {
        // Nothing runs yet: a closed pipe (`| head`) may end the process quietly.
        // SAFETY: resets one signal's disposition before any thread writes to stdout.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
        println!(
            "torture: seed={seed} engine={} profile={} pool={} prefill={} backups={} faults=[{}]",
            engine.name(),
            drawn.profile,
            drawn.pool_size,
            drawn.prefill,
            drawn.backups,
            faults
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(",")
        );
        println!(
            "torture: the least --duration for one round of these faults: {}",
            humantime::format_duration(Duration::from_millis(minimum))
        );
        for (k, why) in &skipped {
            println!("torture: SKIPPED {k}: {why}");
        }
        if let Some(old) = &old_bin {
            println!(
                "torture: rolling-upgrade: the instances start on {}, the roll swaps them with {}",
                old.display(),
                bin.display()
            );
        }
        let mut sched = faults::schedule(seed, &faults);
        if let Err(need) = faults::fit(&mut sched, &faults, duration_ms) {
            println!(
                "torture: --duration {} is too short (it needs {})",
                humantime::format_duration(duration),
                humantime::format_duration(Duration::from_millis(need))
            );
            std::process::exit(2);
        }
        let mut t = faults::warmup_ms(duration_ms);
        // What a rewind's draw asks for (the run may have to take the other: no standby
        // through PgBouncer, no archive on a server not the harness's own), and the roll's
        // swaps as planned (a start refused by a newer store or schema changes the rest).
        let mut roll = upgrade::Roll::default();
        let mut builds = vec![upgrade::Build::Old; instances];
        let mut detail = |p: &faults::Planned| match p.kind {
            FaultKind::HistoryRewind => {
                let v = faults::RewindVariant::pick(p.variant, true, true).expect("both");
                format!(" [{}]", v.name())
            }
            FaultKind::StoreDamage => format!(" [{}]", damage::planned(p.variant)),
            FaultKind::RollingUpgrade => match roll.next(&builds) {
                Some((i, to)) => {
                    builds[i] = to;
                    format!(
                        " [instance {i}: {} -> {} build]",
                        to.other().name(),
                        to.name()
                    )
                }
                None => String::new(),
            },
            _ => String::new(),
        };
        for p in &sched.round {
            t += p.gap_ms;
            println!(
                "torture: round: {} for {} ms after {} ms of quiet (target draw {}, variant {}{}; planned by {} ms)",
                p.kind.name(),
                p.dur_ms,
                p.gap_ms,
                p.target % 3,
                p.variant % 3,
                detail(p),
                t + p.dur_ms + p.kind.overhead_ms()
            );
            t += p.dur_ms + p.kind.overhead_ms();
        }
        for p in sched.main.iter().take_while(|p| {
            t += p.gap_ms;
            let fits = t + p.dur_ms + faults::TAIL_MS <= duration_ms;
            t += p.dur_ms + 2_000;
            fits
        }) {
            println!(
                "torture: fault {} for {} ms after {} ms of quiet (target draw {}, variant {}{})",
                p.kind.name(),
                p.dur_ms,
                p.gap_ms,
                p.target % 3,
                p.variant % 3,
                detail(p)
            );
        }
        if let Some(r) = sched.recv.first() {
            println!(
                "torture: receiver stalls from {} ms on (the first for {} ms)",
                r.gap_ms, r.dur_ms
            );
        }
        std::process::exit(0);
    }
    let work = std::env::temp_dir().join(format!("orderly-torture-{seed}-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap_or_else(|e| usage(&format!("{}: {e}", work.display())));
    // PostgreSQL runs as its own user: it must reach directories under here.
    let _ = std::fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    if !args.keep {
        cluster::register(cluster::Cleanup::RemoveDir(work.clone()));
    }
    let history_path = args
        .history
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("torture-{seed}.jsonl")));

    std::panic::set_hook(Box::new(|info| {
        eprintln!("orderly-torture: the harness panicked: {info}");
        cluster::run_cleanup();
        std::process::exit(2);
    }));
    tokio::spawn(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        println!("torture: interrupted: cleaning up");
        cluster::run_cleanup();
        std::process::exit(2);
    });

    // Storage.
    let admin_token = format!("torture-admin-{seed:x}");
    let provider_secret = format!("torture-provider-{seed:x}");
    let mut lazyfs = None;
    let mut data_dir = None;
    let mut pg = None;
    let mut net = None;
    // Said on stdout and in the history once it exists (the role the harness made).
    let mut storage_notes: Vec<String> = Vec::new();
    let mut storage_args: Vec<String>;
    let wants_lazy = faults
        .iter()
        .any(|k| matches!(k, FaultKind::PowerLoss | FaultKind::DiskStall));
    match engine {
        Engine::Sled => {
            let mut dir = work.join("data").join("db");
            if wants_lazy {
                let why = match &args.lazyfs {
                    None => Err("LazyFS not given (--lazyfs PATH or LAZYFS_BIN; scripts/lazyfs.sh build DIR prints it)".to_string()),
                    Some(b) => LazyFs::mount(b, &work.join("lazyfs")).await,
                };
                match why {
                    Ok(l) => {
                        dir = l.mnt().join("db");
                        lazyfs = Some(l);
                    }
                    Err(e) => {
                        for k in [FaultKind::PowerLoss, FaultKind::DiskStall] {
                            if let Some(p) = faults.iter().position(|x| *x == k) {
                                faults.remove(p);
                                skipped.push((k.name().into(), e.clone()));
                            }
                        }
                    }
                }
            }
            storage_args = vec!["--data-dir".into(), dir.display().to_string()];
            if let Some(mb) = args.cache_mb {
                storage_args.extend(["--cache-mb".into(), mb.to_string()]);
            }
            data_dir = Some(dir);
        }
        Engine::Postgres => {
            let rewinds = faults.contains(&FaultKind::HistoryRewind);
            let want_standby = faults.contains(&FaultKind::Failover) || rewinds;
            let db = format!("torture_{}_{}", seed % 1_000_000_000, std::process::id());
            match Pg::build(
                &scripts,
                &work,
                args.database_url.as_deref(),
                &db,
                want_standby,
                rewinds,
                args.pooler,
                args.keep,
                old_bin.is_some(),
            )
            .await
            {
                Ok((p, notes)) => {
                    for n in notes.iter().filter(|n| n.starts_with("role ")) {
                        println!("torture: {n}");
                        storage_notes.push(n.clone());
                    }
                    if rewinds && !p.has_standby() && !p.can_pitr() {
                        faults.retain(|k| *k != FaultKind::HistoryRewind);
                        let why = if args.database_url.is_some() {
                            "the server is not the harness's own (--database-url): neither a standby to promote nor a WAL archive to restore from".to_string()
                        } else {
                            format!("neither a standby nor a WAL archive ({})", notes.join("; "))
                        };
                        skipped.push(("history-rewind".into(), why));
                    }
                    if faults.contains(&FaultKind::Failover) && !p.has_standby() {
                        faults.retain(|k| *k != FaultKind::Failover);
                        let why = if args.database_url.is_some() {
                            "the server is not the harness's own (--database-url)".to_string()
                        } else if args.pooler {
                            "PgBouncer has one server: a failover needs the multi-host URL"
                                .to_string()
                        } else {
                            notes.join("; ")
                        };
                        skipped.push(("failover".into(), why));
                    }
                    if faults.contains(&FaultKind::DbRestart) && !p.is_own() {
                        faults.retain(|k| *k != FaultKind::DbRestart);
                        skipped.push((
                            "db-restart".into(),
                            "the server is not the harness's own (--database-url): no cluster to restart in place".into(),
                        ));
                    }
                    if faults.contains(&FaultKind::LostStandby) {
                        let ok = match pg::connect(&p.primary_maint_url()).await {
                            Ok(c) => c
                                .query_one(
                                    "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
                                    &[],
                                )
                                .await
                                .map(|r| r.get::<_, bool>(0))
                                .unwrap_or(false),
                            Err(_) => false,
                        };
                        if !ok {
                            faults.retain(|k| *k != FaultKind::LostStandby);
                            skipped.push((
                                "lost-standby".into(),
                                "ALTER SYSTEM needs a superuser".into(),
                            ));
                        }
                    }
                    storage_args = vec![
                        "--database-url".into(),
                        p.instance_url.clone(),
                        "--database-pool-size".into(),
                        drawn.pool_size.to_string(),
                    ];
                    if faults.iter().any(|k| k.in_netns()) {
                        match network(&p, instances).await {
                            Ok(n) => net = Some(n),
                            Err(e) => skip_network(&mut faults, &mut skipped, &e),
                        }
                    }
                    pg = Some(p);
                }
                Err(e) => cannot_run(&format!("PostgreSQL: {e}")),
            }
        }
    }

    let cfg = Config {
        bin: bin.clone(),
        engine,
        instances,
        duration,
        seed,
        faults: faults.clone(),
        clients: args.clients,
        deadline,
        max_rss_mib: args.max_rss,
        settle,
        keep: args.keep,
        faketime_lib: args.faketime_lib.clone(),
        prefill: drawn.prefill,
        backups: drawn.backups,
        work: work.clone(),
        profile: drawn.profile.clone(),
        medium_orders: args.medium_orders,
        bulk_keys: args.bulk_keys,
    };
    let first = json!({
        "torture": 1, "seed": seed, "engine": engine.name(), "instances": instances,
        "faults": faults.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "duration_ms": duration.as_millis() as u64, "deadline_ms": deadline.as_millis() as u64,
        "clients": args.clients, "bin": bin.display().to_string(), "pooler": args.pooler,
        "old_bin": old_bin.as_ref().map(|o| o.display().to_string()),
        "pool_size": drawn.pool_size, "prefill": drawn.prefill, "backups": drawn.backups, "profile": drawn.profile,
        "cache_mb": args.cache_mb, "medium_orders": args.medium_orders, "bulk_keys": args.bulk_keys,
        "skipped": skipped.iter().map(|(k, w)| json!({"fault": k, "why": w})).collect::<Vec<_>>(),
    });
    let hist = History::create(&history_path, &first)
        .unwrap_or_else(|e| usage(&format!("{}: {e}", history_path.display())));
    println!(
        "torture: seed={seed} engine={} instances={instances} duration={} profile={} clients={} faults=[{}] pool={} prefill={} backups={}{}",
        engine.name(),
        humantime::format_duration(duration),
        drawn.profile,
        args.clients,
        faults.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
        if engine == Engine::Postgres { drawn.pool_size.to_string() } else { "-".into() },
        drawn.prefill,
        drawn.backups,
        args.cache_mb.map_or(String::new(), |mb| format!(" cache-mb={mb}"))
            + &if args.medium_orders > 0.0 { format!(" medium-orders={}", args.medium_orders) } else { String::new() }
            + &if args.bulk_keys > 0 { format!(" bulk-keys={}", args.bulk_keys) } else { String::new() },
    );
    if let Some(old) = &old_bin {
        println!(
            "torture: rolling-upgrade: the instances start on {}, the roll swaps them with {}",
            old.display(),
            bin.display()
        );
    }
    println!(
        "torture: history {} ; work dir {}{}",
        history_path.display(),
        work.display(),
        if args.keep { " (kept)" } else { "" }
    );

    let mut spawn_args: Vec<String> = vec![
        "--admin-token".into(),
        admin_token.clone(),
        "--allow-private-callbacks".into(),
        "--provider-secret".into(),
        format!("torture={provider_secret}"),
        "--fulfillment-delay".into(),
        "800ms".into(),
        "--webhook-retry-schedule".into(),
        "1s,2s,4s,8s".into(),
        "--rate-limit".into(),
        "100000000".into(),
        "--request-deadline".into(),
        args.request_deadline.clone(),
    ];
    spawn_args.extend(storage_args);
    let spawner = Spawner {
        bin: bin.clone(),
        old_bin: old_bin.clone(),
        args: spawn_args,
        log_dir: work.clone(),
        faketime_lib: args.faketime_lib.clone(),
    };
    let receiver = receiver::Receiver::start(seed)
        .await
        .unwrap_or_else(|e| cannot_run(&format!("webhook receiver: {e}")));
    let instances_v: Vec<Arc<Instance>> = (0..instances)
        .map(|i| Instance::new(i, hist.start()))
        .collect();
    if let Some(n) = &net {
        if let Err(e) = receiver.listen_also(n.receiver_host()).await {
            cannot_run(&format!("webhook receiver on {}: {e}", n.receiver_host()));
        }
        for i in &instances_v {
            i.set_place(n.place(i.idx));
        }
    }
    // rolling-upgrade: the run starts on the earlier build.
    if old_bin.is_some() {
        for i in &instances_v {
            i.set_build(upgrade::Build::Old);
        }
    }
    let cluster = Cluster {
        instances: instances_v,
        spawner,
        pg,
        lazyfs,
        data_dir,
        admin_token,
        provider_secret,
        roll: std::sync::Mutex::new(upgrade::Roll::default()),
    };
    let ctx = Arc::new(Ctx {
        cfg,
        hist,
        tally: Tally::default(),
        cluster,
        state: state::State::default(),
        stopping: AtomicBool::new(false),
        faults_stopping: AtomicBool::new(false),
        faults_active: AtomicU64::new(0),
        round_done: AtomicBool::new(false),
        window: std::sync::Mutex::new(ctx::Window::default()),
        quiet_after_ms: AtomicU64::new(0),
        receiver: receiver.clone(),
        net,
    });
    receiver.attach(ctx.clone());
    for (k, why) in &skipped {
        ctx.skip(k, why);
    }
    for n in &storage_notes {
        ctx.note(n);
    }
    let code = run(&ctx).await;
    cluster::run_cleanup();
    std::process::exit(code);
}

async fn run(ctx: &Arc<Ctx>) -> i32 {
    if ctx.cfg.profile == "near-limits" {
        match setup::restore_carried(ctx).await {
            Ok(line) => {
                println!("torture: {line}");
                ctx.note(&line);
            }
            Err(e) => cannot_run(&e),
        }
    }
    if let Err(e) = ctx.cluster.start_all().await {
        cannot_run(&e);
    }
    if let Err(e) = setup::setup(ctx).await {
        cannot_run(&e);
    }
    if let Err(e) = setup::prefill(ctx, ctx.cfg.prefill).await {
        cannot_run(&e);
    }
    if ctx.cfg.bulk_keys > 0 {
        let Some(pg) = &ctx.cluster.pg else {
            cannot_run("--bulk-keys needs PostgreSQL");
        };
        let n = ctx.cfg.bulk_keys;
        let quiet = ctx.state.account(setup::QUIET).id;
        match pg.bulk_keys(n, &quiet).await {
            Ok(secs) => {
                let line = format!(
                    "bulk keys: {n} API keys of account {quiet} written straight into the database in {secs:.1} s (no instance told)"
                );
                println!("torture: {line}");
                ctx.note(&line);
            }
            Err(e) => cannot_run(&format!("--bulk-keys: {e}")),
        }
    }
    // restore-swap's other file: a backup of the store before the workload (other keys, other
    // counts than any backup taken under load).
    let base = if ctx.cfg.faults.contains(&FaultKind::RestoreSwap) {
        Some(backup::take_base(ctx).await)
    } else {
        None
    };
    let monitor = tokio::spawn(monitor::run(ctx.clone()));
    let started = Instant::now();
    let end_ms = ctx.now_ms() + ctx.cfg.duration.as_millis() as u64;
    ctx.note(&format!(
        "workload starts at {} ms, ends at {end_ms} ms",
        ctx.now_ms()
    ));
    let mut sched = faults::schedule(ctx.cfg.seed, &ctx.cfg.faults);
    if let Err(need) = faults::fit(
        &mut sched,
        &ctx.cfg.faults,
        ctx.cfg.duration.as_millis() as u64,
    ) {
        cannot_run(&format!(
            "--duration is too short for one round of the faults (it needs {})",
            humantime::format_duration(Duration::from_millis(need))
        ));
    }
    ctx.round_done
        .store(sched.round.is_empty(), Ordering::SeqCst);
    let f_main = tokio::spawn(faults::run_main(
        ctx.clone(),
        sched.round,
        sched.main,
        end_ms,
    ));
    let f_recv = tokio::spawn(faults::run_receiver(
        ctx.clone(),
        ctx.receiver.clone(),
        sched.recv,
        end_ms,
    ));
    let backups = tokio::spawn(backup::run_schedule(ctx.clone(), ctx.cfg.backups, end_ms));
    let mut mix = setup::Mix::draw(ctx.cfg.seed);
    if mix.profile != ctx.cfg.profile {
        let mut r = Rng::stream(ctx.cfg.seed, "mix-override", 0);
        let p: &'static str = match ctx.cfg.profile.as_str() {
            "orders" => "orders",
            "keys" => "keys",
            "admin" => "admin",
            "webhooks" => "webhooks",
            "near-limits" => "near-limits",
            _ => "balanced",
        };
        mix = setup::Mix::for_profile(p, &mut r);
    }
    let clients: Vec<_> = (0..ctx.cfg.clients)
        .map(|c| tokio::spawn(workload::Client::new(ctx.clone(), c, mix.clone()).run()))
        .collect();
    // The run; past its duration only while the first round of faults has not ended (at
    // most 2 minutes more: a fault that took far longer than its estimate).
    let mut extended = false;
    while started.elapsed() < ctx.cfg.duration
        || (!ctx.round_done.load(Ordering::SeqCst)
            && started.elapsed() < ctx.cfg.duration + Duration::from_secs(120))
    {
        if started.elapsed() >= ctx.cfg.duration && !extended {
            extended = true;
            let line = "the workload runs on past --duration until the first round of faults ends";
            println!("torture: {line}");
            ctx.note(line);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ctx.stopping.store(true, Ordering::SeqCst);
    ctx.faults_stopping.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = tokio::time::timeout(ctx.cfg.deadline + Duration::from_secs(20), c).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(150), f_main).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), f_recv).await;
    let mut backups = tokio::time::timeout(Duration::from_secs(150), backups)
        .await
        .ok()
        .and_then(|r| r.ok())
        .unwrap_or_default();
    backups.splice(0..0, base);
    println!(
        "torture: {:.1}s workload done; healing and checking",
        ctx.now_ms() as f64 / 1000.0
    );

    // Heal: everything up and ready, deliveries settled.
    ctx.check();
    let stuck = faults::recover(ctx).await;
    if !stuck.is_empty() {
        ctx.violation("not-ready-at-end", &format!("instances {stuck:?} did not answer /readyz 200 within 60 s after the faults stopped; restarting them for the end checks"));
        // What they acknowledged must survive a restart: the end checks then judge that.
        for k in &stuck {
            let i = &ctx.cluster.instances[*k];
            i.terminate(Duration::from_secs(35)).await;
        }
        let still = faults::recover(ctx).await;
        if !still.is_empty() {
            ctx.violation(
                "not-ready-at-end",
                &format!("instances {still:?} not ready even after a restart: end checks skipped"),
            );
            return summary(ctx);
        }
    }
    quiesce(ctx).await;
    checks::end_checks(ctx).await;
    monitor.abort();
    // The end of the run stops every instance gracefully (it must within 30 s, and let a POST
    // on the wire end); the restores come after, with no instance of the run left.
    for i in &ctx.cluster.instances {
        let t = Instant::now();
        if let Some(e) = i.terminate(Duration::from_secs(35)).await {
            ctx.check();
            if t.elapsed() > Duration::from_secs(31) {
                ctx.violation(
                    "stop-bound",
                    &format!(
                        "instance {}: SIGTERM took {:.1} s at the end (exit {:?})",
                        i.idx,
                        t.elapsed().as_secs_f64(),
                        e.code
                    ),
                );
            }
        }
    }
    // Every process has ended: the POSTs whose senders went away can all be judged now.
    let judged = ctx.receiver.judge_cut_posts(ctx.as_ref());
    if judged > 0 {
        ctx.note(&format!(
            "end: {judged} POSTs whose sender went away judged against its process's end"
        ));
    }
    ctx.receiver.recording.store(false, Ordering::SeqCst);
    backup::verify_all(ctx, &backups).await;
    if let Some(old) = &ctx.cluster.spawner.old_bin {
        let refused = ctx
            .cluster
            .instances
            .iter()
            .map(|i| i.refused.load(Ordering::Relaxed))
            .sum();
        let line = ctx
            .cluster
            .roll
            .lock()
            .unwrap()
            .summary(old, &ctx.cluster.spawner.bin, refused);
        ctx.summary_line(&line);
    }
    // Every kind the run enabled was injected at least once.
    ctx.check();
    let enabled: Vec<&str> = ctx.cfg.faults.iter().map(|k| k.name()).collect();
    let injected = ctx.tally.faults.lock().unwrap().clone();
    for k in model::missing_kinds(&enabled, &|k| injected.get(k).is_some_and(|n| *n > 0)) {
        ctx.violation(
            "fault-coverage",
            &format!("fault {k} was enabled and never injected"),
        );
    }
    summary(ctx)
}

/// Waits (bounded) for the deliveries in flight to settle: no event pending or retrying.
async fn quiesce(ctx: &Arc<Ctx>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let base = ctx.cluster.instances[0].url();
    let until = Instant::now() + ctx.cfg.settle;
    loop {
        let mut busy = 0;
        for idx in 0..ctx.state.account_count() {
            let id = ctx.state.account(idx).id;
            for f in ["pending", "retrying"] {
                let r = http
                    .get(format!(
                        "{base}/admin/accounts/{id}/events?delivery={f}&limit=1"
                    ))
                    .header(
                        "Authorization",
                        format!("Bearer {}", ctx.cluster.admin_token),
                    )
                    .send()
                    .await;
                if let Ok(r) = r {
                    if let Ok(v) = r.json::<Value>().await {
                        busy += v["events"].as_array().map(|a| a.len()).unwrap_or(0);
                    }
                }
            }
        }
        if busy == 0 || Instant::now() > until {
            if busy > 0 {
                ctx.note(&format!(
                    "deliveries still pending or retrying after {} of quiet",
                    humantime::format_duration(ctx.cfg.settle)
                ));
            }
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn summary(ctx: &Ctx) -> i32 {
    let ops = ctx.tally.ops.lock().unwrap().clone();
    let faults = ctx.tally.faults.lock().unwrap().clone();
    let violations = ctx.tally.violations.lock().unwrap().clone();
    let total_ops: u64 = ops
        .iter()
        .filter(|(k, _)| **k != "setup")
        .map(|(_, v)| *v)
        .sum();
    let total_faults: u64 = faults.values().sum();
    let total_v: u64 = violations.values().sum();
    let join = |m: Vec<(String, u64)>| {
        m.into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "torture: operations: {}",
        join(ops.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    );
    println!(
        "torture: faults: {}",
        if faults.is_empty() {
            "none".into()
        } else {
            join(faults.into_iter().collect())
        }
    );
    for (k, why) in ctx.tally.skipped.lock().unwrap().iter() {
        println!("torture: SKIPPED {k}: {why}");
    }
    for l in ctx.tally.summary_lines.lock().unwrap().iter() {
        println!("torture: {l}");
    }
    if !violations.is_empty() {
        println!(
            "torture: violations: {}",
            join(violations.into_iter().collect())
        );
    }
    let exempt = ctx.tally.exempt.load(Ordering::Relaxed);
    let rss: Vec<String> = ctx
        .cluster
        .instances
        .iter()
        .map(|i| format!("{}", i.rss_peak_kib.load(Ordering::Relaxed) / 1024))
        .collect();
    println!(
        "torture: {} requests exempt from the deadline (instance paused or killed in flight); peak RSS MiB per instance [{}]; {} webhook POSTs ({} same-process overlaps); history {}{}",
        exempt,
        rss.join(","),
        ctx.receiver.count.load(Ordering::Relaxed),
        ctx.receiver.same_instance_overlaps.load(Ordering::Relaxed),
        ctx.hist.path().display(),
        if ctx.hist.ops_dropped() > 0 { format!(" ({} operation lines over the bound)", ctx.hist.ops_dropped()) } else { String::new() },
    );
    let line = format!(
        "torture: seed={} engine={} instances={} duration={}: {} operations, {} faults, {} checks, {} violations",
        ctx.cfg.seed,
        ctx.cfg.engine.name(),
        ctx.cfg.instances,
        humantime::format_duration(ctx.cfg.duration),
        total_ops,
        total_faults,
        ctx.tally.checks.load(Ordering::Relaxed),
        total_v
    );
    ctx.note(&line);
    ctx.hist.flush();
    println!("{line}");
    if total_v > 0 {
        1
    } else {
        0
    }
}
