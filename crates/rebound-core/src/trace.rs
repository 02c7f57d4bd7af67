//! TODO: module `trace` (being written).
