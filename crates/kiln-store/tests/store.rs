//! Behaviour of the public `Store` API, on every backend: the embedded pair
//! (SQLite and a blob directory in a temporary directory) and Postgres + S3
//! on real servers the tests start (`support/servers.rs`).

mod support;

use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::{Stream, StreamExt as _, TryStreamExt as _, stream};
use kiln_core::{Nanoid, RelPath, SessionKey};
use kiln_store::{GcReport, NewObject, ObjectMeta, Store, StoreError};
use support::{DAY, Fixture, Kind};

const HOUR_MS: i64 = 60 * 60 * 1000;
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const HELLO_SHA256: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

fn key() -> SessionKey {
    SessionKey::from_stored("local:user:alice".to_owned())
}

async fn new_session(store: &Store) -> Nanoid {
    let sid = Nanoid::random();
    store.create_session(&sid, &key()).await.unwrap();
    sid
}

/// A session bound to `key` (an agent's) whose bytes count against `owner`.
async fn session_owned_by(store: &Store, key: &SessionKey, owner: &SessionKey) -> Nanoid {
    let sid = Nanoid::random();
    store.create_session_owned(&sid, key, owner).await.unwrap();
    sid
}

fn new_object(session: &Nanoid, name: &str) -> NewObject {
    NewObject {
        session_id: session.clone(),
        file_id: Nanoid::random(),
        name: RelPath::parse(name).unwrap(),
        content_type: "text/plain".to_owned(),
        read_only: false,
    }
}

fn body(chunks: &[&[u8]]) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + Unpin + use<> {
    let chunks: Vec<Result<Bytes, io::Error>> = chunks
        .iter()
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    stream::iter(chunks)
}

async fn read_all(store: &Store, meta: &ObjectMeta) -> Vec<u8> {
    let chunks: Vec<Bytes> = store.read(meta).await.unwrap().try_collect().await.unwrap();
    chunks.concat()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn put_read_list_object_and_delete_round_trip(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;

    let mut b = new_object(&sid, "b.txt");
    b.read_only = true;
    let b = store
        .put_stream(b, body(&[b"hel", b"lo"]), 1024)
        .await
        .unwrap();
    let a = store
        .put_stream(new_object(&sid, "a/data.csv"), body(&[b"x,y\n1,2\n"]), 1024)
        .await
        .unwrap();

    assert_eq!(b.size, 5);
    assert_eq!(b.sha256, HELLO_SHA256);
    assert_eq!(b.etag(), format!("\"{HELLO_SHA256}\""));
    assert_eq!(b.name, "b.txt");
    assert_eq!(b.content_type, "text/plain");
    assert!(b.read_only);
    assert_eq!(b.version.len(), 32);
    assert!((b.created_at_ms - now_ms()).abs() < 60_000);
    assert_eq!(read_all(&store, &b).await, b"hello");
    assert_eq!(read_all(&store, &a).await, b"x,y\n1,2\n");

    assert_eq!(
        store.object(&sid, &b.file_id).await.unwrap(),
        Some(b.clone())
    );
    assert_eq!(store.object(&sid, &Nanoid::random()).await.unwrap(), None);
    let names: Vec<String> = store
        .list(&sid)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(names, ["a/data.csv", "b.txt"]);

    assert!(store.delete(&sid, &b.file_id).await.unwrap());
    assert!(!store.delete(&sid, &b.file_id).await.unwrap());
    assert_eq!(store.object(&sid, &b.file_id).await.unwrap(), None);
    assert!(matches!(store.read(&b).await, Err(StoreError::NotFound)));
    assert_eq!(fx.blobs().await.len(), 1, "only a's blob remains");

    // deleting the last object keeps the session
    assert!(store.delete(&sid, &a.file_id).await.unwrap());
    let info = store.session(&sid).await.unwrap().unwrap();
    assert_eq!(info.id, sid);
    assert_eq!(info.key, key());
    assert!(store.list(&sid).await.unwrap().is_empty());
    assert!(fx.blobs().await.is_empty());
}

async fn zero_byte_objects_are_stored_read_and_copied(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;

    let meta = store
        .put_stream(new_object(&sid, "empty.txt"), body(&[]), 0)
        .await
        .unwrap();
    assert_eq!(meta.size, 0);
    assert_eq!(meta.sha256, EMPTY_SHA256);
    assert!(read_all(&store, &meta).await.is_empty());

    let dest = fx.dir.path().join("staged");
    store.copy_to(&meta, &dest).await.unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"");
}

