//! The ledger: every call a jail makes through the gateway, allowed or
//! refused, recorded once it has ended (run, principal, service, method,
//! path, status, bytes, time). The gateway writes through the small
//! [`Ledger`] trait; Kiln's store implements it (`egress_calls` table), and
//! [`MemoryLedger`] keeps calls in memory for tests and for `kiln exec`.

use std::sync::Mutex;

use futures::future::BoxFuture;
pub use kiln_core::egress::CallRecord;

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
