//! The processes of a run: orderly instances (start, kill -9, pause, restart, under libfaketime
//! or a file-size limit, on either build of a rolling upgrade, in a network namespace of its
//! own), the cluster of them with its storage (pg.rs, lazyfs.rs), and the
//! cleanup that removes everything on any exit (normal, Ctrl-C, SIGTERM, a panic).

use crate::lazyfs::LazyFs;
use crate::model::{Ending, SenderEnd};
use crate::pg::Pg;
pub use crate::procs::*;
use crate::upgrade::{is_refusal, refusal_line, short, Build, Roll};
use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicI32, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Instances.

/// Where an instance runs when it has a network namespace of its own (netns.rs): the
/// namespace, the address it listens on (the harness's clients reach it there), and the
/// address of the host that its database URL names instead of 127.0.0.1 (the proxies listen
/// there too).
#[derive(Clone, Debug)]
pub struct NetPlace {
    pub ns_path: PathBuf,
    pub addr: std::net::Ipv4Addr,
    pub db_host: std::net::Ipv4Addr,
}

/// The serve flags for an instance at `place`: its database URL names the host's address the
/// namespace reaches instead of 127.0.0.1 (the namespace's own loopback has no proxy).
pub fn args_for(args: &[String], place: Option<&NetPlace>) -> Vec<String> {
    let Some(place) = place else {
        return args.to_vec();
    };
    let mut out = args.to_vec();
    for k in 1..out.len() {
        if out[k - 1] == "--database-url" {
            out[k] = out[k].replace("127.0.0.1", &place.db_host.to_string());
        }
    }
    out
}

/// How an instance is started this time (a clock step, a full disk).
#[derive(Clone, Debug, Default)]
pub struct LaunchMods {
    /// FAKETIME for libfaketime (e.g. "+600s"); None: the real clock.
    pub faketime: Option<String>,
    /// RLIMIT_FSIZE in bytes (writes past it fail with EFBIG, SIGXFSZ ignored): a full disk.
    pub fsize_limit: Option<u64>,
    /// A start that may be refused (store-damage: a damaged store): the build under test
    /// (`--bin`) runs it, its stderr goes to this file alone (the refusal's one line is
    /// judged there), and its exit at start is the fault's to judge, not a death. Once it
    /// answers /healthz it is a process like any other.
    pub probe: Option<PathBuf>,
}

pub struct Spawner {
    pub bin: PathBuf,
    /// rolling-upgrade's earlier build (`--old-bin`): instances on `Build::Old` run it.
    pub old_bin: Option<PathBuf>,
    /// Every `serve` flag but `--listen`.
    pub args: Vec<String>,
    pub log_dir: PathBuf,
    pub faketime_lib: PathBuf,
}

#[derive(Clone, Debug)]
pub struct Exit {
    pub at_ms: u64,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub expected: bool,
}

#[derive(Default)]
struct InstState {
    running: bool,
    paused_since: Option<u64>,
    down_since: Option<u64>,
    /// Closed intervals [from, to] in ms when the process was stopped (SIGSTOP).
    pauses: Vec<(u64, u64)>,
    /// Closed intervals when it was not running (killed, exited, restarting).
    downs: Vec<(u64, u64)>,
    expect_exit: bool,
    /// Started, not yet answering /healthz: an exit now is the start's to judge (a refusal
    /// of a newer store or schema is no death), not the monitor's until the start says so.
    starting: bool,
    unreported: Vec<Exit>,
    last_exit: Option<Exit>,
    mods: LaunchMods,
    /// The pid and process generation (its start count) of the process now running, read
    /// together (the receiver attributes each connection to a process).
    pid: i32,
    gen: u64,
    /// How each process generation ended (or was signalled to end).
    ends: HashMap<u64, SenderEnd>,
}

