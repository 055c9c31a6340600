//! The documents users read: every shell line in the README and docs/ runs as written.

mod inventory;
mod mutants;
mod readme;
mod recipes;
mod walkthrough;
