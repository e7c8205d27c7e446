//! The real `orderly` binary on a free port over a fresh data directory, and the admin and
//! partner calls the tests make to arrange and to check.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};

pub const ADMIN_TOKEN: &str = "client-tests-admin";
pub const PRICE: i64 = 999;

pub struct Server {
    pub url: String,
    child: Child,
    _data: tempfile::TempDir,
}

pub struct Partner {
    pub account_id: String,
    pub api_key: String,
    pub webhook_secret: String,
}

/// `ORDERLY_BIN` when set, else `orderly` beside this test binary's target directory, built
/// once if it is not there yet (a plain `cargo test` at the root builds it first).
pub fn orderly_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf();
        if let Some(bin) = std::env::var_os("ORDERLY_BIN") {
            let bin = PathBuf::from(bin);
            return if bin.is_absolute() || bin.exists() {
                bin
            } else {
                workspace.join(bin)
            };
        }
        // <target>/debug/deps/it-<hash> → <target>/debug/orderly
        let exe = std::env::current_exe().expect("test binary path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target layout");
        let bin = profile_dir.join("orderly");
        if !bin.exists() {
            let target = profile_dir.parent().expect("target dir");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "-p", "orderly", "--bin", "orderly"])
                .env("CARGO_TARGET_DIR", target)
                .current_dir(&workspace)
                .status()
                .expect("cargo build of orderly");
            assert!(status.success(), "building orderly failed");
        }
        bin
    })
}

impl Server {
    /// Starts orderly with a generous rate limit and slow fulfillment unless `extra` says
    /// otherwise.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_in(tempfile::tempdir().expect("temp dir"), extra)
    }

    /// A server on the store `orderly restore` makes of `backup` (the same accounts, keys and
    /// ledgers, as far as the backup says).
    pub fn restored(backup: &str) -> Server {
        let data = tempfile::tempdir().expect("temp dir");
        let file = data.path().join("orderly.backup");
        std::fs::write(&file, backup).unwrap();
        let out = Command::new(orderly_bin())
            .args(["restore", "--from"])
            .arg(&file)
            .arg("--data-dir")
            .arg(data.path().join("db"))
            .env_remove("ORDERLY_DATA_DIR")
            .env_remove("ORDERLY_DATABASE_URL")
            .output()
            .expect("orderly restore runs");
        assert!(
            out.status.success(),
            "orderly restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Server::start_in(data, &[])
    }

    /// `GET /admin/backup`, whole.
    pub fn backup(&self) -> String {
        let mut response = agent()
            .get(format!("{}/admin/backup", self.url))
            .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
            .call()
            .expect("a backup");
        assert_eq!(response.status().as_u16(), 200);
        response
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .unwrap()
    }

    fn start_in(data: tempfile::TempDir, extra: &[&str]) -> Server {
        let mut args: Vec<String> = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-token",
            ADMIN_TOKEN,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend([
            "--data-dir".into(),
            data.path().join("db").display().to_string(),
        ]);
        for (flag, value) in [("--rate-limit", "1000000"), ("--fulfillment-delay", "1h")] {
            if !extra.contains(&flag) {
                args.extend([flag.to_string(), value.to_string()]);
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child = Command::new(orderly_bin())
            .args(&args)
            .env("RUST_LOG", "error")
            .env_remove("ORDERLY_ADMIN_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting orderly");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("orderly listening on ") {
                    let _ = tx.send(addr.to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("orderly did not say where it listens within 30 s");
        Server {
            url,
            child,
            _data: data,
        }
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.url);
        let mut request = ureq::http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let agent = agent();
        let mut response = match body {
            Some(body) => agent.run(
                request
                    .header("Content-Type", "application/json")
                    .body(body.to_string())
                    .unwrap(),
            ),
            None => agent.run(request.body(()).unwrap()),
        }
        .expect("call to orderly");
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        let key = uuid::Uuid::new_v4().to_string();
        let (status, answer) = self.call(
            method,
            path,
            &[("Authorization", &auth), ("X-Idempotency-Key", &key)],
            body.as_ref(),
        );
        assert_eq!(status, 200, "{method} {path}: {answer}");
        answer
    }

    /// A wholesale EU account with `balance`, an optional credit line and an all-scopes key;
    /// the product `prd_uc` (999, needs a username) is in the catalog.
    pub fn partner(&self, balance: i64, credit_limit: i64) -> Partner {
        self.admin(
            "PUT",
            "/admin/products/prd_uc",
            Some(json!({"name": "660 UC", "price": PRICE, "regions": [], "deliveryFields": ["username"], "active": true})),
        );
        let account = self.admin(
            "POST",
            "/admin/accounts",
            Some(json!({"name": "Acme", "wholesale": true, "creditLimit": credit_limit, "region": "EU"})),
        );
        let account_id = account["account"]["id"].as_str().unwrap().to_string();
        let webhook_secret = account["account"]["webhookSecret"]
            .as_str()
            .unwrap()
            .to_string();
        if balance > 0 {
            self.top_up(&account_id, balance);
        }
        let key = self.admin(
            "POST",
            &format!("/admin/accounts/{account_id}/api-keys"),
            Some(
                json!({"scopes": ["orders:write", "orders:read", "balance:read", "catalog:read"]}),
            ),
        );
        Partner {
            account_id,
            api_key: key["apiKey"]["key"].as_str().unwrap().to_string(),
            webhook_secret,
        }
    }

    pub fn top_up(&self, account_id: &str, amount: i64) {
        self.admin(
            "POST",
            &format!("/admin/accounts/{account_id}/credits"),
            Some(json!({"amount": amount, "reason": "test top-up"})),
        );
    }

    pub fn get(&self, api_key: &str, path: &str) -> (u16, Value) {
        self.call("GET", path, &[("X-Api-Key", api_key)], None)
    }

    fn all_pages(&self, api_key: &str, path: &str, resource: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page_path = match &cursor {
                Some(c) => format!("{path}?limit=100&cursor={c}"),
                None => format!("{path}?limit=100"),
            };
            let (status, page) = self.get(api_key, &page_path);
            assert_eq!(status, 200, "GET {page_path}: {page}");
            out.extend(page[resource].as_array().unwrap().iter().cloned());
            match page["nextCursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => return out,
            }
        }
    }

    pub fn orders(&self, api_key: &str) -> Vec<Value> {
        self.all_pages(api_key, "/b2b/orders", "orders")
    }

    /// The ledger's order charges (one per order placed).
    pub fn charges(&self, api_key: &str) -> Vec<Value> {
        self.all_pages(api_key, "/b2b/transactions", "transactions")
            .into_iter()
            .filter(|t| t["reason"] == "order")
            .collect()
    }

    pub fn balance(&self, api_key: &str) -> i64 {
        self.get(api_key, "/b2b/balance").1["balance"]["available"]
            .as_i64()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// The order body of one line of `prd_uc` for `username`.
pub fn basket(username: &str, quantity: u64) -> Value {
    json!({"items": [{"productId": "prd_uc", "quantity": quantity, "deliveryData": {"username": username}}]})
}
