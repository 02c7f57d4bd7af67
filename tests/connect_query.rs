//! Issue 10, item 3: a CONNECT request whose URL has a path and a query
//! must not reach hyper-util, which would log both at WARN ("CONNECT
//! request stripping path"). It is refused before the transport, and the
//! query appears nowhere: not in any span or event at TRACE, not in the
//! error's `Display` or `Debug`.
//!
//! Alone in its test binary, with the capturing subscriber installed
//! before anything runs: tracing caches a callsite's interest
//! process-wide, so a test without a subscriber could hide hyper-util's
//! WARN from this one.

use std::time::Duration;

use http::{Method, Request};
use rebound::{Body, Client, ErrorKind, Sent};
use rebound_test::capture::Capture;
use rebound_test::fault::FaultServer;

const SECRET: &str = "k3y-Qw7r";

#[tokio::test]
async fn a_connect_query_is_refused_and_never_logged() {
    let capture = Capture::new();
    let _guard = capture.set_default();
    let outcomes = tokio::time::timeout(Duration::from_secs(20), async {
        let server = FaultServer::builder().start().await;
        let client = Client::builder().build().unwrap();

        // A plain request first, so the capture demonstrably sees
        // hyper-util's own events (otherwise "no secret" would prove
        // nothing).
        let res = client.get(server.url("/warm-up")).await.unwrap();
        assert_eq!(res.status(), 200);

        let mut outcomes = Vec::new();
        for target in [
            format!("/tunnel?api_key={SECRET}"),
            format!("/?api_key={SECRET}"),
        ] {
            let req = Request::builder()
                .method(Method::CONNECT)
                .uri(server.url(&target))
                .body(Body::empty())
                .unwrap();
            outcomes.push(client.send(req).await.map(|res| res.status()));
        }
        // Nothing reached the server but the warm-up.
        (outcomes, server.request_count())
    })
    .await
    .expect("test exceeded its time limit");
    let (outcomes, requests) = outcomes;

    assert!(
        capture
            .events()
            .iter()
            .any(|e| e.target.starts_with("hyper_util"))
            || capture
                .spans()
                .iter()
                .any(|s| s.target.starts_with("hyper_util")),
        "nothing captured from hyper_util"
    );
    assert_eq!(capture.count(SECRET), 0, "{}", capture.text());
    assert_eq!(capture.count("stripping path"), 0, "{}", capture.text());

    for outcome in outcomes {
        let err = outcome.expect_err("a CONNECT with a path or query is refused");
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
        assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
        assert_eq!(err.attempts(), 1, "not retried");
        let shown = format!("{err} | {err:?}");
        assert!(shown.contains("CONNECT"), "{shown}");
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(!shown.contains("api_key"), "{shown}");
    }
    assert_eq!(requests, 1, "nothing but the warm-up reached the server");
}
