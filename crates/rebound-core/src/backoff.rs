//! TODO: module `backoff` (being written).
