//! One run's way to the egress gateway: when the run's principal may use
//! operator-approved services, the server mints a grant owned by the run,
//! makes the jail's network namespace with the gateway's listener in it,
//! serves the grant there, and tells the program where (`KILN_SERVICES_URL`,
//! `KILN_SERVICES`). The grant is revoked and the listener closed when the
//! run ends, whatever happened.
//!
//! A run whose principal may use no service never comes here: no grant, no
//! channel, the same warm jail and socket rules as before.

use std::time::{Duration, Instant};

use kiln_core::Principal;
use kiln_egress::{Channel, Gateway, Grant, GrantOwner};
use kiln_sandbox::JailNetwork;

use crate::types::ExecError;

/// The port of the gateway inside a granted jail: `http://127.0.0.1`.
pub const SERVICES_PORT: u16 = 80;
/// `KILN_SERVICES_URL` as the jail sees it.
pub const SERVICES_URL: &str = "http://127.0.0.1";

/// A grant for this run, if its principal may use any service.
pub(crate) fn mint(
    gateway: Option<&Gateway>,
    principal: &Principal,
    run_id: &str,
    wall_time: Duration,
) -> Option<Grant> {
    gateway?.mint(principal, GrantOwner::Run(run_id.to_owned()), wall_time)
}

/// The open channel of one granted run.
pub(crate) struct RunChannel {
    channel: Channel,
    network: JailNetwork,
}

impl RunChannel {
    /// Makes the jail's network namespace and serves `grant` on its
    /// listener.
    pub(crate) fn open(gateway: &Gateway, grant: Grant) -> Result<RunChannel, ExecError> {
        let t = Instant::now();
        let (network, listener) = JailNetwork::create(SERVICES_PORT)
            .map_err(|e| ExecError::SandboxSetup(format!("services channel: {e}")))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| ExecError::SandboxSetup(format!("services channel: {e}")))?;
        let channel = gateway.open(grant, listener, SERVICES_URL);
        metrics::histogram!("kiln_exec_phase_seconds", "phase" => "egress")
            .record(t.elapsed().as_secs_f64());
        Ok(RunChannel { channel, network })
    }

    /// What the jail joins.
    pub(crate) fn network(&self) -> JailNetwork {
        self.network.clone()
    }

    /// The variables that tell the program about its services.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        vec![
            ("KILN_SERVICES_URL".to_owned(), SERVICES_URL.to_owned()),
            (
                "KILN_SERVICES".to_owned(),
                self.channel.grant().service_names().join(","),
            ),
        ]
    }

    /// Revokes the grant and ends every connection.
    pub(crate) async fn close(self) {
        self.channel.close().await;
    }
}
