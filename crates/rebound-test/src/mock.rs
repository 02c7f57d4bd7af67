//! TODO: the mock service (being written).
