//! [`Gateway`]: the registry, the ledger and the gateway-wide limits;
//! mints grants and opens one [`Channel`] per grant holder.

use std::sync::Arc;
use std::time::Duration;

use kiln_core::Principal;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::EgressSettings;
use crate::forward::ChannelCtx;
use crate::grant::{Grant, GrantOwner};
use crate::ledger::Ledger;
use crate::registry::Registry;
use crate::server;

/// What every channel shares.
pub(crate) struct Shared {
    pub settings: EgressSettings,
    pub ledger: Arc<dyn Ledger>,
    /// One permit per upstream call in flight, gateway-wide.
    pub upstream: Arc<Semaphore>,
}

/// The egress gateway. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    registry: Arc<Registry>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("services", &self.registry.len())
            .finish_non_exhaustive()
    }
}

impl Gateway {
    pub fn new(registry: Registry, settings: EgressSettings, ledger: Arc<dyn Ledger>) -> Gateway {
        let upstream = Arc::new(Semaphore::new(settings.max_concurrent_calls.max(1)));
        Gateway {
            registry: Arc::new(registry),
            shared: Arc::new(Shared {
                settings,
                ledger,
                upstream,
            }),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn settings(&self) -> &EgressSettings {
        &self.shared.settings
    }

    /// A grant for `owner`, acting for `principal`, of every service the
    /// principal may use, valid for `lifetime` (plus the settings' grace);
    /// `None` when the principal may use none (the run then gets no channel
    /// at all).
    pub fn mint(
        &self,
        principal: &Principal,
        owner: GrantOwner,
        lifetime: Duration,
    ) -> Option<Grant> {
        let services = self.registry.allowed_for(principal);
        if services.is_empty() {
            return None;
        }
        metrics::counter!("kiln_egress_grants_total").increment(1);
        let grant = Grant::new(
            owner,
            principal.clone(),
            services,
            lifetime + self.shared.settings.grace,
            self.shared.settings.max_concurrent_per_grant,
        );
        tracing::debug!(grant = %grant.id(), owner = %grant.owner(), services = ?grant.service_names(), "egress grant minted");
        Some(grant)
    }

    /// Serves `grant`'s holder on `listener` (inside its jail's network
    /// namespace, or any listener in tests): every connection accepted
    /// there acts under this grant, so the channel itself is the
    /// credential. `public_url` is the gateway's URL as the holder sees it
    /// (`KILN_SERVICES_URL`). Closing (or dropping) the channel revokes
    /// the grant and ends every connection.
    pub fn open(&self, grant: Grant, listener: TcpListener, public_url: &str) -> Channel {
        let stop = CancellationToken::new();
        let ctx = Arc::new(ChannelCtx {
            grant: grant.clone(),
            shared: Arc::clone(&self.shared),
            public_url: public_url.trim_end_matches('/').to_owned(),
        });
        metrics::gauge!("kiln_egress_channels_open").increment(1.0);
        let task = tokio::spawn(server::serve(ctx, listener, stop.clone()));
        Channel {
            grant,
            stop,
            task: Some(task),
        }
    }
}

/// One grant holder's way to the gateway; see [`Gateway::open`].
#[derive(Debug)]
pub struct Channel {
    grant: Grant,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Channel {
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// Revokes the grant, stops serving and waits until every connection
    /// is closed.
    pub async fn close(mut self) {
        self.grant.revoke();
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.grant.revoke();
        self.stop.cancel();
        metrics::gauge!("kiln_egress_channels_open").decrement(1.0);
    }
}
