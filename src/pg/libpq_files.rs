//! The two files libpq reads connection settings from, read the way libpq reads them, so that
//! cron jobs keep passwords out of crontabs and URLs (and so out of `--format env` output):
//!
//! - the password file: `PGPASSFILE`, else `~/.pgpass`; lines
//!   `hostname:port:database:username:password`, `*` matching anything, `\:` and `\\`
//!   escaped, the first matching line wins; ignored (with a warning) unless it is a regular
//!   file without group or world permissions, as libpq does. Used only when neither the URL,
//!   the service nor `PGPASSWORD` gives a password. A unix-socket host matches `localhost`.
//! - the connection service file: the service named by `service=` in the URL or `PGSERVICE`,
//!   looked up in `PGSERVICEFILE` (else `~/.pg_service.conf`), then in
//!   `PGSYSCONFDIR/pg_service.conf` (else Debian's `/etc/postgresql-common/pg_service.conf`).
//!   Its settings fill what the URL leaves out, before the `PG*` variables do.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// The settings of one service section (`key=value` lines under `[name]`).
pub type Service = HashMap<String, String>;

/// Debian's libpq looks here when PGSYSCONFDIR is unset.
const SYSTEM_SERVICE_DIR: &str = "/etc/postgresql-common";

/// Loads service `name`, or says where it was looked for.
pub fn service(name: &str) -> Result<Service, Error> {
    let mut looked = Vec::new();
    let user_file = env_path("PGSERVICEFILE").or_else(|| home_file(".pg_service.conf"));
    let system_file = Some(
        env_path("PGSYSCONFDIR")
            .unwrap_or_else(|| PathBuf::from(SYSTEM_SERVICE_DIR))
            .join("pg_service.conf"),
    );
    for path in [user_file, system_file].into_iter().flatten() {
        looked.push(path.display().to_string());
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if let Some(found) = parse_service(&text, name) {
            return Ok(found);
        }
    }
    Err(Error::usage(
        format!(
            "there is no PostgreSQL service `{name}` (looked in {})",
            looked.join(" and ")
        ),
        "define it in ~/.pg_service.conf (or the file PGSERVICEFILE names), or fix `service=` / PGSERVICE",
    ))
}

fn parse_service(text: &str, name: &str) -> Option<Service> {
    let mut found: Option<Service> = None;
    let mut in_section = false;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            if found.is_some() {
                break;
            }
            in_section = section == name;
            if in_section {
                found = Some(Service::new());
            }
            continue;
        }
        if let (true, Some((key, value))) = (in_section, line.split_once('=')) {
            if let Some(service) = found.as_mut() {
                service
                    .entry(key.trim().to_owned())
                    .or_insert_with(|| value.trim().to_owned());
            }
        }
    }
    found
}

/// A warning about the password file, once per process: one command may look a password up
/// for several connections (the store, a target, a reconnect).
fn warn_once(warning: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if !said.iter().any(|s| s == warning) {
        said.push(warning.to_owned());
        crate::terminal::warn(warning);
    }
}

/// The password for (host, port, database, user) from the password file, if any matches.
pub fn password(host: &str, port: u16, database: &str, user: &str) -> Option<String> {
    let path = env_path("PGPASSFILE").or_else(|| home_file(".pgpass"))?;
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() {
        warn_once(&format!(
            "warning: password file `{}` is not a plain file; it is ignored",
            path.display()
        ));
        return None;
    }
    if meta.mode() & 0o077 != 0 {
        warn_once(&format!(
            "warning: password file `{}` has group or world access; permissions should be u=rw (0600) or less, so it is ignored (as libpq does)",
            path.display()
        ));
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let host = if host.starts_with('/') || host.is_empty() {
        "localhost"
    } else {
        host
    };
    let port = port.to_string();
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = split_fields(line);
            let [h, p, d, u, password] = fields.as_slice() else {
                return None;
            };
            let matches = |pattern: &str, value: &str| pattern == "*" || pattern == value;
            (matches(h, host) && matches(p, &port) && matches(d, database) && matches(u, user))
                .then(|| password.clone())
        })
}

/// Splits a password-file line on unescaped `:`; `\:` and `\\` stand for `:` and `\`. The
/// password is the rest of the line (it may hold `:` only escaped, as in libpq).
fn split_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut().unwrap().push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn home_file(name: &str) -> Option<PathBuf> {
    env_path("HOME").map(|home| Path::new(&home).join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_lines_follow_libpq() {
        assert_eq!(
            split_fields(r"db\:host:5432:*:me:pa\:ss:word"),
            ["db:host", "5432", "*", "me", "pa:ss:word"]
        );
        assert_eq!(
            split_fields(r"h:1:d:u:back\\slash"),
            ["h", "1", "d", "u", r"back\slash"]
        );
    }

    #[test]
    fn services_are_sections() {
        let text = "# comment\n[other]\nhost=x\n[ops]\nhost = db.internal\nport=6432\ndbname=ops\n[later]\nhost=y\n";
        let ops = parse_service(text, "ops").unwrap();
        assert_eq!(ops["host"], "db.internal");
        assert_eq!(ops["port"], "6432");
        assert!(parse_service(text, "missing").is_none());
    }
}
