//! Connection parameters resolved as libpq resolves them: the URL, then a service's
//! settings, then the `PG*` variables, then the defaults ([`ConnectParams`]).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

use crate::error::Error;
use crate::pg::{libpq_files, DEFAULT_CONNECT_TIMEOUT};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ssl {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// A PostgreSQL server to connect to, fully resolved from URL and environment.
pub struct ConnectParams {
    pub(super) config: Config,
    pub(super) ssl: Ssl,
    pub(super) root_cert: Option<PathBuf>,
    /// The URL without its password, for messages.
    pub display: String,
}

impl ConnectParams {
    /// Resolves a `postgres://` URL plus `PG*` fallbacks, without connecting.
    pub fn resolve(url: &str, display: &str) -> Result<ConnectParams, Error> {
        let (url, params) = take_ssl_params(url);
        let mut config = Config::from_str(&url).map_err(|err| {
            Error::usage(
                format!("`{display}` is not a valid PostgreSQL URL: {err}"),
                "write it as postgres://user[:password]@host[:port]/database[?sslmode=require]",
            )
            .with_source(err)
        })?;
        // A service's settings come after the URL's and before the PG* variables (libpq).
        let service = match params.service.or_else(|| env("PGSERVICE")) {
            Some(name) => libpq_files::service(&name)?,
            None => libpq_files::Service::new(),
        };
        apply_service(&mut config, &service, display)?;
        let sslmode = params.sslmode.or_else(|| service.get("sslmode").cloned());
        let sslrootcert = params
            .sslrootcert
            .or_else(|| service.get("sslrootcert").cloned());
        if config.get_hosts().is_empty() {
            match env("PGHOST") {
                Some(hosts) => {
                    for host in hosts.split(',') {
                        add_host(&mut config, host);
                    }
                }
                None if Path::new("/var/run/postgresql").is_dir() => {
                    config.host_path("/var/run/postgresql");
                }
                None => {
                    config.host("localhost");
                }
            }
        }
        if config.get_ports().is_empty() {
            if let Some(port) = env("PGPORT") {
                let port = port.parse::<u16>().map_err(|err| {
                    Error::usage(
                        format!("PGPORT=`{port}` is not a port number"),
                        "set PGPORT to a number such as 5432, or put the port in the URL",
                    )
                    .with_source(err)
                })?;
                config.port(port);
            }
        }
        if config.get_user().is_none() {
            let user = env("PGUSER").or_else(os_user).ok_or_else(|| {
                Error::usage(
                    format!("`{display}` names no user, and PGUSER is unset"),
                    "put the user in the URL (postgres://user@host/db) or set PGUSER",
                )
            })?;
            config.user(&user);
        }
        if config.get_dbname().is_none() {
            if let Some(db) = env("PGDATABASE") {
                config.dbname(&db);
            }
        }
        if config.get_password().is_none() {
            if let Some(password) = env("PGPASSWORD").or_else(|| password_file(&config)) {
                config.password(password);
            }
        }
        if config.get_connect_timeout().is_none() {
            let timeout = env("PGCONNECT_TIMEOUT")
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&secs| secs > 0)
                .map_or(DEFAULT_CONNECT_TIMEOUT, Duration::from_secs);
            config.connect_timeout(timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("fence");
        }
        let sslmode = sslmode.or_else(|| env("PGSSLMODE"));
        let ssl = match sslmode.as_deref() {
            None | Some("prefer") | Some("allow") => Ssl::Prefer,
            Some("disable") => Ssl::Disable,
            Some("require") => Ssl::Require,
            Some("verify-ca") => Ssl::VerifyCa,
            Some("verify-full") => Ssl::VerifyFull,
            Some(other) => {
                return Err(Error::usage(
                    format!("sslmode `{other}` is not one PostgreSQL knows"),
                    "use disable, prefer, require, verify-ca or verify-full",
                ))
            }
        };
        // libpq does not use TLS on unix sockets; neither do we.
        let ssl = if config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, Host::Unix(_)))
        {
            Ssl::Disable
        } else {
            ssl
        };
        let root_cert = match ssl {
            Ssl::VerifyCa | Ssl::VerifyFull => {
                let path = sslrootcert
                    .or_else(|| env("PGSSLROOTCERT"))
                    .map(PathBuf::from)
                    .or_else(|| {
                        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".postgresql/root.crt"))
                    })
                    .ok_or_else(|| {
                        Error::usage(
                            "sslmode verify-ca/verify-full needs a CA certificate and none is configured",
                            "add `sslrootcert=/path/to/ca.pem` to the URL or set PGSSLROOTCERT",
                        )
                    })?;
                Some(path)
            }
            _ => None,
        };
        Ok(ConnectParams {
            config,
            ssl,
            root_cert,
            display: display.to_owned(),
        })
    }

    /// The first port the connection tries (`None`: the default, 5432).
    pub fn port(&self) -> Option<u16> {
        self.config.get_ports().first().copied()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn add_host(config: &mut Config, host: &str) {
    if host.starts_with('/') {
        config.host_path(host);
    } else {
        config.host(host);
    }
}

/// The name of the user running fence, as libpq defaults `user` to it.
fn os_user() -> Option<String> {
    env("USER").or_else(|| env("LOGNAME")).or_else(|| {
        // SAFETY: getpwuid returns a pointer to static storage or null; we copy the name out
        // immediately and fence does not call getpw* from other threads.
        unsafe {
            let pw = libc::getpwuid(libc::getuid());
            if pw.is_null() || (*pw).pw_name.is_null() {
                return None;
            }
            std::ffi::CStr::from_ptr((*pw).pw_name)
                .to_str()
                .ok()
                .map(str::to_owned)
        }
    })
}

/// Splits `sslmode` and `sslrootcert` out of a URL's query (tokio-postgres rejects
/// `verify-full` and does not know `sslrootcert`).
fn take_ssl_params(url: &str) -> (String, UrlParams) {
    let mut params = UrlParams::default();
    let Some((head, query)) = url.split_once('?') else {
        return (url.to_owned(), params);
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslmode", value)) => params.sslmode = Some(decode(value)),
            Some(("sslrootcert", value)) => params.sslrootcert = Some(decode(value)),
            Some(("service", value)) => params.service = Some(decode(value)),
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        head.to_owned()
    } else {
        format!("{head}?{}", kept.join("&"))
    };
    (url, params)
}

/// URL parameters fence handles itself (the driver does not know them).
#[derive(Default)]
struct UrlParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    service: Option<String>,
}

