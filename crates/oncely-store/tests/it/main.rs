//! Integration tests of the stores: the conformance suite against each backend.

mod memory;
#[cfg(feature = "postgres")]
mod pg_connection;
#[cfg(feature = "postgres")]
mod pg_write_path;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
