//! `fence run`: containment of the command and its descendants, supervision, run ids, and waiting for a lease.

mod cgroup;
mod chains;
mod containment;
mod containment_review;
mod max_time;
mod paused_fence;
mod run_ids;
mod run_safety;
mod supervise;
mod waiting;
mod zombies;
