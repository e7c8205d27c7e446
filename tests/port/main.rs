//! The storage port's conformance suite: every rule a `Store` must keep, written once and
//! run against each engine through `orderly::open_store`, as object_store and sqlx test
//! their backends. A third engine passes this suite before the HTTP suite means anything.
//!
//! Each case is `async fn(&dyn Store)`. `conformance!` makes two tests of it: `on_sled`,
//! and `on_postgres`, ignored on a plain `cargo test` (it needs a server: set
//! `ORDERLY_TEST_DATABASE_URL` and pass `--include-ignored`, as CI does).

mod authentication;
mod engines;
mod fixtures;
mod held_backup;
mod lifecycle;
mod orders;
mod outbox;
mod snapshot;
mod visibility;
mod webhook_ops;

/// Two tests of one case: one per engine.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_sled() {
                let opened = crate::engines::embedded().await;
                super::$case(&*opened.store).await;
                opened.close().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
            async fn on_postgres() {
                let opened = crate::engines::shared().await;
                super::$case(&*opened.store).await;
                opened.close().await;
            }
        }
    )*};
}
pub(crate) use conformance;
