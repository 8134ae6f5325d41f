//! The face kit: what every face is served through and no face owns.
//!
//! - [`admit`]: the one admission extractor ([`Admitted`]): shutdown,
//!   content type, the gate's check, a bounded body read and the caller,
//!   in that order, each refusal in the face's envelope.
//! - [`attached`]: LibreChat's attached workspace as a request names it
//!   (read by the programmatic face and by the cluster layer's routing).
//! - [`envelope`]: the `{"<FIELD>": "<message>"}` error envelopes.
//! - [`routes`]: every route's metadata (rate class, node affinity),
//!   declared once in one table that the rate layer ([`crate::rate`]) and
//!   the cluster layer ([`crate::cluster`]) read instead of matching paths.
//!
//! The kit imports no face module (the tidy test
//! `crates/kiln-api/tests/tidy.rs` checks it).

pub mod admit;
pub mod attached;
pub mod envelope;
pub mod routes;

pub use admit::{
    Admitted, BodyKind, Door, FileBody, Gate, JsonBody, NoBody, Open, Queues, RawBody, Unresolved,
};
pub use routes::{Affinity, Mount, Rate, Route, Verb};