async fn reads_stream_in_bounded_chunks(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;
    let data: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<&[u8]> = data.chunks(10_000).collect();

    let meta = store
        .put_stream(new_object(&sid, "big.bin"), body(&chunks), u64::MAX)
        .await
        .unwrap();
    assert_eq!(meta.size, data.len() as u64);

    let mut read = store.read(&meta).await.unwrap();
    let (mut got, mut pieces) = (Vec::new(), 0);
    while let Some(chunk) = read.next().await {
        let chunk = chunk.unwrap();
        assert!(chunk.len() <= 64 * 1024, "chunk of {} bytes", chunk.len());
        got.extend_from_slice(&chunk);
        pieces += 1;
    }
    assert!(pieces > 1);
    assert_eq!(got, data);
}

async fn too_large_bodies_leave_no_row_blob_or_staging_file(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;

    // one byte over: rejected
    let err = store
        .put_stream(new_object(&sid, "x.txt"), body(&[b"123456", b"12345"]), 10)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { limit: 10 }), "{err:?}");

    // far over, after multipart parts were already written: rejected too
    let big = vec![7u8; 3 * 1024 * 1024];
    let err = store
        .put_stream(
            new_object(&sid, "y.bin"),
            body(&[&big, &big]),
            5 * 1024 * 1024,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err:?}");

    assert!(store.list(&sid).await.unwrap().is_empty());
    assert_eq!(fx.blobs().await, Vec::<String>::new());

    // exactly at the limit: accepted
    let meta = store
        .put_stream(new_object(&sid, "z.txt"), body(&[b"12345", b"12345"]), 10)
        .await
        .unwrap();
    assert_eq!(meta.size, 10);
}

async fn a_failing_body_leaves_no_row_blob_or_staging_file(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;

    let big = Bytes::from(vec![1u8; 2 * 1024 * 1024]);
    let failing = stream::iter(vec![
        Ok(big),
        Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "client went away",
        )),
    ]);
    let err = store
        .put_stream(new_object(&sid, "x.bin"), failing, u64::MAX)
        .await
        .unwrap_err();
    match err {
        StoreError::BodyRead(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
        other => panic!("expected BodyRead, got {other:?}"),
    }
    assert!(store.list(&sid).await.unwrap().is_empty());
    assert_eq!(fx.blobs().await, Vec::<String>::new());
}

async fn puts_into_a_missing_session_are_refused_without_leftovers(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    // also when the caller names the owner (nothing reads the session first)
    for owned in [false, true] {
        let obj = new_object(&Nanoid::random(), "x.txt");
        let put = match owned {
            false => store.put_stream(obj, body(&[b"data"]), 100).await,
            true => {
                store
                    .put_stream_owned(obj, &key(), body(&[b"data"]), 100)
                    .await
            }
        };
        let err = put.unwrap_err();
        assert!(
            matches!(err, StoreError::NotFound),
            "owned {owned}: {err:?}"
        );
        assert!(fx.blobs().await.is_empty(), "owned {owned}");
    }
}

async fn duplicate_ids_conflict_and_keep_the_original_bytes(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;

    let err = store.create_session(&sid, &key()).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");

    let first = new_object(&sid, "a.txt");
    let mut second = new_object(&sid, "b.txt");
    second.file_id = first.file_id.clone();
    let original = store
        .put_stream(first, body(&[b"original"]), 100)
        .await
        .unwrap();
    let err = store
        .put_stream(second, body(&[b"intruder"]), 100)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");

    assert_eq!(
        store.object(&sid, &original.file_id).await.unwrap(),
        Some(original.clone())
    );
    assert_eq!(read_all(&store, &original).await, b"original");
    assert_eq!(fx.blobs().await.len(), 1);
}

async fn copy_to_materialises_the_object_owner_only(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;
    let meta = store
        .put_stream(new_object(&sid, "a.txt"), body(&[b"hello"]), 100)
        .await
        .unwrap();

    let dest = fx.dir.path().join("a.txt");
    store.copy_to(&meta, &dest).await.unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
    let meta_fs = std::fs::symlink_metadata(&dest).unwrap();
    assert!(meta_fs.is_file());
    assert_eq!(meta_fs.permissions().mode() & 0o777, 0o600);
}

async fn copy_to_refuses_an_existing_destination(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;
    let meta = store
        .put_stream(new_object(&sid, "a.txt"), body(&[b"new"]), 100)
        .await
        .unwrap();

    let dest = fx.dir.path().join("a.txt");
    std::fs::write(&dest, b"old").unwrap();
    let err = store.copy_to(&meta, &dest).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Io { ref source, .. } if source.kind() == io::ErrorKind::AlreadyExists),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"old");
}

