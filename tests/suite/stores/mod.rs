//! The coordinators themselves: the lease contract on every store, token monotonicity under churn and crashes, the directory store's accidents, credentials.

mod churn;
mod contract;
mod file_store;
mod new_store;
mod pgpass;
mod restart;
