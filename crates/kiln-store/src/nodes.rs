//! What several nodes share besides files: the nodes alive (`nodes`, one
//! row each, refreshed by a heartbeat), which node owns each node-local
//! thing (`owners`: live kernels and runs), and rate-limit state
//! (`rate_limits`, a GCRA per key counted in one statement).
//!
//! Times are the calling node's clock (Unix ms; µs for rate limits): nodes
//! are expected to keep their clocks in sync (NTP), as the heartbeat's
//! timeout and the limits' windows are compared across nodes.

use crate::meta::with_pool;
use crate::{Store, StoreError};

/// Which node holds a node-local thing (a run, kernel, runtime session,
/// worker or project), as recorded: the node that "owns" it among several,
/// not the principal that owns it (that is `kiln_core::Owner`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord {
    pub node_id: String,
    /// Where the owner is reached; `None` when its node row is gone (it
    /// stopped, or was pruned as dead).
    pub url: Option<String>,
    /// The owner's last heartbeat (Unix ms), with its node row.
    pub heartbeat_at_ms: Option<i64>,
    pub draining: bool,
}

/// One node as recorded.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct NodeRow {
    pub node_id: String,
    pub url: String,
    pub started_at: i64,
    pub heartbeat_at: i64,
    pub draining: bool,
}

/// What one shared GCRA step returned: the key's theoretical arrival time
/// after the step (allowed) or as it stands (refused), Unix µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateStep {
    pub allowed: bool,
    pub tat_us: i64,
}