async fn copy_to_never_follows_a_symlink_destination(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;
    let meta = store
        .put_stream(new_object(&sid, "a.txt"), body(&[b"evil"]), 100)
        .await
        .unwrap();

    // a dangling link: following it would create the target
    let target = fx.dir.path().join("target-outside");
    let dangling = fx.dir.path().join("dangling.txt");
    std::os::unix::fs::symlink(&target, &dangling).unwrap();
    assert!(store.copy_to(&meta, &dangling).await.is_err());
    assert!(!target.exists());

    // a link to an existing file: following it would overwrite the file
    let victim = fx.dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let link = fx.dir.path().join("link.txt");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    assert!(store.copy_to(&meta, &link).await.is_err());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

async fn gc_removes_expired_objects_and_sessions_and_keeps_fresh_ones(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let pause = || tokio::time::sleep(Duration::from_millis(5));

    let old = new_session(&store).await;
    let mixed = new_session(&store).await; // old session that later gets a fresh object
    let expired = store
        .put_stream(new_object(&old, "old.txt"), body(&[b"old"]), 100)
        .await
        .unwrap();
    let expired_in_mixed = store
        .put_stream(new_object(&mixed, "old2.txt"), body(&[b"old2"]), 100)
        .await
        .unwrap();
    pause().await;
    let fresh_session = new_session(&store).await;
    let fresh = store
        .put_stream(new_object(&fresh_session, "new.txt"), body(&[b"new"]), 100)
        .await
        .unwrap();
    let fresh_in_mixed = store
        .put_stream(new_object(&mixed, "new2.txt"), body(&[b"new2"]), 100)
        .await
        .unwrap();

    // a moment at which `expired*` are just past the retention and the rest is not
    let now = expired_in_mixed.created_at_ms + DAY.as_millis() as i64 + 1;
    assert!(now - (DAY.as_millis() as i64) <= fresh.created_at_ms);

    let report = store.gc_at(now).await.unwrap();
    assert_eq!(
        report,
        GcReport {
            sessions: 1,
            objects: 2,
            orphan_blobs: 0
        }
    );

    assert_eq!(store.object(&old, &expired.file_id).await.unwrap(), None);
    assert_eq!(
        store
            .object(&mixed, &expired_in_mixed.file_id)
            .await
            .unwrap(),
        None
    );
    assert!(store.session(&old).await.unwrap().is_none());
    assert!(
        store.session(&mixed).await.unwrap().is_some(),
        "holds a fresh object"
    );
    assert!(store.session(&fresh_session).await.unwrap().is_some());
    assert_eq!(read_all(&store, &fresh).await, b"new");
    assert_eq!(read_all(&store, &fresh_in_mixed).await, b"new2");
    assert_eq!(fx.blobs().await.len(), 2);

    // a second pass finds nothing more
    assert_eq!(store.gc_at(now).await.unwrap(), GcReport::default());

    // a day later everything goes
    let report = store
        .gc_at(fresh_in_mixed.created_at_ms + DAY.as_millis() as i64 + 1)
        .await
        .unwrap();
    assert_eq!(
        report,
        GcReport {
            sessions: 2,
            objects: 2,
            orphan_blobs: 0
        }
    );
    assert!(fx.blobs().await.is_empty());
}

#[tokio::test]
async fn gc_removes_old_orphan_blobs_and_staging_files_only() {
    let fx = Fixture::new(Kind::Embedded).unwrap();
    let store = fx.open().await;
    let sid = new_session(&store).await;
    let kept = store
        .put_stream(new_object(&sid, "a.txt"), body(&[b"keep"]), 100)
        .await
        .unwrap();

    let session_dir = fx.dir.path().join("blobs").join(sid.as_str());
    let orphan_dir = fx.dir.path().join("blobs").join(Nanoid::random().as_str());
    std::fs::create_dir(&orphan_dir).unwrap();
    let write = |path: PathBuf, age: Duration| {
        std::fs::write(&path, b"leftover").unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
        path
    };
    let two_hours = Duration::from_secs(2 * 60 * 60);
    let fresh_orphan = write(
        session_dir.join(format!("{}.abcd", Nanoid::random())),
        Duration::ZERO,
    );
    let old_orphan = write(
        session_dir.join(format!("{}.abcd", Nanoid::random())),
        two_hours,
    );
    let old_staging = write(
        session_dir.join(format!("{}.abcd#1", Nanoid::random())),
        two_hours,
    );
    let old_in_unknown_session = write(orphan_dir.join("whatever"), two_hours);
    // the kept object's blob is old on disk but still referenced
    let kept_blob = session_dir.join(format!("{}.{}", kept.file_id, kept.version));
    std::fs::File::options()
        .write(true)
        .open(&kept_blob)
        .unwrap()
        .set_modified(SystemTime::now() - two_hours)
        .unwrap();

    let report = store.gc().await.unwrap();
    assert_eq!(
        report,
        GcReport {
            sessions: 0,
            objects: 0,
            orphan_blobs: 3
        }
    );
    assert!(fresh_orphan.exists());
    assert!(!old_orphan.exists());
    assert!(!old_staging.exists());
    assert!(!old_in_unknown_session.exists());
    assert!(!orphan_dir.exists(), "emptied session directory is removed");
    assert_eq!(read_all(&store, &kept).await, b"keep");

    // an hour later the young orphan is old enough too
    let report = store.gc_at(now_ms() + 2 * HOUR_MS).await.unwrap();
    assert_eq!(report.orphan_blobs, 1);
    assert!(!fresh_orphan.exists());
    assert_eq!(read_all(&store, &kept).await, b"keep");
}

async fn data_survives_dropping_and_reopening_the_store(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let (sid, meta) = {
        let store = fx.open().await;
        let sid = new_session(&store).await;
        let meta = store
            .put_stream(new_object(&sid, "keep.txt"), body(&[b"durable"]), 100)
            .await
            .unwrap();
        (sid, meta)
    };
    let store = fx.open().await;
    assert_eq!(
        store.session(&sid).await.unwrap().map(|s| s.key),
        Some(key())
    );
    assert_eq!(
        store.object(&sid, &meta.file_id).await.unwrap(),
        Some(meta.clone())
    );
    assert_eq!(read_all(&store, &meta).await, b"durable");
    store.close().await;

    let store = fx.open().await;
    assert_eq!(store.list(&sid).await.unwrap(), [meta]);
}

async fn fifty_parallel_puts_and_reads_all_succeed(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;

    let puts: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            let sid = sid.clone();
            tokio::spawn(async move {
                let data = format!("object {i} ").repeat(1000 + i);
                let chunks: Vec<&[u8]> = data.as_bytes().chunks(4096).collect();
                let meta = store
                    .put_stream(
                        new_object(&sid, &format!("f{i:02}.txt")),
                        body(&chunks),
                        u64::MAX,
                    )
                    .await
                    .unwrap();
                (meta, data)
            })
        })
        .collect();
    let mut stored = Vec::new();
    for put in puts {
        stored.push(put.await.unwrap());
    }

    let reads: Vec<_> = stored
        .into_iter()
        .map(|(meta, data)| {
            let store = store.clone();
            tokio::spawn(async move {
                let got = read_all(&store, &meta).await;
                assert_eq!(got, data.as_bytes(), "{}", meta.name);
            })
        })
        .collect();
    for read in reads {
        read.await.unwrap();
    }

    let listed = store.list(&sid).await.unwrap();
    assert_eq!(listed.len(), 50);
    let names: Vec<_> = listed.iter().map(|m| m.name.clone()).collect();
    let expected: Vec<_> = (0..50).map(|i| format!("f{i:02}.txt")).collect();
    assert_eq!(names, expected);
}

