//! The kinds of fault orderly-torture injects: their names on the command line, the
//! engines and the machine each needs, and the durations each is drawn from. A leaf: the run's
//! context (`ctx.rs`) names a kind without depending on how the faults are made (`faults.rs`).

use crate::engine::Engine;

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
    GracefulRestart,
    RestoreSwap,
    HistoryRewind,
    RollingUpgrade,
    NetSlow,
    Partition,
    DbRestart,
    StoreDamage,
}

pub const ALL: [FaultKind; 19] = [
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
    FaultKind::GracefulRestart,
    FaultKind::RestoreSwap,
    FaultKind::HistoryRewind,
    FaultKind::RollingUpgrade,
    FaultKind::NetSlow,
    FaultKind::Partition,
    FaultKind::DbRestart,
    FaultKind::StoreDamage,
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
            FaultKind::GracefulRestart => "graceful-restart",
            FaultKind::RestoreSwap => "restore-swap",
            FaultKind::HistoryRewind => "history-rewind",
            FaultKind::RollingUpgrade => "rolling-upgrade",
            FaultKind::NetSlow => "net-slow",
            FaultKind::Partition => "partition",
            FaultKind::DbRestart => "db-restart",
            FaultKind::StoreDamage => "store-damage",
        }
    }

    pub fn parse(s: &str) -> Option<FaultKind> {
        ALL.iter().copied().find(|k| k.name() == s)
    }

    /// The engine this fault applies to (None: both).
    pub fn engine(self) -> Option<Engine> {
        match self {
            FaultKind::PowerLoss
            | FaultKind::DiskStall
            | FaultKind::DiskFull
            | FaultKind::StoreDamage => Some(Engine::Sled),
            FaultKind::LostStandby
            | FaultKind::RowsHeld
            | FaultKind::ConnCut
            | FaultKind::Failover
            | FaultKind::HistoryRewind
            | FaultKind::NetSlow
            | FaultKind::Partition
            | FaultKind::DbRestart => Some(Engine::Postgres),
            _ => None,
        }
    }

    /// The fault kills or restarts an instance's process (a backup streaming from it would be
    /// cut): it waits for the backup's end, and no backup starts on that instance until the
    /// fault is over. A pause only delays a backup; a clock step takes the window for each
    /// of its two restarts, not for the time between them.
    pub fn on_process(self) -> bool {
        matches!(
            self,
            FaultKind::Kill
                | FaultKind::PowerLoss
                | FaultKind::DiskFull
                | FaultKind::GracefulRestart
                | FaultKind::RollingUpgrade
                | FaultKind::StoreDamage
        )
    }

    /// Needs the instances in network namespaces of their own (netns.rs).
    pub fn in_netns(self) -> bool {
        matches!(self, FaultKind::NetSlow | FaultKind::Partition)
    }

    /// Drawn in the main sequence (the receiver's stalls have their track, restore-swap runs
    /// among the end's restores).
    pub fn in_main(self) -> bool {
        !matches!(self, FaultKind::ReceiverStall | FaultKind::RestoreSwap)
    }

    /// Relative weight in the schedule.
    pub fn weight(self) -> u32 {
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
            FaultKind::HistoryRewind => 1,
            FaultKind::GracefulRestart => 2,
            FaultKind::RollingUpgrade => 2,
            FaultKind::NetSlow => 3,
            FaultKind::Partition => 2,
            FaultKind::DbRestart => 2,
            FaultKind::StoreDamage => 2,
            FaultKind::ReceiverStall | FaultKind::RestoreSwap => 0,
        }
    }
}

impl FaultKind {
    /// The range a fault's duration is drawn from (what it holds, or its down time).
    pub fn dur_range(self) -> (u64, u64) {
        match self {
            FaultKind::Pause => (1_000, 6_000),
            FaultKind::DiskStall => (3_000, 20_000),
            FaultKind::LostStandby => (3_000, 20_000),
            FaultKind::RowsHeld => (2_000, 8_000),
            FaultKind::ConnCut => (2_000, 10_000),
            FaultKind::ClockStep => (20_000, 60_000),
            FaultKind::Kill | FaultKind::PowerLoss => (0, 2_000),
            // How long the workload runs between the rewind point and the primary's end.
            FaultKind::HistoryRewind => (2_000, 8_000),
            // How long the receiver takes to answer while the instance stops.
            FaultKind::GracefulRestart | FaultKind::RollingUpgrade => (3_000, 9_000),
            FaultKind::ReceiverStall => (5_000, 30_000),
            FaultKind::NetSlow => (5_000, 20_000),
            FaultKind::Partition => (2_000, 15_000),
            _ => (0, 0),
        }
    }

    /// What a fault takes beyond its drawn duration, generously (restarts, the readiness
    /// watch's end, a standby rebuilt, a disk filled, a POST awaited), for fitting the first
    /// round into the run.
    pub fn overhead_ms(self) -> u64 {
        match self {
            FaultKind::Kill => 4_000,
            FaultKind::Pause => 1_000,
            FaultKind::PowerLoss => 6_000,
            FaultKind::DiskStall => 4_000,
            FaultKind::DiskFull => 25_000,
            FaultKind::LostStandby => 4_000,
            FaultKind::RowsHeld => 2_000,
            FaultKind::ConnCut => 4_000,
            FaultKind::ClockStep => 8_000,
            FaultKind::Failover => 25_000,
            // A base backup, the archive, a recovery or a promotion, a standby rebuilt, and
            // the keys revoked before it tried on every instance.
            FaultKind::HistoryRewind => 35_000,
            FaultKind::GracefulRestart => 15_000,
            // A graceful restart's, and a start refused by a newer store or schema before the
            // newer build's (a migration on the first start of the new build).
            FaultKind::RollingUpgrade => 20_000,
            // The readiness watch's end; after a partition, connections whose retransmissions
            // backed off while their packets went nowhere.
            FaultKind::NetSlow => 6_000,
            FaultKind::Partition => 10_000,
            // The crash restart (1.5 to 4.2 s measured, a standby reconnecting among them) and
            // every instance ready again (at once, or within 0.1 s).
            FaultKind::DbRestart => 6_000,
            // A graceful stop (1.1 s), the store hashed twice (0.5 to 2.9 s each at 0.3 to
            // 1.1 GiB), up to three starts (0.1 to 1.2 s each): 1.8 to 6.4 s measured.
            FaultKind::StoreDamage => 10_000,
            FaultKind::ReceiverStall | FaultKind::RestoreSwap => 0,
        }
    }
}
