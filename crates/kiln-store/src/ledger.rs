//! The egress gateway's ledger (`egress_calls`): every call a jail made
//! through the services gateway, written by `kiln-egress` through its
//! `Ledger` trait (the binary wires it to [`Store::record_egress_call`]).

use kiln_core::egress::CallRecord;

use crate::meta::with_pool;
use crate::{Store, StoreError};

/// One row as stored.
#[derive(sqlx::FromRow)]
struct Row {
    grant_id: String,
    owner: String,
    tenant: String,
    user_id: String,
    service: String,
    method: String,
    path: String,
    status: i64,
    outcome: String,
    bytes_up: i64,
    bytes_down: i64,
    started_at: i64,
    duration_ms: i64,
}

impl Row {
    fn into_record(self) -> CallRecord {
        CallRecord {
            grant_id: self.grant_id,
            owner: self.owner,
            tenant: self.tenant,
            user_id: self.user_id,
            service: self.service,
            method: self.method,
            path: self.path,
            status: u16::try_from(self.status).unwrap_or(0),
            outcome: self.outcome,
            bytes_up: to_u64(self.bytes_up),
            bytes_down: to_u64(self.bytes_down),
            started_at_ms: self.started_at,
            duration_ms: to_u64(self.duration_ms),
        }
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Store {
    /// Records one egress call.
    pub async fn record_egress_call(&self, c: &CallRecord) -> Result<(), StoreError> {
        with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "INSERT INTO egress_calls (grant_id, owner, tenant, user_id, service, method, path, \
             status, outcome, bytes_up, bytes_down, started_at, duration_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(&c.grant_id)
        .bind(&c.owner)
        .bind(&c.tenant)
        .bind(&c.user_id)
        .bind(&c.service)
        .bind(&c.method)
        .bind(&c.path)
        .bind(i64::from(c.status))
        .bind(&c.outcome)
        .bind(to_i64(c.bytes_up))
        .bind(to_i64(c.bytes_down))
        .bind(c.started_at_ms)
        .bind(to_i64(c.duration_ms))
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// The calls made under grants of `owner` (`run:<id>`), oldest first.
    pub async fn egress_calls(&self, owner: &str) -> Result<Vec<CallRecord>, StoreError> {
        let rows: Vec<Row> = with_pool!(self.inner.meta.pool(), |p| sqlx::query_as(
            "SELECT grant_id, owner, tenant, user_id, service, method, path, status, outcome, \
             bytes_up, bytes_down, started_at, duration_ms FROM egress_calls \
             WHERE owner = $1 ORDER BY id",
        )
        .bind(owner)
        .fetch_all(p)
        .await)?;
        Ok(rows.into_iter().map(Row::into_record).collect())
    }

    /// The `limit` most recent calls of every owner, newest first (the
    /// operator's view).
    pub async fn recent_egress_calls(&self, limit: u32) -> Result<Vec<CallRecord>, StoreError> {
        let rows: Vec<Row> = with_pool!(self.inner.meta.pool(), |p| sqlx::query_as(
            "SELECT grant_id, owner, tenant, user_id, service, method, path, status, outcome, \
             bytes_up, bytes_down, started_at, duration_ms FROM egress_calls \
             ORDER BY started_at DESC, id DESC LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(p)
        .await)?;
        Ok(rows.into_iter().map(Row::into_record).collect())
    }

    /// Removes calls that started before `cutoff_ms`; returns how many.
    pub async fn prune_egress_calls(&self, cutoff_ms: i64) -> Result<u64, StoreError> {
        let res = with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "DELETE FROM egress_calls WHERE started_at < $1"
        )
        .bind(cutoff_ms)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::StoreConfig;

    fn call(owner: &str, started_at_ms: i64) -> CallRecord {
        CallRecord {
            grant_id: "g".into(),
            owner: owner.into(),
            tenant: "default".into(),
            user_id: "alice".into(),
            service: "deepl".into(),
            method: "POST".into(),
            path: "/v2/document".into(),
            status: 200,
            outcome: "ok".into(),
            bytes_up: 1234,
            bytes_down: u64::MAX,
            started_at_ms,
            duration_ms: 56,
        }
    }

    #[tokio::test]
    async fn calls_are_recorded_listed_by_owner_and_pruned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(StoreConfig {
            dir: dir.path().to_owned(),
            retention: Duration::from_secs(3600),
            budget: Default::default(),
        })
        .await
        .expect("open");
        store
            .record_egress_call(&call("run:a", 10))
            .await
            .expect("record");
        store
            .record_egress_call(&call("run:b", 20))
            .await
            .expect("record");
        store
            .record_egress_call(&call("run:a", 30))
            .await
            .expect("record");
        let a = store.egress_calls("run:a").await.expect("list");
        assert_eq!(a.len(), 2);
        // u64::MAX does not fit SQLite's integer: stored saturated
        assert_eq!(
            a[0],
            CallRecord {
                bytes_down: i64::MAX as u64,
                ..call("run:a", 10)
            }
        );
        assert_eq!(a[1].started_at_ms, 30);
        // the operator's view: every owner, newest first, bounded
        let recent = store.recent_egress_calls(2).await.expect("recent");
        let seen: Vec<(&str, i64)> = recent
            .iter()
            .map(|c| (c.owner.as_str(), c.started_at_ms))
            .collect();
        assert_eq!(seen, [("run:a", 30), ("run:b", 20)]);
        assert_eq!(store.prune_egress_calls(25).await.expect("prune"), 2);
        assert_eq!(store.egress_calls("run:a").await.expect("list").len(), 1);
        assert!(store.egress_calls("run:b").await.expect("list").is_empty());
    }
}
