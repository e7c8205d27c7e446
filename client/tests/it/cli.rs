//! Running the `orderly-client` binary the way a partner's scripts would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_orderly-client");

/// One partner's command line: where to call, with which key, which journal.
pub struct Cli {
    pub url: String,
    pub api_key: String,
    pub journal: PathBuf,
    pub extra: Vec<String>,
    dir: PathBuf,
}

pub struct Ran {
    pub code: i32,
    pub lines: Vec<Value>,
    pub stderr: String,
}

impl Ran {
    pub fn line(&self) -> &Value {
        assert_eq!(
            self.lines.len(),
            1,
            "expected one line, got {:?} ({})",
            self.lines,
            self.stderr
        );
        &self.lines[0]
    }
}

/// A command with no inherited `ORDERLY_CLIENT_*` settings.
pub fn command() -> Command {
    let mut cmd = Command::new(BIN);
    for (name, _) in std::env::vars() {
        if name.starts_with("ORDERLY_CLIENT_") {
            cmd.env_remove(name);
        }
    }
    cmd
}

impl Cli {
    pub fn new(url: &str, api_key: &str, dir: &Path) -> Cli {
        Cli {
            url: url.to_string(),
            api_key: api_key.to_string(),
            journal: dir.join("orderly-client.journal"),
            extra: Vec::new(),
            dir: dir.to_path_buf(),
        }
    }

    /// The same journal and key, another URL (a proxy in front of the same server).
    pub fn via(&self, url: &str) -> Cli {
        Cli {
            url: url.to_string(),
            api_key: self.api_key.clone(),
            journal: self.journal.clone(),
            extra: self.extra.clone(),
            dir: self.dir.clone(),
        }
    }

    pub fn with(mut self, flags: &[&str]) -> Cli {
        self.extra.extend(flags.iter().map(|s| s.to_string()));
        self
    }

    /// Writes a basket file and returns its path.
    pub fn basket_file(&self, name: &str, basket: &Value) -> PathBuf {
        let path = self.dir.join(format!("{name}.json"));
        std::fs::write(&path, basket.to_string()).unwrap();
        path
    }

    fn build(&self, args: &[&str]) -> Command {
        let mut cmd = command();
        cmd.arg("--url")
            .arg(&self.url)
            .arg("--api-key")
            .arg(&self.api_key)
            .arg("--journal")
            .arg(&self.journal)
            .args(&self.extra)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.build(args).spawn().expect("starting orderly-client")
    }

    /// Runs to the end (bounded: 90 s).
    pub fn run(&self, args: &[&str]) -> Ran {
        finish(self.spawn(args), Duration::from_secs(90))
    }

    pub fn place(&self, intent: &str, basket: &Value) -> Ran {
        let file = self.basket_file(intent, basket);
        self.run(&[
            "place",
            "--intent",
            intent,
            "--basket",
            file.to_str().unwrap(),
        ])
    }
}

/// Waits for `child` (killing it past `within`) and parses its stdout lines.
pub fn finish(mut child: Child, within: Duration) -> Ran {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("orderly-client did not finish within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ran {
        code: output.status.code().unwrap_or(-1),
        lines: stdout
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line: {l:?}: {e}"))
            })
            .collect(),
        stderr: String::from_utf8_lossy(&output.stderr).to_string(),
    }
}
