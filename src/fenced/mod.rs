//! Fenced targets: where a write becomes durable, and where the token is enforced (DESIGN I2,
//! I6). The target keeps the highest token it has accepted per resource and refuses a write
//! carrying a lower one, atomically with the write itself.

pub mod object;
pub mod postgres;
pub mod privileges;
pub mod protection;
pub mod sql_check;
pub mod target;

use sha2::{Digest, Sha256};

use crate::error::{ConflictKind, Error};
use crate::object::ObjectUrl;
use crate::url::redact_url;

/// A resolved `--target` URL.
#[derive(Clone, Debug)]
pub struct TargetSpec {
    /// The URL as given (may hold a password; never printed).
    pub url: String,
    /// The URL without its password.
    pub display: String,
    /// Set for `s3://`, `gs://` and `file://` object targets; `None` for PostgreSQL.
    pub object: Option<ObjectUrl>,
}

impl TargetSpec {
    /// The PostgreSQL target, or a usage error naming what `what` needs.
    pub fn postgres(&self, what: &str) -> Result<&TargetSpec, Error> {
        match self.object {
            None => Ok(self),
            Some(_) => Err(Error::usage(
                format!("{what} needs a PostgreSQL target, not `{}`", self.display),
                "use `--target postgres://user@host/db`; objects are written with `fence write --from FILE`",
            )),
        }
    }

    pub fn resolve(url: &str) -> Result<TargetSpec, Error> {
        let display = redact_url(url);
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(TargetSpec {
                url: url.to_owned(),
                display,
                object: None,
            });
        }
        if let Some(object) = ObjectUrl::parse(url, true) {
            return Ok(TargetSpec {
                url: url.to_owned(),
                display,
                object: Some(object?),
            });
        }
        Err(Error::usage(
            format!("`{display}` is not a target URL fence understands"),
            "use `--target postgres://user@host/db`, `s3://bucket/key`, `gs://bucket/key` or `file:///dir/name`",
        ))
    }
}

/// Quotes `name` or `schema.name` as SQL identifiers, each part taken literally.
pub fn quote_table(name: &str) -> Result<String, Error> {
    let parts: Vec<&str> = name.splitn(2, '.').collect();
    if parts.iter().any(|p| p.is_empty()) || name.contains('\0') {
        return Err(Error::usage(
            format!("`{name}` is not a table name"),
            "write --table TABLE or --table SCHEMA.TABLE, each part as it is named in the database",
        ));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join("."))
}

/// An SQL string literal that means the same whatever `standard_conforming_strings` is.
pub fn quote_literal(value: &str) -> String {
    format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// What a write with an id does, as 16 hex digits (the first 64 bits of the SHA-256 of its SQL
/// or its bytes). The ledger keeps it beside the id, so that a retry of the same write is told
/// apart from a different write given the same id: the first is replayed, the second refused.
pub fn write_digest(effect: &[u8]) -> String {
    Sha256::digest(effect)
        .iter()
        .take(8)
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Whether write id `id` was used, as the ledger says (`recorded`: the digest kept with it,
/// `None` for entries written before digests were kept), for this write (`digest`) or for
/// another one: then the answer is a conflict instead of a replay.
pub fn check_reused_id(
    recorded: Option<&str>,
    digest: &str,
    resource: &str,
    token: i64,
    id: &str,
    applied_token: i64,
) -> Result<(), Error> {
    match recorded {
        Some(recorded) if recorded != digest => Err(Error::Conflict {
            resource: resource.to_owned(),
            token,
            kind: ConflictKind::IdReused {
                write_id: id.to_owned(),
                applied_token,
            },
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_table("t").unwrap(), "\"t\"");
        assert_eq!(quote_table("s.t\"x").unwrap(), "\"s\".\"t\"\"x\"");
        assert!(quote_table(".t").is_err());
        assert_eq!(quote_literal("it's \\"), "E'it''s \\\\'");
    }

    #[test]
    fn a_digest_tells_writes_apart_and_old_entries_replay() {
        // SHA-256("abc") begins ba7816bf8f01cfea.
        assert_eq!(write_digest(b"abc"), "ba7816bf8f01cfea");
        let same = write_digest(b"INSERT 1");
        assert!(check_reused_id(Some(&same), &same, "r", 1, "id", 1).is_ok());
        assert!(check_reused_id(None, &same, "r", 1, "id", 1).is_ok());
        let other = check_reused_id(Some(&write_digest(b"INSERT 2")), &same, "r", 3, "id", 1);
        assert!(matches!(
            other,
            Err(Error::Conflict {
                kind: ConflictKind::IdReused {
                    applied_token: 1,
                    ..
                },
                token: 3,
                ..
            })
        ));
    }
}
