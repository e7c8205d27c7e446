//! PostgreSQL for a run: the throwaway cluster (pg-cluster.sh) or a given server, a fresh
//! database, a synchronous standby for failovers (rebuilt after each one), PgBouncer, and the
//! harness's TCP proxies in front of each.

use crate::cluster::{register, script, Cleanup};
use crate::proxy::Proxy;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct PgNode {
    pub dir: PathBuf,
    pub port: u16,
}

pub struct Pg {
    /// The maintenance URL given (external) or printed by pg-cluster.sh.
    pub maint_url: String,
    pub db: String,
    /// Slot i is reached through proxies[i]; `primary` names the slot of the primary.
    pub nodes: Mutex<Vec<PgNode>>,
    pub primary: AtomicUsize,
    pub proxies: Vec<Arc<Proxy>>,
    /// What the instances get as --database-url.
    pub instance_url: String,
    pub scripts: PathBuf,
    pub work: PathBuf,
    next_dir: AtomicU64,
    /// The synchronous_standby_names a healthy cluster has ('' or '*').
    pub sync_names: Mutex<String>,
}

/// `url` with its database (path) replaced by `db`.
pub fn with_db(url: &str, db: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (auth_host, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => match rest.find('?') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        },
    };
    let query = match tail.find('?') {
        Some(i) => &tail[i..],
        None if tail.starts_with('?') => tail,
        None => "",
    };
    format!("{scheme}://{auth_host}/{db}{query}")
}

