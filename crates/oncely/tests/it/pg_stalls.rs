//! Commits that wait, through the real binary, on a real primary whose synchronous
//! standby is stopped for a while (`PgCluster::stop_standby`): every commit on the
//! primary then waits, holding its row locks, until the standby is back.
//!
//! A lease written by such a commit is dated when its statement began, so it can be
//! lapsed by the database's clock the moment it becomes visible, while its owner is alive
//! and about to call the upstream (a claim) or still calling it (a renewal). Neither may
//! let a duplicate take the record over: the chaos run found both (a `write` executed
//! twice 20 ms apart, a `job` run again 12 ms after it started). And a commit that waits
//! when the primary restarts is shown by the restarted primary though the standby never
//! got it: an owner (a completion) or a worker (a delivery's end) that retries its write
//! there and finds it applied may not take it as recorded before the standby has it.

use std::time::Duration;

use oncely_store_conformance::testing::PgCluster;

use crate::common::post as http_post;
use crate::durable::start;
use crate::pg_failover::{cluster, migrate, on_cluster, two_gateways, Renders, AUTH};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_commit_waits_past_the_lease_is_not_taken_over() {
    let cluster = cluster().await;
    let up = Renders::start(Duration::from_secs(2)).await;
    let (a, b, _dir) = two_gateways(&cluster, &up, "1s").await;

    on_cluster(&cluster, PgCluster::stop_standby).await;
    let url_a = a.url("/v1/render");
    let original = tokio::spawn(async move { http_post(&url_a, "a stalled claim", &AUTH).await });
    // The claim's commit waits for the standby past the lease it wrote: nothing is
    // forwarded before the ledger has answered.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        up.total(),
        0,
        "a call was forwarded before its claim was answered"
    );
    let url_b = b.url("/v1/render");
    let dup = tokio::spawn(async move { http_post(&url_b, "a stalled claim", &AUTH).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    on_cluster(&cluster, PgCluster::resume_standby).await;

    let (original, dup) = (original.await.unwrap(), dup.await.unwrap());
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(up.runs("a stalled claim"), 1, "the intention ran twice");
    assert_eq!(dup.body, original.body);
    let mut statuses = [
        original.header("oncely-status"),
        dup.header("oncely-status"),
    ];
    statuses.sort();
    assert_eq!(statuses, ["fresh", "joined"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_whose_commit_waits_past_the_lease_keeps_the_owners_record() {
    let cluster = cluster().await;
    let up = Renders::start(Duration::from_secs(5)).await;
    let (a, b, _dir) = two_gateways(&cluster, &up, "1s").await;

    let url_a = a.url("/v1/render");
    let original = tokio::spawn(async move { http_post(&url_a, "a long call", &AUTH).await });
    up.until_begun(1).await;
    // The owner's renewals wait for the standby, past the lease each wrote.
    on_cluster(&cluster, PgCluster::stop_standby).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let url_b = b.url("/v1/render");
    let dup = tokio::spawn(async move { http_post(&url_b, "a long call", &AUTH).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    on_cluster(&cluster, PgCluster::resume_standby).await;

    let (original, dup) = (original.await.unwrap(), dup.await.unwrap());
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(original.header("oncely-status"), "fresh");
    assert_eq!(up.runs("a long call"), 1, "the live owner's call ran again");
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(dup.header("oncely-status"), "joined");
    assert_eq!(dup.body, original.body);
}

/// A webhook delivery runs 4 s at one gateway while commits wait for 2.5 s (its task's
/// lease is 1 s, renewed every third): the other gateway, polling for due deliveries,
/// finds the task's renewal lapsed by the database's clock once it is visible, and must
/// not send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_renewal_whose_commit_waits_past_the_lease_keeps_the_delivery_with_its_worker() {
    let cluster = cluster().await;
    let (seen, cfg, _dir) = webhooks(&cluster, None).await;
    let (a, _b) = (start(&cfg), start(&cfg));
    event(&a, "msg_stall", "slow_evt").await;
    assert_eq!(
        seen.until("slow_evt", 1, Duration::from_secs(10))
            .await
            .len(),
        1,
        "the delivery began"
    );
    on_cluster(&cluster, PgCluster::stop_standby).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    on_cluster(&cluster, PgCluster::resume_standby).await;
    // Past the delivery's end and a few polls of both workers.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        seen.of("slow_evt").len(),
        1,
        "the delivery was sent again while its worker was still sending it"
    );
}

/// A completion that waits for the standby when the primary is restarted is on the
/// primary alone: the restarted primary shows it at once, but the standby never got it.
/// The owner, retrying its completion there, must not take it as recorded: the standby is
/// then promoted without it, and the record is `processing` again. The owner's next try
/// records it on the new primary, and the intention runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_only_the_restarted_primary_has_is_recorded_again_after_the_failover() {
    let cluster = cluster().await;
    let up = Renders::start(Duration::from_secs(2)).await;
    // A lease of 4 s: renewals at 1.33 s and 2.67 s, so that the completion (at 2 s) is
    // the commit that waits, not a renewal it would queue behind.
    let (a, b, _dir) = two_gateways(&cluster, &up, "4s").await;

    let url_a = a.url("/v1/render");
    let body = "a completion the standby missed";
    let original = tokio::spawn(async move { http_post(&url_a, body, &AUTH).await });
    up.until_begun(1).await;
    // The claim and the first renewal are on both; the completion waits for the standby.
    tokio::time::sleep(Duration::from_millis(1450)).await;
    on_cluster(&cluster, PgCluster::stop_standby).await;
    // The call ends at 2 s; its completion waits, and the next renewal queues behind it.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // A restart ends the waiting commit's session: the primary alone has it, and shows
    // it once it is back. The owner tries its completion again meanwhile.
    on_cluster(&cluster, PgCluster::stop_primary).await;
    on_cluster(&cluster, PgCluster::start_primary).await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // The primary is lost before the standby ever received the completion.
    on_cluster(&cluster, PgCluster::kill_primary).await;
    on_cluster(&cluster, PgCluster::start_standby_again).await;
    on_cluster(&cluster, PgCluster::promote).await;

    let dup = http_post(&b.url("/v1/render"), body, &AUTH).await;
    let original = original.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(
        up.runs(body),
        1,
        "the intention ran again after the failover\nA:\n{}\nB:\n{}",
        a.lines.lock().unwrap().join("\n"),
        b.lines.lock().unwrap().join("\n")
    );
    assert_eq!(dup.body, original.body);
}

/// The same for a webhook delivery's end: a 4 s delivery with a 7.5 s task lease (renewed
/// at 2.5 s and 5 s), so that the delivery's delete is the commit that waits when the
/// primary is restarted. The worker retries it there, finds the task gone, and must not
/// take it as delivered before the standby has that; the standby is then promoted without
/// it, the task is running again under the worker's lease, and the worker's next try ends
/// it there. The event is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_end_only_the_restarted_primary_has_is_recorded_again_after_the_failover() {
    let cluster = cluster().await;
    let (seen, cfg, _dir) = webhooks(&cluster, Some("7500ms")).await;
    let (a, b) = (start(&cfg), start(&cfg));
    event(&a, "msg_end", "slow_end").await;
    let began = seen.until("slow_end", 1, Duration::from_secs(10)).await;
    assert_eq!(began.len(), 1, "the delivery began");
    // After the renewal at 2.5 s; the delivery ends at 4 s and its delete waits.
    tokio::time::sleep(Duration::from_millis(2900).saturating_sub(began[0].1.elapsed())).await;
    on_cluster(&cluster, PgCluster::stop_standby).await;
    tokio::time::sleep(Duration::from_millis(4600).saturating_sub(began[0].1.elapsed())).await;
    on_cluster(&cluster, PgCluster::stop_primary).await;
    on_cluster(&cluster, PgCluster::start_primary).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    on_cluster(&cluster, PgCluster::kill_primary).await;
    on_cluster(&cluster, PgCluster::start_standby_again).await;
    on_cluster(&cluster, PgCluster::promote).await;
    // Past the new primary's first lease and a lease watched, with polls of both (the
    // delivery was sent again after 8-9 s here before the fix).
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        seen.of("slow_end").len(),
        1,
        "the delivery was sent again after the failover\nA:\n{}\nB:\n{}",
        a.lines.lock().unwrap().join("\n"),
        b.lines.lock().unwrap().join("\n")
    );
}

/// Two instances' config on `cluster` with a webhook endpoint (`crate::durable::config`,
/// its delivery lease `lease` instead of 1 s when given) delivering to an upstream that
/// notes each delivery (`slow...` events take 4 s).
async fn webhooks(
    cluster: &PgCluster,
    lease: Option<&str>,
) -> (crate::durable::Seen, String, tempfile::TempDir) {
    use crate::durable::{config, service, Seen};
    let url = cluster.url(
        &[cluster.port(0), cluster.port(1)],
        "target_session_attrs=read-write",
    );
    migrate(&url);
    let seen = Seen::default();
    let up = crate::common::upstream(service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &url, up);
    if let Some(lease) = lease {
        let text = std::fs::read_to_string(&cfg).unwrap();
        let at = text.rfind("lease = \"1s\"").expect("the webhook's lease");
        let edited = format!("{}lease = \"{lease}\"{}", &text[..at], &text[at + 12..]);
        std::fs::write(&cfg, edited).unwrap();
    }
    (seen, cfg, dir)
}

/// Sends the signed event `id` (webhook message `msg`) to `gw`, and checks it is accepted.
async fn event(gw: &crate::common::Gateway, msg: &str, id: &str) {
    let body = format!(r#"{{"type":"invoice.paid","id":"{id}"}}"#);
    let mut headers: Vec<(String, String)> = crate::durable::signed(msg, &body);
    headers.push(("content-type".into(), "application/json".into()));
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let ack = http_post(&gw.url("/hooks/events"), &body, &h).await;
    assert_eq!(ack.status, 200, "{}", ack.text());
}
