//! TODO: module `collect` (being written).
