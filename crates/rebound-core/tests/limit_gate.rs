//! Retry-After gate: a 429/503 with a hint holds new requests to the same
//! authority (waiting or failing fast), leaves other authorities alone, and
//! keeps a bounded table.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use rebound_core::annotations::{Deadline, RetryAfterHint, Verdict};
use rebound_core::gate::{GateMode, GateTable, RetryAfterGateLayer};
use rebound_core::{Error, ErrorKind};
use tokio::time::Instant;
use tokio_test::{assert_pending, task};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

fn req(uri: &str) -> Request<()> {
    Request::get(uri).body(()).unwrap()
}

type Calls = Arc<Mutex<Vec<(String, Instant)>>>;

/// Records `(authority + path, time)` of every call. `/busy` answers 429 with
/// a 2 s hint, `/busy503` 503 with a 2 s hint, `/nohint` 429 without one,
/// `/okhint` 200 with a hint; everything else 200.
fn upstream(
    layer: RetryAfterGateLayer,
) -> (
    Calls,
    impl Service<Request<()>, Response = Response<()>, Error = Error, Future = impl Send> + Clone,
) {
    let calls = Calls::default();
    let svc = {
        let calls = calls.clone();
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(move |req: Request<()>| {
                let what = format!(
                    "{}{}",
                    req.uri().authority().map_or("", |a| a.as_str()),
                    req.uri().path()
                );
                calls.lock().unwrap().push((what, Instant::now()));
                let mut res = Response::new(());
                let (status, hint) = match req.uri().path() {
                    "/busy" => (429, true),
                    "/busy503" => (503, true),
                    "/nohint" => (429, false),
                    "/okhint" => (200, true),
                    _ => (200, false),
                };
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
                if hint {
                    // What the Retry-After layer below would leave.
                    res.extensions_mut()
                        .insert(RetryAfterHint(Duration::from_secs(2)));
                }
                async move { Ok::<_, Infallible>(res) }
            }))
    };
    (calls, svc)
}

fn calls_to(calls: &Calls, authority: &str) -> Vec<Instant> {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(w, _)| w.starts_with(authority))
        .map(|(_, t)| *t)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_holds_the_next_50_requests() {
    let baseline = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let (calls, svc) = upstream(RetryAfterGateLayer::new());
    let start = Instant::now();
    let res = svc
        .clone()
        .oneshot(req("http://a.test/busy"))
        .await
        .unwrap();
    assert_eq!(res.status(), 429);

    let waiting: Vec<_> = (0..50)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                svc.oneshot(req(&format!("http://a.test/next/{i}")))
                    .await
                    .unwrap();
                Instant::now()
            })
        })
        .collect();
    // Another authority is not held.
    svc.clone().oneshot(req("http://b.test/x")).await.unwrap();
    assert_eq!(calls_to(&calls, "b.test"), vec![start]);

    // During the pause the upstream sees none of the 50.
    tokio::time::sleep(Duration::from_millis(1_990)).await;
    assert_eq!(calls_to(&calls, "a.test").len(), 1, "sent during the pause");

    let mut finished = Vec::new();
    for w in waiting {
        finished.push(w.await.unwrap());
    }
    let to_a = calls_to(&calls, "a.test");
    assert_eq!(to_a.len(), 51);
    for t in &to_a[1..] {
        let waited = *t - start;
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_millis(2_100),
            "sent after {waited:?}"
        );
    }
    assert!(finished
        .iter()
        .all(|t| *t - start < Duration::from_millis(2_100)));
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        baseline
    );
}

