//! The store over a fault-injecting object store (`support/faults.rs`):
//! uploads and run outputs either commit whole or are reported as failed,
//! and nothing half-written is ever served.

mod support;

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _, stream};
use kiln_core::{Nanoid, RelPath, SessionKey};
use kiln_store::{Backends, BlobBackend, MetaBackend, NewObject, Store, StoreConfig, StoreError};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use support::DAY;
use support::faults::{Faults, FaultyStore};

const MIB: usize = 1024 * 1024;

struct Faulty {
    _dir: tempfile::TempDir,
    store: Store,
    faults: FaultyStore,
    inner: Arc<InMemory>,
    sid: Nanoid,
}

async fn faulty() -> Faulty {
    let dir = tempfile::tempdir().unwrap();
    let inner = Arc::new(InMemory::new());
    let faults = FaultyStore::new(inner.clone());
    let store = Store::open_with(
        StoreConfig {
            dir: dir.path().to_path_buf(),
            retention: DAY,
            budget: Default::default(),
        },
        Backends {
            meta: MetaBackend::Sqlite,
            blobs: BlobBackend::Custom(Arc::new(faults.clone())),
        },
    )
    .await
    .unwrap();
    let sid = Nanoid::random();
    store
        .create_session(&sid, &SessionKey::from_stored("local:user:a".to_owned()))
        .await
        .unwrap();
    Faulty {
        _dir: dir,
        store,
        faults,
        inner,
        sid,
    }
}

fn new_object(sid: &Nanoid, name: &str) -> NewObject {
    NewObject {
        session_id: sid.clone(),
        file_id: Nanoid::random(),
        name: RelPath::parse(name).unwrap(),
        content_type: "application/octet-stream".to_owned(),
        read_only: false,
    }
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn body(
    data: &[u8],
) -> impl futures::Stream<Item = Result<Bytes, io::Error>> + Send + Unpin + use<> {
    let chunks: Vec<Result<Bytes, io::Error>> = data
        .chunks(256 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    stream::iter(chunks)
}

async fn objects_in(inner: &InMemory) -> usize {
    inner
        .list(None)
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .len()
}

#[tokio::test]
async fn a_write_failing_half_way_is_reported_and_leaves_nothing_to_serve() {
    let f = faulty().await;
    // a multipart upload (20 MiB, parts of 8) whose second part fails, and a
    // single put (1 MiB) that fails: both reported, neither visible
    f.faults.set(Faults {
        fail_writes_after: Some(10 * MIB as u64),
        ..Faults::default()
    });
    let big = new_object(&f.sid, "big.bin");
    let big_id = big.file_id.clone();
    let err = f
        .store
        .put_stream(big, body(&data(20 * MIB)), u64::MAX)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Blob(_)), "{err:?}");
    f.faults.set(Faults {
        fail_writes_after: Some(1000),
        ..Faults::default()
    });
    let err = f
        .store
        .put_stream(new_object(&f.sid, "small.bin"), body(&data(MIB)), u64::MAX)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Blob(_)), "{err:?}");
    assert_eq!(f.store.object(&f.sid, &big_id).await.unwrap(), None);
    assert!(f.store.list(&f.sid).await.unwrap().is_empty());
    assert_eq!(
        objects_in(&f.inner).await,
        0,
        "a partial object became visible"
    );

    // once the store recovers, the same upload commits whole
    f.faults.set(Faults::default());
    let meta = f
        .store
        .put_stream(
            new_object(&f.sid, "big.bin"),
            body(&data(20 * MIB)),
            u64::MAX,
        )
        .await
        .unwrap();
    let got: Vec<Bytes> = f
        .store
        .read(&meta)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(got.concat(), data(20 * MIB));
}

#[tokio::test]
async fn a_read_whose_connection_is_lost_ends_in_an_error_never_short() {
    let f = faulty().await;
    let meta = f
        .store
        .put_stream(new_object(&f.sid, "a.bin"), body(&data(3 * MIB)), u64::MAX)
        .await
        .unwrap();
    f.faults.set(Faults {
        cut_reads_after: Some(MIB as u64),
        ..Faults::default()
    });
    // a download: bytes up to the cut, then an error (the HTTP response is
    // aborted, so the client never takes a short body for the file)
    let mut read = f.store.read(&meta).await.unwrap();
    let mut got = 0;
    let err = loop {
        match read.next().await {
            Some(Ok(chunk)) => got += chunk.len(),
            Some(Err(e)) => break e,
            None => panic!("the stream ended after {got} bytes without an error"),
        }
    };
    assert!(matches!(err, StoreError::Blob(_)), "{err:?}");
    assert!(got <= MIB);
    // staging into a workspace: an error, and no partial file left behind
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("a.bin");
    let err = f.store.copy_to(&meta, &dest).await.unwrap_err();
    assert!(matches!(err, StoreError::Blob(_)), "{err:?}");
    assert!(!dest.exists(), "a partial copy was left in the workspace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_read_streams_and_holds_up_nothing_else() {
    let f = faulty().await;
    let meta = f
        .store
        .put_stream(new_object(&f.sid, "slow.bin"), body(&data(MIB)), u64::MAX)
        .await
        .unwrap();
    // 16 chunks of 64 KiB, 50 ms each: 800 ms for the whole
    f.faults.set(Faults {
        read_delay: Some(Duration::from_millis(50)),
        ..Faults::default()
    });
    let started = Instant::now();
    let mut read = f.store.read(&meta).await.unwrap();
    let first = read.next().await.unwrap().unwrap();
    let to_first = started.elapsed();
    assert!(!first.is_empty());
    assert!(
        to_first < Duration::from_millis(500),
        "first chunk after {to_first:?}"
    );
    let reader = tokio::spawn(async move {
        let mut n = first.len();
        while let Some(chunk) = read.next().await {
            n += chunk.unwrap().len();
        }
        n
    });
    // meanwhile other requests are served at once
    f.faults.set(Faults::default());
    let t = Instant::now();
    let other = f
        .store
        .put_stream(new_object(&f.sid, "other.txt"), body(b"other"), 100)
        .await
        .unwrap();
    assert_eq!(f.store.list(&f.sid).await.unwrap().len(), 2);
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(reader.await.unwrap(), MIB);
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert_eq!(other.size, 5);
}
