//! PostgreSQL through PgBouncer, through the real binary:
//!
//! - in session pooling mode, two gateways on one database through the pooler are one
//!   gateway as with direct connections: concurrent duplicates run once, a repeat
//!   replays, and a duplicate at one joins an original running at the other (LISTEN and
//!   NOTIFY through the pooler);
//! - in transaction pooling mode (no session: `LISTEN` and named prepared statements do
//!   not survive a transaction), `migrate` and `serve` refuse in one line that says to use
//!   session mode, before they write anything.
//!
//! PgBouncer runs before the shared test server, one database per test (a pooler does
//! not pass the URL's `options`, which the per-test schemas use).

use std::time::Duration;

use oncely_store_conformance::testing::{fresh_pg_database, PgBouncer, PoolMode};

use crate::cluster::shared_url;
use crate::common::post as http_post;
use crate::pg_failover::{
    a_duplicate_joins_across, agreed_bodies, answers, assert_migrate_refuses, assert_serve_refuses,
    callers, migrate, serve, Renders, AUTH,
};

/// A PgBouncer in `mode` before the shared server, and a new database's name.
async fn bouncer(mode: PoolMode) -> (PgBouncer, String) {
    let base = shared_url();
    let database = fresh_pg_database(&base).await;
    let bouncer = tokio::task::spawn_blocking(move || PgBouncer::start(&base, mode))
        .await
        .expect("pgbouncer starts");
    (bouncer, database)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_in_session_mode_two_gateways_are_one() {
    let (bouncer, database) = bouncer(PoolMode::Session).await;
    let url = bouncer.url(&database);
    migrate(&url);
    let up = Renders::start(Duration::from_millis(1500)).await;
    let a = serve(&up.url, &url);
    let b = serve(&up.url, &url);
    let urls = [a.url("/v1/render"), b.url("/v1/render")];

    let calls = answers(callers(&urls, "take", 4, 16)).await;
    let bodies = agreed_bodies(&calls);
    for c in &calls {
        assert_eq!(c.answer.status, 200, "{}", c.answer.text());
    }
    for i in 0..4 {
        let intention = format!("take {i}");
        assert_eq!(up.runs(&intention), 1, "{intention} ran once");
        let fresh = calls
            .iter()
            .filter(|c| c.intention == intention)
            .filter(|c| c.answer.header("oncely-status") == "fresh")
            .count();
        assert_eq!(fresh, 1, "{intention}: one fresh answer");
        for url in &urls {
            let replay = http_post(url, &intention, &AUTH).await;
            assert_eq!(replay.header("oncely-status"), "replayed");
            assert_eq!(replay.header("idempotent-replayed"), "true");
            assert_eq!(replay.body, bodies[&intention]);
        }
    }
    a_duplicate_joins_across(&a, &b, &up, "joined through the pooler").await;
    a_duplicate_joins_across(&b, &a, &up, "joined back through the pooler").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_in_transaction_mode_migrate_and_serve_refuse_in_one_line() {
    let (bouncer, database) = bouncer(PoolMode::Transaction).await;
    let store = bouncer.url(&database);
    tokio::task::spawn_blocking(move || {
        assert_migrate_refuses(&store, "pool_mode = session");
        assert_serve_refuses(&store, "pool_mode = session");
    })
    .await
    .unwrap();
    // Refused before migrating: the database has no ledger tables.
    let base: tokio_postgres::Config = shared_url().parse().unwrap();
    let mut direct = base.clone();
    direct.dbname(&database);
    let (client, connection) = direct.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let tables = client
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(tables.get::<_, i64>(0), 0, "nothing was created");
}
