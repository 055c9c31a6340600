//! `fence renew`: extend a lease still held with this owner and token.

use serde_json::{json, Map, Value};

use crate::cli::RenewArgs;
use crate::cmd::Context;
use crate::coordinator::{Lease, LeaseRef};
use crate::error::Error;
use crate::output::Report;
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
    let lease = coordinator.renew(&lease, args.ttl).await?;
    Ok(Renewed { lease })
}

impl Report for Renewed {
    fn json(&self) -> Map<String, Value> {
        let lease = &self.lease;
        let mut map = Map::new();
        map.insert("resource".into(), json!(lease.resource));
        map.insert("owner".into(), json!(lease.owner));
        map.insert("token".into(), json!(lease.token));
        map.insert(
            "lease_expires_at".into(),
            json!(time::rfc3339(lease.expires_at_ms)),
        );
        map.insert("ttl_ms".into(), json!(lease.ttl_ms));
        map
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