/// A store of `kind` whose owners may keep 10 bytes each, with the fixture
/// that holds it (`None`: the backend is not available here).
async fn ten_byte_quota(kind: Kind) -> Option<(Fixture, Store)> {
    let fx = Fixture::new(kind)?;
    let store = fx
        .open_with(kiln_store::StorageBudget {
            owner_quota_bytes: Some(10),
            min_free_bytes: 0,
        })
        .await;
    Some((fx, store))
}

async fn an_owners_quota_counts_every_session_they_created_and_refuses_past_it(kind: Kind) {
    let Some((fx, store)) = ten_byte_quota(kind).await else {
        return;
    };
    let alice = key();
    let bob = SessionKey::from_stored("local:user:bob".to_owned());
    let agent = SessionKey::from_stored("local:agent:a1".to_owned());
    // alice's own session and an agent's session she uploaded to both count
    let own = new_session(&store).await;
    let shared = session_owned_by(&store, &agent, &alice).await;
    store
        .put_stream(new_object(&own, "a"), body(&[b"123456"]), 100)
        .await
        .unwrap();
    store
        .put_stream_owned(new_object(&shared, "b"), &alice, body(&[b"123"]), 100)
        .await
        .unwrap();
    assert_eq!(store.owner_bytes(&alice).await.unwrap(), 9);
    // one byte left: two are refused, nothing of them remains
    let e = store
        .put_stream(new_object(&own, "c"), body(&[b"12"]), 100)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::QuotaExceeded { quota: 10 }), "{e}");
    let e = store
        .put_stream_owned(new_object(&shared, "c"), &alice, body(&[b"12"]), 100)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::QuotaExceeded { quota: 10 }), "{e}");
    assert_eq!(store.list(&own).await.unwrap().len(), 1);
    // the caller's own smaller limit still reads as too large
    let e = store
        .put_stream(new_object(&own, "d"), body(&[b"12"]), 1)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::TooLarge { .. }), "{e}");
    // bob is not affected
    let bobs = Nanoid::random();
    store.create_session(&bobs, &bob).await.unwrap();
    store
        .put_stream(new_object(&bobs, "x"), body(&[b"0123456789"]), 100)
        .await
        .unwrap();
    // deleting frees alice's quota
    let listed = store.list(&own).await.unwrap();
    assert!(store.delete(&own, &listed[0].file_id).await.unwrap());
    store
        .put_stream(new_object(&own, "c"), body(&[b"12"]), 100)
        .await
        .unwrap();
    assert_eq!(fx.blobs().await.len(), 3, "a, deleted, took its blob along");
}

