//! TODO: module `idempotency` (being written).
