//! How much memory the per-IP rate limiter holds for many distinct clients, and whether
//! pruning gives it back. docs/benchmarks.md gives the figure at 100,000 addresses.
//!
//!   cargo run --release --example rate_limit_memory

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use clap::Parser;
use orderly::RateLimits;
use orderly::{Cli, Command};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn client(wave: u32, i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0b00_0000 + wave * 200_000 + i))
}

fn main() {
    let Command::Serve(settings) = Cli::parse_from(["orderly", "serve"]).command else {
        unreachable!("serve was parsed");
    };
    let limits = RateLimits::new(&settings);
    let start = rss_kib();
    println!("| step | tracked clients | RSS MiB |");
    println!("|---|---:|---:|");
    println!(
        "| start | {} | {:.1} |",
        limits.tracked_clients(),
        start as f64 / 1024.0
    );
    for wave in 0..10 {
        for i in 0..100_000 {
            limits.check(client(wave, i));
        }
        println!(
            "| wave {} filled: 100,000 new addresses | {} | {:.1} |",
            wave + 1,
            limits.tracked_clients(),
            rss_kib() as f64 / 1024.0
        );
        // At 500/min a cell is 120 ms; governor forgets a key one cell after it is full again.
        std::thread::sleep(Duration::from_millis(300));
        limits.prune();
        println!(
            "| wave {} pruned | {} | {:.1} |",
            wave + 1,
            limits.tracked_clients(),
            rss_kib() as f64 / 1024.0
        );
    }
}
