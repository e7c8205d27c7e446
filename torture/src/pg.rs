//! PostgreSQL for a run: the throwaway cluster (pg-cluster.sh) or a given server, a fresh
//! database, a synchronous standby for failovers (rebuilt after each one), WAL archiving for
//! point-in-time restores, PgBouncer, and the harness's TCP proxies in front of each. And the
//! two ways the history-rewind fault sends the database back in time: an asynchronous standby
//! cut off, then promoted; the primary restored from a base backup to a restore point.

use crate::procs::{register, script, Cleanup};
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
    /// Where the primary archives its WAL (the harness's own cluster, when a rewind may
    /// restore it to a point in time).
    pub archive: Option<PathBuf>,
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

/// The role the instances connect as (scripts/pg-cluster.sh creates it on the harness's own
/// clusters): LOGIN, not a superuser, no CREATEDB; it owns the run's databases. The harness's own
/// SQL (faults, checks, the bulk keys) stays `postgres`.
pub const ROLE: &str = "orderly";

/// The role's password, for a server whose authentication asks one (`--database-url`): what
/// `ORDERLY_TORTURE_ROLE_PASSWORD` says (the role is created with it when the harness creates
/// it); none on the harness's own clusters (trust).
pub fn role_password() -> Option<String> {
    std::env::var("ORDERLY_TORTURE_ROLE_PASSWORD")
        .ok()
        .filter(|p| !p.is_empty())
}

/// `url` with its user (and password) replaced by `user` (and `password`).
pub fn with_user(url: &str, user: &str, password: Option<&str>) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (auth_host, tail) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = match auth_host.rfind('@') {
        Some(i) => &auth_host[i + 1..],
        None => auth_host,
    };
    let auth = match password {
        Some(p) => format!("{user}:{}", pct(p)),
        None => user.to_string(),
    };
    format!("{scheme}://{auth}@{host}{tail}")
}

/// A password made safe for a URL's userinfo.
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `url` as the instances' role.
pub fn as_role(url: &str) -> String {
    with_user(url, ROLE, role_password().as_deref())
}

async fn role_exists(c: &tokio_postgres::Client) -> Result<bool, String> {
    c.query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&ROLE])
        .await
        .map(|r| r.is_some())
        .map_err(|e| format!("pg_roles: {e}"))
}

