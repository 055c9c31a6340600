//! The on-call view: `fence log`, `fence inspect` pages, `fence metrics`, `fence prune`.

mod bounded_memory;
mod expiries;
mod hung_holders;
mod inspect_pages;
mod late_events;
mod late_events_review;
mod log;
mod metrics;
mod prune;
mod run_events;
mod screen;
