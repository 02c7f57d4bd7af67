//! The fault matrix of issue 5, as one table-driven spec: every fault ×
//! GET, POST with idempotency keys off, POST with a key, through the
//! ready-made client over real sockets. The table itself is `MATRIX` in
//! `tests/support/mod.rs`; this test runs it and checks, per cell, the
//! attempts (client and server side), how the call ended (final status, or
//! error kind and stage), why the loop stopped, the idempotency key on the
//! wire, that the call ended within its deadline plus a margin, that no
//! concurrency permit was left, and, at the end, that no task was left.

mod support;

use support::{assert_no_task_left, render, run_matrix, Secrets};

#[tokio::test]
async fn every_fault_for_get_post_without_key_and_post_with_key() {
    let reports = run_matrix(Secrets::None).await;
    println!("{}", render(&reports));
    assert_eq!(reports.len(), 36);
    assert_no_task_left().await;
}
