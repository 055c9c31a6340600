//! URLs: parsing and printing the addresses fence is given. A leaf module (it depends only on
//! [`crate::error`]): the command line, the coordinators, the targets and the error messages
//! all use it.
//!
//! - [`ObjectUrl`]: `s3://bucket/key`, `gs://bucket/key`, `file:///dir/name`, checked before
//!   anything is sent;
//! - [`redact_url`]: a URL without its password, the only form fence ever prints;
//! - [`percent_decode`]: `file://` paths are percent-decoded, as file URLs are everywhere.

use std::path::PathBuf;

use crate::error::Error;

/// Which object service a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    S3,
    Gcs,
    /// Objects in a local directory.
    File,
}

/// A resolved `s3://bucket/key`, `gs://bucket/key` or `file:///dir/key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectUrl {
    pub service: Service,
    /// The bucket (for `file://`, the directory holding the object or prefix).
    pub bucket: String,
    /// The key or prefix inside the bucket, without leading or trailing `/`.
    pub key: String,
    pub display: String,
    /// Whether the URL names one object (a target), rather than a store's prefix: an
    /// object's key is used exactly as written; a store's objects stay where earlier
    /// versions of fence put them (see `object::s3`).
    pub names_object: bool,
}

impl ObjectUrl {
    /// Parses an object URL; `None` when the scheme is not an object scheme.
    pub fn parse(url: &str, want_key: bool) -> Option<Result<ObjectUrl, Error>> {
        let (service, rest) = if let Some(rest) = url.strip_prefix("s3://") {
            (Service::S3, rest)
        } else if let Some(rest) = url.strip_prefix("gs://") {
            (Service::Gcs, rest)
        } else if let Some(rest) = url.strip_prefix("file://") {
            (Service::File, rest)
        } else {
            return None;
        };
        Some(Self::parse_rest(url, service, rest, want_key))
    }

    fn parse_rest(
        url: &str,
        service: Service,
        rest: &str,
        want_key: bool,
    ) -> Result<ObjectUrl, Error> {
        let bad = |why: &str| {
            Error::usage(
                format!("`{url}` {why}"),
                if want_key {
                    "write `s3://bucket/key`, `gs://bucket/key` or `file:///dir/name`"
                } else {
                    "write `s3://bucket/prefix` or `gs://bucket/prefix`"
                },
            )
        };
        if service == Service::File {
            let path = file_path(rest).map_err(|err| match err {
                FilePathError::BadEscape => bad("has a malformed %-escape"),
                FilePathError::NotAbsolute => {
                    bad("does not name an absolute path (write three slashes)")
                }
            })?;
            let text = path.to_string_lossy();
            // `Path` drops a trailing `/` or `/.`: `file:///dir/obj/` would write `obj`, and
            // `file:///dir/` the directory itself as an object of its parent.
            if text.ends_with('/') || text.ends_with("/.") || text.ends_with("/..") {
                return Err(bad(
                    "ends with `/` (or `/.`, `/..`): that names a directory, not an object; name the file in it, e.g. `file:///dir/name`",
                ));
            }
            // No file name can hold a NUL, and a control character (a newline) in a path is
            // unreadable in every listing and message.
            if text.chars().any(char::is_control) {
                return Err(bad(
                    "has a NUL or another control character (a newline, a tab…) in its path (`%00`, `%0A`…); name the file without it",
                ));
            }
            let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(bad("does not name a file"));
            };
            // fence keeps `.<name>.fence.next.json` beside the object: it must fit too.
            if name.len() > MAX_FILE_NAME_BYTES {
                return Err(bad(&format!(
                    "names a file of {} bytes; fence keeps `.<name>.fence.next.json` beside it, so an object name may have at most {MAX_FILE_NAME_BYTES} bytes (255 for that file); use a shorter name",
                    name.len()
                )));
            }
            // Writing them as objects would let any lease holder forge another object's
            // token and write ids.
            if is_bookkeeping(&name.to_string_lossy()) {
                return Err(bad(
                    "names one of fence's own files (the metadata, lock or temporary file kept beside a `file://` object), not an object",
                ));
            }
            return Ok(ObjectUrl {
                service,
                bucket: dir.display().to_string(),
                key: name.to_string_lossy().into_owned(),
                display: url.to_owned(),
                names_object: want_key,
            });
        }
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.len() < 3
            || !bucket
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-._".contains(c))
        {
            return Err(bad(
                "does not start with a bucket name (3 or more of a-z, 0-9, `-`, `.`, `_`)",
            ));
        }
        if want_key && key.ends_with('/') {
            return Err(bad(
                "ends with `/`: that names a directory, not an object (fence would not guess which)",
            ));
        }
        let key = key.trim_matches('/');
        if want_key && key.is_empty() {
            return Err(bad("names a bucket but no object key"));
        }
        // Both services limit names to 1024 bytes of UTF-8; control characters (a newline in
        // a name) are legal on neither in practice and unreadable in every listing. fence adds
        // up to ~60 bytes under a coordinator prefix.
        if key.len() > MAX_KEY_BYTES {
            return Err(bad(&format!(
                "has a key of {} bytes; S3 and GCS allow at most 1024 (a coordinator prefix at most {MAX_KEY_BYTES})",
                key.len()
            )));
        }
        if key.chars().any(char::is_control) {
            return Err(bad(
                "has a control character (a newline, a tab…) in its key",
            ));
        }
        if key
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
        {
            return Err(bad("has an empty, `.` or `..` path segment"));
        }
        Ok(ObjectUrl {
            service,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            display: url.to_owned(),
            names_object: want_key,
        })
    }

    /// `prefix/name`, or `name` when there is no prefix.
    pub fn join(&self, name: &str) -> String {
        if self.key.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.key)
        }
    }
}

