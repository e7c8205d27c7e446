//! LazyFS under the sled data directory: a disk whose unsynced writes a power cut drops
//! (`lazyfs::clear-cache`) and which can stop answering (its process stopped).

use crate::procs::{alive, register, signal, Cleanup};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

pub struct LazyFs {
    pub dir: PathBuf,
    pub pid: i32,
}

impl LazyFs {
    /// Mounts DIR/mnt over DIR/root with the configuration scripts/lazyfs.sh writes (faults
    /// FIFO DIR/faults.fifo). Done here rather than through the script so the process is
    /// known (and cleaned up) even when its cache takes long to allocate.
    pub async fn mount(bin: &Path, dir: &Path) -> Result<LazyFs, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("no /dev/fuse".into());
        }
        if !bin.exists() {
            return Err(format!("no LazyFS binary at {}", bin.display()));
        }
        let (mnt, root) = (dir.join("mnt"), dir.join("root"));
        std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
        // The cache holds every page LazyFS serves (eviction off): room for a prefilled store.
        let config = format!(
            "[faults]\nfifo_path=\"{d}/faults.fifo\"\n[cache]\napply_eviction=false\n[cache.simple]\ncustom_size=\"4gb\"\nblocks_per_page=1\n[filesystem]\nlog_all_operations=false\nlogfile=\"{d}/lazyfs.log\"\n",
            d = dir.display()
        );
        std::fs::write(dir.join("config.toml"), config).map_err(|e| e.to_string())?;
        let out = std::fs::File::create(dir.join("lazyfs.out")).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg(&mnt)
            .arg("--config-path")
            .arg(dir.join("config.toml"))
            .args(["-o", "allow_other", "-o", "modules=subdir", "-o"])
            .arg(format!("subdir={}", root.display()))
            .arg("-f")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        let child = cmd.spawn().map_err(|e| format!("{}: {e}", bin.display()))?;
        let pid = child.id().unwrap_or(0) as i32;
        register(Cleanup::LazyFs {
            pid,
            mnt: mnt.clone(),
        });
        // Reap it whenever it ends (after the unmount).
        tokio::spawn(async move {
            let mut child = child;
            let _ = child.wait().await;
        });
        let mnt_s = mnt.display().to_string();
        for _ in 0..600 {
            let mounted = std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
                m.lines()
                    .any(|l| l.split(' ').nth(4) == Some(mnt_s.as_str()))
            });
            if mounted && dir.join("faults.fifo").exists() {
                return Ok(LazyFs {
                    dir: dir.to_path_buf(),
                    pid,
                });
            }
            if !alive(pid) {
                let o = std::fs::read_to_string(dir.join("lazyfs.out")).unwrap_or_default();
                return Err(format!(
                    "LazyFS exited: {}",
                    o.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("LazyFS did not mount within 60 s".into())
    }

    pub fn mnt(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    /// Drops whatever was not fsynced (a power cut), and waits for LazyFS to say so.
    pub async fn clear_cache(&self) -> Result<(), String> {
        let out = self.dir.join("lazyfs.out");
        let count = || {
            std::fs::read_to_string(&out)
                .map(|s| s.matches("cache is cleared").count())
                .unwrap_or(0)
        };
        let before = count();
        let fifo = self.dir.join("faults.fifo");
        tokio::task::spawn_blocking(move || -> Result<(), String> {
            use std::io::Write;
            let mut f = OpenOptions::new()
                .write(true)
                .open(&fifo)
                .map_err(|e| format!("{}: {e}", fifo.display()))?;
            f.write_all(b"lazyfs::clear-cache\n")
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())??;
        for _ in 0..300 {
            if count() > before {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("LazyFS did not clear its cache within 30 s".into())
    }

    pub fn stop(&self) {
        signal(self.pid, libc::SIGSTOP);
    }

    pub fn cont(&self) {
        signal(self.pid, libc::SIGCONT);
    }
}
