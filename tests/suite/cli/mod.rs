//! The command line: its edges, generated completions and man pages, warnings, the JSON answers, error causes.

mod edges;
mod error_causes;
mod generated;
mod help;
mod review18;
mod warnings;
mod wire;