pub struct Instance {
    pub idx: usize,
    t0: Instant,
    port: AtomicU16,
    pid: AtomicI32,
    state: Mutex<InstState>,
    /// Bumped whenever the process is disturbed (paused, killed, restarted): a request whose
    /// epoch changed while in flight is exempt from the deadline and the watchdog.
    epoch: AtomicU64,
    next_req: AtomicU64,
    /// Requests in flight: id -> (sent ms, is a write).
    inflight: Mutex<BTreeMap<u64, (u64, bool)>>,
    pub last_answer_ms: AtomicU64,
    pub last_write_done_ms: AtomicU64,
    pub rss_peak_kib: AtomicU64,
    pub starts: AtomicU64,
    pub last_write_sent_ms: AtomicU64,
    /// Armed by the full-disk fault: (armed at, the first write that failed after it).
    failure_watch: Mutex<Option<(u64, Option<u64>)>>,
    /// The build it runs (rolling-upgrade; always `New` without `--old-bin`).
    build: Mutex<Build>,
    /// Starts refused by a store or schema newer than the build knew, each followed by the
    /// other build's start: not yet said by a fault's note.
    refusals: Mutex<Vec<String>>,
    /// How many starts were refused so (the summary's count).
    pub refused: AtomicU64,
    /// Its network namespace, when it has one (set once, before its first start).
    place: std::sync::OnceLock<NetPlace>,
}

impl Instance {
    pub fn new(idx: usize, t0: Instant) -> Arc<Instance> {
        Arc::new(Instance {
            idx,
            t0,
            port: AtomicU16::new(free_port()),
            pid: AtomicI32::new(0),
            state: Mutex::new(InstState {
                down_since: Some(0),
                ..Default::default()
            }),
            epoch: AtomicU64::new(0),
            next_req: AtomicU64::new(0),
            inflight: Mutex::new(BTreeMap::new()),
            last_answer_ms: AtomicU64::new(0),
            last_write_done_ms: AtomicU64::new(0),
            rss_peak_kib: AtomicU64::new(0),
            starts: AtomicU64::new(0),
            last_write_sent_ms: AtomicU64::new(0),
            failure_watch: Mutex::new(None),
            build: Mutex::new(Build::New),
            refusals: Mutex::new(Vec::new()),
            refused: AtomicU64::new(0),
            place: std::sync::OnceLock::new(),
        })
    }

    /// The build its next start runs.
    pub fn build(&self) -> Build {
        *self.build.lock().unwrap()
    }

    pub fn set_build(&self, b: Build) {
        *self.build.lock().unwrap() = b;
    }

    /// The refusals since the last call (see `refusals`).
    pub fn take_refusals(&self) -> Vec<String> {
        std::mem::take(&mut self.refusals.lock().unwrap())
    }