/// The longest key (or coordinator prefix) accepted: S3's and GCS's 1024-byte limit, less
/// the room fence's own names under a prefix need (`/events/<resource>/<seq>-…`; resource
/// names are limited separately).
const MAX_KEY_BYTES: usize = 1024 - 256;

/// The longest `file://` object name: its longest bookkeeping file, `.<name>.fence.next.json`
/// (17 bytes more), must fit the 255 bytes Linux file systems allow a name.
pub const MAX_FILE_NAME_BYTES: usize = 255 - ".".len() - ".fence.next.json".len();

/// Whether `name` is one of the files this backend keeps beside an object (its sidecar, next
/// sidecar, lock, or a temporary file): never an object itself.
pub fn is_bookkeeping(name: &str) -> bool {
    name.starts_with(LEGACY_TMP_PREFIX)
        || (name.starts_with('.')
            && [
                ".fence.json",
                ".fence.next.json",
                ".fence.lock",
                ".fence.tmp",
                ".fence.next.tmp",
            ]
            .iter()
            .any(|suffix| name.ends_with(suffix)))
}

/// The prefix of the temporary files of fence 0.1's writes (random names, which a crashed
/// write left behind for good). Still never an object.
const LEGACY_TMP_PREFIX: &str = ".fence-tmp-";

/// Why the rest of a `file://` URL names no path.
#[derive(Debug, PartialEq)]
pub enum FilePathError {
    /// Not `/…` (nor `localhost/…`): `file://dir` names a host, not a directory.
    NotAbsolute,
    BadEscape,
}

/// The absolute path that `rest`, what follows `file://`, names: an empty host or
/// `localhost`, then a percent-decoded path. Stores and object targets both read `file://`
/// URLs through here.
pub fn file_path(rest: &str) -> Result<PathBuf, FilePathError> {
    let path = rest.strip_prefix("localhost").unwrap_or(rest);
    if !path.starts_with('/') {
        return Err(FilePathError::NotAbsolute);
    }
    percent_decode(path)
        .map(PathBuf::from)
        .ok_or(FilePathError::BadEscape)
}

/// Decodes `%XX` escapes; `None` when an escape is malformed or the result is not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Removes the password from `scheme://user:password@host/…` and any `password=` query
/// parameter, so that URLs can be printed (DESIGN: secrets never appear in output).
///
/// The user info ends at the FIRST `@`, as the driver reads it (a password may hold `/`, `?`
/// or `#`; a query may hold `@`, and cutting at the last one printed what followed it as
/// the host: review 16). A host part that still holds an `@` (a password with an `@` of its
/// own) is cut to what follows its last one. Parameters are looked for in what follows the
/// first `?` of the rest, or, when the user info swallowed that `?`, in its `&`-separated
/// parts.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_loose(url);
    };
    let (user, rest) = match rest.split_once('@') {
        Some((userinfo, rest)) => (Some(userinfo.split(':').next().unwrap_or_default()), rest),
        None => (None, rest),
    };
    let host_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (host, tail) = rest.split_at(host_end);
    let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
    let rest = redact_query(&format!("{host}{tail}"));
    match user {
        Some(user) => format!("{scheme}://{user}@{rest}"),
        None => format!("{scheme}://{rest}"),
    }
}

