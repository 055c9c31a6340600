//! Former review findings. Each test is named after what it proves; the file says which review found it.

mod digests_and_bounds;
mod ids_prune_inspect;
mod ids_records_and_roles;
mod late_answers;
mod late_grants;
mod log_and_metrics;
mod pg_review;
mod pg_write_and_run;
mod reaper;
mod reaper_start_and_run_ids;
mod restored_objects;
mod restored_objects_history;
mod restored_objects_review;
mod review16;
mod review17;
mod review19;
mod review20;
mod review21;
mod review22;
mod review23;
mod review_history_and_keys;
mod review_on_call;
mod review_run_events;
mod trust;
