//! TODO: module `deadline` (being written).
