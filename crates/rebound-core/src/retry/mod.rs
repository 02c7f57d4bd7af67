//! TODO: module `retry` (being written).
