//! `spawn_app()`: the real `orderly` binary on a free port over a fresh data directory, and
//! the calls the tests make against it.
//!
//! With `ORDERLY_TEST_DATABASE_URL` set (a maintenance URL of a PostgreSQL server), every
//! server runs on PostgreSQL instead: a fresh database per server, cloned from a template
//! that `orderly migrate` prepared once per test run; a restart reuses the same database.
//! With `ORDERLY_TEST_POOLER_URL` set as well (a connection pooler in front of that server,
//! PgBouncer, routing every database name to it), the servers connect through the pooler,
//! while the tests' own SQL (creating and dropping databases, holding locks) stays direct.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

use reqwest::{Client, Response, StatusCode};
use serde_json::{json, Value};

pub const ADMIN_TOKEN: &str = "test-admin-token";
/// High enough that only the rate-limit tests ever meet the limiter.
const GENEROUS_RATE_LIMIT: &str = "1000000";

pub struct TestApp {
    pub address: String,
    pub client: Client,
    pub data_dir: PathBuf,
    /// Every line the server printed on stdout so far.
    printed: Arc<Mutex<Vec<String>>>,
    /// Every line the server logged on stderr so far (also passed through to the test's).
    logged: Arc<Mutex<Vec<String>>>,
    _data_root: Option<tempfile::TempDir>,
    /// On PostgreSQL: the server's database, dropped with the last app that uses it.
    _database: Option<TestDatabase>,
    child: Child,
}

/// The maintenance URL of the PostgreSQL server the tests run on, if they do.
pub fn test_database_url() -> Option<String> {
    std::env::var("ORDERLY_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
}

pub fn on_postgres() -> bool {
    test_database_url().is_some()
}

/// The URL of database `name` on the test server, for the tests' own SQL.
pub fn database_url(name: &str) -> String {
    named(&test_database_url().expect("on PostgreSQL"), name)
}

/// The URL the servers use for database `name`: through the pooler, when there is one, and
/// as the servers' role (`server_role`).
pub fn server_database_url(name: &str) -> String {
    let pooler = std::env::var("ORDERLY_TEST_POOLER_URL")
        .ok()
        .filter(|u| !u.trim().is_empty());
    as_server_role(&match pooler {
        Some(pooler) => named(&pooler, name),
        None => database_url(name),
    })
}

/// The role the servers run as (`ORDERLY_TEST_ROLE`): CI's clusters have `orderly`, which is
/// not a superuser and owns only the databases made for it (scripts/pg-cluster.sh), as
/// production runs it. Unset: the servers connect as the tests do.
pub fn server_role() -> Option<String> {
    std::env::var("ORDERLY_TEST_ROLE")
        .ok()
        .filter(|r| !r.trim().is_empty())
}

/// `url` with the servers' role as its user, when there is one.
pub fn as_server_role(url: &str) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    if let Some(role) = server_role() {
        url.set_username(&role).expect("a URL with a host");
    }
    url.to_string()
}

/// `CREATE DATABASE name ...` owned by the servers' role, when there is one.
pub fn create_database_sql(name: &str, template: Option<&str>) -> String {
    let template = template.map_or(String::new(), |t| format!(" TEMPLATE {t}"));
    let owner = server_role().map_or(String::new(), |r| format!(" OWNER {r}"));
    format!("CREATE DATABASE {name}{template}{owner}")
}

fn named(server: &str, name: &str) -> String {
    let mut url = url::Url::parse(server).expect("a URL");
    url.set_path(&format!("/{name}"));
    url.to_string()
}

/// Runs SQL on the maintenance database (off the test's runtime: on a thread of its own).
pub fn maintenance_sql(sql: String) -> Result<(), String> {
    sql_on(test_database_url().expect("on PostgreSQL"), sql)
}

/// Runs SQL on the database at `url`, on a thread of its own.
pub fn sql_on(url: String, sql: String) -> Result<(), String> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            let connection = tokio::spawn(connection);
            let done = client
                .batch_execute(&sql)
                .await
                .map_err(|e| format!("{sql}: {:?}", e.as_db_error().map(|d| d.message())));
            drop(client);
            let _ = connection.await;
            done
        })
    })
    .join()
    .map_err(|_| "the SQL thread panicked".to_string())?
}

