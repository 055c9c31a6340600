//! `fence renew`: extend a lease still held with this owner and token.

use serde_json::{Map, Value};

use crate::cli::RenewArgs;
use crate::cmd::acquire::LeaseJson;
use crate::cmd::Context;
use crate::coordinator::{Lease, LeaseRef};
use crate::error::Error;
use crate::output::{self, Report};
use crate::time;

pub struct Renewed {
    lease: Lease,
}

pub async fn run(args: RenewArgs, ctx: &Context) -> Result<Renewed, Error> {
    let lease = LeaseRef {
        resource: args.lease.resource,
        owner: args.lease.owner,
        token: args.lease.token,
    };
    let coordinator = ctx.coordinator().await?;
    let lease = coordinator.renew_in_time(&lease, args.ttl).await?;
    Ok(Renewed { lease })
}

impl Report for Renewed {
    fn json(&self) -> Map<String, Value> {
        output::fields(&LeaseJson::of(&self.lease, None))
    }

    fn human(&self) -> String {
        let lease = &self.lease;
        format!(
            "renewed `{}` with token {}; {} ({})\n",
            lease.resource,
            lease.token,
            time::expires_in(lease.expires_in_ms),
            time::rfc3339(lease.expires_at_ms),
        )
    }
}
