//! `fence release`: free a lease held with this owner and token (idempotent).

use serde_json::{json, Map, Value};

use crate::cli::ReleaseArgs;
use crate::cmd::Context;
use crate::coordinator::{LeaseRef, Released};
use crate::error::Error;
use crate::output::Report;

pub struct ReleaseReport {
    lease: LeaseRef,
    released: Released,
}

pub async fn run(args: ReleaseArgs, ctx: &Context) -> Result<ReleaseReport, Error> {
    let lease = LeaseRef {
        resource: args.lease.resource,
        owner: args.lease.owner,
        token: args.lease.token,
    };
    let coordinator = ctx.coordinator().await?;
    let released = coordinator.release(&lease).await?;
    Ok(ReleaseReport { lease, released })
}

impl Report for ReleaseReport {
    fn json(&self) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("resource".into(), json!(self.lease.resource));
        map.insert("owner".into(), json!(self.lease.owner));
        map.insert("token".into(), json!(self.lease.token));
        map.insert(
            "already_released".into(),
            json!(self.released == Released::Already),
        );
        map
    }

    fn human(&self) -> String {
        let lease = &self.lease;
        match self.released {
            Released::Now => format!("released `{}` (token {})\n", lease.resource, lease.token),
            Released::Already => format!(
                "`{}` was already released (token {}); nothing to do\n",
                lease.resource, lease.token
            ),
        }
    }
}
