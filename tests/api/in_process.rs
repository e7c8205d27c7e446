//! orderly in this process on the embedded engine, with its durability step under the test's
//! control: a flush hook (`Gate`) that can hold the group commit or make it fail, so that
//! "before the flush" and "a disk that stopped answering" are states a test holds.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use clap::Parser;
use orderly::{Application, RunError};
use orderly::{Cli, Command};
use orderly::{FlushHook, FlushStep};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::helpers::ADMIN_TOKEN;

#[derive(Default)]
pub struct GateState {
    closed: bool,
    failing: bool,
    waiting: usize,
    /// Completed sled flushes and `fdatasync`s.
    flushed: usize,
    synced: usize,
}

/// The flush hook: open (flushes pass), closed (the commit thread waits in it), or failing
/// (the flush fails, as a full disk would make it).
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl Gate {
    pub fn hook(self: &Arc<Self>) -> FlushHook {
        let gate = Arc::clone(self);
        Box::new(move |step| match step {
            FlushStep::Flushing => gate.pass(),
            FlushStep::Flushed => gate.count(|s| s.flushed += 1),
            FlushStep::Synced => gate.count(|s| s.synced += 1),
        })
    }

    pub fn count(&self, step: impl FnOnce(&mut GateState)) -> std::io::Result<()> {
        step(&mut self.state.lock().unwrap());
        Ok(())
    }

    /// Completed (flushes, fdatasyncs) so far.
    pub fn done(&self) -> (usize, usize) {
        let state = self.state.lock().unwrap();
        (state.flushed, state.synced)
    }

    pub fn pass(&self) -> std::io::Result<()> {
        let mut state = self.state.lock().unwrap();
        state.waiting += 1;
        self.changed.notify_all();
        while state.closed && !state.failing {
            state = self.changed.wait(state).unwrap();
        }
        state.waiting -= 1;
        if state.failing {
            return Err(std::io::Error::other("injected: no space left on device"));
        }
        Ok(())
    }

    pub fn set(&self, closed: bool, failing: bool) {
        let mut state = self.state.lock().unwrap();
        state.closed = closed;
        state.failing = failing;
        self.changed.notify_all();
    }

    pub fn close(&self) {
        self.set(true, false);
    }

    pub fn open(&self) {
        self.set(false, false);
    }

    pub fn fail(&self) {
        self.set(false, true);
    }

    /// Waits (bounded) until a flush is held in the gate.
    pub async fn until_a_flush_waits(&self) {
        for _ in 0..1000 {
            if self.state.lock().unwrap().waiting > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no flush reached the gate within 10 s");
    }
}

/// orderly in this process, on a fresh database, with the gate as its flush hook.
pub struct InProcess {
    pub address: String,
    pub client: Client,
    pub gate: Arc<Gate>,
    ended: std::sync::mpsc::Receiver<Result<(), RunError>>,
    _dir: tempfile::TempDir,
}

impl InProcess {
    pub fn start(extra: &[&str]) -> InProcess {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("db").display().to_string();
        let mut argv = vec![
            "orderly",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data_dir,
            "--admin-token",
            ADMIN_TOKEN,
            "--rate-limit",
            "1000000",
            "--fulfillment-delay",
            "1h",
        ];
        argv.extend_from_slice(extra);
        let Command::Serve(settings) = Cli::parse_from(argv).command else {
            unreachable!("serve was parsed")
        };
        let gate = Arc::new(Gate::default());
        let hook = gate.hook();
        let (bound, address) = std::sync::mpsc::channel();
        let (end, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let app = Application::build_with_flush_hook(*settings, Some(hook))
                    .await
                    .expect("the application starts");
                bound.send(app.address()).unwrap();
                let _ = end.send(app.run_until_stopped().await);
            })
        });
        let address = address
            .recv_timeout(Duration::from_secs(30))
            .expect("orderly bound its port");
        InProcess {
            address: format!("http://{address}"),
            client: Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            gate,
            ended,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn admin(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let resp = self
            .client
            .request(method, self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        resp.json().await.unwrap()
    }

    /// A funded wholesale account and its key; the product `prd_uc` exists.
    pub async fn partner(&self) -> String {
        self.admin(
            reqwest::Method::PUT,
            "/admin/products/prd_uc",
            json!({"name": "UC", "price": 999, "deliveryFields": ["username"]}),
        )
        .await;
        self.partner_with(100_000).await
    }

    pub fn order(
        &self,
        client: &Client,
        api_key: &str,
        key: &str,
        body: &Value,
    ) -> reqwest::RequestBuilder {
        client
            .post(self.url("/b2b/orders"))
            .header("X-Api-Key", api_key)
            .header("X-Idempotency-Key", key)
            .json(body)
    }

    /// A wholesale account with `funds` and its key (`partner` makes the product).
    pub async fn partner_with(&self, funds: i64) -> String {
        let account = self
            .admin(
                reqwest::Method::POST,
                "/admin/accounts",
                json!({"name": "Acme", "wholesale": true, "region": "EU"}),
            )
            .await;
        let id = account["account"]["id"].as_str().unwrap().to_string();
        self.admin(
            reqwest::Method::POST,
            &format!("/admin/accounts/{id}/credits"),
            json!({"amount": funds}),
        )
        .await;
        let key = self
            .admin(
                reqwest::Method::POST,
                &format!("/admin/accounts/{id}/api-keys"),
                json!({}),
            )
            .await;
        key["apiKey"]["key"].as_str().unwrap().to_string()
    }

    /// A counter from `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self
            .client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    pub async fn get_json(&self, api_key: &str, path: &str) -> Value {
        let resp = self.get(api_key, path).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        resp.json().await.unwrap()
    }

    pub fn get(&self, api_key: &str, path: &str) -> reqwest::RequestBuilder {
        self.client.get(self.url(path)).header("X-Api-Key", api_key)
    }

    /// How the application ended, waiting at most `within`.
    pub fn ended_within(&self, within: Duration) -> Option<Result<(), RunError>> {
        self.ended.recv_timeout(within).ok()
    }
}
