//! This node among several ([`Cluster`]) and the headers and owner kinds
//! of forwarding; the forwarding layer itself is [`crate::cluster`].

use std::time::Duration;

use axum::http::HeaderName;

/// The node that forwarded a request.
pub const FORWARDED_BY: HeaderName = HeaderName::from_static("x-kiln-forwarded-by");
/// The nodes' shared secret, proving a request was forwarded by a node.
pub const NODE_SECRET: HeaderName = HeaderName::from_static("x-kiln-node-secret");
/// The address of the client a forwarded request came from.
pub const CLIENT_ADDR: HeaderName = HeaderName::from_static("x-kiln-client-addr");
/// Response header: the node that answered (the owner, when forwarded).
pub const NODE: HeaderName = HeaderName::from_static("x-kiln-node");
/// Response header on a forwarded answer: the node the client reached.
pub const VIA: HeaderName = HeaderName::from_static("x-kiln-via");

/// Owner kinds in the `owners` table.
pub const KIND_SESSION: &str = "session";
pub const KIND_RUN: &str = "run";
/// A runtime session of the stateful profile, by its hint.
pub const KIND_RUNTIME: &str = "runtime";
/// A seed-004 worker (a user's live kernel), by its `user_uuid`.
pub const KIND_WORKER: &str = "worker";
/// A LibreChat attached workspace's project (on the node whose data dir
/// holds it).
pub const KIND_PROJECT: &str = "project";
/// A sandbox of the bridge (`/v1/sandbox/{id}`), on the node that made it.
pub const KIND_SANDBOX: &str = "sandbox";

/// This node among several.
#[derive(Clone)]
pub struct Cluster {
    /// This node's id (its `nodes` row).
    pub node_id: String,
    /// Where the other nodes reach this one (`http://10.0.0.7:8000`).
    pub advertise_url: String,
    pub(crate) secret: String,
    /// A node whose heartbeat is older than this is taken as gone.
    pub dead_after: Duration,
    pub(crate) client: reqwest::Client,
}