/// Makes sure the role exists (idempotent: a role already there is left as it is). Returns
/// whether it had to be created.
pub async fn ensure_role(c: &tokio_postgres::Client) -> Result<bool, String> {
    if role_exists(c).await? {
        return Ok(false);
    }
    let password = role_password()
        .map(|p| format!(" PASSWORD '{}'", p.replace('\'', "''")))
        .unwrap_or_default();
    let q = format!("CREATE ROLE {ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE{password}");
    match c.batch_execute(&q).await {
        Ok(()) => Ok(true),
        // Another run made it meanwhile.
        Err(_) if role_exists(c).await? => Ok(false),
        Err(e) => Err(format!("CREATE ROLE {ROLE}: {e}")),
    }
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
    #[allow(clippy::too_many_arguments)]
    pub async fn build(
        scripts: &Path,
        work: &Path,
        external: Option<&str>,
        db: &str,
        want_standby: bool,
        want_archive: bool,
        pooler: bool,
        keep: bool,
        earlier_build: bool,
    ) -> Result<(Pg, Vec<String>), String> {
        // --keep leaves the data (stopped) for a look afterwards.
        let stop = if keep { "down" } else { "stop" };
        let mut notes = Vec::new();
        let mut archive = None;
        let (own, maint_url, mut nodes) = match external {
            Some(u) => (false, u.to_string(), Vec::new()),
            None => {
                let dir = work.join("pg-0");
                register(Cleanup::Script(vec![
                    scripts.join("pg-cluster.sh").display().to_string(),
                    stop.into(),
                    dir.display().to_string(),
                ]));
                // WAL archiving from the start (archive_mode needs a restart to change): a
                // point-in-time restore replays it. Standbys copied from the primary have the
                // setting too, so a promoted one archives as well.
                let mut extra = String::new();
                if want_archive {
                    let a = work.join("pg-archive");
                    std::fs::create_dir_all(&a).map_err(|e| format!("{}: {e}", a.display()))?;
                    chown_postgres(&a)?;
                    extra = archive_settings(&a);
                    archive = Some(a);
                }
                let url = script(
                    scripts,
                    "pg-cluster.sh",
                    &["start", &dir.display().to_string()],
                    &[("PG_CONF_EXTRA", extra.as_str())],
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
        // The instances run as production runs them: a role that owns only its database.
        if ensure_role(&c).await? {
            notes.push(format!(
                "role {ROLE} created (LOGIN, not a superuser, no CREATEDB{}): the server had none",
                if role_password().is_some() {
                    ", the password of ORDERLY_TORTURE_ROLE_PASSWORD"
                } else {
                    ""
                }
            ));
        }
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
            .await
            .map_err(|e| format!("drop database: {e:?}"))?;
        c.batch_execute(&format!("CREATE DATABASE {db} OWNER {ROLE}"))
            .await
            .map_err(|e| format!("create database: {e}"))?;
        drop(c);
        if earlier_build {
            // rolling-upgrade's earlier build (6ffde73 in CI) reads the database's history
            // through these three, which a hardened cluster revokes: it could not start at all
            // (the defect its successors fixed). Granted to the role in this run's database
            // only; the build under test calls none of them where it may not.
            let run_db = connect(&with_db(&maint_url, db)).await?;
            let grant = format!(
                "GRANT EXECUTE ON FUNCTION pg_control_system(), pg_current_wal_lsn(), \
                 pg_walfile_name(pg_lsn) TO {ROLE}"
            );
            run_db
                .batch_execute(&grant)
                .await
                .map_err(|e| format!("{grant}: {e}"))?;
            notes.push(format!(
                "role {ROLE} granted pg_control_system(), pg_current_wal_lsn() and pg_walfile_name() in {db}: rolling-upgrade's earlier build cannot start without them"
            ));
        }
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
        // What the instances connect with: the run's database, as the role.
        let db_url_base = as_role(&with_db(&maint_url, db));
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
            let u = as_role(&with_port(&purl, p.port));
            proxies.push(p);
            u
        } else if nodes.len() == 2 {
            let p0 = Proxy::start(nodes[0].port)
                .await
                .map_err(|e| e.to_string())?;
            let p1 = Proxy::start(nodes[1].port)
                .await
                .map_err(|e| e.to_string())?;
            let auth = db_url_base
                .split_once("://")
                .map(|x| x.1)
                .unwrap_or("")
                .split('@')
                .next()
                .unwrap_or(ROLE);
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
                archive,
            },
            notes,
        ))
    }

    pub fn has_standby(&self) -> bool {
        self.nodes.lock().unwrap().len() == 2
    }

    /// The primary can be restored to a point in time: the harness's own, archiving its WAL.
    pub fn can_pitr(&self) -> bool {
        self.archive.is_some() && !self.nodes.lock().unwrap().is_empty()
    }

    /// The standby's maintenance URL, direct.
    fn standby_maint_url(&self) -> Option<String> {
        let nodes = self.nodes.lock().unwrap();
        if nodes.len() != 2 {
            return None;
        }
        let s = 1 - self.primary.load(Ordering::SeqCst);
        Some(with_port(&self.maint_url, nodes[s].port))
    }

    /// The primary's directory (pg-cluster.sh's DIR) and port.
    fn primary_node(&self) -> Result<(PathBuf, u16), String> {
        let nodes = self.nodes.lock().unwrap();
        let n = nodes
            .get(self.primary.load(Ordering::SeqCst))
            .ok_or("not the harness's own server")?;
        Ok((n.dir.clone(), n.port))
    }

    /// history-rewind, an asynchronous standby: commits no longer wait for the standby
    /// (`synchronous_standby_names = ''`), then the standby's WAL receiver is cut
    /// (`primary_conninfo = ''` on it) and the primary shows no standby streaming. What the
    /// primary acknowledges from now on, the standby misses.
    pub async fn cut_standby(&self) -> Result<(), String> {
        let primary = self.primary_maint_url();
        let standby = self.standby_maint_url().ok_or("no standby")?;
        set_sync_names(&primary, "").await?;
        let c = connect(&standby).await?;
        for q in [
            "ALTER SYSTEM SET primary_conninfo = ''",
            "SELECT pg_reload_conf()",
        ] {
            c.batch_execute(q)
                .await
                .map_err(|e| format!("on the standby: {q}: {e}"))?;
        }
        wait_not_streaming(&primary).await
    }

    /// history-rewind, a point-in-time restore, step 1: a base backup of the primary, beside
    /// its data directory (`pg_basebackup -X stream -c fast`).
    pub async fn base_backup(&self, n: u64) -> Result<PathBuf, String> {
        let (dir, port) = self.primary_node()?;
        let target = dir.join(format!("base-{n}"));
        let bin = server_bin_dir()?.join("pg_basebackup");
        let port = port.to_string();
        let t = target.display().to_string();
        as_postgres(
            &bin,
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                &t,
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        )
        .await?;
        Ok(target)
    }

    /// Step 2: the restore point (the rewind point: the caller notes the time before), and a
    /// WAL switch so that its segment is archived.
    pub async fn restore_point(&self, name: &str) -> Result<(), String> {
        let c = connect(&self.primary_maint_url()).await?;
        c.query_one("SELECT pg_create_restore_point($1)::text", &[&name])
            .await
            .map_err(|e| format!("pg_create_restore_point: {e}"))?;
        c.batch_execute("SELECT pg_switch_wal()")
            .await
            .map_err(|e| format!("pg_switch_wal: {e}"))
    }

    /// Step 3: another WAL switch, and the wait (at most 30 s) until the archiver has archived
    /// the segment it closed. Returns that segment's name.
    pub async fn switch_and_archive(&self) -> Result<String, String> {
        let c = connect(&self.primary_maint_url()).await?;
        let seg: String = c
            .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
            .await
            .map_err(|e| format!("pg_switch_wal: {e}"))?
            .get(0);
        let mut last = String::new();
        let mut failed = String::new();
        for _ in 0..300 {
            let r = c
                .query_one(
                    "SELECT coalesce(last_archived_wal, ''), coalesce(last_failed_wal, '') FROM pg_stat_archiver",
                    &[],
                )
                .await
                .map_err(|e| format!("pg_stat_archiver: {e}"))?;
            last = r.get(0);
            failed = r.get(1);
            if archived_past(&last, &seg) {
                return Ok(seg);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "the archiver did not archive {seg} within 30 s (last archived {last:?}, last failed {failed:?})"
        ))
    }

    /// Step 4: the primary killed, its data directory replaced by the base backup (its port
    /// and configuration are the backup's: the same), set to recover from the archive up to
    /// the restore point `name` and be promoted there (a new timeline), started, and waited
    /// for until it is out of recovery. Commits do not wait for a standby
    /// (`synchronous_standby_names = ''`). If it cannot come up, the old data directory is put
    /// back and started (crash recovery: no rewind), and the error says so. Returns a note and
    /// when the primary was killed.
    pub async fn restore_primary(
        &self,
        backup: &Path,
        name: &str,
    ) -> Result<(String, std::time::Instant), String> {
        let (dir, port) = self.primary_node()?;
        let d = dir.display().to_string();
        let data = dir.join("data");
        let old = dir.join("data.before-rewind");
        let t = std::time::Instant::now();
        self.pg_cluster(&["kill", &d]).await?;
        let killed = std::time::Instant::now();
        // The killed postmaster's children notice and exit: none may still write in there.
        let orphans = wait_no_process_in(&data, Duration::from_secs(10)).await;
        // The killed postmaster stays a zombie until something reaps it, and its socket's lock
        // file names it: a new postmaster on the port would take it as still running.
        remove_socket_lock(&dir, port);
        let archive = self.archive.as_ref().ok_or("no WAL archive")?;
        let _ = std::fs::remove_dir_all(&old);
        std::fs::rename(&data, &old).map_err(|e| format!("moving the data aside: {e}"))?;
        let setup = (|| -> Result<(), String> {
            std::fs::rename(backup, &data).map_err(|e| format!("the base backup: {e}"))?;
            let auto = data.join("postgresql.auto.conf");
            let mut conf = std::fs::read_to_string(&auto).unwrap_or_default();
            conf.push_str(&format!(
                "restore_command = 'cp \"{}/%f\" \"%p\"'\nrecovery_target_name = '{name}'\nrecovery_target_action = 'promote'\nprimary_conninfo = ''\nsynchronous_standby_names = ''\n",
                archive.display()
            ));
            std::fs::write(&auto, conf).map_err(|e| format!("{}: {e}", auto.display()))?;
            chown_postgres(&auto)?;
            let signal = data.join("recovery.signal");
            std::fs::write(&signal, b"").map_err(|e| format!("{}: {e}", signal.display()))?;
            chown_postgres(&signal)
        })();
        let replaced = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let started = match setup {
            Ok(()) => match self.pg_cluster(&["up", &d]).await {
                Ok(_) => wait_out_of_recovery(&self.primary_maint_url()).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = started {
            let log = tail_file(&dir.join("log"), 6);
            let _ = self.pg_cluster(&["down", &d]).await;
            let _ = wait_no_process_in(&data, Duration::from_secs(10)).await;
            remove_socket_lock(&dir, port);
            let _ = std::fs::remove_dir_all(&data);
            let _ = std::fs::remove_file(old.join("postmaster.pid"));
            let back = match std::fs::rename(&old, &data) {
                Ok(()) => match self.pg_cluster(&["up", &d]).await {
                    Ok(_) => "the old data put back and started".to_string(),
                    Err(e2) => format!("the old data put back, not started: {e2}"),
                },
                Err(e2) => format!("the old data could not be put back: {e2}"),
            };
            return Err(format!("the restored primary: {e} (log: {log}); {back}"));
        }
        let recovered = t.elapsed().as_secs_f64();
        let _ = std::fs::remove_dir_all(&old);
        // What only the recovery needed goes; the rest of the configuration is the backup's.
        let c = connect(&self.primary_maint_url()).await?;
        for q in [
            "ALTER SYSTEM RESET restore_command",
            "ALTER SYSTEM RESET recovery_target_name",
            "ALTER SYSTEM RESET recovery_target_action",
            "ALTER SYSTEM RESET primary_conninfo",
            "SELECT pg_reload_conf()",
        ] {
            c.batch_execute(q).await.map_err(|e| format!("{q}: {e}"))?;
        }
        if !self.has_standby() {
            *self.sync_names.lock().unwrap() = String::new();
        }
        let tli: String = c
            .query_one("SELECT timeline_id::text FROM pg_control_checkpoint()", &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or_else(|_| "?".into());
        Ok((
            format!(
                "killed and replaced in {replaced:.1} s{}; recovered to {name} and promoted (timeline {tli}) in {recovered:.1} s",
                if orphans { "" } else { " (a process of the old one still ran 10 s after the kill)" }
            ),
            killed,
        ))
    }

    /// history-rewind, an asynchronous standby, the end: the primary killed (and its
    /// processes gone), the standby promoted (a new timeline, commits not waiting for a
    /// standby). The standby slot is then empty: `rebuild_standby` fills it. Returns a note
    /// and when the primary was killed.
    pub async fn promote_standby(&self) -> Result<(String, std::time::Instant), String> {
        let (old_slot, old_dir, new_dir) = {
            let nodes = self.nodes.lock().unwrap();
            if nodes.len() != 2 {
                return Err("no standby".into());
            }
            let p = self.primary.load(Ordering::SeqCst);
            (p, nodes[p].dir.clone(), nodes[1 - p].dir.clone())
        };
        let t = std::time::Instant::now();
        self.pg_cluster(&["kill", &old_dir.display().to_string()])
            .await?;
        let killed = std::time::Instant::now();
        let orphans = wait_no_process_in(&old_dir.join("data"), Duration::from_secs(10)).await;
        let gone = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        self.pg_cluster(&["promote", &new_dir.display().to_string()])
            .await?;
        self.primary.store(1 - old_slot, Ordering::SeqCst);
        Ok((
            format!(
                "primary in slot {old_slot} killed ({gone:.1} s until its processes were gone{}), slot {} promoted in {:.1} s",
                if orphans { "" } else { "; one still ran after 10 s" },
                1 - old_slot,
                t.elapsed().as_secs_f64()
            ),
            killed,
        ))
    }

    /// After a restore: the standby (of a history the primary no longer has) replaced by a
    /// fresh one of the primary in its slot, streaming, and commits synchronous again. Nothing
    /// without a standby. Returns how long it took.
    pub async fn rebuild_standby(&self) -> Result<Option<f64>, String> {
        let t = std::time::Instant::now();
        let (slot, old_dir) = {
            let nodes = self.nodes.lock().unwrap();
            if nodes.len() != 2 {
                return Ok(None);
            }
            let s = 1 - self.primary.load(Ordering::SeqCst);
            (s, nodes[s].dir.clone())
        };
        self.standby_in(slot, &old_dir).await?;
        Ok(Some(t.elapsed().as_secs_f64()))
    }

    /// Stops the node whose data directory is `old_dir`, builds a fresh standby of the primary
    /// in its slot (its proxy retargeted), waits until it streams, and makes replication
    /// synchronous again.
    async fn standby_in(&self, slot: usize, old_dir: &Path) -> Result<(), String> {
        let _ = self
            .pg_cluster(&["stop", &old_dir.display().to_string()])
            .await;
        let n = self.next_dir.fetch_add(1, Ordering::SeqCst);
        let dir = self.work.join(format!("pg-{n}"));
        register(Cleanup::Script(vec![
            self.scripts.join("pg-cluster.sh").display().to_string(),
            "stop".into(),
            dir.display().to_string(),
        ]));
        let primary = self.primary_maint_url();
        let url = self
            .pg_cluster(&["standby", &dir.display().to_string(), &primary])
            .await?;
        let port = port_of(&url).ok_or_else(|| format!("pg-cluster.sh printed {url}"))?;
        self.nodes.lock().unwrap()[slot] = PgNode { dir, port };
        self.proxies[slot].retarget(port);
        wait_streaming(&primary).await?;
        set_sync_names(&primary, "*").await?;
        *self.sync_names.lock().unwrap() = "*".into();
        Ok(())
    }

    /// `scripts/pg-cluster.sh ARGS…` on this run's nodes: what it printed last, or why it failed.
    async fn pg_cluster(&self, args: &[&str]) -> Result<String, String> {
        script(&self.scripts, "pg-cluster.sh", args, &[]).await
    }

    /// A maintenance URL of the current primary, direct (not through a proxy).
    pub fn primary_maint_url(&self) -> String {
        let nodes = self.nodes.lock().unwrap();
        match nodes.get(self.primary.load(Ordering::SeqCst)) {
            Some(n) => with_port(&self.maint_url, n.port),
            None => self.maint_url.clone(),
        }
    }

    /// orderly's database on the current primary, direct, as `postgres` (the harness's own SQL).
    pub fn primary_db_url(&self) -> String {
        with_db(&self.primary_maint_url(), &self.db)
    }

    /// Database `db` on the current primary, direct, as the instances' role.
    pub fn primary_role_url(&self, db: &str) -> String {
        as_role(&with_db(&self.primary_maint_url(), db))
    }

    /// db-restart: the primary crash-restarted in place (`scripts/pg-cluster.sh crash-restart`:
    /// `pg_ctl stop -m immediate`, then started on the same data): crash recovery, the same
    /// timeline, UNLOGGED tables emptied. Returns a note (the timeline before and after, how
    /// long the script took).
    pub async fn crash_restart(&self) -> Result<String, String> {
        let (dir, _) = self.primary_node()?;
        let slot = self.primary.load(Ordering::SeqCst);
        let before = self.timeline().await;
        let t = std::time::Instant::now();
        self.pg_cluster(&["crash-restart", &dir.display().to_string()])
            .await?;
        let took = t.elapsed().as_secs_f64();
        let after = self.timeline().await;
        Ok(format!(
            "the primary (slot {slot}) crash-restarted in place in {took:.1} s (timeline {before} before, {after} after)"
        ))
    }

    /// The primary's timeline, as its last checkpoint says ("?" when it cannot be read).
    async fn timeline(&self) -> String {
        match connect(&self.primary_maint_url()).await {
            Ok(c) => c
                .query_one("SELECT timeline_id::text FROM pg_control_checkpoint()", &[])
                .await
                .map(|r| r.get(0))
                .unwrap_or_else(|_| "?".into()),
            Err(_) => "?".into(),
        }
    }

    /// `--bulk-keys N`: N API keys of `account` written straight into the run's database as
    /// `postgres`, with the triggers off (`session_replication_role = replica`: no instance is
    /// told), so that an instance meets them all when it reads every key again (after a rewind,
    /// a restart of the database, its own start). Returns how long it took, in seconds.
    pub async fn bulk_keys(&self, n: u64, account: &str) -> Result<f64, String> {
        let t = std::time::Instant::now();
        let c = connect(&self.primary_db_url()).await?;
        let q = format!(
            "SET session_replication_role = replica; \
             INSERT INTO api_keys (hash, id, account_id, scopes, revoked, created_at) \
             SELECT sha256(('bulk ' || i)::bytea), 'key_bulk_' || i, '{}', '[]', false, 0 \
             FROM generate_series(1, {n}) AS i; \
             SET session_replication_role = DEFAULT",
            account.replace('\'', "''")
        );
        c.batch_execute(&q)
            .await
            .map_err(|e| format!("inserting {n} keys: {e}"))?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// The server is the harness's own (pg-cluster.sh made it): it can be restarted in place.
    pub fn is_own(&self) -> bool {
        !self.nodes.lock().unwrap().is_empty()
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
        self.pg_cluster(&["kill", &old_dir.display().to_string()])
            .await?;
        self.pg_cluster(&["promote", &new_dir.display().to_string()])
            .await?;
        self.primary.store(1 - old_slot, Ordering::SeqCst);
        let promoted = std::time::Instant::now();
        // The old primary's directory goes; a fresh standby of the new primary takes its slot.
        self.standby_in(old_slot, &old_dir).await?;
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

/// The lines for postgresql.conf that archive every WAL segment into `dir` (a segment archived
/// twice must be the same bytes; a copy lands whole).
pub fn archive_settings(dir: &Path) -> String {
    let a = dir.display();
    format!(
        "archive_mode = on\narchive_command = 'if [ -f \"{a}/%f\" ]; then cmp -s \"%p\" \"{a}/%f\"; else cp \"%p\" \"{a}/%f.tmp\" && mv \"{a}/%f.tmp\" \"{a}/%f\"; fi'\n"
    )
}

/// The archiver's last archived file is `seg` or a later segment of its timeline.
pub fn archived_past(last: &str, seg: &str) -> bool {
    last.len() >= 24
        && seg.len() == 24
        && last[..24].bytes().all(|b| b.is_ascii_hexdigit())
        && last[..8] == seg[..8]
        && last[..24] >= *seg
}

/// The PostgreSQL server programs pg-cluster.sh uses (the first version with initdb).
fn server_bin_dir() -> Result<PathBuf, String> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("/usr/lib/postgresql: {e}"))?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .next()
        .ok_or_else(|| "no PostgreSQL server programs under /usr/lib/postgresql".into())
}

/// The postgres user's uid and gid.
fn postgres_ids() -> Option<(u32, u32)> {
    let name = std::ffi::CString::new("postgres").ok()?;
    // SAFETY: getpwnam returns null or a pointer to static storage, read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: checked non-null above.
    unsafe { Some(((*pw).pw_uid, (*pw).pw_gid)) }
}

/// The server runs as postgres: what it must read or write is made its own.
fn chown_postgres(path: &Path) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let (u, g) = postgres_ids().ok_or("no postgres user")?;
    std::os::unix::fs::chown(path, Some(u), Some(g))
        .map_err(|e| format!("chown {}: {e}", path.display()))
}

/// Runs a server program as the postgres user (as pg-cluster.sh does); its stderr's last
/// lines on failure.
async fn as_postgres(program: &Path, args: &[&str]) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        let mut c = tokio::process::Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        tokio::process::Command::new(program)
    };
    cmd.args(args).stdin(std::process::Stdio::null());
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .map_err(|_| format!("{}: no end within 180 s", program.display()))?
        .map_err(|e| format!("{}: {e}", program.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(4).collect();
        return Err(format!(
            "{} exited {}: {}",
            program.display(),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    Ok(())
}

/// Waits (bounded) until no process works in `data` (the backends of a killed postmaster).
/// False if one still does.
async fn wait_no_process_in(data: &Path, max: Duration) -> bool {
    let until = std::time::Instant::now() + max;
    loop {
        let busy = std::fs::read_dir("/proc")
            .map(|rd| {
                rd.flatten().any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                        && std::fs::read_link(e.path().join("cwd")).is_ok_and(|c| c == data)
                })
            })
            .unwrap_or(false);
        if !busy {
            return true;
        }
        if std::time::Instant::now() > until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most 90 s) until the server at `maint` accepts connections and is out of
/// recovery.
async fn wait_out_of_recovery(maint: &str) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..900 {
        match connect(maint).await {
            Ok(c) => match c.query_one("SELECT pg_is_in_recovery()", &[]).await {
                Ok(r) if !r.get::<_, bool>(0) => return Ok(()),
                Ok(_) => last = "still in recovery".into(),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("not out of recovery within 90 s: {last}"))
}

/// Removes the socket and its lock file a killed postmaster left in `dir` (pg-cluster.sh's
/// unix_socket_directories) for `port`.
fn remove_socket_lock(dir: &Path, port: u16) {
    let _ = std::fs::remove_file(dir.join(format!(".s.PGSQL.{port}.lock")));
    let _ = std::fs::remove_file(dir.join(format!(".s.PGSQL.{port}")));
}

fn tail_file(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = s.lines().rev().take(n).collect();
    v.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Waits (at most 30 s) until the primary at `maint` has no standby streaming.
async fn wait_not_streaming(maint: &str) -> Result<(), String> {
    let c = connect(maint).await?;
    for _ in 0..300 {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        if n == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the standby still streamed 30 s after its WAL receiver was cut".into())
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
        assert_eq!(
            with_user("postgres://postgres@127.0.0.1:5432/t1", "orderly", None),
            "postgres://orderly@127.0.0.1:5432/t1"
        );
        assert_eq!(
            with_user(
                "postgres://u:p@h:1/x?sslmode=disable",
                "orderly",
                Some("a b")
            ),
            "postgres://orderly:a%20b@h:1/x?sslmode=disable"
        );
        assert_eq!(
            with_user("postgres://h:1", "orderly", None),
            "postgres://orderly@h:1"
        );
    }

    #[test]
    fn the_archiver_is_past_a_segment_of_its_timeline() {
        let seg = "000000010000000000000005";
        assert!(archived_past(seg, seg));
        assert!(archived_past("000000010000000000000006", seg));
        assert!(!archived_past("000000010000000000000004", seg));
        assert!(!archived_past("", seg));
        assert!(!archived_past("00000002.history", seg));
        assert!(archived_past(
            "000000010000000000000006.00000028.backup",
            seg
        ));
        assert!(!archived_past("000000020000000000000006", seg));
        let s = archive_settings(Path::new("/w/a"));
        assert!(s.starts_with("archive_mode = on\n"));
        assert!(s.contains("cp \"%p\" \"/w/a/%f.tmp\""));
    }
}
