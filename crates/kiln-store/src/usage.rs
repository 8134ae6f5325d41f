//! What each owner keeps in the store, for the operator's console.

use crate::meta::with_pool;
use crate::{Store, StoreError};

/// Bytes and files stored by one owner (the user key of whoever created
/// the sessions, `<tenant>:user:<id>`): what counts against their quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBytes {
    pub owner: String,
    pub bytes: u64,
    pub files: u64,
}

impl Store {
    /// Stored bytes and files per owner — the same sums the storage quota
    /// checks ([`crate::StorageBudget`]) — largest first, at most
    /// `limit` owners. One aggregate query over the metadata (no blob is
    /// read), bounded by the retention period.
    pub async fn stored_by_owner(&self, limit: u32) -> Result<Vec<StoredBytes>, StoreError> {
        let rows: Vec<(String, i64, i64)> =
            with_pool!(self.inner.meta.pool(), |p| sqlx::query_as(
                "SELECT s.owner, CAST(COALESCE(SUM(o.size), 0) AS BIGINT), COUNT(o.file_id) \
             FROM objects o JOIN sessions s ON s.id = o.session_id \
             GROUP BY s.owner ORDER BY 2 DESC, 1 LIMIT $1",
            )
            .bind(i64::from(limit))
            .fetch_all(p)
            .await)?;
        Ok(rows
            .into_iter()
            .map(|(owner, bytes, files)| StoredBytes {
                owner,
                bytes: u64::try_from(bytes).unwrap_or(0),
                files: u64::try_from(files).unwrap_or(0),
            })
            .collect())
    }
}