/// `url` with its host:port replaced.
pub fn with_port(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (auth_host, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let auth = match auth_host.rfind('@') {
        Some(i) => &auth_host[..=i],
        None => "",
    };
    format!("{scheme}://{auth}127.0.0.1:{port}{tail}")
}

pub fn port_of(url: &str) -> Option<u16> {
    let rest = url.split_once("://")?.1;
    let host = rest.split('/').next()?;
    let host = host.rsplit('@').next()?;
    host.rsplit(':').next()?.parse().ok()
}

impl Pg {
    /// Starts (or uses) the server, creates a fresh database, and, when asked, a synchronous
    /// standby, PgBouncer and the proxies.
    pub async fn build(
        scripts: &Path,
        work: &Path,
        external: Option<&str>,
        db: &str,
        want_standby: bool,
        pooler: bool,
        keep: bool,
    ) -> Result<(Pg, Vec<String>), String> {
        // --keep leaves the data (stopped) for a look afterwards.
        let stop = if keep { "down" } else { "stop" };
        let mut notes = Vec::new();
        let (own, maint_url, mut nodes) = match external {
            Some(u) => (false, u.to_string(), Vec::new()),
            None => {
                let dir = work.join("pg-0");
                register(Cleanup::Script(vec![
                    scripts.join("pg-cluster.sh").display().to_string(),
                    stop.into(),
                    dir.display().to_string(),
                ]));
                let url = script(
                    scripts,
                    "pg-cluster.sh",
                    &["start", &dir.display().to_string()],
                    &[],
                )
                .await?;
                let port = port_of(&url).ok_or_else(|| format!("pg-cluster.sh printed {url}"))?;
                (true, url, vec![PgNode { dir, port }])
            }
        };
        let c = connect(&maint_url).await?;
        if own && want_standby && !pooler {
            // pg_basebackup waits for a spread checkpoint, which under load lasts most of
            // checkpoint_timeout: a standby rebuilt after a failover would take minutes. The
            // setting is in postgresql.auto.conf, so every standby copied from here has it too.
            for q in [
                "ALTER SYSTEM SET checkpoint_completion_target = 0",
                "SELECT pg_reload_conf()",
            ] {
                c.batch_execute(q).await.map_err(|e| format!("{q}: {e}"))?;
            }
        }
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
            .await
            .map_err(|e| format!("drop database: {e:?}"))?;
        c.batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .map_err(|e| format!("create database: {e}"))?;
        drop(c);
        let mut sync_names = String::new();
        if want_standby && own && !pooler {
            let dir = work.join("pg-1");
            register(Cleanup::Script(vec![
                scripts.join("pg-cluster.sh").display().to_string(),
                stop.into(),
                dir.display().to_string(),
            ]));
            match script(
                scripts,
                "pg-cluster.sh",
                &["standby", &dir.display().to_string(), &maint_url],
                &[],
            )
            .await
            {
                Ok(url) => {
                    let port =
                        port_of(&url).ok_or_else(|| format!("pg-cluster.sh printed {url}"))?;
                    nodes.push(PgNode { dir, port });
                    let primary_port = nodes[0].port;
                    wait_streaming(&with_port(&maint_url, primary_port)).await?;
                    set_sync_names(&with_port(&maint_url, primary_port), "*").await?;
                    sync_names = "*".into();
                }
                Err(e) => notes.push(format!("failover: no standby: {e}")),
            }
        }
        let bouncer_dir = if pooler {
            let dir = work.join("pgbouncer");
            register(Cleanup::Script(vec![
                scripts.join("pgbouncer.sh").display().to_string(),
                "stop".into(),
                dir.display().to_string(),
            ]));
            Some(dir)
        } else {
            None
        };
        // The proxies: one per server slot (or one to the pooler).
        let mut proxies = Vec::new();
        let db_url_base = with_db(&maint_url, db);
        let instance_url = if let Some(bdir) = &bouncer_dir {
            let target = match nodes.first() {
                Some(n) => with_port(&db_url_base, n.port),
                None => db_url_base.clone(),
            };
            let purl = script(
                scripts,
                "pgbouncer.sh",
                &["start", &bdir.display().to_string(), &target, "transaction"],
                &[],
            )
            .await?;
            let pport = port_of(&purl).ok_or_else(|| format!("pgbouncer.sh printed {purl}"))?;
            let p = Proxy::start(pport).await.map_err(|e| e.to_string())?;
            let u = with_port(&purl, p.port);
            proxies.push(p);
            u
        } else if nodes.len() == 2 {
            let p0 = Proxy::start(nodes[0].port)
                .await
                .map_err(|e| e.to_string())?;
            let p1 = Proxy::start(nodes[1].port)
                .await
                .map_err(|e| e.to_string())?;
            let auth = maint_url
                .split_once("://")
                .map(|x| x.1)
                .unwrap_or("")
                .split('@')
                .next()
                .unwrap_or("postgres");
            let u = format!(
                "postgresql://{auth}@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
                p0.port, p1.port
            );
            proxies.push(p0);
            proxies.push(p1);
            u
        } else {
            let upstream = nodes
                .first()
                .map(|n| n.port)
                .or_else(|| port_of(&maint_url))
                .unwrap_or(5432);
            let p = Proxy::start(upstream).await.map_err(|e| e.to_string())?;
            let u = with_port(&db_url_base, p.port);
            proxies.push(p);
            u
        };
        Ok((
            Pg {
                maint_url,
                db: db.to_string(),
                nodes: Mutex::new(nodes),
                primary: AtomicUsize::new(0),
                proxies,
                instance_url,
                scripts: scripts.to_path_buf(),
                work: work.to_path_buf(),
                next_dir: AtomicU64::new(2),
                sync_names: Mutex::new(sync_names),
            },
            notes,
        ))
    }

    pub fn has_standby(&self) -> bool {
        self.nodes.lock().unwrap().len() == 2
    }

    /// A maintenance URL of the current primary, direct (not through a proxy).
    pub fn primary_maint_url(&self) -> String {
        let nodes = self.nodes.lock().unwrap();
        match nodes.get(self.primary.load(Ordering::SeqCst)) {
            Some(n) => with_port(&self.maint_url, n.port),
            None => self.maint_url.clone(),
        }
    }

    /// orderly's database on the current primary, direct.
    pub fn primary_db_url(&self) -> String {
        with_db(&self.primary_maint_url(), &self.db)
    }

    /// Kills the primary, promotes the standby, then rebuilds a standby of the new primary in
    /// the old slot (so the next failover can run). Returns what happened, for the history.
    pub async fn failover(&self) -> Result<String, String> {
        let (old_slot, old_dir, new_dir) = {
            let nodes = self.nodes.lock().unwrap();
            if nodes.len() != 2 {
                return Err("no standby".into());
            }
            let p = self.primary.load(Ordering::SeqCst);
            (p, nodes[p].dir.clone(), nodes[1 - p].dir.clone())
        };
        script(
            &self.scripts,
            "pg-cluster.sh",
            &["kill", &old_dir.display().to_string()],
            &[],
        )
        .await?;
        script(
            &self.scripts,
            "pg-cluster.sh",
            &["promote", &new_dir.display().to_string()],
            &[],
        )
        .await?;
        self.primary.store(1 - old_slot, Ordering::SeqCst);
        let promoted = std::time::Instant::now();
        // The old primary's directory goes; a fresh standby of the new primary takes its slot.
        let _ = script(
            &self.scripts,
            "pg-cluster.sh",
            &["stop", &old_dir.display().to_string()],
            &[],
        )
        .await;
        let n = self.next_dir.fetch_add(1, Ordering::SeqCst);
        let dir = self.work.join(format!("pg-{n}"));
        register(Cleanup::Script(vec![
            self.scripts.join("pg-cluster.sh").display().to_string(),
            "stop".into(),
            dir.display().to_string(),
        ]));
        let primary = self.primary_maint_url();
        let url = script(
            &self.scripts,
            "pg-cluster.sh",
            &["standby", &dir.display().to_string(), &primary],
            &[],
        )
        .await?;
        let port = port_of(&url).ok_or_else(|| format!("pg-cluster.sh printed {url}"))?;
        self.nodes.lock().unwrap()[old_slot] = PgNode { dir, port };
        self.proxies[old_slot].retarget(port);
        wait_streaming(&primary).await?;
        set_sync_names(&primary, "*").await?;
        *self.sync_names.lock().unwrap() = "*".into();
        Ok(format!(
            "primary in slot {old_slot} killed, slot {} promoted; new standby rebuilt in {:.1} s",
            1 - old_slot,
            promoted.elapsed().as_secs_f64()
        ))
    }
}

pub async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, conn) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_postgres::connect(url, tokio_postgres::NoTls),
    )
    .await
    .map_err(|_| format!("connect {url}: timed out"))?
    .map_err(|e| format!("connect {url}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

pub async fn set_sync_names(maint: &str, names: &str) -> Result<(), String> {
    let c = connect(maint).await?;
    let q = if names.is_empty() {
        "ALTER SYSTEM RESET synchronous_standby_names".to_string()
    } else {
        format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'")
    };
    c.batch_execute(&q).await.map_err(|e| format!("{q}: {e}"))?;
    c.batch_execute("SELECT pg_reload_conf()")
        .await
        .map_err(|e| format!("reload: {e}"))?;
    Ok(())
}

async fn wait_streaming(maint: &str) -> Result<(), String> {
    let c = connect(maint).await?;
    for _ in 0..300 {
        let rows = c
            .query(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        let n: i64 = rows[0].get(0);
        if n > 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the standby did not stream within 30 s".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_rewritten_without_losing_their_parts() {
        assert_eq!(
            with_db("postgres://postgres@127.0.0.1:5432/postgres", "t1"),
            "postgres://postgres@127.0.0.1:5432/t1"
        );
        assert_eq!(
            with_db("postgres://u:p@h:1/x?sslmode=disable", "t1"),
            "postgres://u:p@h:1/t1?sslmode=disable"
        );
        assert_eq!(with_db("postgres://u@h:1", "t1"), "postgres://u@h:1/t1");
        assert_eq!(
            with_port("postgres://postgres@127.0.0.1:5432/t1", 7),
            "postgres://postgres@127.0.0.1:7/t1"
        );
        assert_eq!(port_of("postgres://postgres@127.0.0.1:5432/t1"), Some(5432));
    }
}
