//! oncely-webhooks