/// The first column of the first row of `sql` on the database at `url`, as an integer.
pub fn sql_i64(url: String, sql: String) -> Result<i64, String> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            let connection = tokio::spawn(connection);
            let row = client
                .query_one(&sql, &[])
                .await
                .map_err(|e| format!("{sql}: {e:?}"));
            drop(client);
            let _ = connection.await;
            Ok(row?.get::<_, i64>(0))
        })
    })
    .join()
    .map_err(|_| "the SQL thread panicked".to_string())?
}

/// How to undo each migration, newest first: what the database looked like before it. The
/// tests that stand for "a database as an older orderly left it" use them.
const UNDO_MIGRATIONS: &[(i64, &str)] = &[
    (
        13,
        "DROP INDEX ledger_unchained; DROP INDEX ledger_account_seq;
         ALTER TABLE ledger DROP COLUMN seq, DROP COLUMN hash;",
    ),
    (12, "ALTER TABLE api_keys DROP COLUMN expires_at;"),
    (
        11,
        "CREATE OR REPLACE FUNCTION orderly_api_key_changed() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             UPDATE auth_cache_version SET version = version + 1 RETURNING version INTO NEW.changed_in;
             RETURN NEW;
         END
         $$;",
    ),
    // 10 gives orderly_history_id() the body 0009 has now: the same answers where the role
    // may call every function it reads, so there is nothing to undo but its number.
    (10, "SELECT 1;"),
    (
        9,
        "DROP FUNCTION orderly_note_history();
         DROP TABLE orderly_history;
         DROP FUNCTION orderly_history_id();
         ALTER TABLE auth_cache_leases DROP COLUMN released;",
    ),
    (
        8,
        "CREATE INDEX orders_processing ON orders (id) WHERE status = 'Processing';
         DROP INDEX orders_processing_due;",
    ),
];

/// Puts the database at `url` back to the schema an orderly at migration `version` left, by
/// undoing every migration above it. Asserts that the database is at the newest migration
/// this table knows how to undo, so that a new migration adds its undo here.
pub fn back_to_schema(url: &str, version: i64) {
    let latest = sql_i64(
        url.to_string(),
        "SELECT max(version)::bigint FROM orderly_schema_migrations".into(),
    )
    .unwrap();
    assert_eq!(
        latest, UNDO_MIGRATIONS[0].0,
        "a new migration: add how to undo it to UNDO_MIGRATIONS"
    );
    for (undone, sql) in UNDO_MIGRATIONS.iter().filter(|(v, _)| *v > version) {
        sql_on(
            url.to_string(),
            format!("{sql} DELETE FROM orderly_schema_migrations WHERE version = {undone}"),
        )
        .unwrap();
    }
}

/// The newest migration (what a binary of this tree migrates a database to).
pub const LATEST_MIGRATION: i64 = UNDO_MIGRATIONS[0].0;

/// `scripts/NAME ARGS...` run by bash: what it printed, or why it failed (its stderr).
pub fn script(name: &str, args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("scripts")
                .join(name),
        )
        .args(args)
        .output()
        .map_err(|e| format!("{name} does not run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{name} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The template every test database is cloned from, migrated once per run.
fn template() -> &'static str {
    static TEMPLATE: OnceLock<String> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let name = format!("orderly_tpl_{}", std::process::id());
        maintenance_sql(format!("DROP DATABASE IF EXISTS {name}")).unwrap();
        maintenance_sql(create_database_sql(&name, None)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_orderly"))
            .args([
                "migrate",
                "--database-url",
                &as_server_role(&database_url(&name)),
            ])
            .output()
            .expect("orderly migrate runs");
        assert!(
            out.status.success(),
            "orderly migrate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        name
    })
}

/// A database of its own for one server (and its restarts), dropped when its last app goes.
pub struct TestDatabase {
    pub name: String,
    /// For the tests' own SQL: direct.
    pub url: String,
    /// For the servers: through the pooler, when the tests run behind one.
    pub server_url: String,
    data_dir: PathBuf,
}

/// Which database belongs to which data directory, so that `start(dir)` after a crash finds
/// the database the first start used.
fn databases() -> &'static Mutex<HashMap<PathBuf, String>> {
    static DATABASES: OnceLock<Mutex<HashMap<PathBuf, String>>> = OnceLock::new();
    DATABASES.get_or_init(Default::default)
}