#[tokio::test]
async fn below_the_free_space_floor_a_put_is_refused_and_leaves_nothing() {
    let fx = Fixture::new(Kind::Embedded).unwrap();
    let free = fx.open().await.free_bytes().unwrap();
    assert!(free > 1 << 20, "{free}");
    let floor = |min_free_bytes| kiln_store::StorageBudget {
        owner_quota_bytes: None,
        min_free_bytes,
    };
    // a floor well under what is free (other writers on this disk cannot
    // close a gap this wide during the test): puts pass
    let roomy = fx.open_with(floor(free / 2)).await;
    let sid = new_session(&roomy).await;
    let mib = vec![0u8; 1 << 20];
    roomy
        .put_stream(new_object(&sid, "mib"), body(&[&mib]), 1 << 30)
        .await
        .unwrap();
    drop(roomy);
    // a floor over what is free: every byte is refused, nothing remains
    let full = fx.open_with(floor(free + (1 << 30))).await;
    let e = full
        .put_stream(new_object(&sid, "one"), body(&[b"x"]), 1 << 30)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::DiskFull { .. }), "{e}");
    // an empty file costs nothing and is kept
    full.put_stream(new_object(&sid, "empty"), body(&[]), 1 << 30)
        .await
        .unwrap();
    let names: Vec<String> = full
        .list(&sid)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(names, ["empty", "mib"]);
    assert_eq!(fx.blobs().await.len(), 2);
}

async fn stored_bytes_are_summed_per_owner_largest_first(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let alice1 = new_session(&store).await;
    let alice2 = new_session(&store).await;
    let bob = Nanoid::random();
    store
        .create_session(&bob, &SessionKey::from_stored("local:user:bob".to_owned()))
        .await
        .unwrap();
    for (sid, name, content) in [
        (&alice1, "a.txt", &b"12345"[..]),
        (&alice2, "b.txt", &b"123"[..]),
        (&bob, "c.txt", &b"1234567890"[..]),
    ] {
        store
            .put_stream(new_object(sid, name), body(&[content]), 1024)
            .await
            .unwrap();
    }
    let rows = store.stored_by_owner(10).await.unwrap();
    let got: Vec<(&str, u64, u64)> = rows
        .iter()
        .map(|r| (r.owner.as_str(), r.bytes, r.files))
        .collect();
    assert_eq!(got, [("local:user:bob", 10, 1), ("local:user:alice", 8, 2)]);
    assert_eq!(store.stored_by_owner(1).await.unwrap().len(), 1);
}

/// What the quota reads (`owner_bytes`, one row of totals the database keeps)
/// against what the owners' objects hold (`stored_by_owner`, a sum over them),
/// for every owner that ever stored something.
async fn assert_totals_match_the_objects(store: &Store, owners: &[&SessionKey]) {
    let summed = store.stored_by_owner(100).await.unwrap();
    for owner in owners {
        let held = summed
            .iter()
            .find(|r| r.owner == owner.as_str())
            .map_or(0, |r| r.bytes);
        assert_eq!(store.owner_bytes(owner).await.unwrap(), held, "{owner:?}");
    }
}