#[tokio::test(start_paused = true)]
async fn fail_fast_mode_returns_throttled() {
    let (calls, svc) = upstream(RetryAfterGateLayer::new().mode(GateMode::FailFast));
    svc.clone()
        .oneshot(req("http://a.test/busy"))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(500)).await;

    let err = svc
        .clone()
        .oneshot(req("http://a.test/next?key=secret"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Throttled);
    assert!(err.to_string().contains("GET http://a.test/next"), "{err}");
    assert!(!err.to_string().contains("secret"));
    assert_eq!(
        err.extensions().get::<RetryAfterHint>(),
        Some(&RetryAfterHint(Duration::from_millis(1_500)))
    );
    assert!(err.extensions().get::<Verdict>().unwrap().is_fatal());
    assert_eq!(calls.lock().unwrap().len(), 1);

    // After the pause the gate opens by itself.
    tokio::time::advance(Duration::from_millis(1_500)).await;
    svc.clone()
        .oneshot(req("http://a.test/next"))
        .await
        .unwrap();
    assert_eq!(calls.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_before_the_gate_opens_fails_at_once() {
    let (calls, svc) = upstream(RetryAfterGateLayer::new());
    svc.clone()
        .oneshot(req("http://a.test/busy"))
        .await
        .unwrap();
    let start = Instant::now();

    let mut short = req("http://a.test/short");
    short
        .extensions_mut()
        .insert(Deadline(start + Duration::from_secs(1)));
    let err = svc.clone().oneshot(short).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Throttled);
    assert_eq!(start.elapsed(), Duration::ZERO);

    let mut long = req("http://a.test/long");
    long.extensions_mut()
        .insert(Deadline(start + Duration::from_secs(3)));
    svc.clone().oneshot(long).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(calls.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_authority_is_scheme_host_and_effective_port() {
    let (calls, svc) = upstream(RetryAfterGateLayer::new().fail_fast());
    svc.clone()
        .oneshot(req("http://api.test/busy"))
        .await
        .unwrap();
    // Same authority: userinfo ignored, host case-insensitive, port 80 implied.
    for same in [
        "http://user:pw@API.test:80/other",
        "http://api.test/third?q=1",
    ] {
        let err = svc.clone().oneshot(req(same)).await.unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Throttled),
            "{same} not held"
        );
    }
    // Other scheme or port: another authority.
    for other in ["https://api.test/x", "http://api.test:8080/x"] {
        svc.clone().oneshot(req(other)).await.unwrap();
    }
    assert_eq!(calls.lock().unwrap().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn only_429_with_a_hint_closes_the_gate_and_503_when_asked() {
    let layer = RetryAfterGateLayer::new().fail_fast();
    let table = layer.table().clone();
    let (calls, svc) = upstream(layer);
    // By default a 503's Retry-After paces only its own request (its
    // retry): one failing endpoint does not hold its host.
    for path in ["/nohint", "/okhint", "/plain", "/busy503"] {
        svc.clone()
            .oneshot(req(&format!("http://a.test{path}")))
            .await
            .unwrap();
        assert!(table.is_empty(), "{path} closed the gate");
    }
    svc.clone()
        .oneshot(req("http://a.test/other"))
        .await
        .unwrap();
    assert_eq!(calls.lock().unwrap().len(), 5);

    // Asked for: a 503 with a hint closes the host's gate as a 429 does.
    let layer = RetryAfterGateLayer::new().fail_fast().close_on_503(true);
    let table = layer.table().clone();
    let (_calls, svc) = upstream(layer);
    svc.clone()
        .oneshot(req("http://a.test/busy503"))
        .await
        .unwrap();
    let until = table
        .closed_until(&"http://a.test/".parse().unwrap())
        .unwrap();
    assert_eq!(until - Instant::now(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn off_holds_nothing_and_closes_nothing() {
    let layer = RetryAfterGateLayer::new().mode(GateMode::Off);
    let table = layer.table().clone();
    let (calls, svc) = upstream(layer);
    let start = Instant::now();
    svc.clone()
        .oneshot(req("http://a.test/busy"))
        .await
        .unwrap();
    assert!(table.is_empty(), "an Off gate closed");
    // Even a gate closed by someone else over the same table is ignored.
    table.close(
        &"http://a.test/".parse().unwrap(),
        start + Duration::from_secs(10),
    );
    svc.clone()
        .oneshot(req("http://a.test/next"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(calls.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_gate_that_does_not_close_holds_at_gates_closed_by_others() {
    let table = Arc::new(GateTable::default());
    // The holding gate only: a 429 through it closes nothing.
    let (calls, holding) = upstream(RetryAfterGateLayer::shared(table.clone()).closes_gates(false));
    holding
        .clone()
        .oneshot(req("http://a.test/busy"))
        .await
        .unwrap();
    assert!(table.is_empty());
    // Closed by another gate over the same table: held until it opens.
    let start = Instant::now();
    table.close(
        &"http://a.test/".parse().unwrap(),
        start + Duration::from_secs(2),
    );
    let other = holding.clone().oneshot(req("http://b.test/x"));
    other.await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "another host was held");
    holding
        .clone()
        .oneshot(req("http://a.test/x"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(calls_to(&calls, "a.test").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_pause_extended_while_waiting_is_honoured() {
    let layer = RetryAfterGateLayer::new();
    let table = layer.table().clone();
    let (calls, svc) = upstream(layer);
    let start = Instant::now();
    svc.clone()
        .oneshot(req("http://a.test/busy"))
        .await
        .unwrap();

    let mut waiting = task::spawn(svc.clone().oneshot(req("http://a.test/w")));
    assert_pending!(waiting.poll());
    tokio::time::advance(Duration::from_secs(1)).await;
    // Another client sharing the table got a longer pause meanwhile.
    table.close(
        &"http://a.test/".parse().unwrap(),
        start + Duration::from_secs(4),
    );
    waiting.await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(4));
    assert_eq!(calls.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_request_sends_nothing() {
    let baseline = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let (calls, svc) = upstream(RetryAfterGateLayer::new());
    svc.clone()
        .oneshot(req("http://a.test/busy"))
        .await
        .unwrap();
    let waiting = tokio::spawn(svc.clone().oneshot(req("http://a.test/w")));
    tokio::time::sleep(Duration::from_millis(500)).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        baseline
    );
}

#[tokio::test(start_paused = true)]
async fn the_table_is_bounded() {
    assert!(matches!(
        GateTable::try_new(0).unwrap_err().kind(),
        ErrorKind::Config
    ));
    let table = Arc::new(GateTable::try_new(2).unwrap());
    let now = Instant::now();
    let uri = |h: &str| format!("http://{h}/").parse::<http::Uri>().unwrap();
    table.close(&uri("a.test"), now + Duration::from_secs(10));
    table.close(&uri("b.test"), now + Duration::from_secs(1));
    table.close(&uri("c.test"), now + Duration::from_secs(5));
    assert_eq!(table.len(), 2);
    // The gate that opened soonest was evicted.
    assert!(table.closed_until(&uri("b.test")).is_none());
    assert!(table.closed_until(&uri("a.test")).is_some());
    assert!(table.closed_until(&uri("c.test")).is_some());

    // Expired entries go when met.
    tokio::time::advance(Duration::from_secs(6)).await;
    assert!(table.closed_until(&uri("c.test")).is_none());
    assert_eq!(table.len(), 1);
    table.clear();
    assert!(table.is_empty());

    // A shared table holds requests of every layer built over it.
    let (calls, svc) = upstream(RetryAfterGateLayer::shared(table.clone()).fail_fast());
    table.close(&uri("d.test"), Instant::now() + Duration::from_secs(1));
    assert!(matches!(
        svc.oneshot(req("http://d.test/x"))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Throttled
    ));
    assert!(calls.lock().unwrap().is_empty());
}

/// A request that queued for a client-wide permit while its host's gate
/// closed gives the permit back while it waits at the gate, so a request to
/// another host goes at once; it takes the permit again (FIFO) when the gate
/// opens.
#[tokio::test(start_paused = true)]
async fn a_queued_request_gives_its_permit_back_while_the_gate_holds_it() {
    use bytes::Bytes;
    use http_body_util::Full;
    use rebound_core::limit::{ConcurrencyLimitLayer, ConcurrencyLimiter};
    use tokio::sync::Semaphore;

    let limiter = Arc::new(ConcurrencyLimiter::try_new(1).unwrap());
    let table = Arc::new(GateTable::default());
    let release = Arc::new(Semaphore::new(0));
    let calls = Calls::default();
    let svc = {
        let (release, calls) = (release.clone(), calls.clone());
        ServiceBuilder::new()
            .layer(ConcurrencyLimitLayer::shared(limiter.clone()))
            .layer(RetryAfterGateLayer::shared(table.clone()))
            .service(service_fn(move |req: Request<()>| {
                let what = format!(
                    "{}{}",
                    req.uri().authority().map_or("", |a| a.as_str()),
                    req.uri().path()
                );
                calls.lock().unwrap().push((what, Instant::now()));
                let release = release.clone();
                async move {
                    if req.uri().path() == "/slow" {
                        release.acquire().await.unwrap().forget();
                    }
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                }
            }))
    };
    let start = Instant::now();
    // X holds the only permit; Y (to a.test) queues behind it.
    let mut x = task::spawn(svc.clone().oneshot(req("http://b.test/slow")));
    assert_pending!(x.poll());
    let mut y = task::spawn(svc.clone().oneshot(req("http://a.test/y")));
    assert_pending!(y.poll());
    assert_eq!(limiter.queued(), 1);
    // a.test's gate closes while Y queues.
    table.close(
        &"http://a.test/".parse().unwrap(),
        start + Duration::from_secs(2),
    );
    // X ends: Y gets the permit, meets the closed gate, gives it back.
    release.add_permits(1);
    x.await.unwrap();
    assert_pending!(y.poll());
    assert_eq!(limiter.in_flight(), 0, "Y holds its permit at the gate");
    // Another host goes at once.
    svc.clone().oneshot(req("http://b.test/now")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(calls_to(&calls, "a.test").is_empty());
    // The gate opens: Y takes a permit again and goes.
    let res = y.await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(
        calls_to(&calls, "a.test"),
        vec![start + Duration::from_secs(2)]
    );
    drop(res);
    assert_eq!(limiter.available(), 1, "every permit returned");
}
