//! TODO: module `retry_after` (being written).