async fn an_owners_total_follows_puts_deletes_and_collection(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let alice = key();
    let bob = SessionKey::from_stored("local:user:bob".to_owned());
    let agent = SessionKey::from_stored("local:agent:a1".to_owned());
    let owners = [&alice, &bob, &agent];
    assert_totals_match_the_objects(&store, &owners).await;

    let first = new_session(&store).await;
    let second = new_session(&store).await;
    let shared = session_owned_by(&store, &agent, &alice).await;
    let bobs = Nanoid::random();
    store.create_session(&bobs, &bob).await.unwrap();
    let mut puts = Vec::new();
    for (sid, content) in [
        (&first, &b"12345"[..]),
        (&first, &b"123"[..]),
        (&second, &b"1234567"[..]),
        (&shared, &b"12"[..]),
        (&bobs, &b"1234567890"[..]),
        (&bobs, &b""[..]),
    ] {
        let meta = store
            .put_stream(new_object(sid, "f"), body(&[content]), 100)
            .await
            .unwrap();
        puts.push(meta);
    }
    assert_eq!(store.owner_bytes(&alice).await.unwrap(), 17);
    assert_eq!(store.owner_bytes(&bob).await.unwrap(), 10);
    assert_eq!(
        store.owner_bytes(&agent).await.unwrap(),
        0,
        "not an uploader"
    );
    assert_totals_match_the_objects(&store, &owners).await;

    // refused puts (past the caller's limit, into a missing session) count nothing
    let e = store
        .put_stream(new_object(&first, "big"), body(&[b"0123456789"]), 4)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::TooLarge { .. }), "{e}");
    let e = store
        .put_stream(new_object(&Nanoid::random(), "x"), body(&[b"1"]), 100)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::NotFound), "{e}");
    assert_eq!(store.owner_bytes(&alice).await.unwrap(), 17);

    // a delete takes its bytes off, a second delete of the same object nothing
    assert!(store.delete(&first, &puts[0].file_id).await.unwrap());
    assert!(!store.delete(&first, &puts[0].file_id).await.unwrap());
    assert_eq!(store.owner_bytes(&alice).await.unwrap(), 12);
    assert_totals_match_the_objects(&store, &owners).await;

    // a collection past the retention takes every owner's objects off at once
    let report = store
        .gc_at(now_ms() + DAY.as_millis() as i64 + HOUR_MS)
        .await
        .unwrap();
    assert_eq!(report.objects, 5, "{report:?}");
    for owner in owners {
        assert_eq!(store.owner_bytes(owner).await.unwrap(), 0, "{owner:?}");
    }
    assert_totals_match_the_objects(&store, &owners).await;

    // and a new put after it counts from zero
    let later = new_session(&store).await;
    store
        .put_stream(new_object(&later, "g"), body(&[b"1234"]), 100)
        .await
        .unwrap();
    assert_eq!(store.owner_bytes(&alice).await.unwrap(), 4);
}

/// An upload's first file and its session in one round-trip: the session
/// exists with the object in it, counted against the owner (not the key);
/// a session id that exists is refused and leaves the first one whole.
async fn a_session_created_with_its_first_object_holds_it_and_counts_it(kind: Kind) {
    let Some((fx, store)) = ten_byte_quota(kind).await else {
        return;
    };
    let alice = key();
    let agent = SessionKey::from_stored("local:agent:a1".to_owned());
    let sid = Nanoid::random();
    let meta = store
        .create_session_with(
            &agent,
            &alice,
            new_object(&sid, "a.txt"),
            body(&[b"hel", b"lo"]),
            100,
        )
        .await
        .unwrap();
    assert_eq!((meta.size, meta.sha256.as_str()), (5, HELLO_SHA256));
    let info = store
        .session(&sid)
        .await
        .unwrap()
        .expect("the session exists");
    assert_eq!(info.key, agent, "bound to the key");
    assert_eq!(store.list(&sid).await.unwrap(), vec![meta.clone()]);
    assert_eq!(read_all(&store, &meta).await, b"hello");
    assert_eq!(
        store.owner_bytes(&alice).await.unwrap(),
        5,
        "counted against the owner"
    );
    assert_eq!(store.owner_bytes(&agent).await.unwrap(), 0);
    // later files go into the session as puts
    store
        .put_stream_owned(new_object(&sid, "b.txt"), &alice, body(&[b"12"]), 100)
        .await
        .unwrap();
    let e = store
        .create_session_with(
            &agent,
            &alice,
            new_object(&sid, "c.txt"),
            body(&[b"1"]),
            100,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    assert_eq!(store.list(&sid).await.unwrap().len(), 2);
    assert_eq!(store.owner_bytes(&alice).await.unwrap(), 7);
    assert_eq!(fx.blobs().await.len(), 2, "the refused file's blob is gone");
}

/// Past the quota the session is still made (empty, as when it was made
/// before its first file) and nothing of the file remains; past the
/// caller's limit nothing is made, and the error says which budget cut it.
async fn a_session_created_with_an_object_over_the_quota_is_empty_and_keeps_no_blob(kind: Kind) {
    let Some((fx, store)) = ten_byte_quota(kind).await else {
        return;
    };
    let alice = key();
    let first = Nanoid::random();
    store
        .create_session_with(
            &alice,
            &alice,
            new_object(&first, "a"),
            body(&[b"123456"]),
            100,
        )
        .await
        .unwrap();
    // four bytes left: five are refused by the quota
    let over = Nanoid::random();
    let e = store
        .create_session_with(
            &alice,
            &alice,
            new_object(&over, "b"),
            body(&[b"12345"]),
            100,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::QuotaExceeded { quota: 10 }), "{e}");
    assert!(
        store.session(&over).await.unwrap().is_some(),
        "the session is made"
    );
    assert!(store.list(&over).await.unwrap().is_empty());
    // past the caller's limit of 3 with 4 left: too large, and no session
    let big = Nanoid::random();
    let e = store
        .create_session_with(&alice, &alice, new_object(&big, "c"), body(&[b"1234"]), 3)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::TooLarge { limit: 3 }), "{e}");
    assert!(store.session(&big).await.unwrap().is_none());
    // past a limit of 5 with 4 left: the quota is what refused it, and
    // the session is made as for any refusal by the quota
    let cut = Nanoid::random();
    let e = store
        .create_session_with(&alice, &alice, new_object(&cut, "c"), body(&[b"123456"]), 5)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::QuotaExceeded { quota: 10 }), "{e}");
    assert!(store.session(&cut).await.unwrap().is_some());
    assert!(store.list(&cut).await.unwrap().is_empty());
    // exactly what is left fits
    store
        .create_session_with(&alice, &alice, new_object(&big, "d"), body(&[b"1234"]), 100)
        .await
        .unwrap();
    assert_eq!(store.owner_bytes(&alice).await.unwrap(), 10);
    assert_eq!(fx.blobs().await.len(), 2, "no refused file left its blob");
}

