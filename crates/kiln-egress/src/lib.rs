//! Kiln's egress gateway: sandboxed code calls a few operator-approved
//! external APIs (DeepL document translation is the worked example) without
//! ever seeing their secrets and without any other network.
//!
//! - [`Registry`]: the operator's services ([`ServiceConfig`], seed 002's
//!   TOML shape), checked and compiled at start-up, `${VAR}` credentials
//!   read from Kiln's environment.
//! - [`Grant`]: deny by default; the server mints one per owner (a run) with
//!   exactly the services the owner's principal may use, and revokes it
//!   when the owner ends.
//! - [`Gateway::open`] serves a grant's holder on a listener Kiln hands in
//!   (inside the jail's own network namespace): the channel is the
//!   credential. `GET /` lists the granted services; `<METHOD>
//!   /<service>/<path>` is forwarded.
//! - The forwarder (`forward.rs`): path allow-list after strict
//!   normalisation (`path.rs`), secret injection, request and response
//!   header allow-lists, secrets scrubbed from responses (`scrub.rs`), the
//!   SSRF guard on every resolved address (`addr.rs`), no redirects,
//!   streamed bodies with hard caps, timeouts, rate limits (`rate.rs`),
//!   concurrency limits, per-grant quotas.
//! - [`Ledger`]: every call recorded (and counted in metrics).
//! - [`Fetcher`]: Kiln's own server-side GET or PUT of a URL a client names
//!   (seed 004's file import and export) behind the same SSRF guard.

mod addr;
mod config;
mod error;
mod fetch;
mod forward;
mod gateway;
mod grant;
mod ledger;
mod path;
mod rate;
mod registry;
mod scrub;
mod server;

pub use addr::{Refusal as AddressRefusal, check as check_address, classify as classify_address};
pub use config::{EgressSettings, ServiceConfig};
pub use error::{ERROR_HEADER, Refused};
pub use fetch::{FetchError, FetchPolicy, Fetcher};
pub use gateway::{Channel, Gateway};
pub use grant::{Grant, GrantOwner, GrantState, ServiceGrant};
pub use ledger::{CallRecord, Ledger, MemoryLedger};
pub use path::{CleanPath, PathPattern};
pub use rate::Rate;
pub use registry::{ConfigError, MIN_SCRUBBED_SECRET, Registry, Service};

/// Installs rustls' ring provider as the process default, once (later calls
/// and a provider installed earlier by the embedding program are fine).
/// Every reqwest client of a program linking this crate needs it: the
/// workspace's reqwest is built without a provider of its own.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
