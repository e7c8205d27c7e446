//! docs/contract.md "When the storage is slow", "a pooler in between changes nothing", last
//! sentence, and docs/operations.md "When it cannot start": a database orderly cannot use as given (unreachable, missing, the login refused,
//! read-only, a pooler refusing a startup parameter or allowing no transactions) stops `serve`
//! at once with status 1 and one line saying which and what to check, never `db error`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{script, sql_on, TestDatabase};

/// `orderly serve` on `url`: its status and stderr, once it ended (bounded: a refusal is at
/// once, and a server that keeps running fails the test).
fn serve_on(url: &str, data_dir: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args(["serve", "--listen", "127.0.0.1:0", "--database-url", url])
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= until {
            let _ = child.kill();
            panic!("serve on {url} kept running: it must refuse");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The one line saying why: exactly one, and nothing opaque anywhere.
fn the_line(status: Option<i32>, stderr: &str) -> String {
    assert_eq!(status, Some(1), "{stderr}");
    assert!(!stderr.contains("db error"), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("orderly: "))
        .collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        !stderr.contains(" ERROR "),
        "said once, not logged again: {stderr}"
    );
    lines[0].to_string()
}

/// A URL of this server with `user` and `database`.
fn with(url: &str, user: &str, database: &str) -> String {
    let mut url = url::Url::parse(url).unwrap();
    url.set_username(user).unwrap();
    url.set_path(&format!("/{database}"));
    url.to_string()
}

/// PgBouncer in front of the test server (`scripts/pgbouncer.sh`), stopped when dropped.
struct Pooler {
    dir: tempfile::TempDir,
    url: String,
}

impl Pooler {
    fn start(mode: &str) -> Pooler {
        let dir = tempfile::tempdir().unwrap();
        let server = crate::helpers::database_url("postgres");
        let url = script(
            "pgbouncer.sh",
            &[
                "start".as_ref(),
                dir.path().as_os_str(),
                server.as_ref(),
                mode.as_ref(),
            ],
        )
        .unwrap_or_else(|why| panic!("{why}"));
        Pooler { dir, url }
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        let _ = script(
            "pgbouncer.sh",
            &["stop".as_ref(), self.dir.path().as_os_str()],
        );
    }
}

#[test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
fn a_database_nobody_listens_for_is_one_line_naming_the_host_and_port_to_check() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let line = the_line_of(serve_on(
        &format!("postgresql://postgres@127.0.0.1:{port}/orderly"),
        dir.path(),
    ));
    assert!(line.contains("cannot reach"), "{line}");
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(line.contains("check the host and port"), "{line}");
}

#[test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
fn a_database_that_does_not_exist_is_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = with(
        &crate::helpers::database_url("postgres"),
        "postgres",
        "orderly_nowhere",
    );
    let line = the_line_of(serve_on(&url, dir.path()));
    assert!(line.contains("orderly_nowhere"), "{line}");
    assert!(line.contains("does not exist"), "{line}");
}

#[test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
fn a_login_the_server_refuses_is_one_line_pointing_at_the_user_and_pg_hba() {
    let dir = tempfile::tempdir().unwrap();
    let url = with(
        &crate::helpers::database_url("postgres"),
        "orderly_ghost",
        "postgres",
    );
    let line = the_line_of(serve_on(&url, dir.path()));
    assert!(line.contains("refused the login"), "{line}");
    assert!(line.contains("orderly_ghost"), "{line}");
    assert!(line.contains("pg_hba.conf"), "{line}");
}

#[test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
fn a_read_only_database_is_one_line_asking_for_the_primary() {
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create(&dir.path().join("db"));
    sql_on(
        crate::helpers::database_url("postgres"),
        format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            database.name
        ),
    )
    .unwrap();
    let line = the_line_of(serve_on(&database.server_url, &dir.path().join("data")));
    assert!(line.contains("is read-only"), "{line}");
    assert!(line.contains("target_session_attrs=read-write"), "{line}");
}

#[test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
fn a_pooler_refusing_a_startup_parameter_is_one_line_naming_ignore_startup_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create(&dir.path().join("db"));
    let pooler = Pooler::start("transaction");
    let url = format!(
        "{}?options=-c%20work_mem%3D8MB",
        with(&pooler.url, "postgres", &database.name)
    );
    let line = the_line_of(serve_on(&url, &dir.path().join("data")));
    assert!(line.contains("refused a startup parameter"), "{line}");
    assert!(line.contains("ignore_startup_parameters"), "{line}");
}

#[test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
fn a_pooler_in_statement_mode_is_one_line_naming_the_pool_mode_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create(&dir.path().join("db"));
    let pooler = Pooler::start("statement");
    let url = with(&pooler.url, "postgres", &database.name);
    let (status, stderr) = serve_on(&url, &dir.path().join("data"));
    // PgBouncer closes the connection after its refusal, which the log notes before the line.
    let line = the_line(status, &stderr);
    assert!(line.contains("statement pooling mode"), "{line}");
    assert!(
        line.contains("pool_mode to transaction or session"),
        "{line}"
    );
}

fn the_line_of((status, stderr): (Option<i32>, String)) -> String {
    let line = the_line(status, &stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    line
}