/// `KiB` chunks of one byte value, `n` of them, as a body that counts what
/// the store pulled of it.
fn counted_body(
    n: usize,
    pulled: &Arc<AtomicUsize>,
) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + Unpin + use<> {
    let pulled = Arc::clone(pulled);
    stream::iter((0..n).map(move |_| {
        pulled.fetch_add(1024, Ordering::SeqCst);
        Ok(Bytes::from_static(&[7u8; 1024]))
    }))
}

/// An owner refused by the quota once has a later upload's bytes cut at
/// what they have left, not written whole to be refused after (the store
/// pulls one chunk of a 1 MiB body, not all of it), its session made as for
/// any refusal by the quota; and once they have room again, an upload that
/// fits is stored.
async fn an_upload_of_an_owner_over_the_quota_is_cut_at_what_is_left(kind: Kind) {
    let Some((fx, store)) = ten_byte_quota(kind).await else {
        return;
    };
    let alice = key();
    let first = Nanoid::random();
    let kept = store
        .create_session_with(
            &alice,
            &alice,
            new_object(&first, "a"),
            body(&[b"123456"]),
            1 << 20,
        )
        .await
        .unwrap();
    // refused after its bytes were written: the refusal is what tells
    let e = store
        .create_session_with(
            &alice,
            &alice,
            new_object(&Nanoid::random(), "b"),
            body(&[b"12345"]),
            1 << 20,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::QuotaExceeded { quota: 10 }), "{e}");
    // the next one is cut at the four bytes left
    let pulled = Arc::new(AtomicUsize::new(0));
    let cut = Nanoid::random();
    let e = store
        .create_session_with(
            &alice,
            &alice,
            new_object(&cut, "c"),
            counted_body(1024, &pulled),
            1 << 20,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::QuotaExceeded { quota: 10 }), "{e}");
    assert!(
        pulled.load(Ordering::SeqCst) <= 2 * 1024,
        "pulled {} bytes of a body refused by the quota",
        pulled.load(Ordering::SeqCst)
    );
    assert!(
        store.session(&cut).await.unwrap().is_some(),
        "the session is made"
    );
    assert!(store.list(&cut).await.unwrap().is_empty());
    // room again: what fits is stored
    assert!(store.delete(&first, &kept.file_id).await.unwrap());
    store
        .create_session_with(
            &alice,
            &alice,
            new_object(&Nanoid::random(), "d"),
            body(&[b"12345678"]),
            1 << 20,
        )
        .await
        .unwrap();
    assert_eq!(store.owner_bytes(&alice).await.unwrap(), 8);
    assert_eq!(fx.blobs().await.len(), 1, "no refused file left its blob");
}

/// Awaits eight racing puts of one owner with room for one: exactly one is
/// stored and seven are refused by the ten-byte quota.
async fn assert_one_stored_seven_refused(
    racing: impl Iterator<Item = tokio::task::JoinHandle<Result<ObjectMeta, StoreError>>>,
) {
    let results = futures::future::join_all(racing).await;
    let stored = results.iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Ok(Err(StoreError::QuotaExceeded { quota: 10 }))))
        .count();
    assert_eq!((stored, refused), (1, 7), "{results:?}");
}

