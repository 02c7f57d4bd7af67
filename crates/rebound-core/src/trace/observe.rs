//! State annotations other layers leave so the trace layers (and metrics)
//! can show state they do not own. They are part of the shared vocabulary
//! and live in [`crate::annotations`]; re-exported here for convenience.

pub use crate::annotations::{BudgetLeft, GateWait, LimiterState};
