//! `fence doctor`: finds the set-ups that silently weaken fence's guarantees before they cost a
//! token — an asynchronous standby that can be promoted with the last grants missing, a role
//! that owns fence's schema (and so can bypass `protect`), a pooler between fence and the
//! server, a directory store or `file://` objects on a network filesystem, `file://` objects in
//! a directory every local user may write — and says what each means and how to fix it. It
//! changes nothing. Each finding is `ok`, `warn` or `fail`; any `fail` makes the exit
//! status 2 (a configuration problem).
//!
//! Here: the findings, the report and the entry point. The checks, by subject: `host.rs` (this
//! host), `postgres.rs` (a PostgreSQL server), `schema.rs` (fence's schema there and the
//! connecting role's rights), `directory.rs` (the directory store and `file://` object
//! directories), `object.rs` (S3 and GCS object stores).

mod directory;
mod host;
mod object;
mod postgres;
mod schema;

use std::path::Path;

use serde::Serialize;

use crate::cli::{DoctorArgs, Format};
use crate::cmd::Context;
use crate::config::StoreKind;
use crate::error::Error;
use crate::exit::Exit;
use crate::fenced::TargetSpec;
use crate::output::Output;

use directory::{directory, object_directory};
use host::{containment, run_cgroup};
use object::{high_water, object_store, preconditions};
use postgres::postgres;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
enum Severity {
    Ok,
    Warn,
    Fail,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Warn => "warn",
            Severity::Fail => "fail",
        }
    }
}

/// One finding, as JSON shows it (`findings[]`: these keys in this order, `severity` `ok`,
/// `warn` or `fail`).
#[derive(Serialize)]
struct Finding {
    /// Where: `store` or the target's URL (without password).
    subject: String,
    /// A stable name for the check, e.g. `postgres.replication`.
    check: &'static str,
    severity: Severity,
    message: String,
    /// What to do about it (empty when nothing needs doing).
    fix: String,
}

/// Collects findings for one subject.
struct Findings<'a> {
    subject: &'a str,
    all: &'a mut Vec<Finding>,
}

impl Findings<'_> {
    fn add(&mut self, check: &'static str, severity: Severity, message: String, fix: &str) {
        self.all.push(Finding {
            subject: self.subject.to_owned(),
            check,
            severity,
            message,
            fix: fix.to_owned(),
        });
    }
}

/// Which role a PostgreSQL database plays.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Coordinator,
    Target,
}

pub async fn run(args: DoctorArgs, ctx: &Context, out: &Output) -> Exit {
    let mut all = Vec::new();
    if let Err(err) = check_all(&args, ctx, &mut all).await {
        return out.error("doctor", ctx.store_display(), &err);
    }
    report(&all, ctx, out)
}

async fn check_all(args: &DoctorArgs, ctx: &Context, all: &mut Vec<Finding>) -> Result<(), Error> {
    containment(&mut Findings {
        subject: "host",
        all,
    });
    run_cgroup(&mut Findings {
        subject: "host",
        all,
    });
    if let Some(store) = &ctx.store {
        let mut findings = Findings {
            subject: "store",
            all,
        };
        match &store.kind {
            StoreKind::Postgres(url) => {
                postgres(
                    url,
                    &store.display,
                    &ctx.schema,
                    Role::Coordinator,
                    &mut findings,
                )
                .await
            }
            StoreKind::File(dir) => directory(dir, &mut findings),
            StoreKind::Object(url) => {
                object_store(&store.display, &mut findings);
                preconditions(url, &url.key, &mut findings).await;
                high_water(url, &mut findings).await;
            }
        }
    }
    if let Some(limit) = args.held_over {
        held_over(
            ctx,
            limit,
            &mut Findings {
                subject: "store",
                all,
            },
        )
        .await;
    }
    for target in &args.targets {
        let spec = TargetSpec::resolve(target)?;
        let mut findings = Findings {
            subject: &spec.display,
            all,
        };
        match &spec.object {
            None => {
                postgres(
                    &spec.url,
                    &spec.display,
                    &ctx.schema,
                    Role::Target,
                    &mut findings,
                )
                .await
            }
            Some(url) if url.service == crate::object::Service::File => {
                object_directory(Path::new(&url.bucket), &mut findings)
            }
            Some(url) => {
                object_store(&spec.display, &mut findings);
                let dir = url
                    .key
                    .rsplit_once('/')
                    .map_or("", |(dir, _)| dir)
                    .to_owned();
                preconditions(url, &dir, &mut findings).await;
            }
        }
    }
    Ok(())
}

