//! The README's stack table is the client's stack as built: the default
//! client runs the rows not marked off by default (or "when configured"),
//! in order, and a client with every option on runs every row.

use std::time::Duration;

use rebound::fallback::{FallbackLayer, Route};
use rebound::grpc::RetryableMethods;
use rebound::hedge::HedgePolicy;
use rebound::reconcile::{Check, OperationId, ReconcileLayer};
use rebound::{BoxError, Client};

/// The table's rows: (layer name, optional).
fn readme_rows() -> Vec<(String, bool)> {
    let readme = include_str!("../README.md");
    let start = readme
        .find("## The layers, outer to inner")
        .expect("the README has its stack table");
    readme[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| layer |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cell = l.split('|').nth(1)?.trim();
            if cell == "transport" {
                return None;
            }
            let name = cell.split('`').nth(1)?.to_owned();
            let name = if cell.contains("(holding)") {
                format!("{name} (holding)")
            } else {
                name
            };
            let optional = cell.contains("off by default") || cell.contains("when configured");
            Some((name, optional))
        })
        .collect()
}

#[test]
fn the_default_client_runs_the_table_without_its_optional_rows() {
    let rows = readme_rows();
    assert!(rows.len() > 15, "{rows:?}");
    let client = Client::builder().build().unwrap();
    let expected: Vec<&str> = rows
        .iter()
        .filter(|(_, optional)| !optional)
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(client.layers(), expected.as_slice());
}

#[test]
fn a_client_with_every_option_runs_every_row() {
    let rows = readme_rows();
    let check = tower::service_fn(|_id: OperationId| async {
        Ok::<_, BoxError>(Check::<http::Response<rebound::ClientBody>>::NotFound)
    });
    let client = Client::builder()
        .concurrency_limit(8)
        .fallback(FallbackLayer::new([Route::base_url("https://b.example")]))
        .grpc_retryable_methods(RetryableMethods::all())
        .hedge(HedgePolicy::fixed(Duration::from_millis(50)))
        .reconcile(ReconcileLayer::new(check))
        .deadline_header(http::HeaderName::from_static("x-budget-ms"))
        .client_throttle(rebound::throttle::ClientThrottle::default())
        .build()
        .unwrap();
    let expected: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(client.layers(), expected.as_slice());
}
