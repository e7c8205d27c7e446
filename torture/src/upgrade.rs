//! rolling-upgrade's bookkeeping: which build each instance runs, the next swap of the roll
//! (every instance to the build under test one by one, then back to the earlier one, and so
//! on), and how a start refused by a store or schema newer than the binary knows is told
//! apart from any other failure (docs/operations.md, "Upgrades": one line and exit 2).
//! Pure: the fault itself is in faults.rs, the start that falls back in cluster.rs.

use std::path::Path;

/// The two builds of a run with `--old-bin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// `--old-bin`: what the instances start on.
    Old,
    /// `--bin`: the build under test.
    New,
}

impl Build {
    pub fn other(self) -> Build {
        match self {
            Build::Old => Build::New,
            Build::New => Build::Old,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Build::Old => "old",
            Build::New => "new",
        }
    }
}

/// The exit status orderly documents for a store or a schema it is too old for.
const REFUSED_STATUS: i32 = 2;

/// A start that ended with the documented refusal: exit 2 and a line saying the store or the
/// schema was written by a newer orderly (PostgreSQL: "the database schema is at version N,
/// newer than this orderly knows"; sled: "the store was written by a newer orderly"). Any other
/// exit at start is a failure.
pub fn is_refusal(code: Option<i32>, log: &str) -> bool {
    let log = log.to_ascii_lowercase();
    code == Some(REFUSED_STATUS)
        && log.contains("newer")
        && ["schema", "store", "layout"]
            .iter()
            .any(|w| log.contains(w))
}

/// The one line of a refusal, for the fault's note (the log's last lines otherwise).
pub fn refusal_line(log: &str) -> String {
    log.split(" | ")
        .find(|l| l.to_ascii_lowercase().contains("newer"))
        .unwrap_or(log)
        .trim()
        .to_string()
}

/// The roll: upgrading while an instance runs the old build, then downgrading while one runs
/// the new build, and so on; within a direction the instances are taken in turn from where the
/// last swap left off (so a downgrade that keeps being refused does not hold the roll on one
/// instance). A refusal leaves its instance on the newer build: the next swap goes on from
/// what each instance runs, whatever the last one asked for.
#[derive(Debug)]
pub struct Roll {
    upgrading: bool,
    cursor: usize,
    /// Swaps asked for, by direction (to new, to old).
    pub to_new: u64,
    pub to_old: u64,
}

impl Default for Roll {
    fn default() -> Roll {
        Roll {
            upgrading: true,
            cursor: 0,
            to_new: 0,
            to_old: 0,
        }
    }
}

impl Roll {
    /// The next swap given what each instance runs: which instance, and the build it goes to.
    /// None with no instance.
    pub fn next(&mut self, builds: &[Build]) -> Option<(usize, Build)> {
        let n = builds.len();
        let mut from = if self.upgrading {
            Build::Old
        } else {
            Build::New
        };
        if !builds.contains(&from) {
            self.upgrading = !self.upgrading;
            from = from.other();
        }
        let idx = (0..n)
            .map(|k| (self.cursor + k) % n)
            .find(|&k| builds[k] == from)?;
        self.cursor = idx + 1;
        match from.other() {
            Build::New => self.to_new += 1,
            Build::Old => self.to_old += 1,
        }
        Some((idx, from.other()))
    }

    /// The summary's line; `refused`: the starts refused by a newer store or schema (any
    /// fault's).
    pub fn summary(&self, old: &Path, new: &Path, refused: u64) -> String {
        format!(
            "rolling-upgrade: {} swaps ({} to the new build {}, {} back to the old build {}); {} starts refused by a newer store or schema (the newer build started instead)",
            self.to_new + self.to_old,
            self.to_new,
            short(new),
            self.to_old,
            short(old),
            refused
        )
    }
}

/// A binary's file name, for notes.
pub fn short(p: &Path) -> String {
    p.file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Build::*;

    #[test]
    fn the_roll_upgrades_every_instance_in_turn_then_downgrades_them() {
        let mut r = Roll::default();
        let mut b = vec![Old, Old];
        let mut seen = Vec::new();
        for _ in 0..6 {
            let (i, to) = r.next(&b).unwrap();
            b[i] = to;
            seen.push((i, to));
        }
        assert_eq!(
            seen,
            vec![(0, New), (1, New), (0, Old), (1, Old), (0, New), (1, New)]
        );
        assert_eq!((r.to_new, r.to_old), (4, 2));
        // One instance (sled): back and forth.
        let mut r = Roll::default();
        let mut one = vec![Old];
        for want in [New, Old, New] {
            let (i, to) = r.next(&one).unwrap();
            assert_eq!((i, to), (0, want));
            one[0] = to;
        }
        assert_eq!(Roll::default().next(&[]), None);
    }

    #[test]
    fn downgrades_that_are_refused_go_round_the_instances() {
        let mut r = Roll::default();
        let b = vec![New, New];
        // Every downgrade refused: the instances stay on the new build.
        let targets: Vec<usize> = (0..4).map(|_| r.next(&b).unwrap().0).collect();
        assert_eq!(targets, vec![0, 1, 0, 1]);
        assert_eq!(r.to_old, 4);
    }

    #[test]
    fn only_the_documented_refusal_is_one() {
        let pg = "Error: the database schema is at version 9, newer than this orderly knows (8); run a newer orderly";
        assert!(is_refusal(Some(2), pg));
        assert!(is_refusal(
            Some(2),
            "the store was written by a newer orderly (layout 2; this binary knows 1)"
        ));
        assert!(!is_refusal(Some(1), pg));
        assert!(!is_refusal(Some(2), "Address already in use"));
        assert!(!is_refusal(None, pg));
        assert_eq!(
            refusal_line(&format!("starting | {pg} | bye")),
            pg.to_string()
        );
    }
}
