//! Sources turn input into IR values and know nothing of Docker.

pub mod eg;
pub mod file;
pub mod remote;
