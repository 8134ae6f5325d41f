//! LibreChat's face: the Code Interpreter API contract (`/exec`,
//! `/exec/programmatic`, `/upload`,
//! `/download`, `/files`, `/sessions/.../objects`, `/health`) with its JSON
//! shapes and error envelopes (spec `librechat-api.md`).

pub mod exec;
pub mod files;
pub mod health;
pub mod programmatic;
pub mod upload;
pub mod workspace;
