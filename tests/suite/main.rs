//! fence's integration suite: one test binary, a module per feature.
//!
//! Every test runs the real `fence` binary against real services that `tests/run` starts
//! (PostgreSQL, PgBouncer, moto, LocalStack, fake-gcs-server), each in a store of its own
//! (a temp directory, a schema, a bucket prefix). Run it with `tests/run`; select a feature
//! with a nextest filter, e.g. `tests/run -E 'test(/^run::/)'`.

#[macro_use]
mod common;

mod cli;
mod docs;
mod doctor;
mod history;
mod model;
mod packaging;
mod regression;
mod run;
mod stores;
mod write_object;
mod write_pg;
