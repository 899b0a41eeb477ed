//! How fast a rollout goes and how it judges new replicas by their traffic; pure, no I/O.
//!
//! [`surge`]: how many new replicas start at once (`[proxy.rollout] max_surge`), and the waves
//! a rollout of N replicas takes. [`judge`]: whether a new replica's own Envoy numbers (5xx
//! answers, resets, upstream connect failures) are worse than its old siblings' by more than
//! chance, with a Wilson score bound so that a handful of requests never decides. [`canary`]:
//! holding a few new replicas beside the old ones and deciding from their numbers.

pub mod canary;
pub mod judge;
pub mod surge;

pub use canary::Canary;
pub use judge::{Sample, Thresholds, Verdict};
pub use surge::MaxSurge;
