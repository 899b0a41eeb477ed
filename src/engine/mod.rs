//! The container engine berth drives.

pub mod docker;

pub use docker::*;
