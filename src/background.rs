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
/// sleeps as long as the CPU time the thread spent since the last call, times
/// `(1 - share) / share`. CPU time, not time passed: a loop that waits (a backup's encoder
/// waiting for the first records while a sled walk of minutes runs) has done no work meanwhile.
/// Counting that wait once made the encoder sleep as long as the walk had taken after its
/// first chunk, and the walk, whose reader had taken nothing for a minute, gave the backup up.
pub(crate) struct Pace {
    rest_per_busy: f64,
    since: std::time::Duration,
}

impl Pace {
    pub(crate) fn at(share: f64) -> Self {
        Pace {
            rest_per_busy: (1.0 - share) / share,
            since: thread_cpu_time(),
        }
    }

    pub(crate) fn rest(&mut self) {
        // A sleeping thread uses no CPU time: the reading before the sleep starts the next span.
        let now = thread_cpu_time();
        std::thread::sleep(now.saturating_sub(self.since).mul_f64(self.rest_per_busy));
        self.since = now;
    }
}

/// The CPU time the calling thread has used.
fn thread_cpu_time() -> std::time::Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given, which lives on this stack;
    // CLOCK_THREAD_CPUTIME_ID exists on every Linux orderly runs on (a failure leaves zero,
    // and the pace then never rests: the backup's priority still yields to requests).
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    std::time::Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_loop_that_waited_rather_than_worked_does_not_rest_for_its_wait() {
        let mut pace = Pace::at(0.5);
        std::thread::sleep(Duration::from_millis(400));
        let resting = Instant::now();
        pace.rest();
        assert!(
            resting.elapsed() < Duration::from_millis(150),
            "rested {:?} after waiting 400 ms",
            resting.elapsed()
        );
    }

    #[test]
    fn a_loop_that_worked_rests_as_long_again_at_half_a_core() {
        let mut pace = Pace::at(0.5);
        let cpu = thread_cpu_time();
        let mut x = 0u64;
        while thread_cpu_time() - cpu < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let resting = Instant::now();
        pace.rest();
        assert!(
            resting.elapsed() >= Duration::from_millis(190),
            "rested {:?} after 200 ms of work",
            resting.elapsed()
        );
    }
}