impl TestDatabase {
    /// A fresh, migrated database (a copy of the template).
    pub fn create(data_dir: &Path) -> TestDatabase {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let template = template();
        let name = format!(
            "orderly_t_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        maintenance_sql(create_database_sql(&name, Some(template))).unwrap();
        databases()
            .lock()
            .unwrap()
            .insert(data_dir.to_path_buf(), name.clone());
        TestDatabase {
            url: database_url(&name),
            server_url: server_database_url(&name),
            name,
            data_dir: data_dir.to_path_buf(),
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        databases().lock().unwrap().remove(&self.data_dir);
        let _ = maintenance_sql(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

/// The server with default flags (and a generous rate limit) on a fresh database.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

pub async fn spawn_app_with(extra: &[&str]) -> TestApp {
    let root = tempfile::tempdir().expect("temp dir");
    let data_dir = root.path().join("db");
    let mut app = start(&data_dir, extra);
    app._data_root = Some(root);
    app
}

/// The server logging at `info` (so that tests can read what it logs).
pub async fn spawn_app_logging(extra: &[&str]) -> TestApp {
    let root = tempfile::tempdir().expect("temp dir");
    let mut app = launch(&root.path().join("db"), extra, true, "info", &[]);
    app._data_root = Some(root);
    app
}

/// The server on sled whatever the environment: for tests of the embedded engine's own
/// mechanisms (CI's PostgreSQL run leaves them out by name).
pub async fn spawn_app_on_sled() -> TestApp {
    let root = tempfile::tempdir().expect("temp dir");
    let dir = root.path().join("db");
    let data_dir = dir.display().to_string();
    let mut app = launch(&dir, &["--data-dir", &data_dir], true, "warn", &[]);
    app._data_root = Some(root);
    app
}

/// The server without `--admin-token`: its admin API does not exist.
pub async fn spawn_app_without_admin() -> TestApp {
    let root = tempfile::tempdir().expect("temp dir");
    let mut app = launch(&root.path().join("db"), &[], false, "warn", &[]);
    app._data_root = Some(root);
    app
}

/// Starts the binary on `data_dir` (an existing database is reused, as after a crash).
pub fn start(data_dir: &Path, extra: &[&str]) -> TestApp {
    launch(data_dir, extra, true, "warn", &[])
}

/// `start`, with these variables in the server's environment (libfaketime's, for one).
pub fn start_with_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> TestApp {
    launch(data_dir, extra, true, "warn", env)
}

/// `start`, logging at `info` (so that tests can read what it logs).
pub fn start_logging(data_dir: &Path, extra: &[&str]) -> TestApp {
    launch(data_dir, extra, true, "info", &[])
}

fn launch(
    data_dir: &Path,
    extra: &[&str],
    with_admin: bool,
    log_level: &str,
    env: &[(&str, &str)],
) -> TestApp {
    let mut args: Vec<String> = vec!["serve".into(), "--listen".into(), "127.0.0.1:0".into()];
    // On PostgreSQL: the data directory's database, created on its first start.
    let mut database = None;
    if extra.contains(&"--database-url") || extra.contains(&"--data-dir") {
        // The test chose its own engine and place (a shared database, or sled on purpose).
    } else if on_postgres() {
        let known = databases().lock().unwrap().get(data_dir).cloned();
        let url = match known {
            Some(name) => server_database_url(&name),
            None => {
                let created = TestDatabase::create(data_dir);
                let url = created.server_url.clone();
                database = Some(created);
                url
            }
        };
        args.extend(["--database-url".into(), url]);
    } else {
        args.extend(["--data-dir".into(), data_dir.display().to_string()]);
    }
    if with_admin {
        args.extend(["--admin-token".into(), ADMIN_TOKEN.into()]);
    }
    // Defaults that keep tests independent of the limiter and of fulfillment timing;
    // a test that cares passes its own value.
    for (flag, value) in [
        ("--rate-limit", GENEROUS_RATE_LIMIT),
        ("--fulfillment-delay", "1h"),
    ] {
        if !extra.contains(&flag) {
            args.extend([flag.to_string(), value.to_string()]);
        }
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    // Tests run in the package root, where `--demo` finds data/demo.json.
    let mut child = Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args(&args)
        .env("RUST_LOG", log_level)
        .envs(env.iter().copied())
        .env_remove("ORDERLY_ADMIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting orderly");
    let logged = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().expect("stderr");
    let log_lines = Arc::clone(&logged);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            log_lines.lock().unwrap().push(line);
        }
    });
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    let printed = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&printed);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("orderly listening on ") {
                let _ = tx.send(addr.to_string());
            }
            log.lock().unwrap().push(line);
        }
    });
    let address = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("orderly did not report its address within 30 s");
    TestApp {
        address,
        client: Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        data_dir: data_dir.to_path_buf(),
        printed,
        logged,
        _data_root: None,
        _database: database,
        child,
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A wholesale account with a key holding every scope.
pub struct Partner {
    pub account_id: String,
    pub api_key: String,
}

/// The order's status as its partner reads it.
pub async fn order_status(app: &TestApp, api_key: &str, id: &str) -> String {
    app.get_json(api_key, &format!("/b2b/orders/{id}")).await["order"]["status"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Waits (5 s at the most) for the order to be completed.
pub async fn wait_until_completed(app: &TestApp, api_key: &str, id: &str) {
    for _ in 0..100 {
        if order_status(app, api_key, id).await == "completed" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("order {id} was not completed within 5 s");
}

/// The sum of every sample of the metric `name` in `/metrics` text (all its label sets).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn basket(product: &str, quantity: u64, username: &str) -> Value {
    json!({ "items": [ { "productId": product, "quantity": quantity, "deliveryData": { "username": username } } ] })
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    /// What the server printed on stdout before it reported its address (the demo keys).
    pub fn printed(&self) -> Vec<String> {
        self.printed.lock().unwrap().clone()
    }

    /// The body of `GET path`, sent with no credentials, as text.
    pub async fn text(&self, path: &str) -> String {
        let resp = self.client.get(self.url(path)).send().await.expect("GET");
        resp.text().await.expect("a text body")
    }

    /// `GET path` as the partner holding `api_key`, whatever the answer.
    pub async fn get(&self, api_key: &str, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .header("X-Api-Key", api_key)
            .send()
            .await
            .expect("GET call")
    }

    /// On PostgreSQL, the URL of this server's database.
    pub fn database_url(&self) -> Option<String> {
        let name = databases().lock().unwrap().get(&self.data_dir).cloned()?;
        Some(database_url(&name))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the server has logged on stderr so far.
    pub fn logged(&self) -> Vec<String> {
        self.logged.lock().unwrap().clone()
    }

    /// `kill -<name>`, then the exit status (bounded wait).
    pub fn signal(&mut self, name: &str, within: Duration) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .expect("kill");
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Starts again on the same data after the process has ended.
    pub fn restart(mut self, extra: &[&str]) -> TestApp {
        let root = self._data_root.take();
        let database = self._database.take();
        let mut app = start(&self.data_dir, extra);
        app._data_root = root;
        app._database = app._database.take().or(database);
        app
    }

    /// kill -9, then start again on the same data.
    pub fn crash_and_restart(mut self, extra: &[&str]) -> TestApp {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let root = self._data_root.take();
        let database = self._database.take();
        let mut app = start(&self.data_dir, extra);
        app._data_root = root;
        app._database = app._database.take().or(database);
        app
    }

    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Response {
        let mut req = self
            .client
            .request(method, self.url(path))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            req = req.json(&body);
        }
        req.send().await.expect("admin call")
    }

    pub async fn create_account(&self, wholesale: bool, credit_limit: i64, region: &str) -> String {
        let resp = self
            .admin(
                reqwest::Method::POST,
                "/admin/accounts",
                Some(json!({"name": "Acme", "wholesale": wholesale, "creditLimit": credit_limit, "region": region})),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let body: Value = resp.json().await.unwrap();
        body["account"]["id"].as_str().unwrap().to_string()
    }

    pub async fn create_key(&self, account_id: &str, scopes: &[&str]) -> String {
        let resp = self
            .admin(
                reqwest::Method::POST,
                &format!("/admin/accounts/{account_id}/api-keys"),
                Some(json!({ "scopes": scopes })),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let body: Value = resp.json().await.unwrap();
        body["apiKey"]["key"].as_str().unwrap().to_string()
    }

    pub async fn credit(&self, account_id: &str, amount: i64) {
        let resp = self
            .client
            .post(self.url(&format!("/admin/accounts/{account_id}/credits")))
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .json(&json!({ "amount": amount, "reason": "test top-up" }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }

    pub async fn put_product(
        &self,
        id: &str,
        price: i64,
        regions: &[&str],
        fields: &[&str],
        active: bool,
    ) {
        let resp = self
            .admin(
                reqwest::Method::PUT,
                &format!("/admin/products/{id}"),
                Some(json!({"name": id, "price": price, "regions": regions, "deliveryFields": fields, "active": active})),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
    }

    /// A wholesale EU account with `balance` and an all-scopes key, plus the standard
    /// products: `prd_uc` (999, needs username), `prd_us` (US only), `prd_free` (price 0).
    pub async fn partner_with_balance(&self, balance: i64) -> Partner {
        self.put_product("prd_uc", 999, &[], &["username"], true)
            .await;
        self.put_product("prd_us", 500, &["US"], &[], true).await;
        self.put_product("prd_free", 0, &[], &[], true).await;
        let account_id = self.create_account(true, 0, "EU").await;
        if balance > 0 {
            self.credit(&account_id, balance).await;
        }
        let api_key = self
            .create_key(
                &account_id,
                &[
                    "orders:write",
                    "orders:read",
                    "balance:read",
                    "catalog:read",
                ],
            )
            .await;
        Partner {
            account_id,
            api_key,
        }
    }

    pub async fn post_order(
        &self,
        api_key: Option<&str>,
        idem_key: Option<&str>,
        body: &Value,
    ) -> Response {
        let mut req = self.client.post(self.url("/b2b/orders")).json(body);
        if let Some(k) = api_key {
            req = req.header("X-Api-Key", k);
        }
        if let Some(k) = idem_key {
            req = req.header("X-Idempotency-Key", k);
        }
        req.send().await.expect("order call")
    }

    /// `POST /b2b/orders/{order}/cancel` without a key or a body.
    pub async fn cancel(&self, api_key: &str, order: &str) -> Response {
        self.client
            .post(self.url(&format!("/b2b/orders/{order}/cancel")))
            .header("X-Api-Key", api_key)
            .send()
            .await
            .expect("cancel call")
    }

    pub async fn get_json(&self, api_key: &str, path: &str) -> Value {
        let resp = self.get(api_key, path).await;
        assert_eq!(resp.status(), StatusCode::OK, "GET {path}");
        resp.json().await.unwrap()
    }

    pub async fn balance(&self, api_key: &str) -> i64 {
        self.get_json(api_key, "/b2b/balance").await["balance"]["available"]
            .as_i64()
            .unwrap()
    }

    /// Every ledger entry, newest first, following the cursor to the end.
    pub async fn ledger(&self, api_key: &str) -> Vec<Value> {
        self.all_pages(api_key, "/b2b/transactions", "transactions")
            .await
    }

    pub async fn orders(&self, api_key: &str) -> Vec<Value> {
        self.all_pages(api_key, "/b2b/orders", "orders").await
    }

    pub async fn all_pages(&self, api_key: &str, path: &str, resource: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page_path = match &cursor {
                Some(c) => format!("{path}?limit=100&cursor={c}"),
                None => format!("{path}?limit=100"),
            };
            let page = self.get_json(api_key, &page_path).await;
            out.extend(page[resource].as_array().unwrap().iter().cloned());
            match page["nextCursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => return out,
            }
        }
    }

    /// The balance, checked against the sum of the ledger.
    /// `GET /admin/backup`, whole, as text (a 200).
    pub async fn backup_text(&self) -> String {
        let resp = self
            .client
            .get(self.url("/admin/backup"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.text().await.unwrap()
    }

    pub async fn assert_ledger_matches_balance(&self, api_key: &str) -> i64 {
        let balance = self.balance(api_key).await;
        let sum: i64 = self
            .ledger(api_key)
            .await
            .iter()
            .map(|e| e["amount"].as_i64().unwrap())
            .sum();
        assert_eq!(sum, balance, "the ledger must sum to the balance");
        balance
    }
}

/// A backup of `records` (its lines but the end record, each JSON) closed by `end` with the
/// digest of those lines made right: what a hand that edits a backup writes.
pub fn sealed_backup(records: &[String], mut end: Value) -> String {
    use sha2::Digest;
    let body: String = records.iter().map(|l| format!("{l}\n")).collect();
    let digest: String = sha2::Sha256::digest(body.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    end["sha256"] = json!(digest);
    format!("{body}{end}\n")
}
