//! An axum gateway whose handlers call a downstream through rebound, with
//! the caller's deadline carried all the way.
//!
//! Run: `cargo run --example axum_gateway` (loopback only, about a second).
//!
//! * `InboundDeadlineLayer` on the router reads the caller's `grpc-timeout`
//!   (and an `x-budget-ms` header) and makes it the deadline of everything
//!   the handler does: the `rebound::Client` call ends by then, whatever the
//!   client's own (longer) total timeout says.
//! * The client tells the downstream how long it has (`x-budget-ms`, set
//!   on every attempt to the time left).
//! * `/flaky` answers 503, 503, 200: the handler sees one success after
//!   three attempts; `/hang` never answers: the handler sees a `deadline`
//!   timeout at the caller's 300 ms.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use http::{HeaderName, Request, StatusCode};
use http_body_util::BodyExt;
use rebound::grpc::InboundDeadlineLayer;
use rebound::{Attempts, Body, Client};
use rebound_test::fault::{Action, FaultServer};
use tokio::time::Instant;

const BUDGET: HeaderName = HeaderName::from_static("x-budget-ms");

#[derive(Clone)]
struct Gateway {
    client: Client,
    downstream: String,
}

async fn call(State(gw): State<Gateway>, Path(what): Path<String>) -> (StatusCode, String) {
    let start = Instant::now();
    match gw.client.get(format!("{}/{what}", gw.downstream)).await {
        Ok(res) => (
            res.status(),
            format!(
                "downstream {} after {} attempt(s), {} ms",
                res.status().as_u16(),
                Attempts::of(res.extensions()),
                start.elapsed().as_millis()
            ),
        ),
        Err(e) => (
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "{e} (stage {}, {} attempt(s), {} ms)",
                e.timeout_stage().map_or("-", |s| s.as_str()),
                e.attempts(),
                start.elapsed().as_millis()
            ),
        ),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let downstream = FaultServer::builder()
        .route(
            "/flaky",
            [
                Action::status(503),
                Action::status(503),
                Action::status(200),
            ],
        )
        .route("/hang", [Action::never_respond()])
        .start()
        .await;

    let client = Client::builder()
        .total_timeout(Duration::from_secs(10))
        .deadline_header(BUDGET)
        .build()?;
    let app = Router::new()
        .route("/call/{what}", get(call))
        .with_state(Gateway {
            client,
            downstream: format!("http://{}", downstream.addr()),
        })
        .layer(InboundDeadlineLayer::new().header(BUDGET));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let gateway = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The caller does not retry the gateway's 504: one call per line below.
    let caller = Client::builder().max_attempts(1).build()?;
    for (path, timeout) in [("/call/flaky", "2S"), ("/call/hang", "300m")] {
        let req = Request::get(format!("{gateway}{path}"))
            .header("grpc-timeout", timeout)
            .body(Body::empty())?;
        let res = caller.send(req).await?;
        let status = res.status();
        let text = res.into_body().collect().await?.to_bytes();
        println!(
            "GET {path} (grpc-timeout: {timeout}) -> {} {}",
            status.as_u16(),
            String::from_utf8_lossy(&text)
        );
    }
    for r in downstream.requests_to("/hang") {
        println!(
            "downstream /hang was told it had {} ms",
            r.header("x-budget-ms").unwrap_or("?")
        );
    }
    Ok(())
}