impl Store {
    /// Records that node `node_id`, reached at `url`, is alive at `now_ms`
    /// (and whether it is draining).
    pub async fn node_heartbeat(
        &self,
        node_id: &str,
        url: &str,
        draining: bool,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "INSERT INTO nodes (node_id, url, started_at, heartbeat_at, draining) \
             VALUES ($1, $2, $3, $3, $4) \
             ON CONFLICT (node_id) DO UPDATE SET url = $2, heartbeat_at = $3, draining = $4",
        )
        .bind(node_id)
        .bind(url)
        .bind(now_ms)
        .bind(draining)
        .execute(p)
        .await
        .map(|_| ()))?;
        Ok(())
    }

    /// Removes node `node_id` and what it owned: a node that stops says so,
    /// and its things read as lost at once.
    pub async fn node_leave(&self, node_id: &str) -> Result<(), StoreError> {
        with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "DELETE FROM owners WHERE node_id = $1"
        )
        .bind(node_id)
        .execute(p)
        .await
        .map(|_| ()))?;
        with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "DELETE FROM nodes WHERE node_id = $1"
        )
        .bind(node_id)
        .execute(p)
        .await
        .map(|_| ()))?;
        Ok(())
    }

    /// Every node recorded, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        Ok(with_pool!(self.inner.meta.pool(), |p| sqlx::query_as(
            "SELECT node_id, url, started_at, heartbeat_at, draining FROM nodes ORDER BY node_id"
        )
        .fetch_all(p)
        .await?))
    }

    /// Records `node_id` as the owner of the `kind` thing `id` (a later
    /// claim replaces an earlier one).
    pub async fn claim(
        &self,
        kind: &str,
        id: &str,
        node_id: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "INSERT INTO owners (kind, id, node_id, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (kind, id) DO UPDATE SET node_id = $3, created_at = $4",
        )
        .bind(kind)
        .bind(id)
        .bind(node_id)
        .bind(now_ms)
        .execute(p)
        .await
        .map(|_| ()))?;
        Ok(())
    }

    /// Forgets the owner of the `kind` thing `id` (it was closed).
    pub async fn release(&self, kind: &str, id: &str) -> Result<(), StoreError> {
        with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "DELETE FROM owners WHERE kind = $1 AND id = $2"
        )
        .bind(kind)
        .bind(id)
        .execute(p)
        .await
        .map(|_| ()))?;
        Ok(())
    }

    /// The recorded owner of the `kind` thing `id`, with its node's state.
    pub async fn owner(&self, kind: &str, id: &str) -> Result<Option<OwnerRecord>, StoreError> {
        type Row = (String, Option<String>, Option<i64>, Option<bool>);
        let row: Option<Row> = with_pool!(self.inner.meta.pool(), |p| sqlx::query_as(
            "SELECT o.node_id, n.url, n.heartbeat_at, n.draining FROM owners o \
             LEFT JOIN nodes n ON n.node_id = o.node_id WHERE o.kind = $1 AND o.id = $2",
        )
        .bind(kind)
        .bind(id)
        .fetch_optional(p)
        .await?);
        Ok(
            row.map(|(node_id, url, heartbeat_at_ms, draining)| OwnerRecord {
                node_id,
                url,
                heartbeat_at_ms,
                draining: draining.unwrap_or(false),
            }),
        )
    }

    /// Removes the nodes whose last heartbeat is older than `dead_before_ms`
    /// and every owner row not older than `keep_before_ms` whose node is
    /// gone, plus owner rows created before `keep_before_ms` (longer than
    /// anything node-local lives). Returns the owner rows removed.
    pub async fn prune_nodes(
        &self,
        dead_before_ms: i64,
        keep_before_ms: i64,
    ) -> Result<u64, StoreError> {
        with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "DELETE FROM nodes WHERE heartbeat_at < $1"
        )
        .bind(dead_before_ms)
        .execute(p)
        .await
        .map(|_| ()))?;
        let n = with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "DELETE FROM owners WHERE created_at < $1 OR \
             NOT EXISTS (SELECT 1 FROM nodes n WHERE n.node_id = owners.node_id)",
        )
        .bind(keep_before_ms)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(n)
    }

    /// One GCRA step for `key` at `now_us`, in one statement (so nodes
    /// counting the same key at once each see the other's step): the
    /// request is allowed when the key's theoretical arrival time, moved on
    /// by `interval_us`, is at most `window_us` ahead of now.
    pub async fn rate_step(
        &self,
        key: &str,
        now_us: i64,
        interval_us: i64,
        window_us: i64,
    ) -> Result<RateStep, StoreError> {
        let stepped: Option<(i64,)> = with_pool!(self.inner.meta.pool(), |p| sqlx::query_as(
            "INSERT INTO rate_limits (key, tat) VALUES ($1, $2 + $3) \
             ON CONFLICT (key) DO UPDATE SET \
               tat = (CASE WHEN rate_limits.tat > $2 THEN rate_limits.tat ELSE $2 END) + $3 \
             WHERE (CASE WHEN rate_limits.tat > $2 THEN rate_limits.tat ELSE $2 END) + $3 \
                   <= $2 + $4 \
             RETURNING tat",
        )
        .bind(key)
        .bind(now_us)
        .bind(interval_us)
        .bind(window_us)
        .fetch_optional(p)
        .await?);
        if let Some((tat_us,)) = stepped {
            return Ok(RateStep {
                allowed: true,
                tat_us,
            });
        }
        // refused: how far ahead the key stands, for Retry-After
        let (tat_us,): (i64,) = with_pool!(self.inner.meta.pool(), |p| sqlx::query_as(
            "SELECT tat FROM rate_limits WHERE key = $1"
        )
        .bind(key)
        .fetch_optional(p)
        .await?)
        .unwrap_or((now_us,));
        Ok(RateStep {
            allowed: false,
            tat_us,
        })
    }

    /// Forgets rate-limit keys whose bucket is full again at `now_us`.
    pub async fn prune_rates(&self, now_us: i64) -> Result<u64, StoreError> {
        Ok(with_pool!(self.inner.meta.pool(), |p| sqlx::query(
            "DELETE FROM rate_limits WHERE tat < $1"
        )
        .bind(now_us)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?)
    }
}
