//! TODO: module `limit` (being written).
