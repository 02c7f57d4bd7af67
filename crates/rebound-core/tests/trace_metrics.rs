//! With the `metrics` feature, the trace layers record the documented
//! metrics with the documented labels, and no label carries a URL, a host,
//! a header value or a request id.
#![cfg(feature = "metrics")]

mod trace_support;

use http::Method;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use rebound_core::metrics as m;
use rebound_core::trace::TraceLayer;
use rebound_core::RetryStop;
use tower::{Layer, ServiceExt};

use trace_support::{secret_request, FakeRetry, Scripted, Step, SECRET};

#[derive(Debug, PartialEq)]
struct Metric {
    kind: MetricKind,
    name: String,
    labels: Vec<(String, String)>,
    value: DebugValue,
}

impl Metric {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn counter(&self) -> u64 {
        match self.value {
            DebugValue::Counter(n) => n,
            ref other => panic!("{} is not a counter: {other:?}", self.name),
        }
    }

    fn samples(&self) -> Vec<f64> {
        match &self.value {
            DebugValue::Histogram(v) => v.iter().map(|x| x.into_inner()).collect(),
            other => panic!("{} is not a histogram: {other:?}", self.name),
        }
    }

    fn gauge(&self) -> f64 {
        match self.value {
            DebugValue::Gauge(g) => g.into_inner(),
            ref other => panic!("{} is not a gauge: {other:?}", self.name),
        }
    }
}

fn metrics(snapshotter: &Snapshotter) -> Vec<Metric> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _unit, _desc, value)| {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            Metric {
                kind,
                name: key.name().to_owned(),
                labels,
                value,
            }
        })
        .collect()
}

fn named<'a>(all: &'a [Metric], name: &str) -> Vec<&'a Metric> {
    all.iter().filter(|m| m.name == name).collect()
}

/// Run `steps` through the stack with a local debugging recorder.
async fn record(steps: &[Step], max: u32, stop: RetryStop, state: bool) -> Vec<Metric> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    {
        let _guard = metrics::set_default_local_recorder(&recorder);
        m::describe();
        let layer = TraceLayer::new();
        let mut inner = Scripted::new(steps);
        inner.annotate_state = state;
        let mut retry = FakeRetry::new(layer.attempt_layer().layer(inner), max);
        retry.exhausted = stop;
        let _ = layer.layer(retry).oneshot(secret_request()).await;
    }
    let all = metrics(&snapshotter);
    // No label value is a URL, a host, a path, a header value or an id.
    for metric in &all {
        for (key, value) in &metric.labels {
            for bad in [
                SECRET,
                "api.example.com",
                "/v1/items",
                "req-42",
                "application/json",
                "alice",
            ] {
                assert!(!value.contains(bad), "{}: {key}={value}", metric.name);
            }
        }
    }
    all
}

