//! oncely-store
