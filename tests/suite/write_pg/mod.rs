//! Fenced writes to PostgreSQL targets: the transaction and row forms, write ids, faults on the wire, `protect` and `grant`, and what the target database is trusted with.

mod fenced_sql;
mod minted;
mod pgbouncer;
mod review14;
mod roles;
mod target_trust;
mod write;
mod write_faults;
mod write_ids;
