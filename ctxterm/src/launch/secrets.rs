//! The secret store: root's, outside any storage, never bound into a sandbox.
//!
//! Each secret is one file, `<store>/<service>/<account>`, mode 0600 in directories of mode
//! 0700, all owned by root. The store is `/var/lib/cortexfs/secrets`, or `$CTX_SECRETS`.
//! Services are `cortexfs:<provider>`; accounts are `api-key`, and the OAuth token slots
//! `oauth:access` and `oauth:refresh` (with `oauth:expires`, when the access token expires,
//! written by `ctx model login`). A value is at most [`VALUE_MAX`] bytes and is written by
//! a rename, so a reader sees the old value or the new one whole.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use super::{Error, Result};

/// The largest secret value.
pub const VALUE_MAX: usize = 64 * 1024;
/// The accounts a service may hold.
pub const ACCOUNTS: [&str; 4] = ["api-key", "oauth:access", "oauth:refresh", "oauth:expires"];

/// The store's directory.
pub fn store() -> PathBuf {
    std::env::var_os("CTX_SECRETS").map_or_else(|| PathBuf::from("/var/lib/cortexfs/secrets"), PathBuf::from)
}

/// The service of a provider's secrets.
pub fn service(provider: &str) -> String {
    format!("cortexfs:{provider}")
}

fn check(provider: &str, account: &str) -> Result<()> {
    policy::name::validate(provider).map_err(|e| Error::Invalid(format!("provider {provider:?}: {e}")))?;
    if !ACCOUNTS.contains(&account) {
        return Err(Error::Invalid(format!("account {account:?} is not one of {}", ACCOUNTS.join(" "))));
    }
    Ok(())
}

fn private_dir(p: &std::path::Path) -> Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = fs::symlink_metadata(p)?;
            if !m.is_dir()
                || m.uid() != 0 && m.uid() != rustix::process::getuid().as_raw()
                || m.mode() & 0o077 != 0
            {
                return Err(Error::Denied(format!(
                    "{}: the secret store must be a directory of its owner only (mode 0700)",
                    p.display()
                )));
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Stores `value` as `provider`'s `account`.
pub fn set(provider: &str, account: &str, value: &[u8]) -> Result<()> {
    check(provider, account)?;
    if value.is_empty() || value.len() > VALUE_MAX {
        return Err(Error::Invalid(format!("a secret is 1 to {VALUE_MAX} bytes, not {}", value.len())));
    }
    let root = store();
    if let Some(parent) = root.parent() {
        fs::create_dir_all(parent)?;
    }
    private_dir(&root)?;
    let dir = root.join(service(provider));
    private_dir(&dir)?;
    let tmp = dir.join(format!(".{account}.{}", std::process::id()));
    let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    f.write_all(value)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(account))?;
    fs::File::open(&dir)?.sync_all()?;
    Ok(())
}

/// `provider`'s `account`, if stored. Refuses a store others could read or write.
pub fn get(provider: &str, account: &str) -> Result<Option<Vec<u8>>> {
    check(provider, account)?;
    let p = store().join(service(provider)).join(account);
    let f = match fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&p) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let m = f.metadata()?;
    if !m.is_file() || m.mode() & 0o077 != 0 {
        return Err(Error::Denied(format!("{}: a secret must be a file of mode 0600", p.display())));
    }
    let mut v = Vec::new();
    f.take(VALUE_MAX as u64 + 1).read_to_end(&mut v)?;
    if v.len() > VALUE_MAX {
        return Err(Error::Invalid(format!("{}: over {VALUE_MAX} bytes", p.display())));
    }
    Ok(Some(v))
}

/// Removes `provider`'s `account`; false when it was not stored.
pub fn remove(provider: &str, account: &str) -> Result<bool> {
    check(provider, account)?;
    match fs::remove_file(store().join(service(provider)).join(account)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Every stored (service, account), sorted; never a value.
pub fn list() -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let root = store();
    let Ok(services) = fs::read_dir(&root) else { return Ok(out) };
    for s in services.flatten() {
        let service = s.file_name().to_string_lossy().into_owned();
        if !service.starts_with("cortexfs:") {
            continue;
        }
        let Ok(accounts) = fs::read_dir(s.path()) else { continue };
        for a in accounts.flatten() {
            let account = a.file_name().to_string_lossy().into_owned();
            if ACCOUNTS.contains(&account.as_str()) {
                out.push((service.clone(), account));
            }
        }
    }
    out.sort();
    Ok(out)
}
