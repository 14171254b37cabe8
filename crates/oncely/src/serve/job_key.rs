//! The key queued jobs are sealed with (see `oncely_tower::seal`), which never lives in
//! the ledger: `ONCELY_SECRET_KEY` (the base64 of 32 bytes), else a key file beside a
//! SQLite ledger (`PATH.key`, owner-only, created on first use and reused after), else
//! (PostgreSQL with a `job` route) the gateway refuses to start.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};
use base64::Engine as _;
use oncely_core::Class;
use oncely_tower::JobKey;

use crate::config::Config;

/// The environment variable that holds the key jobs are sealed with.
pub const SECRET_KEY_ENV: &str = "ONCELY_SECRET_KEY";

/// The key for this config's jobs: `None` when it has no `job` route and no
/// `ONCELY_SECRET_KEY` (nothing is sealed then). A bad `ONCELY_SECRET_KEY`, an
/// unreadable key file, or PostgreSQL with a job route and no key is an error.
pub fn resolve(config: &Config) -> anyhow::Result<Option<JobKey>> {
    let has_jobs = config.routes.iter().any(|r| r.class == Class::Job);
    if let Some(value) = std::env::var_os(SECRET_KEY_ENV).filter(|v| !v.is_empty()) {
        let value = value
            .into_string()
            .map_err(|_| anyhow!("{SECRET_KEY_ENV} is not text: {}", KEY_FORMAT))?;
        return decode(&value)
            .map(|k| Some(JobKey::new(k)))
            .with_context(|| format!("{SECRET_KEY_ENV} is unusable"));
    }
    if !has_jobs {
        return Ok(None);
    }
    if let Some(path) = config.store.strip_prefix("sqlite://") {
        let file = key_file(Path::new(path));
        return load_or_create(&file)
            .map(|k| Some(JobKey::new(k)))
            .with_context(|| format!("job key file {}", file.display()));
    }
    if config.store == "memory:" || config.store == "memory://" {
        // Nothing outlives the process: a fresh key per run.
        let mut k = [0u8; 32];
        rand::fill(&mut k);
        return Ok(Some(JobKey::new(k)));
    }
    bail!(
        "a PostgreSQL ledger with a job route needs {SECRET_KEY_ENV} ({KEY_FORMAT}, the same \
         on every instance), so that queued jobs are encrypted with a key kept outside the \
         database"
    )
}

const KEY_FORMAT: &str = "the base64 of 32 random bytes, e.g. from `openssl rand -base64 32`";

/// The key file of a SQLite ledger at `db`: `DB.key`.
pub fn key_file(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".key");
    PathBuf::from(name)
}

fn decode(text: &str) -> anyhow::Result<[u8; 32]> {
    let text = text.trim();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(text))
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text))
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text))
        .map_err(|_| anyhow!("not base64; it must be {KEY_FORMAT}"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| anyhow!("{} bytes, not 32; it must be {KEY_FORMAT}", bytes.len()))
}

/// Reads the key file, or creates it (owner-only) with a random key. Created under a
/// temporary name and linked into place, so two gateways starting at once on one ledger
/// agree on one key.
fn load_or_create(file: &Path) -> anyhow::Result<[u8; 32]> {
    match std::fs::read_to_string(file) {
        Ok(text) => {
            owner_only(file)?;
            return decode(&text);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context("cannot read it"),
    }
    let mut key = [0u8; 32];
    rand::fill(&mut key);
    let text = base64::engine::general_purpose::STANDARD.encode(key);
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        let mut f = create_owner_only(&tmp)?;
        f.write_all(format!("{text}\n").as_bytes())?;
        f.sync_all()?;
        std::fs::hard_link(&tmp, file)
    })();
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => {
            tracing::info!(file = %file.display(), "created the key queued jobs are encrypted with; keep it with the ledger");
            Ok(key)
        }
        // Another gateway created it first: use its key.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = std::fs::read_to_string(file).context("cannot read it")?;
            decode(&text)
        }
        Err(e) => Err(e).context("cannot create it (may oncely write in the ledger's directory?)"),
    }
}

#[cfg(unix)]
fn create_owner_only(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn create_owner_only(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

/// Makes an existing key file owner-only.
fn owner_only(path: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .context("it is readable by others and cannot be made owner-only")?;
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_base64_of_32_bytes() {
        let k = base64::engine::general_purpose::STANDARD.encode([3u8; 32]);
        assert_eq!(decode(&k).unwrap(), [3u8; 32]);
        assert_eq!(decode(&format!(" {k}\n")).unwrap(), [3u8; 32]);
        assert!(decode("not base64!").is_err());
        let short = base64::engine::general_purpose::STANDARD.encode([3u8; 16]);
        assert!(decode(&short).unwrap_err().to_string().contains("16 bytes"));
    }

    #[test]
    fn a_key_file_is_created_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let file = key_file(&dir.path().join("l.db"));
        assert!(file.ends_with("l.db.key"));
        let first = load_or_create(&file).unwrap();
        assert_eq!(load_or_create(&file).unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
