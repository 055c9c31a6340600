//! `fence acquire`: take a lease and report its token (or the live holder, on busy).

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::AcquireArgs;
use crate::cmd::wait;
use crate::cmd::Context;
use crate::config::{StoreKind, StoreSpec};
use crate::coordinator::{Grant, Lease, LeaseRef};
use crate::error::{shell_quote, Error};
use crate::exit::Exit;
use crate::output::{self, Output, Report};
use crate::sys::random_u64;
use crate::time;
use crate::url::{redact_url, url_has_password};

pub struct Acquired {
    grant: Grant,
    /// Where the lease is, for `--format env` (later commands must reach the same store).
    store: Option<StoreSpec>,
    schema: String,
}

pub async fn run(args: AcquireArgs, ctx: &Context, out: &Output) -> Result<Acquired, Error> {
    if crate::sys::stdout_was_closed() {
        // The token would go nowhere, and the lease be held for its TTL by nobody.
        return Err(Error::usage(
            format!(
                "standard output is closed, so the token of `{}` could not be delivered; nothing was acquired",
                args.resource
            ),
            "give fence a standard output to print the grant on (e.g. `token=$(fence acquire R --format env)`), or use `fence run R -- COMMAND`",
        ));
    }
    let owner = args.owner.unwrap_or_else(default_owner);
    let coordinator = ctx.coordinator().await?;
    let grant = match args.above {
        // A recovery is asked once, never queued for (clap keeps --above from --wait).
        Some(above) => {
            coordinator
                .grant_in_time(&args.resource, &owner, args.ttl, Some(above))
                .await?
        }
        None => {
            wait::acquire(
                coordinator.as_ref(),
                &args.resource,
                &owner,
                args.ttl,
                args.wait,
                out,
            )
            .await?
        }
    };
    Ok(Acquired {
        grant,
        store: ctx.store.clone(),
        schema: ctx.schema.clone(),
    })
}

/// Acquires and prints the answer. A new lease whose answer could not be written to stdout
/// (a full disk, a closed pipe) is released again, since nobody saw its token, and the
/// command fails: a granted lease nobody knows of would block the resource until it expires.
pub async fn run_and_print(args: AcquireArgs, ctx: &Context, out: &Output) -> Exit {
    let op = "acquire";
    let acquired = match run(args, ctx, out).await {
        Ok(acquired) => acquired,
        Err(err) => return out.error(op, ctx.store_display(), &err),
    };
    let write_err = match out.try_success(op, ctx.store_display(), &acquired) {
        Ok(exit) => return exit,
        Err(err) => err,
    };
    let lease = &acquired.grant.lease;
    let (resource, token) = (&lease.resource, lease.token);
    let failure = if acquired.grant.reacquired {
        Error::OutcomeUnknown {
            message: format!("cannot write the answer to standard output: {write_err}; the lease on `{resource}` was reacquired and is still held with token {token}"),
            hint: "make standard output writable; the lease stays held until it expires or is released".into(),
            source: None,
        }
    } else {
        let lease_ref = LeaseRef {
            resource: resource.clone(),
            owner: lease.owner.clone(),
            token,
        };
        let released = match ctx.coordinator().await {
            Ok(coordinator) => coordinator.release(&lease_ref).await.map(|_| ()),
            Err(err) => Err(err),
        };
        match released {
            Ok(()) => Error::unavailable(
                format!("cannot write the answer to standard output: {write_err}; the lease on `{resource}` with token {token} was released again, since nobody saw its token"),
                "make standard output writable (a full disk? a closed pipe?) and retry",
            ),
            Err(err) => Error::OutcomeUnknown {
                message: format!("cannot write the answer to standard output: {write_err}, and releasing the lease it got failed: {err}"),
                hint: format!(
                    "the lease on `{resource}` (token {token}, owner `{}`) may stay held until it expires; `fence inspect {}` shows it",
                    lease.owner,
                    crate::error::resource_word(resource)
                ),
                source: None,
            },
        }
    };
    out.error(op, ctx.store_display(), &failure)
}

/// The JSON answer of `acquire` (with `reacquired`) and `renew` (without).
#[derive(Serialize)]
pub(crate) struct LeaseJson<'a> {
    resource: &'a str,
    owner: &'a str,
    token: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reacquired: Option<bool>,
    lease_expires_at: String,
    ttl_ms: i64,
}

impl LeaseJson<'_> {
    pub(crate) fn of(lease: &Lease, reacquired: Option<bool>) -> LeaseJson<'_> {
        LeaseJson {
            resource: &lease.resource,
            owner: &lease.owner,
            token: lease.token,
            reacquired,
            lease_expires_at: time::rfc3339(lease.expires_at_ms),
            ttl_ms: lease.ttl_ms,
        }
    }
}

/// `<hostname>/<pid>/<8 hex>`: unique per process, and readable in `inspect`.
pub fn default_owner() -> String {
    format!(
        "{}/{}/{:08x}",
        hostname(),
        std::process::id(),
        random_u64() as u32
    )
}

/// This machine's name (`localhost` when it has none fit to print).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && !h.chars().any(char::is_control) && h.len() <= 150)
        .unwrap_or_else(|| "localhost".into())
}

impl Report for Acquired {
    fn json(&self) -> Map<String, Value> {
        output::fields(&LeaseJson::of(
            &self.grant.lease,
            Some(self.grant.reacquired),
        ))
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

    fn env(&self) -> Option<String> {
        let lease = &self.grant.lease;
        let mut lines = format!(
            "export FENCE_RESOURCE={}\nexport FENCE_OWNER={}\nexport FENCE_TOKEN={}\n",
            shell_quote(&lease.resource),
            shell_quote(&lease.owner),
            lease.token
        );
        // Never the password (secrets are never printed), but never left out either: later
        // commands must reach the same store, or fail loudly there for want of a password.
        let store = self.store.as_ref()?;
        lines.push_str(&format!(
            "export FENCE_STORE={}\n",
            shell_quote(&redact_url(&store.url))
        ));
        if url_has_password(&store.url) {
            crate::terminal::warn(
                "FENCE_STORE is exported without its password: later commands read it from ~/.pgpass, PGPASSFILE, PGSERVICE or PGPASSWORD, as libpq does",
            );
        }
        if matches!(store.kind, StoreKind::Postgres(_)) {
            lines.push_str(&format!(
                "export FENCE_SCHEMA={}\n",
                shell_quote(&self.schema)
            ));
        }
        lines.push_str(&format!(
            "export FENCE_LEASE_EXPIRES_AT={}\n",
            shell_quote(&time::rfc3339(lease.expires_at_ms))
        ));
        Some(lines)
    }
}
