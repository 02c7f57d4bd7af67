//! TODO: the fault server (being written).
