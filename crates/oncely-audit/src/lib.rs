//! oncely-audit