/// `--held-over`: each live lease granted longer than `limit` ago, by the store's clock.
async fn held_over(ctx: &Context, limit: std::time::Duration, findings: &mut Findings<'_>) {
    const CHECK: &str = "leases.held_over";
    let over = crate::time::duration(limit);
    let held = async {
        let coordinator = ctx.coordinator().await?;
        coordinator.require_existing().await?;
        let query = crate::coordinator::InspectQuery {
            state: Some(crate::coordinator::State::Held),
            ..Default::default()
        };
        Ok::<_, Error>(coordinator.inspect_query(&query).await?.views)
    };
    let views = match held.await {
        Ok(views) => views,
        Err(err) => {
            findings.add(
                CHECK,
                Severity::Fail,
                format!("cannot read the store's leases: {err}"),
                &err.hint(),
            );
            return;
        }
    };
    let limit_ms = i64::try_from(limit.as_millis()).unwrap_or(i64::MAX);
    let mut long = 0;
    for v in &views {
        let (Some(acquired), Some(expires), Some(left)) =
            (v.acquired_at_ms, v.expires_at_ms, v.expires_in_ms)
        else {
            continue;
        };
        // The store's now, from its own answer: the expiry less what was left of it.
        let held_ms = expires.saturating_sub(left).saturating_sub(acquired);
        if held_ms <= limit_ms {
            continue;
        }
        long += 1;
        let resource = crate::error::resource_word(&v.resource);
        findings.add(
            CHECK,
            Severity::Warn,
            format!(
                "`{}` has been held by `{}` (token {}) for {}, since {}: longer than --held-over {over}",
                v.resource,
                v.owner.as_deref().unwrap_or("?"),
                v.token.unwrap_or_default(),
                crate::time::span(held_ms),
                crate::time::rfc3339(acquired)
            ),
            &format!(
                "see what the holder is doing: `fence log {resource}` shows its run (host, pid, process group); bound such jobs with `fence run --max-time`"
            ),
        );
    }
    if long == 0 {
        findings.add(
            CHECK,
            Severity::Ok,
            format!(
                "no lease held longer than {over} ({} held now)",
                views.len()
            ),
            "",
        );
    }
}

fn report(all: &[Finding], ctx: &Context, out: &Output) -> Exit {
    let failed = all.iter().any(|f| f.severity == Severity::Fail);
    let count = |s: Severity| all.iter().filter(|f| f.severity == s).count();
    if out.format == Format::Json {
        #[derive(Serialize)]
        struct Json<'a> {
            findings: &'a [Finding],
            summary: Summary,
        }
        /// How many findings of each severity.
        #[derive(Serialize)]
        struct Summary {
            ok: usize,
            warn: usize,
            fail: usize,
        }
        let answer = Json {
            findings: all,
            summary: Summary {
                ok: count(Severity::Ok),
                warn: count(Severity::Warn),
                fail: count(Severity::Fail),
            },
        };
        out.json_answer(!failed, "doctor", ctx.store_display(), &answer);
    } else if !out.quiet || failed {
        let mut table = crate::output::table();
        table.set_header(["", "WHERE", "CHECK", "FINDING", "FIX"]);
        for f in all {
            table.add_row([
                f.severity.as_str(),
                f.subject.as_str(),
                f.check,
                f.message.as_str(),
                f.fix.as_str(),
            ]);
        }
        crate::output::print_line(&crate::output::fit(&crate::terminal::terminal_safe(
            &format!(
                "{}\n{} ok, {} warn, {} fail",
                crate::output::render(&table),
                count(Severity::Ok),
                count(Severity::Warn),
                count(Severity::Fail)
            ),
            true,
        )));
    }
    if failed {
        Exit::Usage
    } else {
        Exit::Success
    }
}
