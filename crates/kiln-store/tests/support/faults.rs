//! A fault-injecting object store for tests, wrapping a real one (modelled
//! on neon's `remote_storage` simulated failures): writes that fail
//! half-way, slow reads, reads whose connection is lost part-way. Faults
//! can be switched while the store is in use.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::{self, BoxStream};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};

/// Which faults are on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Every write fails once it has sent this many bytes: a single `PUT`
    /// longer than this fails whole, a multipart upload fails at the part
    /// that crosses it (the parts before it were accepted).
    pub fail_writes_after: Option<u64>,
    /// Every read is cut (the connection "resets") after this many bytes.
    pub cut_reads_after: Option<u64>,
    /// Every chunk of a read is delayed this long.
    pub read_delay: Option<Duration>,
}

/// Chunks a read is split into (a network store sends many).
const CHUNK: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Arc<Mutex<Faults>>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> FaultyStore {
        FaultyStore {
            inner,
            faults: Arc::default(),
        }
    }

    pub fn set(&self, faults: Faults) {
        *self.faults.lock().unwrap() = faults;
    }

    fn now(&self) -> Faults {
        *self.faults.lock().unwrap()
    }
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: what.into(),
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        if let Some(limit) = self.now().fail_writes_after
            && payload.content_length() as u64 > limit
        {
            return Err(injected("connection reset while sending the object"));
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultyUpload {
            inner,
            sent: 0,
            fail_after: self.now().fail_writes_after,
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let got = self.inner.get_opts(location, options).await?;
        let faults = self.now();
        let meta = got.meta.clone();
        let range = got.range.clone();
        let attributes = got.attributes.clone();
        let bytes = got.bytes().await?;
        let chunks: Vec<Bytes> = (0..bytes.len())
            .step_by(CHUNK)
            .map(|at| bytes.slice(at..(at + CHUNK).min(bytes.len())))
            .collect();
        let mut sent = 0u64;
        let body = stream::iter(chunks)
            .then(move |chunk| async move {
                if let Some(delay) = faults.read_delay {
                    tokio::time::sleep(delay).await;
                }
                chunk
            })
            .map(move |chunk| {
                sent += chunk.len() as u64;
                match faults.cut_reads_after {
                    Some(limit) if sent > limit => Err(injected("connection lost mid-read")),
                    _ => Ok(chunk),
                }
            })
            .boxed();
        Ok(GetResult {
            payload: GetResultPayload::Stream(body),
            meta,
            range,
            attributes,
            extensions: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    sent: u64,
    fail_after: Option<u64>,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.sent += data.content_length() as u64;
        match self.fail_after {
            Some(limit) if self.sent > limit => {
                Box::pin(async { Err(injected("connection reset while sending a part")) })
            }
            _ => self.inner.put_part(data),
        }
    }

    async fn complete(&mut self) -> Result<PutResult> {
        self.inner.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}
