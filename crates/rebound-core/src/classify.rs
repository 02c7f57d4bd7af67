//! TODO: module `classify` (being written).
