//! What every message of one endpoint shares, whatever its server: the endpoint's config,
//! the gateway's guard (its engine and store) and what it has learned of the server's
//! tools. The core's parts that need nothing of the server take this, not the core.

use std::sync::Arc;

use oncely_tower::Guard;

use crate::catalog::ToolCatalog;
use crate::config::McpConfig;

/// One endpoint's config, guard and tool catalog.
pub struct Shared {
    pub(crate) config: McpConfig,
    pub(crate) guard: Arc<Guard>,
    pub(crate) catalog: ToolCatalog,
    /// The key arguments' values of the records seen last (`made_keys`).
    pub(crate) made_keys: super::made_keys::MadeKeys,
}
