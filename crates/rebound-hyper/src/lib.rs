//! rebound's transport and ready-made client.
//!
//! TODO: being written.
