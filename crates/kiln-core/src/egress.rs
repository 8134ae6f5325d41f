//! The record of one call a jail made through the egress gateway: written
//! by `kiln-egress`, stored by `kiln-store` (its ledger table).

/// One call through the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    /// The grant the call was made under.
    pub grant_id: String,
    /// The grant's owner (`run:<id>`).
    pub owner: String,
    pub tenant: String,
    pub user_id: String,
    /// The service named in the request (may be one not granted).
    pub service: String,
    pub method: String,
    /// The path as requested (after the service name; at most 512 bytes).
    pub path: String,
    /// The HTTP status the jail got.
    pub status: u16,
    /// `ok`, or the reason the gateway refused or cut the call
    /// (`not_granted`, `rate_limited`, `response_too_large`, ...).
    pub outcome: String,
    /// Request body bytes sent upstream.
    pub bytes_up: u64,
    /// Response body bytes passed to the jail.
    pub bytes_down: u64,
    /// When the call arrived (Unix milliseconds).
    pub started_at_ms: i64,
    pub duration_ms: u64,
}
