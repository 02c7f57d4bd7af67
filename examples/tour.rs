//! A tour of rebound's retry core, on real time, in a few seconds.
//!
//! The stack is the one of the README — retry, backoff, Retry-After,
//! classify — over a scripted in-process service (`rebound_test::mock`), and
//! a small probe between the retry loop and the layers below it prints one
//! line per attempt: the delay the loop chose before it and why
//! (`backoff` or the server's `retry_after`), the outcome and its verdict.
//!
//! ```text
//! cargo run --example tour
//! ```

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use rebound::{
    Attempt, Attempts, Backoff, BackoffLayer, ClassifyLayer, Deadline, Error, ErrorKind,
    HttpClassifier, Jitter, PreviousAttempt, RetryAfterLayer, RetryLayer, RetryPolicy, RetryStop,
    Verdict,
};
use rebound_test::mock::{MockService, Reply};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

/// Prints each attempt's outcome as the retry loop sees it.
#[derive(Clone, Debug)]
struct Probe<S>(S);

impl<S, B, R> Service<Request<B>> for Probe<S>
where
    S: Service<Request<B>, Response = Response<R>, Error = Error>,
    S::Future: Send + 'static,
{
    type Response = Response<R>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let attempt = Attempt::of(req.extensions());
        // The delay the retry loop chose before this attempt, and why.
        let waited = match req
            .extensions()
            .get::<PreviousAttempt>()
            .and_then(|p| p.delay)
        {
            Some(d) => format!("after {:>4} ms ({})", d.delay.as_millis(), d.source),
            None => "at once".to_owned(),
        };
        let fut = self.0.call(req);
        Box::pin(async move {
            let outcome = fut.await;
            let ext = match &outcome {
                Ok(res) => res.extensions(),
                Err(err) => err.extensions(),
            };
            let what = match &outcome {
                Ok(res) => res.status().to_string(),
                Err(err) => err.to_string(),
            };
            let verdict = Verdict::of(ext);
            println!("  attempt {attempt}, {waited:<28} {what:<26} {verdict}");
            outcome
        })
    }
}

#[derive(Clone, Copy, Debug)]
struct ProbeLayer;

impl<S> Layer<S> for ProbeLayer {
    type Service = Probe<S>;
    fn layer(&self, inner: S) -> Probe<S> {
        Probe(inner)
    }
}

async fn run(title: &str, mock: MockService, req: Request<Full<Bytes>>) {
    println!("\n== {title}");
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(4)))
        .layer(ProbeLayer)
        .layer(BackoffLayer::new(
            Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10))
                .jitter(Jitter::Full),
        ))
        .layer(RetryAfterLayer::new())
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(mock);
    let start = tokio::time::Instant::now();
    let outcome = svc.oneshot(req).await;
    let took = start.elapsed().as_secs_f64();
    match outcome {
        Ok(res) => {
            let attempts = Attempts::of(res.extensions());
            let stop = res.extensions().get::<RetryStop>().copied();
            let status = res.status();
            let body = res.into_body().collect().await.map(|b| b.to_bytes());
            let len = body.map(|b| b.len()).unwrap_or(0);
            print!("  => {status} after {attempts} attempt(s) in {took:.2} s, body {len} bytes");
            match stop {
                Some(stop) => println!(", stopped: {stop}"),
                None => println!(),
            }
        }
        Err(err) => println!(
            "  => error after {} attempt(s) in {took:.2} s: {err} (stopped: {})",
            err.attempts(),
            err.retry_stop().map_or("-", |s| s.as_str())
        ),
    }
}

fn request(method: Method, path: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(format!("http://tour.example{path}"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("a valid request")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    println!("rebound tour: retry core over a scripted service (real time)");

    run(
        "GET: 503, then 429 with Retry-After: 1, then 200",
        MockService::new()
            .respond(Reply::code(503).body("busy"))
            .respond(Reply::code(429).header("retry-after", "1"))
            .respond(Reply::code(200).body("hello")),
        request(Method::GET, "/flaky"),
    )
    .await;

    run(
        "GET: the server stays down (503 x4)",
        MockService::new().otherwise(Reply::code(503).body("still busy")),
        request(Method::GET, "/down"),
    )
    .await;

    run(
        "GET: 404 is fatal",
        MockService::new().respond(Reply::code(404)),
        request(Method::GET, "/missing"),
    )
    .await;

    run(
        "POST: 503 may have been processed, not retried",
        MockService::new().respond(Reply::code(503)),
        request(Method::POST, "/orders"),
    )
    .await;

    run(
        "POST: connection refused (never sent), retried",
        MockService::new()
            .fail(
                Error::new(ErrorKind::Connect)
                    .with_source(io::Error::from(io::ErrorKind::ConnectionRefused)),
            )
            .respond(Reply::code(201)),
        request(Method::POST, "/orders"),
    )
    .await;

    let mut with_key = request(Method::POST, "/payments");
    with_key
        .headers_mut()
        .insert("idempotency-key", http::HeaderValue::from_static("tour-1"));
    run(
        "POST with an Idempotency-Key: 502, then 201",
        MockService::new()
            .respond(Reply::code(502))
            .respond(Reply::code(201)),
        with_key,
    )
    .await;

    let mut tight = request(Method::GET, "/rate-limited");
    tight.extensions_mut().insert(Deadline(
        tokio::time::Instant::now() + Duration::from_millis(500),
    ));
    run(
        "GET with 500 ms left: 429 asking for 30 s comes back at once",
        MockService::new()
            .respond(Reply::code(429).header("retry-after", "30"))
            .otherwise(Reply::code(200)),
        tight,
    )
    .await;
}
