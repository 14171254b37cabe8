//! Integration tests of oncely-webhooks: published vectors, interoperability with the
//! providers' own libraries, and properties over arbitrary input.

mod interop;
mod properties;
mod vectors;
