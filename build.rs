//! Writes the commit the binary is built from into `ORDERLY_COMMIT`, for `orderly --version`:
//! an operator comparing instances during a rolling upgrade needs to know which build each
//! runs. "unknown" outside a git checkout (a source tarball).

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|text| text.trim().to_string())
        .filter(|text| !text.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ORDERLY_COMMIT={commit}");
    // A new commit (or another branch checked out) changes HEAD or the ref it names. Only
    // paths that exist are watched: cargo runs a script watching a missing one on every build.
    println!("cargo:rerun-if-changed=build.rs");
    for watched in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if std::path::Path::new(watched).exists() {
            println!("cargo:rerun-if-changed={watched}");
        }
    }
}
