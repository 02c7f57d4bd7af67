//! TODO: module `cancel` (being written).
