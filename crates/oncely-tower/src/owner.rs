//! The owner task: runs one upstream call on a task of its own, renews the lease while
//! it runs, streams the answer to its caller while buffering it, and records it.