/// A value that is not a URL fence reads, as it may be echoed in the error that says so
/// (review 18): a missing or mangled scheme (`postgresql:/app:pw@host`, `admin:pw@host`)
/// keeps its user info up to its first `:`, and a host part that still holds an `@` what
/// follows its last; libpq's `keyword=value` form (`host=db password=pw`, `password = 'p w'`)
/// loses every password; and so do URL parameters.
fn redact_loose(text: &str) -> String {
    let text = match text.split_once('@') {
        Some((userinfo, rest)) if userinfo.contains(':') => {
            let host_end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (host, tail) = rest.split_at(host_end);
            let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
            format!(
                "{}@{host}{tail}",
                userinfo.split(':').next().unwrap_or_default()
            )
        }
        _ => text.to_owned(),
    };
    redact_keywords(&redact_query(&text))
}

/// Whether a parameter or keyword names a secret: `password`, and `sslpassword` (a client
/// key's passphrase), whatever the case.
fn is_secret_name(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with("password")
}

/// `text` without its `keyword=value` pairs whose keyword is a secret, read as libpq reads a
/// connection string: pairs separated by any whitespace, spaces allowed around `=`, a value in
/// single quotes or not, a backslash escaping the character after it in either (review 19:
/// a tab, `\'` in quotes and `\ ` outside them each let part of a password through). When a
/// pair was left out, the rest is joined with single spaces.
fn redact_keywords(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let space = |i: usize| chars.get(i).is_some_and(char::is_ascii_whitespace);
    let mut kept: Vec<String> = Vec::new();
    let mut dropped = false;
    let mut i = 0;
    while i < chars.len() {
        if space(i) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && chars[i] != '=' && !space(i) {
            i += 1;
        }
        let keyword: String = chars[start..i].iter().collect();
        let mut j = i;
        while space(j) {
            j += 1;
        }
        if chars.get(j) != Some(&'=') {
            // A word of its own, not a pair.
            kept.push(keyword);
            continue;
        }
        j += 1;
        while space(j) {
            j += 1;
        }
        let quoted = chars.get(j) == Some(&'\'');
        if quoted {
            j += 1;
        }
        while j < chars.len() {
            match chars[j] {
                '\\' => j += 2,
                '\'' if quoted => {
                    j += 1;
                    break;
                }
                _ if !quoted && space(j) => break,
                _ => j += 1,
            }
        }
        let end = j.min(chars.len());
        if is_secret_name(&keyword) {
            dropped = true;
        } else {
            kept.push(chars[start..end].iter().collect());
        }
        i = end;
    }
    if dropped {
        kept.join(" ")
    } else {
        text.to_owned()
    }
}

/// `text` without its `password` parameters: those after its first `?`, or, without one, its
/// `&`-separated parts after the first.
fn redact_query(text: &str) -> String {
    let (head, query, sep) = match text.split_once('?') {
        Some((head, query)) => (head, query, "?"),
        None => match text.split_once('&') {
            Some((head, query)) => (head, query, "&"),
            None => return text.to_owned(),
        },
    };
    // The driver percent-decodes parameter names too (`pass%77ord=` is the password: review
    // 14); a name that does not decode cannot be told apart, and is left out as well.
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(name, _)| name);
            percent_decode(name).is_some_and(|name| !is_secret_name(&name))
        })
        .collect();
    if kept.is_empty() {
        head.to_owned()
    } else {
        format!("{head}{sep}{}", kept.join("&"))
    }
}

