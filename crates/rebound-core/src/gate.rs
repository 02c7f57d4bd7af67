//! TODO: module `gate` (being written).
