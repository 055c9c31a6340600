//! Installing fence: the Debian package, `cargo install` from a clone, `fence bench`.

mod bench;
mod deb;
mod install;
mod start;