#[tokio::test(start_paused = true)]
async fn durations_attempts_and_retries_by_reason() {
    let all = record(
        &[Step::Refused, Step::Unavailable, Step::Ok],
        4,
        RetryStop::Attempts,
        false,
    )
    .await;

    let request = named(&all, m::REQUEST_DURATION);
    assert_eq!(request.len(), 1, "{all:#?}");
    assert_eq!(request[0].kind, MetricKind::Histogram);
    assert_eq!(
        request[0].labels,
        [
            ("http.request.method".to_owned(), "POST".to_owned()),
            ("http.response.status_code".to_owned(), "200".to_owned()),
        ]
    );
    let secs = request[0].samples();
    assert_eq!(secs.len(), 1);
    assert!((secs[0] - 2.1).abs() < 1e-6, "{secs:?}");

    let attempts = named(&all, m::ATTEMPT_DURATION);
    let mut by_outcome: Vec<_> = attempts
        .iter()
        .map(|a| {
            (
                a.label(m::LABEL_STATUS).map(str::to_owned),
                a.label(m::LABEL_ERROR_TYPE).map(str::to_owned),
                a.samples().len(),
            )
        })
        .collect();
    by_outcome.sort();
    assert_eq!(
        by_outcome,
        [
            (None, Some("connect".to_owned()), 1),
            (Some("200".to_owned()), None, 1),
            (Some("503".to_owned()), Some("503".to_owned()), 1),
        ]
    );

    let per_request = named(&all, m::REQUEST_ATTEMPTS);
    assert_eq!(per_request.len(), 1);
    assert_eq!(per_request[0].label(m::LABEL_STOP), Some("success"));
    assert_eq!(per_request[0].samples(), [3.0]);

    let mut retries: Vec<_> = named(&all, m::RETRIES)
        .iter()
        .map(|r| {
            (
                r.label(m::LABEL_REASON).unwrap().to_owned(),
                r.label(m::LABEL_DELAY_SOURCE).unwrap().to_owned(),
                r.counter(),
            )
        })
        .collect();
    retries.sort();
    assert_eq!(
        retries,
        [
            ("connect refused".to_owned(), "backoff".to_owned(), 1),
            ("status 503".to_owned(), "retry_after".to_owned(), 1),
        ]
    );
    assert!(named(&all, m::BUDGET_EXHAUSTED).is_empty());
    assert!(named(&all, m::DEADLINE_EXPIRED).is_empty());
}

#[tokio::test(start_paused = true)]
async fn budget_exhaustion_and_deadline_expiry_are_counted() {
    let all = record(&[Step::Refused], 2, RetryStop::Budget, false).await;
    let budget = named(&all, m::BUDGET_EXHAUSTED);
    assert_eq!(budget.len(), 1, "{all:#?}");
    assert_eq!(budget[0].counter(), 1);
    assert_eq!(budget[0].label(m::LABEL_METHOD), Some("POST"));
    let request = named(&all, m::REQUEST_DURATION);
    assert_eq!(request[0].label(m::LABEL_ERROR_TYPE), Some("connect"));
    assert_eq!(request[0].label(m::LABEL_STATUS), None);

    let all = record(&[Step::Deadline], 3, RetryStop::Attempts, false).await;
    let deadline = named(&all, m::DEADLINE_EXPIRED);
    assert_eq!(deadline.len(), 1, "{all:#?}");
    assert_eq!(deadline[0].counter(), 1);
    assert!(named(&all, m::BUDGET_EXHAUSTED).is_empty());
}

#[tokio::test(start_paused = true)]
async fn limiter_and_gate_from_annotations() {
    let all = record(&[Step::Unavailable, Step::Ok], 3, RetryStop::Attempts, true).await;
    let limit = named(&all, m::LIMITER_LIMIT);
    assert_eq!(limit.len(), 1, "{all:#?}");
    assert_eq!(limit[0].label(m::LABEL_LIMITER), Some("adaptive"));
    assert_eq!(limit[0].gauge(), 8.0);
    assert_eq!(named(&all, m::LIMITER_QUEUE_LENGTH)[0].gauge(), 1.0);
    // Gates hold attempts: one wait per attempt, not per request.
    assert_eq!(named(&all, m::GATE_WAITS)[0].counter(), 2);
    assert_eq!(named(&all, m::GATE_WAIT_DURATION)[0].samples(), [1.5, 1.5]);
}

#[tokio::test(start_paused = true)]
async fn odd_methods_do_not_become_labels() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    {
        let _guard = metrics::set_default_local_recorder(&recorder);
        let layer = TraceLayer::new();
        let svc = layer.layer(layer.attempt_layer().layer(Scripted::new(&[Step::Ok])));
        let mut req = secret_request();
        *req.method_mut() = Method::from_bytes(b"PURGE-USER-1234").unwrap();
        svc.oneshot(req).await.unwrap();
    }
    let all = metrics(&snapshotter);
    assert!(!all.is_empty());
    for metric in &all {
        assert_eq!(metric.label(m::LABEL_METHOD), Some("_OTHER"), "{metric:?}");
    }
}
