//! What fingerprinting a 25 MB `multipart/form-data` upload costs in memory: the body is
//! held once (as `Bytes`, as the gateway holds it for the upstream), then fingerprinted,
//! and the process's peak resident set (`VmHWM` in `/proc/self/status`) is read before and
//! after. The fingerprint reads the parts where they lie, so the peak should not move by
//! more than a few pages; a copy of the body, measured the same way afterwards as a
//! control, moves it by the body's size.
//!
//! Run with: `cargo run --release -p oncely-core --example multipart_memory [MIB]`
//! (default 25).

use std::time::Instant;

use bytes::Bytes;
use oncely_core::FingerprintBuilder;

const BOUNDARY: &str = "----oncely-memory-3b9f1e2d";

/// `VmRSS` and `VmHWM` of this process, in KiB.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("a VmRSS and VmHWM line")
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// An upload as an SDK sends it (two small fields and the file), written into one
/// allocation of exactly its size, so that building it leaves no higher peak behind.
fn upload(size: usize) -> Bytes {
    let head = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"talk.mp3\"\r\n\
         Content-Type: audio/mpeg\r\n\r\n"
    );
    let tail = format!("\r\n--{BOUNDARY}--\r\n");
    let mut body = Vec::with_capacity(head.len() + size + tail.len());
    body.extend_from_slice(head.as_bytes());
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    body.extend((0..size).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 24) as u8
    }));
    body.extend_from_slice(tail.as_bytes());
    assert_eq!(body.len(), body.capacity());
    Bytes::from(body)
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("a size in MiB"))
        .unwrap_or(25);
    let (start_rss, _) = memory();
    let body = upload(mib << 20);
    let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
    let (rss, hwm) = memory();
    println!(
        "body: {} bytes; RSS {start_rss} KiB at start, {rss} KiB holding it (peak {hwm} KiB)",
        body.len()
    );

    let started = Instant::now();
    let fingerprint = FingerprintBuilder::new("acct_1", "POST", "/v1/audio/transcriptions")
        .request_body(Some(content_type.as_bytes()), &body, &[]);
    let took = started.elapsed();
    let (after_rss, after_hwm) = memory();
    println!(
        "fingerprint {fingerprint} in {:.1} ms ({:.0} MB/s, one run)",
        took.as_secs_f64() * 1e3,
        body.len() as f64 / took.as_secs_f64() / 1e6
    );
    println!(
        "fingerprinting: peak {hwm} -> {after_hwm} KiB (+{} KiB), RSS after {after_rss} KiB",
        after_hwm - hwm
    );

    // The control: a copy of the body, as a reader that decoded the parts into buffers
    // of their own would make, moves the peak by the body's size.
    let copy = body.to_vec();
    let (_, copy_hwm) = memory();
    println!(
        "control, one copy of the body: peak {after_hwm} -> {copy_hwm} KiB (+{} KiB)",
        copy_hwm - after_hwm
    );
    drop(copy);
}
