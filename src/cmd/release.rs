//! `fence release`: free a lease held with this owner and token (idempotent).

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::ReleaseArgs;
use crate::cmd::Context;
use crate::coordinator::{LeaseRef, Released};
use crate::error::Error;
use crate::output::{self, Report};

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
        #[derive(Serialize)]
        struct Json<'a> {
            resource: &'a str,
            owner: &'a str,
            token: i64,
            already_released: bool,
        }
        output::fields(&Json {
            resource: &self.lease.resource,
            owner: &self.lease.owner,
            token: self.lease.token,
            already_released: self.released == Released::Already,
        })
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
