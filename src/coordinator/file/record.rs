//! The lease record (`leases/<name>.json`) and the two clocks it is judged by.
//!
//! Expiry never uses the wall clock (I7): a lease records its deadline on the kernel's
//! `CLOCK_BOOTTIME` (monotonic, counting suspend) together with the boot id; a lease from
//! an earlier boot has expired. The wall-clock instants in the records are for display only.

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::log::EventLine;
use crate::coordinator::Lease;
use crate::error::Error;

/// A lease record as stored in `leases/<name>.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Record {
    pub resource: String,
    pub owner: String,
    pub token: i64,
    pub acquired_at_ms: i64,
    pub renewed_at_ms: i64,
    /// Wall-clock estimate of the expiry, for display only.
    pub expires_at_ms: i64,
    pub ttl_ms: i64,
    pub released: bool,
    pub boot_id: String,
    /// The deadline on `CLOCK_BOOTTIME`, in nanoseconds: what decides expiry.
    pub expires_boot_ns: u64,
    /// How many changes the record has had (0: written by an older version).
    #[serde(default)]
    pub change: u64,
    /// The event of the last change, kept in the record until the next one: a change is
    /// written before its event is appended, and a process killed between the two leaves the
    /// log without it; the next operation on the resource appends it then
    /// (`FileCoordinator::catch_up`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<EventLine>,
}

/// "Now" on both clocks, read once per operation.
pub(super) struct Now {
    pub wall_ms: i64,
    pub boot_ns: u64,
}

impl Now {
    pub fn read() -> Result<Now, Error> {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Ok(Now {
            wall_ms,
            boot_ns: boottime_ns()?,
        })
    }
}

fn boottime_ns() -> Result<u64, Error> {
    crate::sys::host_boottime_ns().ok_or_else(|| {
        Error::internal(
            format!(
                "cannot read the monotonic clock: {}",
                io::Error::last_os_error()
            ),
            "the local directory store needs CLOCK_BOOTTIME (Linux)",
        )
    })
}

impl Record {
    /// A fresh grant of `token` to `owner`.
    pub fn grant(
        resource: &str,
        owner: &str,
        token: i64,
        ttl_ms: i64,
        now: &Now,
        boot_id: &str,
    ) -> Record {
        let mut record = Record {
            resource: resource.to_owned(),
            owner: owner.to_owned(),
            token,
            acquired_at_ms: now.wall_ms,
            renewed_at_ms: now.wall_ms,
            expires_at_ms: 0,
            ttl_ms,
            released: false,
            boot_id: String::new(),
            expires_boot_ns: 0,
            change: 0,
            event: None,
        };
        record.extend(now, boot_id, ttl_ms);
        record
    }

    /// Remaining lifetime in milliseconds (≤ 0: expired or released).
    pub fn expires_in_ms(&self, now: &Now, boot_id: &str) -> i64 {
        if self.released || self.boot_id != boot_id {
            return 0;
        }
        let left = i128::from(self.expires_boot_ns) - i128::from(now.boot_ns);
        i64::try_from(left.div_euclid(1_000_000)).unwrap_or(0)
    }

    pub fn is_live(&self, now: &Now, boot_id: &str) -> bool {
        !self.released && self.boot_id == boot_id && self.expires_boot_ns > now.boot_ns
    }

    pub fn lease(&self, now: &Now, boot_id: &str) -> Lease {
        Lease {
            resource: self.resource.clone(),
            owner: self.owner.clone(),
            token: self.token,
            acquired_at_ms: self.acquired_at_ms,
            renewed_at_ms: self.renewed_at_ms,
            expires_at_ms: self.expires_at_ms,
            expires_in_ms: self.expires_in_ms(now, boot_id),
            ttl_ms: self.ttl_ms,
        }
    }

    pub fn extend(&mut self, now: &Now, boot_id: &str, ttl_ms: i64) {
        self.renewed_at_ms = now.wall_ms;
        self.ttl_ms = ttl_ms;
        self.expires_at_ms = now.wall_ms.saturating_add(ttl_ms);
        self.boot_id = boot_id.to_owned();
        self.expires_boot_ns = now.boot_ns + u64::try_from(ttl_ms).unwrap_or(0) * 1_000_000;
        self.released = false;
    }
}
