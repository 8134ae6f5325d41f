//! The ledger: every call a jail makes through the gateway, allowed or
//! refused, recorded once it has ended (run, principal, service, method,
//! path, status, bytes, time). The gateway writes through the small
//! [`Ledger`] trait; Kiln's store implements it (`egress_calls` table), and
//! [`MemoryLedger`] keeps calls in memory for tests and for `kiln exec`.

use std::sync::Mutex;

use futures::future::BoxFuture;

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

/// Where calls are recorded.
pub trait Ledger: Send + Sync + 'static {
    fn record(&self, call: CallRecord) -> BoxFuture<'_, Result<(), String>>;
}

/// Calls kept in memory.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    calls: Mutex<Vec<CallRecord>>,
}

impl MemoryLedger {
    pub fn calls(&self) -> Vec<CallRecord> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Ledger for MemoryLedger {
    fn record(&self, call: CallRecord) -> BoxFuture<'_, Result<(), String>> {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call);
        Box::pin(async { Ok(()) })
    }
}
