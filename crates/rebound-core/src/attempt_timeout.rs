//! TODO: module `attempt_timeout` (being written).
