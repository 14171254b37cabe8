//! Integration tests of oncely-webhooks: published vectors, interoperability with the
//! providers' own libraries, properties over arbitrary input, and the ingress (real
//! HTTP servers on 127.0.0.1, real SQLite files and PostgreSQL).

mod delivery;
mod ingress;
mod interop;
mod properties;
mod support;
mod vectors;
