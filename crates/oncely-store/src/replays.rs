//! What the stores' replay caches share: which completed records are small enough to keep,
//! and how many. Each backend keeps them its own way (SQLite invalidates on another
//! connection's commit, PostgreSQL by the database's time and an age limit: see
//! `sqlite::replays` and `postgres::replays`), but both keep the same records.

#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

use oncely_core::Record;

/// Records with bodies larger than this are read from the store each time.
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// At most this many records are kept; a full cache starts over.
pub(crate) const MAX_RECORDS: usize = 16 * 1024;

/// Whether `record` has a stored answer small enough to keep (an answer kept without its
/// body, over `max_response`, is small).
pub(crate) fn small_enough(record: &Record) -> bool {
    record
        .response
        .as_ref()
        .is_some_and(|r| r.body.as_ref().is_none_or(|b| b.len() <= MAX_BODY))
}
