//! What every part of a run shares: the resolved configuration, the history, the tallies the
//! summary prints (operations, faults, checks, violations) and the one way to report a
//! violation.

use crate::cluster::Cluster;
pub use crate::engine::Engine;
use crate::fault_kind::FaultKind;
use crate::history::History;
use crate::model::SenderEnd;
use crate::receiver::{Judge, Receiver};
use crate::state::State;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A run's settings once flags, the seed's draws and `--replay` are resolved.
#[derive(Clone, Debug)]
pub struct Config {
    pub bin: PathBuf,
    pub engine: Engine,
    pub instances: usize,
    pub duration: Duration,
    pub seed: u64,
    /// The faults the schedule draws from (requested, supported, and set up).
    pub faults: Vec<FaultKind>,
    pub clients: usize,
    pub deadline: Duration,
    pub max_rss_mib: u64,
    /// How long the end waits for deliveries to settle (`--settle`).
    pub settle: Duration,
    pub keep: bool,
    pub faketime_lib: PathBuf,
    pub prefill: u64,
    pub backups: u32,
    pub work: PathBuf,
    /// The mix of operations, drawn from the seed (weights per kind).
    pub profile: String,
    /// The share of orders whose delivery data is 3 to 8 KiB (`--medium-orders`): answers and
    /// rows of that size fill sled's pages past its blob threshold at 33 rows.
    pub medium_orders: f64,
    /// API keys written straight into the database before the workload (`--bulk-keys`).
    pub bulk_keys: u64,
}

impl Config {
    pub fn deadline_ms(&self) -> u64 {
        self.deadline.as_millis() as u64
    }
}

/// Counters for the summary.
#[derive(Default)]
pub struct Tally {
    pub checks: AtomicU64,
    pub ops: Mutex<BTreeMap<&'static str, u64>>,
    pub faults: Mutex<BTreeMap<String, u64>>,
    pub violations: Mutex<BTreeMap<String, u64>>,
    pub skipped: Mutex<Vec<(String, String)>>,
    pub exempt: AtomicU64,
    /// Revocations soon after a rewind whose key some instance accepted for a while (within
    /// the grace).
    pub rewind_grace_used: AtomicU64,
    /// Lines the summary prints before its last (what the rewinds undid).
    pub summary_lines: Mutex<Vec<String>>,
}

pub struct Ctx {
    pub cfg: Config,
    pub hist: History,
    pub tally: Tally,
    pub cluster: Cluster,
    pub state: State,
    /// Set when the clients must stop (end of the run, or Ctrl-C).
    pub stopping: AtomicBool,
    /// Set when the fault schedule must stop and heal.
    pub faults_stopping: AtomicBool,
    /// Which instance a backup is streaming from, and which a process fault is on: neither
    /// starts on an instance the other holds (a backup gets its window).
    pub window: Mutex<Window>,
    /// The first round of the main sequence (every kind once) has ended.
    pub round_done: AtomicBool,
    /// Faults in force now (the receiver's stalls not counted: they touch no instance).
    pub faults_active: AtomicU64,
    /// A fault ended less than a grace period before this: answers that only a fault
    /// explains (a 500, writes that stop) are not judged until then.
    pub quiet_after_ms: AtomicU64,
    pub receiver: Arc<Receiver>,
    /// The instances' network namespaces (net-slow, partition), when the run has them.
    pub net: Option<crate::netns::Net>,
}

/// See `Ctx::window`.
#[derive(Default, Debug)]
pub struct Window {
    pub backup_on: Option<usize>,
    pub fault_on: Option<usize>,
}

/// Who takes the window.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    Backup,
    Fault,
}

/// How many lines of one check are printed before the rest are only counted.
const PRINT_PER_CHECK: u64 = 25;

impl Ctx {
    pub fn now_ms(&self) -> u64 {
        self.hist.now_ms()
    }

    /// One check made (whatever its result): the summary's C.
    pub fn check(&self) {
        self.tally.checks.fetch_add(1, Ordering::Relaxed);
    }

    pub fn checks(&self, n: u64) {
        self.tally.checks.fetch_add(n, Ordering::Relaxed);
    }

