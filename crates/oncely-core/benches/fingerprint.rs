//! What a body's fingerprint costs: a 25 MB `multipart/form-data` upload read as its parts
//! (the delimiter search and SHA-256 over the content where it lies), beside the same
//! bytes hashed as bytes (SHA-256 alone) and a Stripe-style form of 200 fields.
//!
//! Run with: `cargo bench -p oncely-core --bench fingerprint`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use oncely_core::FingerprintBuilder;

const UPLOAD: usize = 25 << 20;
const BOUNDARY: &str = "----oncely-bench-7d1f0c9a";

/// Bytes that look like a compressed file (a xorshift stream).
fn noise(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// An upload as an SDK sends it: two small fields and a 25 MB file.
fn upload() -> Vec<u8> {
    let mut body = Vec::with_capacity(UPLOAD + 1024);
    for (name, value) in [("model", "whisper-1"), ("language", "en")] {
        body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"talk.mp3\"\r\nContent-Type: audio/mpeg\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(&noise(UPLOAD));
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    body
}

fn form() -> Vec<u8> {
    let fields: Vec<String> = (0..200)
        .map(|i| {
            format!(
                "items[{}][price]=price_{i:08}&metadata[note_{i}]=a+b%2Fc",
                i % 20
            )
        })
        .collect();
    fields.join("&").into_bytes()
}

fn bodies(c: &mut Criterion) {
    let builder = || FingerprintBuilder::new("acct_1", "POST", "/v1/audio/transcriptions");
    let upload = upload();
    let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
    let mut group = c.benchmark_group("fingerprint");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(10))
        .throughput(Throughput::Bytes(upload.len() as u64));
    group.bench_function("multipart_25MB", |b| {
        b.iter(|| {
            builder().request_body(
                Some(black_box(content_type.as_bytes())),
                black_box(&upload),
                &[],
            )
        })
    });
    group.bench_function("bytes_25MB", |b| {
        b.iter(|| builder().request_body(None, black_box(&upload), &[]))
    });
    let form = form();
    group
        .sample_size(100)
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Bytes(form.len() as u64));
    group.bench_function("form_200_fields", |b| {
        b.iter(|| {
            builder().request_body(
                Some(b"application/x-www-form-urlencoded"),
                black_box(&form),
                &[],
            )
        })
    });
    group.finish();
}

criterion_group!(benches, bodies);
criterion_main!(benches);
