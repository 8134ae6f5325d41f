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