    /// The process of a start exited before it answered. The documented refusal of a newer
    /// store or schema (exit 2, docs/operations.md "Upgrades"), with the other build there to
    /// start instead, is the binary's answer, not a death: true, and the instance moves to the
    /// other build. Anything else is handed to the monitor as any exit of its own is: false.
    fn exit_at_start(&self, sp: &Spawner, tail: &str, probe: bool) -> bool {
        let mut s = self.state.lock().unwrap();
        s.starting = false;
        let Some(e) = s.last_exit.clone() else {
            return false;
        };
        let refused = !probe && sp.old_bin.is_some() && is_refusal(e.code, tail);
        if !refused {
            if !e.expected {
                s.unreported.push(e);
            }
            return false;
        }
        drop(s);
        let Some(old) = &sp.old_bin else {
            return false;
        };
        let from = self.build();
        let bin = match from {
            Build::Old => old,
            Build::New => &sp.bin,
        };
        self.refusals.lock().unwrap().push(format!(
            "the {} build {} refused to start (exit 2: {}), so the {} build started instead",
            from.name(),
            short(bin),
            refusal_line(tail),
            from.other().name()
        ));
        self.set_build(from.other());
        self.refused.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    pub fn url(&self) -> String {
        format!(
            "http://{}:{}",
            self.host(),
            self.port.load(Ordering::SeqCst)
        )
    }

    /// The address it listens on: its namespace's, or 127.0.0.1.
    fn host(&self) -> std::net::Ipv4Addr {
        self.place
            .get()
            .map(|p| p.addr)
            .unwrap_or(std::net::Ipv4Addr::LOCALHOST)
    }

    /// Puts the instance in a network namespace for all its starts (before the first).
    pub fn set_place(&self, place: NetPlace) {
        let _ = self.place.set(place);
    }

    pub fn pid(&self) -> i32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// The running process's pid and generation (1 for the first start), read together;
    /// pid 0 when none runs.
    pub fn pid_gen(&self) -> (i32, u64) {
        let s = self.state.lock().unwrap();
        (s.pid, s.gen)
    }

    /// The generation of the process now running (or the last one).
    pub fn gen(&self) -> u64 {
        self.state.lock().unwrap().gen
    }

    /// How process generation `gen` ended, if it has (or has been signalled to).
    pub fn end_of(&self, gen: u64) -> Option<SenderEnd> {
        self.state.lock().unwrap().ends.get(&gen).copied()
    }

    /// Records that the harness is about to end the running process, and how.
    fn signalled(s: &mut InstState, how: Ending, now: u64) {
        let gen = s.gen;
        s.ends.entry(gen).or_insert(SenderEnd {
            how,
            signal_ms: Some(now),
            exit_ms: None,
        });
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    pub fn is_running(&self) -> bool {
        self.state.lock().unwrap().running
    }

    pub fn is_paused(&self) -> bool {
        self.state.lock().unwrap().paused_since.is_some()
    }

    /// Running and not stopped: requests to it must be answered.
    pub fn is_live(&self) -> bool {
        let s = self.state.lock().unwrap();
        s.running && s.paused_since.is_none()
    }

    pub fn set_mods(&self, mods: LaunchMods) {
        self.state.lock().unwrap().mods = mods;
    }

    pub fn mods(&self) -> LaunchMods {
        self.state.lock().unwrap().mods.clone()
    }

    /// The instance was stopped (SIGSTOP) at some point in [from, to].
    pub fn paused_during(&self, from: u64, to: u64) -> bool {
        let s = self.state.lock().unwrap();
        s.pauses.iter().any(|(a, b)| *a <= to && from <= *b)
            || s.paused_since.is_some_and(|p| p <= to)
    }

    /// The instance was paused, down or restarting at some point in [from, to].
    pub fn disturbed_during(&self, from: u64, to: u64) -> bool {
        let s = self.state.lock().unwrap();
        s.pauses
            .iter()
            .chain(s.downs.iter())
            .any(|(a, b)| *a <= to && from <= *b)
            || s.paused_since.is_some_and(|p| p <= to)
            || s.down_since.is_some_and(|p| p <= to)
    }

    /// The end of the last disturbance (pause, downtime), for the watchdog.
    pub fn last_disturbance_end(&self) -> u64 {
        let s = self.state.lock().unwrap();
        let a = s.pauses.last().map(|p| p.1).unwrap_or(0);
        let b = s.downs.last().map(|p| p.1).unwrap_or(0);
        a.max(b)
    }

    pub fn take_unreported_exits(&self) -> Vec<Exit> {
        std::mem::take(&mut self.state.lock().unwrap().unreported)
    }

    pub fn last_exit(&self) -> Option<Exit> {
        self.state.lock().unwrap().last_exit.clone()
    }

    /// Marks a request sent: returns its id and the epoch it was sent in.
    pub fn begin_request(&self, is_write: bool, now_ms: u64) -> (u64, u64) {
        let id = self.next_req.fetch_add(1, Ordering::Relaxed);
        self.inflight.lock().unwrap().insert(id, (now_ms, is_write));
        if is_write {
            self.last_write_sent_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
        (id, self.epoch())
    }

    /// Marks a request answered (or given up). `answered`: a response came back;
    /// `write_done`: it was a write answered 2xx (the storage completed it); `write_failed`: a
    /// write answered 5xx or dropped.
    pub fn end_request(
        &self,
        id: u64,
        answered: bool,
        write_done: bool,
        write_failed: bool,
        now_ms: u64,
    ) {
        self.inflight.lock().unwrap().remove(&id);
        if write_failed {
            if let Some((armed, first)) = self.failure_watch.lock().unwrap().as_mut() {
                if first.is_none() && now_ms >= *armed {
                    *first = Some(now_ms);
                }
            }
        }
        if answered {
            self.last_answer_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
        if write_done {
            self.last_write_done_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }

    pub fn arm_failure_watch(&self, now_ms: u64) {
        *self.failure_watch.lock().unwrap() = Some((now_ms, None));
    }

    pub fn disarm_failure_watch(&self) {
        *self.failure_watch.lock().unwrap() = None;
    }

    pub fn first_failure(&self) -> Option<u64> {
        self.failure_watch.lock().unwrap().and_then(|(_, f)| f)
    }

    /// The send time of the oldest write in flight, and of the oldest request of any kind.
    pub fn oldest_inflight(&self) -> (Option<u64>, Option<u64>) {
        let m = self.inflight.lock().unwrap();
        let w = m.values().filter(|(_, w)| *w).map(|(t, _)| *t).min();
        let a = m.values().map(|(t, _)| *t).min();
        (w, a)
    }

    /// Starts the process and waits for /healthz (a bind failure retries on a fresh port; a
    /// build refused by a newer store or schema is followed by the other build).
    pub async fn start(self: &Arc<Self>, sp: &Spawner) -> Result<(), String> {
        if self.is_running() {
            return Ok(());
        }
        let mods = self.mods();
        let mut last_err = String::new();
        for _attempt in 0..3 {
            let port = self.port.load(Ordering::SeqCst);
            let log_path = sp.log_dir.join(format!("instance-{}.log", self.idx));
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(|e| format!("{}: {e}", log_path.display()))?;
            let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
            let log2 = log.try_clone().map_err(|e| e.to_string())?;
            let bin = match (self.build(), &sp.old_bin) {
                _ if mods.probe.is_some() => &sp.bin,
                (Build::Old, Some(old)) => old,
                _ => &sp.bin,
            };
            let err_out = match &mods.probe {
                Some(p) => Stdio::from(
                    std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?,
                ),
                None => Stdio::from(log2),
            };
            let mut cmd = tokio::process::Command::new(bin);
            cmd.arg("serve")
                .arg("--listen")
                .arg(format!("{}:{port}", self.host()))
                .args(args_for(&sp.args, self.place.get()));
            cmd.stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(err_out);
            cmd.env(
                "RUST_LOG",
                std::env::var("ORDERLY_TORTURE_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            );
            if let Some(ft) = &mods.faketime {
                cmd.env("LD_PRELOAD", &sp.faketime_lib);
                cmd.env("FAKETIME", ft);
                // Only the wall clock moves: a monotonic clock that jumps would be another
                // fault (and tokio's timers would misfire).
                cmd.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
                cmd.env("FAKETIME_NO_CACHE", "1");
            }
            let limit = mods.fsize_limit;
            // Opened here, entered in the child (the file closes at exec: O_CLOEXEC).
            let ns = match self.place.get() {
                Some(p) => Some(
                    std::fs::File::open(&p.ns_path)
                        .map_err(|e| format!("{}: {e}", p.ns_path.display()))?,
                ),
                None => None,
            };
            let ns_fd = ns.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
            // SAFETY: only async-signal-safe calls (prctl, setns, setrlimit, signal) between
            // fork and exec; ns_fd stays open in the parent until the spawn returned.
            unsafe {
                cmd.pre_exec(move || {
                    if let Some(fd) = ns_fd {
                        if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    // Dies with the harness, even a harness killed with -9.
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    // A group of its own, as under a service manager: a signal it sends to
                    // its group (kill(0, …)) must not reach the harness.
                    libc::setpgid(0, 0);
                    if let Some(bytes) = limit {
                        let r = libc::rlimit {
                            rlim_cur: bytes,
                            rlim_max: bytes,
                        };
                        libc::setrlimit(libc::RLIMIT_FSIZE, &r);
                        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    }
                    Ok(())
                });
            }
            let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", bin.display()))?;
            drop(ns);
            let pid = child.id().unwrap_or(0) as i32;
            live_add(pid);
            let gen = {
                let mut s = self.state.lock().unwrap();
                self.pid.store(pid, Ordering::SeqCst);
                let gen = self.starts.fetch_add(1, Ordering::Relaxed) + 1;
                s.pid = pid;
                s.gen = gen;
                s.running = true;
                // Under a file-size limit the process is meant to stop by itself (a full
                // disk): its fault judges the exit.
                s.expect_exit = mods.fsize_limit.is_some() || mods.probe.is_some();
                s.starting = true;
                gen
            };
            let me = self.clone();
            tokio::spawn(async move {
                let st = child.wait().await;
                live_remove(pid);
                let now = me.now_ms();
                me.epoch.fetch_add(1, Ordering::SeqCst);
                let mut s = me.state.lock().unwrap();
                s.running = false;
                if let Some(p) = s.paused_since.take() {
                    s.pauses.push((p, now));
                }
                if s.down_since.is_none() {
                    s.down_since = Some(now);
                }
                use std::os::unix::process::ExitStatusExt;
                let (code, sig) = match st {
                    Ok(st) => (st.code(), st.signal()),
                    Err(_) => (None, None),
                };
                let e = Exit {
                    at_ms: now,
                    code,
                    signal: sig,
                    expected: s.expect_exit,
                };
                // Not signalled by the harness: under a file-size limit, the full disk's
                // exit; otherwise a death of its own.
                let how = if e.expected {
                    Ending::FullDiskExit
                } else {
                    Ending::Died
                };
                s.ends
                    .entry(gen)
                    .or_insert(SenderEnd {
                        how,
                        signal_ms: None,
                        exit_ms: None,
                    })
                    .exit_ms = Some(now);
                if s.gen == gen {
                    s.pid = 0;
                }
                s.expect_exit = false;
                if !e.expected && !s.starting {
                    s.unreported.push(e.clone());
                }
                s.last_exit = Some(e);
                me.pid
                    .compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .ok();
            });
            let deadline = Instant::now() + Duration::from_secs(180);
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(1))
                .build()
                .map_err(|e| e.to_string())?;
            loop {
                if !self.is_running() {
                    let mut tail = log_tail(&log_path, log_start, 8);
                    if let Some(p) = &mods.probe {
                        let err = std::fs::read_to_string(p).unwrap_or_default();
                        tail = format!("{tail} | {}", err.lines().collect::<Vec<_>>().join(" | "));
                    }
                    if self.exit_at_start(sp, &tail, mods.probe.is_some()) {
                        last_err = format!("instance {} refused to start: {tail}", self.idx);
                        break;
                    }
                    if tail.contains("Address already in use") || tail.contains("address in use") {
                        self.port.store(free_port(), Ordering::SeqCst);
                        last_err = format!("port {port} in use");
                        break;
                    }
                    return Err(format!("instance {} exited at start: {tail}", self.idx));
                }
                if let Ok(r) = client
                    .get(format!("http://{}:{port}/healthz", self.host()))
                    .send()
                    .await
                {
                    if r.status().is_success() {
                        let now = self.now_ms();
                        let mut s = self.state.lock().unwrap();
                        s.starting = false;
                        if mods.probe.is_some() {
                            // It opened: from now on an exit of its own is a death.
                            s.expect_exit = false;
                        }
                        if let Some(d) = s.down_since.take() {
                            s.downs.push((d, now));
                        }
                        drop(s);
                        self.epoch.fetch_add(1, Ordering::SeqCst);
                        return Ok(());
                    }
                }
                if Instant::now() > deadline {
                    self.kill9().await;
                    return Err(format!(
                        "instance {} did not answer /healthz within 180 s: {}",
                        self.idx,
                        log_tail(&log_path, log_start, 8)
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Err(last_err)
    }

    /// kill -9 (continuing it first is not needed: SIGKILL ends a stopped process too).
    pub async fn kill9(&self) {
        self.kill9_as(Ending::Kill9).await
    }

    /// kill -9, recorded as `how` (a power loss is a kill -9 with the disk's cache dropped).
    pub async fn kill9_as(&self, how: Ending) {
        let pid = self.pid();
        {
            let now = self.now_ms();
            let mut s = self.state.lock().unwrap();
            if !s.running {
                return;
            }
            s.expect_exit = true;
            s.down_since.get_or_insert(now);
            Self::signalled(&mut s, how, now);
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        signal(pid, libc::SIGKILL);
        self.wait_exit(Duration::from_secs(10)).await;
    }

    /// SIGTERM, then SIGKILL if it has not ended within `grace`. Returns the exit.
    pub async fn terminate(&self, grace: Duration) -> Option<Exit> {
        let pid = self.pid();
        {
            let now = self.now_ms();
            let mut s = self.state.lock().unwrap();
            if !s.running {
                return s.last_exit.clone();
            }
            s.expect_exit = true;
            s.down_since.get_or_insert(now);
            Self::signalled(&mut s, Ending::Term, now);
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        signal(pid, libc::SIGCONT);
        signal(pid, libc::SIGTERM);
        if !self.wait_exit(grace).await {
            signal(pid, libc::SIGKILL);
            self.wait_exit(Duration::from_secs(10)).await;
        }
        self.last_exit()
    }

    /// Says the next exit is the harness's doing (a full disk's exit is checked by its fault).
    pub fn expect_exit(&self) {
        let mut s = self.state.lock().unwrap();
        s.expect_exit = true;
    }

    pub async fn wait_exit(&self, max: Duration) -> bool {
        let until = Instant::now() + max;
        while self.is_running() {
            if Instant::now() > until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    pub fn pause(&self) -> bool {
        let now = self.now_ms();
        let mut s = self.state.lock().unwrap();
        if !s.running || s.paused_since.is_some() {
            return false;
        }
        s.paused_since = Some(now);
        drop(s);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        signal(self.pid(), libc::SIGSTOP)
    }

    pub fn resume(&self) {
        let now = self.now_ms();
        let mut s = self.state.lock().unwrap();
        if let Some(p) = s.paused_since.take() {
            s.pauses.push((p, now));
        }
        drop(s);
        signal(self.pid(), libc::SIGCONT);
    }
}

/// The last lines of an instance's log written since `from`.
pub fn log_tail(path: &Path, from: u64, lines: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let from = (from as usize).min(text.len());
    let s = String::from_utf8_lossy(&text[from..]);
    let v: Vec<&str> = s.lines().rev().take(lines).collect();
    v.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

// ---------------------------------------------------------------------------------------------
// The cluster of a run.

pub struct Cluster {
    pub instances: Vec<Arc<Instance>>,
    pub spawner: Spawner,
    pub pg: Option<Pg>,
    pub lazyfs: Option<LazyFs>,
    /// sled: the data directory of the one instance.
    pub data_dir: Option<PathBuf>,
    pub admin_token: String,
    pub provider_secret: String,
    /// rolling-upgrade's roll (which instance is swapped next, and to which build).
    pub roll: Mutex<Roll>,
}

impl Cluster {
    /// The live instances' indexes (running, not paused), or every index when none is.
    pub fn live(&self) -> Vec<usize> {
        let v: Vec<usize> = self
            .instances
            .iter()
            .filter(|i| i.is_live())
            .map(|i| i.idx)
            .collect();
        if v.is_empty() {
            (0..self.instances.len()).collect()
        } else {
            v
        }
    }

    /// What each instance runs, by index.
    pub fn builds(&self) -> Vec<Build> {
        self.instances.iter().map(|i| i.build()).collect()
    }

    /// Starts every instance that is not running.
    pub async fn start_all(&self) -> Result<(), String> {
        for i in &self.instances {
            i.start(&self.spawner).await?;
        }
        Ok(())
    }
}