/// Uploads of one owner racing are judged one after the other against the
/// total the others committed: of eight 5-byte uploads with 9 bytes left,
/// exactly one is stored. (The owner has stored before: on Postgres the
/// lock is the owner's total row, which the owner's first object makes.)
async fn uploads_of_one_owner_racing_never_pass_the_quota_together(kind: Kind) {
    let Some((_fx, store)) = ten_byte_quota(kind).await else {
        return;
    };
    let alice = key();
    store
        .create_session_with(
            &alice,
            &alice,
            new_object(&Nanoid::random(), "a"),
            body(&[b"1"]),
            100,
        )
        .await
        .unwrap();
    let racing = (0..8).map(|_| {
        let store = store.clone();
        let alice = alice.clone();
        tokio::spawn(async move {
            let sid = Nanoid::random();
            store
                .create_session_with(
                    &alice,
                    &alice,
                    new_object(&sid, "b"),
                    body(&[b"12345"]),
                    100,
                )
                .await
        })
    });
    assert_one_stored_seven_refused(racing).await;
    assert_eq!(store.owner_bytes(&alice).await.unwrap(), 6);
}

/// Puts of one owner racing into a session (a batch's later files, a run's
/// outputs) are judged like uploads' first files: of eight 5-byte puts
/// with 9 bytes left, exactly one is stored.
async fn puts_of_one_owner_racing_never_pass_the_quota_together(kind: Kind) {
    let Some((fx, store)) = ten_byte_quota(kind).await else {
        return;
    };
    let sid = new_session(&store).await;
    store
        .put_stream(new_object(&sid, "a"), body(&[b"1"]), 100)
        .await
        .unwrap();
    let racing = (0..8).map(|i| {
        let store = store.clone();
        let sid = sid.clone();
        tokio::spawn(async move {
            store
                .put_stream(new_object(&sid, &format!("b{i}")), body(&[b"12345"]), 100)
                .await
        })
    });
    assert_one_stored_seven_refused(racing).await;
    assert_eq!(store.owner_bytes(&key()).await.unwrap(), 6);
    assert_eq!(store.list(&sid).await.unwrap().len(), 2);
    assert_eq!(fx.blobs().await.len(), 2, "no refused put left its blob");
}

on_every_backend!(
    puts_of_one_owner_racing_never_pass_the_quota_together,
    a_session_created_with_its_first_object_holds_it_and_counts_it,
    a_session_created_with_an_object_over_the_quota_is_empty_and_keeps_no_blob,
    uploads_of_one_owner_racing_never_pass_the_quota_together,
    an_upload_of_an_owner_over_the_quota_is_cut_at_what_is_left,
    a_body_larger_than_one_part_is_stored_whole,
    an_owners_total_follows_puts_deletes_and_collection,
    put_read_list_object_and_delete_round_trip,
    zero_byte_objects_are_stored_read_and_copied,
    reads_stream_in_bounded_chunks,
    too_large_bodies_leave_no_row_blob_or_staging_file,
    a_failing_body_leaves_no_row_blob_or_staging_file,
    puts_into_a_missing_session_are_refused_without_leftovers,
    duplicate_ids_conflict_and_keep_the_original_bytes,
    copy_to_materialises_the_object_owner_only,
    copy_to_refuses_an_existing_destination,
    copy_to_never_follows_a_symlink_destination,
    gc_removes_expired_objects_and_sessions_and_keeps_fresh_ones,
    data_survives_dropping_and_reopening_the_store,
    fifty_parallel_puts_and_reads_all_succeed,
    an_owners_quota_counts_every_session_they_created_and_refuses_past_it,
    stored_bytes_are_summed_per_owner_largest_first,
);

async fn a_body_larger_than_one_part_is_stored_whole(kind: Kind) {
    let Some(fx) = Fixture::new(kind) else {
        return;
    };
    let store = fx.open().await;
    let sid = new_session(&store).await;
    // past the S3 part size (8 MiB) twice over: a multipart upload of 3 parts
    let data: Vec<u8> = (0..20 * 1024 * 1024 + 5).map(|i| (i % 253) as u8).collect();
    let chunks: Vec<&[u8]> = data.chunks(256 * 1024).collect();
    let meta = store
        .put_stream(new_object(&sid, "big.bin"), body(&chunks), u64::MAX)
        .await
        .unwrap();
    assert_eq!(meta.size, data.len() as u64);
    assert_eq!(read_all(&store, &meta).await, data);
    let dest = fx.dir.path().join("staged.bin");
    store.copy_to(&meta, &dest).await.unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), data);
    assert_eq!(fx.blobs().await.len(), 1);
}
