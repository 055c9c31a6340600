//! Fenced targets: where a write becomes durable, and where the token is enforced (DESIGN I2,
//! I6). The target keeps the highest token it has accepted per resource and refuses a write
//! carrying a lower one, atomically with the write itself.

pub mod grant;
pub mod object;
pub mod postgres;
pub mod protection;
pub mod sql_check;

use crate::error::Error;
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
}
