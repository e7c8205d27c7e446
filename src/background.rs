//! Threads for work no request waits on (a backup's walk, decoding and encoding): they give
//! the CPU to requests. On two cores those three otherwise take the time the request path
//! needs, and orders placed during a backup waited 2.8x their quiet p99.

use std::thread::JoinHandle;

/// Niceness of a background thread: the lowest priority there is short of SCHED_IDLE, which
/// would starve a backup under steady load.
const NICENESS: libc::c_int = 19;

/// Runs `work` on a thread of its own at the lowest priority. Linux gives each thread its own
/// niceness, so the rest of the process is untouched, and the thread ends with its work (a
/// pooled thread could not be given its priority back without privilege). Where the priority
/// cannot be lowered the work runs at normal priority.
pub(crate) fn spawn_idle<F>(name: &str, work: F) -> JoinHandle<()>
where
    F: FnOnce() + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            lower_priority();
            work()
        })
        .expect("spawning a background thread")
}

fn lower_priority() {
    // SAFETY: gettid and setpriority take and return plain integers and touch no memory of
    // ours; a failure is reported in the return value, which is checked.
    let lowered = unsafe {
        let thread = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, thread, NICENESS)
    };
    if lowered != 0 {
        log::debug!(
            "a background thread keeps its priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Keeps a background loop to a share of one core: called between pieces of its work, it
/// sleeps as long as the work since the last call took, times `(1 - share) / share`.
pub(crate) struct Pace {
    rest_per_busy: f64,
    since: std::time::Instant,
}

impl Pace {
    pub(crate) fn at(share: f64) -> Self {
        Pace {
            rest_per_busy: (1.0 - share) / share,
            since: std::time::Instant::now(),
        }
    }

    pub(crate) fn rest(&mut self) {
        let busy = self.since.elapsed();
        std::thread::sleep(busy.mul_f64(self.rest_per_busy));
        self.since = std::time::Instant::now();
    }
}
