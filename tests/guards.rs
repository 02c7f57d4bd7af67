//! Size guards (DESIGN.md §13, "Guards"): what every request moves, held
//! to what it measures now, so that a change that makes it larger says so.
//!
//! Sizes are those of a 64-bit target.

use std::mem::size_of;

/// The client's response: 112 bytes of `http::Response` head, and the one
/// body wrapper (`StackBody<Incoming>`, 536 bytes): hyper's body (40), the
/// body timer (136: idle, rate and deadline state, one lazily boxed
/// `Sleep`), the trace's body watch (200), the request's name for errors
/// (112), the permit (16), the shutdown guard, the trace configuration and
/// the body-error mapping (8 each). It was 784 bytes with four nested
/// body wrappers (issue 19).
#[test]
#[cfg(target_pointer_width = "64")]
fn the_client_response_stays_small() {
    let response = size_of::<http::Response<rebound::ClientBody>>();
    assert!(
        response <= 648,
        "Response<ClientBody> is {response} bytes (bound: 648)"
    );
}
