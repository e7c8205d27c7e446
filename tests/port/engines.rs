//! The engines the conformance suite runs on, each opened through `orderly::open_store`:
//! sled in a fresh directory, PostgreSQL in a fresh database on the server that
//! `ORDERLY_TEST_DATABASE_URL` names (migrated on open), dropped afterwards.

use std::sync::Arc;

use orderly::{Engine, Store};

/// An open store and what must outlive it.
pub struct Opened {
    pub store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
    database: Option<(String, String)>,
}

impl Opened {
    /// Stops the store (its queued writes finish) and removes its data.
    pub async fn close(self) {
        self.store.stop(crate::fixtures::soon()).await;
        drop(self.store);
        if let Some((maintenance, name)) = &self.database {
            sql(
                maintenance,
                &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            )
            .await;
        }
    }
}

pub async fn embedded() -> Opened {
    embedded_opened(None).await
}

/// sled whose backups run `before_walk` before they walk (a test holds one in flight).
pub async fn embedded_with_walk_gate(before_walk: Arc<dyn Fn() + Send + Sync>) -> Opened {
    embedded_opened(Some(before_walk)).await
}

async fn embedded_opened(before_walk: Option<Arc<dyn Fn() + Send + Sync>>) -> Opened {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::Embedded {
        path: dir.path().join("db"),
        cache_bytes: 16 << 20,
        flush_hook: None,
        before_walk,
    };
    let store = orderly::open_store(engine, Default::default(), 4096)
        .await
        .expect("sled opens");
    Opened {
        store,
        _dir: Some(dir),
        database: None,
    }
}

pub async fn shared() -> Opened {
    let maintenance = std::env::var("ORDERLY_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .expect("the PostgreSQL half of the port suite needs ORDERLY_TEST_DATABASE_URL");
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let name = format!(
        "orderly_port_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    // As production runs it, where CI says so (ORDERLY_TEST_ROLE: a role that is not a
    // superuser and owns only this database; tests/api/helpers.rs `server_role`).
    let role = std::env::var("ORDERLY_TEST_ROLE")
        .ok()
        .filter(|r| !r.trim().is_empty());
    let owner = role
        .as_ref()
        .map_or(String::new(), |r| format!(" OWNER {r}"));
    sql(&maintenance, &format!("CREATE DATABASE {name}{owner}")).await;
    let mut url = url::Url::parse(&maintenance).expect("a URL");
    url.set_path(&format!("/{name}"));
    if let Some(role) = &role {
        url.set_username(role).expect("a URL with a host");
    }
    let engine = Engine::Shared {
        url: url.to_string(),
        pool_size: 8,
        empty_only: false,
    };
    let store = orderly::open_store(engine, Default::default(), 4096)
        .await
        .expect("PostgreSQL opens");
    Opened {
        store,
        _dir: None,
        database: Some((maintenance, name)),
    }
}

async fn sql(url: &str, statement: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the maintenance database answers");
    let connection = tokio::spawn(connection);
    client.batch_execute(statement).await.expect(statement);
    drop(client);
    let _ = connection.await;
}