    /// Reports a violation: one line on stdout (the first few of each check), one in the
    /// history.
    pub fn violation(&self, check: &str, detail: &str) {
        let n = {
            let mut v = self.tally.violations.lock().unwrap();
            let c = v.entry(check.to_string()).or_insert(0);
            *c += 1;
            *c
        };
        self.hist.violation(check, detail);
        if n <= PRINT_PER_CHECK {
            println!("VIOLATION {check}: {detail}");
        } else if n == PRINT_PER_CHECK + 1 {
            println!("VIOLATION {check}: (further violations of this check are counted and written to the history only)");
        }
    }

    pub fn count_op(&self, kind: &'static str) {
        *self.tally.ops.lock().unwrap().entry(kind).or_insert(0) += 1;
    }

    pub fn count_fault(&self, kind: &str) {
        *self
            .tally
            .faults
            .lock()
            .unwrap()
            .entry(kind.to_string())
            .or_insert(0) += 1;
    }

    pub fn skip(&self, what: &str, why: &str) {
        self.hist.note(&format!("SKIPPED {what}: {why}"));
        self.tally
            .skipped
            .lock()
            .unwrap()
            .push((what.to_string(), why.to_string()));
    }

    pub fn note(&self, text: &str) {
        self.hist.note(text);
    }

    /// A line for the summary (and the history).
    pub fn summary_line(&self, text: &str) {
        self.hist.note(text);
        self.tally
            .summary_lines
            .lock()
            .unwrap()
            .push(text.to_string());
    }

    pub fn fault_begin(&self) {
        self.faults_active.fetch_add(1, Ordering::SeqCst);
    }

    /// A fault ended: what only a fault explains is judged again `grace_ms` later.
    pub fn fault_end(&self, grace_ms: u64) {
        self.quiet_after_ms
            .fetch_max(self.now_ms() + grace_ms, Ordering::SeqCst);
        self.faults_active.fetch_sub(1, Ordering::SeqCst);
    }

    /// A fault is in force, or ended within its grace period.
    pub fn faults_busy(&self) -> bool {
        self.faults_active.load(Ordering::SeqCst) > 0
            || self.now_ms() < self.quiet_after_ms.load(Ordering::SeqCst)
    }

    /// Takes instance `idx` for a backup or a process fault, waiting (at most `max`) while the
    /// other holds it. Returns whether it waited at all, and false in `.1` if it gave up.
    pub async fn take_window(&self, who: Holder, idx: usize, max: Duration) -> (bool, bool) {
        let until = std::time::Instant::now() + max;
        let mut waited = false;
        loop {
            {
                let mut w = self.window.lock().unwrap();
                let other = match who {
                    Holder::Backup => w.fault_on,
                    Holder::Fault => w.backup_on,
                };
                if other != Some(idx) || std::time::Instant::now() > until {
                    let taken = other != Some(idx);
                    match who {
                        Holder::Backup => w.backup_on = Some(idx),
                        Holder::Fault => w.fault_on = Some(idx),
                    }
                    return (waited, taken);
                }
            }
            waited = true;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn release_window(&self, who: Holder) {
        let mut w = self.window.lock().unwrap();
        match who {
            Holder::Backup => w.backup_on = None,
            Holder::Fault => w.fault_on = None,
        }
    }

    pub fn receiver_url(&self, account: usize) -> String {
        self.receiver.url_for(account)
    }
}

impl Judge for Ctx {
    fn now_ms(&self) -> u64 {
        Ctx::now_ms(self)
    }
    fn senders(&self) -> Vec<(usize, i32, u64)> {
        self.cluster
            .instances
            .iter()
            .map(|i| {
                let (pid, gen) = i.pid_gen();
                (i.idx, pid, gen)
            })
            .collect()
    }
    fn secrets_of(&self, account: usize) -> Vec<String> {
        self.state.secrets_of(account)
    }
    fn check(&self) {
        Ctx::check(self)
    }
    fn violation(&self, check: &str, detail: &str) {
        Ctx::violation(self, check, detail)
    }
    fn note(&self, text: &str) {
        Ctx::note(self, text)
    }
    fn record(&self, op: serde_json::Value) {
        self.hist.op(op)
    }
    fn end_of(&self, instance: usize, gen: u64) -> Option<SenderEnd> {
        self.cluster.instances[instance].end_of(gen)
    }
    fn paused_during(&self, instance: Option<usize>, from: u64, to: u64) -> bool {
        match instance {
            Some(i) => self.cluster.instances[i].paused_during(from, to),
            None => self
                .cluster
                .instances
                .iter()
                .any(|x| x.paused_during(from, to)),
        }
    }
    fn on_sled(&self) -> bool {
        self.cfg.engine == Engine::Sled
    }
}
