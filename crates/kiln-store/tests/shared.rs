//! What several nodes sharing one Postgres database and one S3 bucket rely
//! on: garbage collection through the backends (listing the bucket, never a
//! directory), idempotent and safe when every node runs it at once;
//! migrations run by nodes starting together; a database that drops its
//! connections.

mod support;

use std::io;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _, stream};
use kiln_core::{Nanoid, RelPath, SessionKey};
use kiln_store::{GcReport, NewObject, Store};
use object_store::ObjectStoreExt as _;
use object_store::path::Path as BlobPath;
use support::{DAY, Fixture, Kind};

const HOUR_MS: i64 = 60 * 60 * 1000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn new_session(store: &Store) -> Nanoid {
    let sid = Nanoid::random();
    store
        .create_session(
            &sid,
            &SessionKey::from_stored("local:user:alice".to_owned()),
        )
        .await
        .unwrap();
    sid
}

async fn put(
    store: &Store,
    sid: &Nanoid,
    name: &str,
    data: &'static [u8],
) -> kiln_store::ObjectMeta {
    let obj = NewObject {
        session_id: sid.clone(),
        file_id: Nanoid::random(),
        name: RelPath::parse(name).unwrap(),
        content_type: "text/plain".to_owned(),
        read_only: false,
    };
    let body = stream::iter([Ok::<_, io::Error>(Bytes::from_static(data))]);
    store.put_stream(obj, body, 1 << 20).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gc_on_s3_removes_old_orphans_found_by_listing_and_leaves_foreign_keys() {
    let Some(fx) = Fixture::new(Kind::PostgresS3) else {
        return;
    };
    let bucket = fx.bucket.clone().unwrap();
    let store = fx.open().await;
    let sid = new_session(&store).await;
    let kept = put(&store, &sid, "a.txt", b"keep").await;

    // a crash between blob and row: a blob no row names
    let orphan = BlobPath::from(format!("{sid}/{}.{}", Nanoid::random(), "0".repeat(32)));
    bucket.put(&orphan, "lost".into()).await.unwrap();
    // someone else's objects in the bucket: never Kiln's to remove
    let foreign = [
        BlobPath::from("backups/db.dump"),
        BlobPath::from(format!("{sid}/notes.txt")),
    ];
    for f in &foreign {
        bucket.put(f, "theirs".into()).await.unwrap();
    }

    // young: left alone
    assert_eq!(store.gc().await.unwrap(), GcReport::default());
    assert!(bucket.head(&orphan).await.is_ok());

    // two hours later (the retention is a day): only the orphan goes
    let report = store.gc_at(now_ms() + 2 * HOUR_MS).await.unwrap();
    assert_eq!(
        report,
        GcReport {
            sessions: 0,
            objects: 0,
            orphan_blobs: 1
        }
    );
    assert!(bucket.head(&orphan).await.is_err());
    for f in &foreign {
        assert!(bucket.head(f).await.is_ok(), "{f} was removed");
    }
    let bytes: Vec<Bytes> = store
        .read(&kept)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(bytes.concat(), b"keep");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_migrating_and_collecting_at_once_remove_each_expired_object_once() {
    let Some(fx) = Fixture::new(Kind::PostgresS3) else {
        return;
    };
    // three nodes start together on a fresh database: one migrates, the
    // others wait for it
    let (a, b, c) = tokio::join!(fx.open(), fx.open(), fx.open());
    let mut expired = Vec::new();
    for i in 0..40 {
        let sid = new_session(&a).await;
        expired.push(put(&a, &sid, &format!("f{i}.txt"), b"bytes").await);
    }
    let later = now_ms() + DAY.as_millis() as i64 + HOUR_MS;
    let (ra, rb, rc) = tokio::join!(a.gc_at(later), b.gc_at(later), c.gc_at(later));
    let reports = [ra.unwrap(), rb.unwrap(), rc.unwrap()];
    let objects: u64 = reports.iter().map(|r| r.objects).sum();
    let sessions: u64 = reports.iter().map(|r| r.sessions).sum();
    assert_eq!(objects, 40, "{reports:?}");
    assert_eq!(sessions, 40, "{reports:?}");
    assert!(fx.blobs().await.is_empty());
    for m in &expired {
        assert_eq!(b.object(&m.session_id, &m.file_id).await.unwrap(), None);
    }
    // idempotent: nothing is left to collect, on any node
    assert_eq!(c.gc_at(later).await.unwrap(), GcReport::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_reconnects_after_postgres_drops_its_connections() {
    let Some(fx) = Fixture::new(Kind::PostgresS3) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;
    let first = put(&store, &sid, "a.txt", b"one").await;
    // the server ends every session of this database (a failover, a restart)
    let url = fx.database_url.as_deref().unwrap();
    let db = url.rsplit('/').next().unwrap();
    let pg = support::servers::postgres().unwrap();
    let ended = pg.psql(
        "postgres",
        &format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = '{db}' AND pid <> pg_backend_pid()"
        ),
    );
    assert_ne!(ended.trim(), "0", "no connection was ended");
    tokio::time::sleep(Duration::from_millis(100)).await;
    // every operation either succeeds or fails cleanly; the pool replaces
    // dead connections, so within a few tries they succeed again
    let mut listed = None;
    for _ in 0..20 {
        match store.list(&sid).await {
            Ok(l) => {
                listed = Some(l);
                break;
            }
            Err(e) => eprintln!("after the drop: {e}"),
        }
    }
    assert_eq!(
        listed.expect("the store reconnects"),
        std::slice::from_ref(&first)
    );
    let second = put(&store, &sid, "b.txt", b"two").await;
    let names: Vec<String> = store
        .list(&sid)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(names, ["a.txt", "b.txt"]);
    let bytes: Vec<Bytes> = store
        .read(&second)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(bytes.concat(), b"two");
    let _ = store.read(&first).await.unwrap().next().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn owners_are_seen_by_every_node_with_their_node_heartbeat_and_go_with_it() {
    let Some(fx) = Fixture::new(Kind::PostgresS3) else {
        return;
    };
    let (a, b) = tokio::join!(fx.open(), fx.open());
    let now = now_ms();
    a.node_heartbeat("node-a", "http://10.0.0.1:8000", false, now)
        .await
        .unwrap();
    a.claim("session", "K1", "node-a", now).await.unwrap();
    // another node reads the owner and where to reach it
    let owner = b.owner("session", "K1").await.unwrap().unwrap();
    assert_eq!(owner.node_id, "node-a");
    assert_eq!(owner.url.as_deref(), Some("http://10.0.0.1:8000"));
    assert_eq!(owner.heartbeat_at_ms, Some(now));
    assert!(!owner.draining);
    // the heartbeat moves on and says draining
    a.node_heartbeat("node-a", "http://10.0.0.1:8000", true, now + 3000)
        .await
        .unwrap();
    let owner = b.owner("session", "K1").await.unwrap().unwrap();
    assert_eq!(
        (owner.heartbeat_at_ms, owner.draining),
        (Some(now + 3000), true)
    );
    assert_eq!(b.owner("run", "K1").await.unwrap(), None, "kinds are apart");
    // a closed session is forgotten
    a.claim("session", "K2", "node-a", now).await.unwrap();
    a.release("session", "K2").await.unwrap();
    assert_eq!(b.owner("session", "K2").await.unwrap(), None);
    // a node that leaves takes its owner rows with it
    a.node_leave("node-a").await.unwrap();
    assert_eq!(b.owner("session", "K1").await.unwrap(), None);
    // a node silent for longer than the cutoff is pruned, and what it owned
    b.node_heartbeat("node-b", "http://10.0.0.2:8000", false, now - 2 * HOUR_MS)
        .await
        .unwrap();
    b.claim("run", "R1", "node-b", now).await.unwrap();
    let dead = b.owner("run", "R1").await.unwrap().unwrap();
    assert_eq!(dead.heartbeat_at_ms, Some(now - 2 * HOUR_MS));
    assert_eq!(
        a.prune_nodes(now - HOUR_MS, now - 24 * HOUR_MS)
            .await
            .unwrap(),
        1
    );
    assert_eq!(a.owner("run", "R1").await.unwrap(), None);
    assert!(a.nodes().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_budget_in_postgres_is_shared_by_nodes_counting_at_once() {
    let Some(fx) = Fixture::new(Kind::PostgresS3) else {
        return;
    };
    let (a, b) = tokio::join!(fx.open(), fx.open());
    let now_us = now_ms() * 1000;
    let (interval, window) = (1_000_000, 10_000_000); // 10 per 10 s
    // 30 requests at the same instant from two nodes at once: exactly the
    // burst of 10 is allowed between them
    let steps = futures::future::join_all((0..30).map(|i| {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move {
            s.rate_step("exec:alice", now_us, interval, window)
                .await
                .unwrap()
        }
    }))
    .await;
    let allowed = steps.iter().filter(|s| s.allowed).count();
    assert_eq!(allowed, 10, "{steps:?}");
    // a refusal says how far ahead the key stands: a full window
    let refused = steps.iter().find(|s| !s.allowed).unwrap();
    assert_eq!(refused.tat_us, now_us + window);
    // one interval later, one more request goes through, on either node
    let later = now_us + interval;
    assert!(
        b.rate_step("exec:alice", later, interval, window)
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !a.rate_step("exec:alice", later, interval, window)
            .await
            .unwrap()
            .allowed
    );
    // another key has its own budget; stale keys are pruned
    assert!(
        a.rate_step("exec:bob", now_us, interval, window)
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(a.prune_rates(now_us + 2 * window).await.unwrap(), 2);
}
