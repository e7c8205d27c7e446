//! orderly's tests of its changes to sled (vendor/sled/ORDERLY-PATCHES.md), in `tests/`, and
//! what they share: the shape of a tree read from its `Debug` print, and queue-like
//! workloads with their model. sled's own suites are beside them, as upstream wrote them
//! (README.md lists every adaptation).

pub mod shape;
pub mod workload;
