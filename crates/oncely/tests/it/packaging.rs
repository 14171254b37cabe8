//! What the Debian package and the container image ship, kept true without building them
//! (`scripts/package` builds and checks the real package): the default config is valid
//! and serves `/healthz`, and the systemd unit runs that config and reloads with SIGHUP.

use std::path::PathBuf;

use crate::common::{get, run, stderr, Gateway};

fn deploy(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/debian")
        .join(file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packaged_default_config_is_valid_and_serves_healthz() {
    let packaged = deploy("oncely.toml");
    let o = run(&["check-config", packaged.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // The same file with its state moved into a temporary directory (ports are given on
    // the command line, as the Dockerfile does).
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&packaged).unwrap();
    assert!(
        text.contains("sqlite:///var/lib/oncely/oncely.db"),
        "{text}"
    );
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        text.replace("/var/lib/oncely", dir.path().to_str().unwrap()),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", cfg.to_str().unwrap()], &[]);
    let health = get(&gw.admin_url("/healthz"), &[]).await;
    assert_eq!(health.status, 200, "{}", health.text());
    assert!(dir.path().join("oncely.db").exists());
    assert_eq!(gw.terminate().code(), Some(0));
}

#[test]
fn the_systemd_unit_runs_the_packaged_config_as_oncely_and_reloads_with_sighup() {
    let unit = std::fs::read_to_string(deploy("oncely.service")).unwrap();
    let lines: Vec<&str> = unit.lines().collect();
    for expected in [
        "User=oncely",
        "ExecStart=/usr/bin/oncely serve --config /etc/oncely/oncely.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "StateDirectory=oncely",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ] {
        assert!(lines.contains(&expected), "{expected:?} not in the unit");
    }
    let dockerfile =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../Dockerfile"))
            .unwrap();
    assert!(dockerfile.contains("COPY deploy/debian/oncely.toml /etc/oncely/oncely.toml"));
    assert!(dockerfile.contains("HEALTHCHECK"));
    assert!(dockerfile.contains("USER oncely"));
}