/// Whether a URL carries a password (then `--format env` leaves FENCE_STORE out).
pub fn url_has_password(url: &str) -> bool {
    redact_url(url) != url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_keys() {
        let u = ObjectUrl::parse("s3://bkt/a/b/", false).unwrap().unwrap();
        assert_eq!(
            (u.service, u.bucket.as_str(), u.key.as_str()),
            (Service::S3, "bkt", "a/b")
        );
        assert_eq!(u.join("leases"), "a/b/leases");
        assert!(ObjectUrl::parse("gs://bkt", true).unwrap().is_err());
        assert!(ObjectUrl::parse("gs://b/x", true).unwrap().is_err());
        assert!(ObjectUrl::parse("gs://bkt/a//b", true).unwrap().is_err());
        assert!(ObjectUrl::parse("gs://bkt/dir/", true).unwrap().is_err());
        assert!(ObjectUrl::parse("gs://bkt/dir/", false).unwrap().is_ok());
        assert!(ObjectUrl::parse("s3://bkt/a\nb", true).unwrap().is_err());
        let long = format!("s3://bkt/{}", "k".repeat(769));
        assert!(ObjectUrl::parse(&long, true).unwrap().is_err());
        assert!(ObjectUrl::parse(&long[..long.len() - 1], true)
            .unwrap()
            .is_ok());
        let f = ObjectUrl::parse("file:///tmp/d/obj", true)
            .unwrap()
            .unwrap();
        assert_eq!((f.bucket.as_str(), f.key.as_str()), ("/tmp/d", "obj"));
        for own in [".obj.fence.json", ".obj.fence.next.json", ".obj.fence.lock"] {
            assert!(ObjectUrl::parse(&format!("file:///tmp/d/{own}"), true)
                .unwrap()
                .is_err());
        }
        assert!(ObjectUrl::parse("file:///tmp/d/obj.fence.json", true)
            .unwrap()
            .is_ok());
        for bad in [
            "file:///tmp/d/obj/",
            "file:///tmp/d/",
            "file:///tmp/d/obj/.",
            "file:///tmp/d/a%00b",
            "file:///tmp/d%0A/obj",
        ] {
            assert!(ObjectUrl::parse(bad, true).unwrap().is_err(), "{bad}");
        }
        let fits = format!("file:///tmp/d/{}", "n".repeat(MAX_FILE_NAME_BYTES));
        assert!(ObjectUrl::parse(&fits, true).unwrap().is_ok());
        assert!(ObjectUrl::parse(&format!("{fits}n"), true)
            .unwrap()
            .is_err());
        assert!(ObjectUrl::parse("postgres://x", true).is_none());
    }

    #[test]
    fn redaction() {
        assert_eq!(
            redact_url("postgres://u:s3cret@h:5432/db?sslmode=require&password=x"),
            "postgres://u@h:5432/db?sslmode=require"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://h/db?password=x"), "postgres://h/db");
        assert!(url_has_password("postgres://u:p@h/db"));
        assert_eq!(
            redact_url("postgres://u:SEC/RET?PW@h:1/db"),
            "postgres://u@h:1/db"
        );
        assert!(!url_has_password("file:///tmp/x"));
        // The driver decodes parameter names: these are passwords too (review 14).
        assert_eq!(
            redact_url("postgres://h/db?pass%77ord=x&sslmode=disable&PassWord=y&%ZZ=z"),
            "postgres://h/db?sslmode=disable"
        );
        // An `@` in the query is not the end of the user info (review 16), and a password's
        // own `@` is not the host's.
        assert_eq!(
            redact_url("postgres://fence@h:1/db?password=pre@secret-part"),
            "postgres://fence@h:1/db"
        );
        assert_eq!(
            redact_url("postgres://fence@h:1/db?user=alice@corp&password=hunter2"),
            "postgres://fence@h:1/db?user=alice@corp"
        );
        // (Without user info, the driver takes the query's first `@` for its end.)
        assert_eq!(
            redact_url("postgres://h:1/db?user=alice@corp&password=hunter2"),
            "postgres://h@corp"
        );
        assert_eq!(redact_url("postgres://u:p@ss@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact_url("postgres://u@h/db?sslpassword=x&sslmode=require"),
            "postgres://u@h/db?sslmode=require"
        );
        // Values that are not URLs fence reads, as an error echoes them (review 18).
        assert_eq!(
            redact_url("host=db port=1 password=pw dbname=app"),
            "host=db port=1 dbname=app"
        );
        assert_eq!(
            redact_url("user=app password = 'p w x' host=db"),
            "user=app host=db"
        );
        assert_eq!(redact_url("password =pw host=db"), "host=db");
        assert_eq!(redact_url("password= pw host=db"), "host=db");
        assert_eq!(
            redact_url("postgresql:/app:pw@h:1/app"),
            "postgresql@h:1/app"
        );
        assert_eq!(
            redact_url("admin:pw@127.0.0.1:9000"),
            "admin@127.0.0.1:9000"
        );
        assert_eq!(redact_url("sslpassword"), "sslpassword");
        // As libpq reads them: any whitespace, escapes in and out of quotes (review 19).
        assert_eq!(
            redact_url("host=h\tpassword=pw dbname=app"),
            "host=h dbname=app"
        );
        assert_eq!(
            redact_url("user=app password='a b\\' secret' host=db"),
            "user=app host=db"
        );
        assert_eq!(
            redact_url("user=app password=a\\ secret host=db"),
            "user=app host=db"
        );
        assert_eq!(
            redact_url("postgresql:/app:p@secret@h:1/app"),
            "postgresql@h:1/app"
        );
        assert_eq!(redact_url("no secret here"), "no secret here");
    }
}
