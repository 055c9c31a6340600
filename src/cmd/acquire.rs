//! `fence acquire`: take a lease and report its token (or the live holder, on busy).

use serde_json::{json, Map, Value};

use crate::cli::AcquireArgs;
use crate::cmd::wait;
use crate::cmd::Context;
use crate::config::{redact_url, url_has_password, StoreKind};
use crate::error::{shell_quote, Error};
use crate::output::{Output, Report};
use crate::store::{random_u64, Grant};
use crate::time;

pub struct Acquired {
    grant: Grant,
}

pub async fn run(args: AcquireArgs, ctx: &Context, out: &Output) -> Result<Acquired, Error> {
    let owner = args.owner.unwrap_or_else(default_owner);
    let coordinator = ctx.coordinator().await?;
    let grant = wait::acquire(
        coordinator.as_ref(),
        &args.resource,
        &owner,
        args.ttl,
        args.wait,
        out,
    )
    .await?;
    Ok(Acquired { grant })
}

/// `<hostname>/<pid>/<8 hex>`: unique per process, and readable in `inspect`.
pub fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && !h.chars().any(char::is_control) && h.len() <= 150)
        .unwrap_or_else(|| "localhost".into());
    format!("{host}/{}/{:08x}", std::process::id(), random_u64() as u32)
}

impl Report for Acquired {
    fn json(&self) -> Map<String, Value> {
        let lease = &self.grant.lease;
        let mut map = Map::new();
        map.insert("resource".into(), json!(lease.resource));
        map.insert("owner".into(), json!(lease.owner));
        map.insert("token".into(), json!(lease.token));
        map.insert("reacquired".into(), json!(self.grant.reacquired));
        map.insert(
            "lease_expires_at".into(),
            json!(time::rfc3339(lease.expires_at_ms)),
        );
        map.insert("ttl_ms".into(), json!(lease.ttl_ms));
        map
    }

    fn human(&self) -> String {
        let lease = &self.grant.lease;
        let verb = if self.grant.reacquired {
            "reacquired"
        } else {
            "acquired"
        };
        format!(
            "{verb} `{}` with token {} as `{}`; {} ({})\n",
            lease.resource,
            lease.token,
            lease.owner,
            time::expires_in(lease.expires_in_ms),
            time::rfc3339(lease.expires_at_ms),
        )
    }

    fn env(&self, ctx: &Context) -> Option<String> {
        let lease = &self.grant.lease;
        let mut lines = format!(
            "export FENCE_RESOURCE={}\nexport FENCE_OWNER={}\nexport FENCE_TOKEN={}\n",
            shell_quote(&lease.resource),
            shell_quote(&lease.owner),
            lease.token
        );
        // Never the password (secrets are never printed), but never left out either: later
        // commands must reach the same store, or fail loudly there for want of a password.
        let store = ctx.store.as_ref()?;
        lines.push_str(&format!(
            "export FENCE_STORE={}\n",
            shell_quote(&redact_url(&store.url))
        ));
        if url_has_password(&store.url) {
            crate::output::warn(
                "FENCE_STORE is exported without its password: later commands read it from ~/.pgpass, PGPASSFILE, PGSERVICE or PGPASSWORD, as libpq does",
            );
        }
        if matches!(store.kind, StoreKind::Postgres(_)) {
            lines.push_str(&format!(
                "export FENCE_SCHEMA={}\n",
                shell_quote(&ctx.schema)
            ));
        }
        lines.push_str(&format!(
            "export FENCE_LEASE_EXPIRES_AT={}\n",
            shell_quote(&time::rfc3339(lease.expires_at_ms))
        ));
        Some(lines)
    }
}
