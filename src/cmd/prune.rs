//! `fence prune`: deletes old lease history and dead waiters' rows, never a lease record, so
//! every resource's token counter stays (DESIGN I1).

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::PruneArgs;
use crate::cmd::Context;
use crate::config::StoreKind;
use crate::coordinator::{PruneQuery, Pruned};
use crate::error::Error;
use crate::output::{self, Report};
use crate::time;

pub struct PruneReport {
    pruned: Pruned,
    keep: u32,
    older_than: std::time::Duration,
    store: String,
}

pub async fn run(args: PruneArgs, ctx: &Context) -> Result<PruneReport, Error> {
    if let Some(StoreKind::File(dir)) = ctx.store.as_ref().map(|s| &s.kind) {
        return Err(Error::usage(
            format!(
                "the directory store `{}` prunes its history by itself: nothing for `fence prune` to do",
                dir.display()
            ),
            "a resource's log is cut to its last 10,000 events once it passes 4 MiB; `fence prune` is for PostgreSQL stores",
        ));
    }
    let coordinator = ctx.coordinator().await?;
    // A typo'd --schema or store (FENCE_SCHEMA missing from a crontab) must fail loudly, not
    // report "nothing to prune" while the real store's history keeps growing.
    coordinator.require_existing().await?;
    let pruned = coordinator
        .prune(&PruneQuery {
            resources: &args.resources,
            older_than: args.older_than,
            keep: args.keep,
        })
        .await?;
    Ok(PruneReport {
        pruned,
        keep: args.keep,
        older_than: args.older_than,
        store: ctx.store_display().unwrap_or_default().to_owned(),
    })
}

impl Report for PruneReport {
    fn json(&self) -> Map<String, Value> {
        #[derive(Serialize)]
        struct Json {
            events_deleted: u64,
            waiters_deleted: u64,
            resources: u64,
            before: Option<String>,
            keep: u32,
        }
        output::fields(&Json {
            events_deleted: self.pruned.events,
            waiters_deleted: self.pruned.waiters,
            resources: self.pruned.resources,
            before: self.pruned.before_ms.map(time::rfc3339),
            keep: self.keep,
        })
    }

    fn human(&self) -> String {
        let Some(before) = self.pruned.before_ms else {
            return format!(
                "store `{}` has no records yet: nothing to prune\n",
                self.store
            );
        };
        let kept = match self.keep {
            0 => String::new(),
            n => format!(", keeping the last {n} of each"),
        };
        format!(
            "deleted {} older than {} (before {}) of {}{kept}, and {} of dead waiters, in store `{}`; token counters untouched\n",
            output::count(self.pruned.events, "event", "events"),
            time::duration(self.older_than),
            time::rfc3339(before),
            output::count(self.pruned.resources, "resource", "resources"),
            output::count(self.pruned.waiters, "row", "rows"),
            self.store
        )
    }
}