/// Fills what the URL left out from a service's settings.
fn apply_service(
    config: &mut Config,
    service: &libpq_files::Service,
    display: &str,
) -> Result<(), Error> {
    if config.get_hosts().is_empty() {
        if let Some(hosts) = service.get("host") {
            for host in hosts.split(',') {
                add_host(config, host);
            }
        }
    }
    if config.get_ports().is_empty() {
        if let Some(port) = service.get("port") {
            let port = port.parse::<u16>().map_err(|err| {
                Error::usage(
                    format!("the service for `{display}` sets port `{port}`, which is not a port number"),
                    "fix the port in the service file",
                )
                .with_source(err)
            })?;
            config.port(port);
        }
    }
    if config.get_user().is_none() {
        if let Some(user) = service.get("user") {
            config.user(user);
        }
    }
    if config.get_dbname().is_none() {
        if let Some(db) = service.get("dbname") {
            config.dbname(db);
        }
    }
    if config.get_password().is_none() {
        if let Some(password) = service.get("password") {
            config.password(password.as_str());
        }
    }
    if config.get_connect_timeout().is_none() {
        if let Some(secs) = service
            .get("connect_timeout")
            .and_then(|v| v.parse::<u64>().ok())
        {
            config.connect_timeout(Duration::from_secs(secs.max(1)));
        }
    }
    if config.get_application_name().is_none() {
        if let Some(name) = service.get("application_name") {
            config.application_name(name);
        }
    }
    Ok(())
}

/// The password file's password for the first host (libpq tries each host in turn; fence
/// sends one password to all of them).
fn password_file(config: &Config) -> Option<String> {
    let host = match config.get_hosts().first()? {
        Host::Tcp(name) => name.clone(),
        Host::Unix(path) => path.display().to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user()?;
    let database = config.get_dbname().unwrap_or(user);
    libpq_files::password(&host, port, database, user)
}

fn decode(value: &str) -> String {
    crate::url::percent_decode(value).unwrap_or_else(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssl_params_are_split_out() {
        let (url, params) = take_ssl_params(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x&service=ops",
        );
        assert_eq!(url, "postgres://u@h/db?application_name=x");
        assert_eq!(params.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(params.sslrootcert.as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(params.service.as_deref(), Some("ops"));
    }
}
