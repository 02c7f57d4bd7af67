//! The circuit breaker's state changes are INFO events naming the host
//! (never its userinfo or query) and, with the `metrics` feature, counted
//! by the state entered, as are the calls it fails at once. In a process of
//! its own: it asserts on tracing output.
#![cfg(feature = "breaker")]

use rebound_core::ErrorKind;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use rebound_core::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
use rebound_core::classify::{ClassifyLayer, HttpClassifier};
use rebound_test::capture::Capture;
use tower::{service_fn, ServiceBuilder, ServiceExt};

#[tokio::test(start_paused = true)]
async fn state_changes_are_info_events_and_metrics() {
    let capture = Capture::new();
    let _guard = capture.set_default();
    #[cfg(feature = "metrics")]
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    #[cfg(feature = "metrics")]
    let snapshotter = recorder.snapshotter();
    #[cfg(feature = "metrics")]
    metrics::set_global_recorder(recorder).unwrap();

    let status = Arc::new(AtomicU16::new(503));
    let svc = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(
            CircuitBreakerConfig::default()
                .minimum_throughput(5)
                .break_duration(Duration::from_secs(5)),
        ))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(service_fn({
            let status = status.clone();
            move |_req: Request<()>| {
                let code = status.load(Ordering::Relaxed);
                async move {
                    let mut res = Response::new(());
                    *res.status_mut() = StatusCode::from_u16(code).unwrap();
                    Ok::<_, Infallible>(res)
                }
            }
        }));
    let call = || {
        svc.clone().oneshot(
            Request::get("https://me:pw@api.example/v1?token=s3cret")
                .body(())
                .unwrap(),
        )
    };

    for _ in 0..5 {
        call().await.unwrap();
    }
    assert!(matches!(
        call().await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    ));
    // A snapshot drains the counters: keep them for the final count.
    #[cfg(feature = "metrics")]
    let while_open = snapshotter.snapshot().into_vec();
    #[cfg(feature = "metrics")]
    {
        let open = while_open.iter().find_map(|(key, _, _, v)| {
            (key.key().name() == rebound_core::metrics::CIRCUITS_OPEN).then_some(v)
        });
        assert_eq!(
            open,
            Some(&metrics_util::debugging::DebugValue::Gauge(1.0.into())),
            "one circuit open"
        );
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    status.store(200, Ordering::Relaxed);
    call().await.unwrap();

    let events = capture.events_at_least(tracing::Level::INFO);
    let changes: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.message().unwrap(), e.field("state").unwrap()))
        .collect();
    assert_eq!(
        changes,
        [
            ("circuit breaker opened", "open"),
            ("circuit breaker half-open", "half_open"),
            ("circuit breaker closed", "closed"),
        ]
    );
    for e in &events {
        assert_eq!(e.level, tracing::Level::INFO);
        assert_eq!(e.field("circuit"), Some("https://api.example:443"));
    }
    assert_eq!(events[0].field("break_ms"), Some("5000"));
    assert_eq!(capture.count("s3cret"), 0);
    assert_eq!(capture.count("pw"), 0);

    #[cfg(feature = "metrics")]
    {
        use metrics_util::debugging::DebugValue;
        let mut seen: Vec<(String, Vec<String>, u64)> = Vec::new();
        let last = snapshotter.snapshot().into_vec();
        let both = while_open
            .into_iter()
            .map(|x| (true, x))
            .chain(last.into_iter().map(|x| (false, x)));
        for (earlier, (key, _, _, value)) in both {
            let labels: Vec<String> = key.key().labels().map(|l| l.value().to_owned()).collect();
            let name = key.key().name().to_owned();
            let n = match value {
                DebugValue::Counter(n) => n,
                // The open-circuits gauge: its last value, back to 0.
                DebugValue::Gauge(_) if earlier => continue,
                DebugValue::Gauge(g) => g.into_inner() as u64,
                other => panic!("{other:?}"),
            };
            match seen
                .iter_mut()
                .find(|(n2, l2, _)| *n2 == name && *l2 == labels)
            {
                Some(entry) => entry.2 += n,
                None => seen.push((name, labels, n)),
            }
        }
        seen.sort();
        let m = |name: &str, labels: &[&str], n| {
            (
                name.to_owned(),
                labels.iter().map(|s| (*s).to_owned()).collect(),
                n,
            )
        };
        assert_eq!(
            seen,
            [
                m(rebound_core::metrics::CIRCUITS_OPEN, &[], 0),
                m(rebound_core::metrics::CIRCUIT_REJECTED, &[], 1),
                m(rebound_core::metrics::CIRCUIT_TRANSITIONS, &["closed"], 1),
                m(
                    rebound_core::metrics::CIRCUIT_TRANSITIONS,
                    &["half_open"],
                    1
                ),
                m(rebound_core::metrics::CIRCUIT_TRANSITIONS, &["open"], 1),
            ]
        );
    }
}
