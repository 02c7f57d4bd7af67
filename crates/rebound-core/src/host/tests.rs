//! The host table on paused time: an idle table costs no hash and keeps no
//! entry; a failure or a closing gives its host one entry, shared by the
//! gate and the breaker, released when nothing is left to remember; the
//! table's bound and eviction order.

use crate::ErrorKind;
use std::cell::Cell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::util::BoxCloneService;
use tower::{service_fn, ServiceBuilder, ServiceExt};

use super::*;
use crate::annotations::CircuitState;
use crate::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
use crate::classify::{ClassifyLayer, HttpClassifier};
use crate::gate::RetryAfterGateLayer;
use crate::retry_after::RetryAfterLayer;

fn keys() -> usize {
    KEYS.with(Cell::get)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn uri(host: &str) -> Uri {
    format!("https://{host}/v1?token=t").parse().unwrap()
}

fn get(host: &str) -> Request<Full<Bytes>> {
    Request::get(uri(host))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// An upstream answering each host with the status set for it (200 by
/// default).
#[derive(Clone, Default)]
struct Hosts(Arc<Mutex<HashMap<String, u16>>>);

type Inner = BoxCloneService<Request<Full<Bytes>>, Response<Full<Bytes>>, Infallible>;

impl Hosts {
    fn set(&self, host: &str, status: u16) {
        self.0.lock().unwrap().insert(host.to_owned(), status);
    }

    fn service(&self) -> Inner {
        let hosts = self.0.clone();
        service_fn(move |req: Request<Full<Bytes>>| {
            let host = req.uri().host().unwrap_or_default().to_owned();
            let status = hosts.lock().unwrap().get(&host).copied().unwrap_or(200);
            async move {
                let mut res = Response::new(Full::new(Bytes::new()));
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
                Ok(res)
            }
        })
        .boxed_clone()
    }
}

type Svc = BoxCloneService<Request<Full<Bytes>>, Response<Full<Bytes>>, Error>;

/// A breaker and a gate over `table`, as standalone layers.
fn layered(table: &Arc<HostTable>, cfg: CircuitBreakerConfig, hosts: &Hosts) -> Svc {
    ServiceBuilder::new()
        .layer(CircuitBreakerLayer::shared(cfg, table.clone()))
        .layer(RetryAfterGateLayer::shared(table.clone()))
        .layer(RetryAfterLayer::new())
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(hosts.service())
        .boxed_clone()
}

/// The whole stack with its gate and breaker over `table` (as the client
/// builds it).
#[cfg(feature = "stack")]
type Stacked =
    BoxCloneService<Request<Full<Bytes>>, Response<crate::stack::StackBody<Full<Bytes>>>, Error>;

#[cfg(feature = "stack")]
fn stacked(table: &Arc<HostTable>, breaker: CircuitBreakerLayer, hosts: &Hosts) -> Stacked {
    ServiceBuilder::new()
        .layer(
            crate::stack::StackLayer::new()
                .retry_after_gate(Some(RetryAfterGateLayer::shared(table.clone())))
                .circuit_breaker(Some(breaker)),
        )
        .service(hosts.service())
        .boxed_clone()
}

/// While every request succeeds, nothing is hashed and no entry is taken:
/// through the whole stack (whose breaker has a key function that counts
/// its calls) and through the standalone breaker and gate.
#[cfg(feature = "stack")]
#[tokio::test(start_paused = true)]
async fn an_idle_table_hashes_nothing_and_keeps_no_entry() {
    let hosts = Hosts::default();
    let table = Arc::new(HostTable::default());
    let key_fn_calls = Arc::new(AtomicUsize::new(0));
    let cfg = {
        let calls = key_fn_calls.clone();
        CircuitBreakerConfig::default().key_fn(move |uri: &Uri| {
            calls.fetch_add(1, AtomicOrdering::Relaxed);
            uri.host().map(str::to_owned)
        })
    };
    let breaker = CircuitBreakerLayer::shared(cfg, table.clone());
    let stack = stacked(&table, breaker.clone(), &hosts);
    let before = keys();
    for n in 0..300 {
        let res = stack
            .clone()
            .oneshot(get(&format!("h{}.example", n % 7)))
            .await;
        assert_eq!(res.unwrap().status(), 200);
    }
    assert_eq!(keys(), before, "no key computed");
    assert_eq!(key_fn_calls.load(AtomicOrdering::Relaxed), 0);
    assert!(table.is_empty());

    let other = Arc::new(HostTable::default());
    let svc = layered(&other, CircuitBreakerConfig::default(), &hosts);
    for n in 0..300 {
        let res = svc
            .clone()
            .oneshot(get(&format!("h{}.example", n % 7)))
            .await;
        assert_eq!(res.unwrap().status(), 200);
    }
    assert_eq!(keys(), before, "no key computed by the standalone layers");
    assert!(other.is_empty());

    // A failure is keyed (once) and takes an entry.
    hosts.set("h1.example", 502);
    let _ = stack.clone().oneshot(get("h1.example")).await;
    assert!(key_fn_calls.load(AtomicOrdering::Relaxed) >= 1);
    assert_eq!(table.len(), 1);
}

/// A counted failure gives its host an entry; successes to it are then
/// counted; the entry goes once the failure has left the window — when a
/// request meets it, or in a sweep run by a request to another host.
#[tokio::test(start_paused = true)]
async fn an_entry_comes_with_a_failure_and_goes_when_the_window_is_clean() {
    let hosts = Hosts::default();
    let table = Arc::new(HostTable::default());
    let svc = layered(&table, CircuitBreakerConfig::default(), &hosts);
    let call = |host: &str| svc.clone().oneshot(get(host));

    hosts.set("a.example", 502);
    call("a.example").await.unwrap();
    assert_eq!(table.len(), 1);
    hosts.set("a.example", 200);
    call("a.example").await.unwrap();
    tokio::time::advance(secs(29)).await;
    call("a.example").await.unwrap();
    assert_eq!(table.len(), 1, "the failure is still in the 30 s window");
    tokio::time::advance(secs(2)).await;
    call("a.example").await.unwrap();
    assert!(table.is_empty(), "released when met");

    // Swept: no request meets b's entry again.
    hosts.set("b.example", 503);
    call("b.example").await.unwrap();
    assert_eq!(table.len(), 1);
    tokio::time::advance(secs(31)).await;
    let before = keys();
    call("c.example").await.unwrap();
    assert_eq!(
        keys() - before,
        2,
        "a busy table: one key per standalone layer (breaker, gate)"
    );
    assert!(table.is_empty(), "swept by a request to another host");
    let before = keys();
    call("c.example").await.unwrap();
    assert_eq!(keys(), before, "idle again: nothing hashed");

    // A gate's entry goes when the gate has opened.
    table.close(&uri("d.example"), Instant::now() + secs(2));
    assert_eq!(table.len(), 1);
    tokio::time::advance(secs(3)).await;
    call("c.example").await.unwrap();
    assert!(table.is_empty());
}

/// A host's gate and circuit are one entry, and a request through the
/// whole stack hashes its host once for the holding gate, the breaker and
/// the closing gate.
#[cfg(feature = "stack")]
#[tokio::test(start_paused = true)]
async fn the_gate_and_the_breaker_of_a_host_share_one_entry() {
    let hosts = Hosts::default();
    let table = Arc::new(HostTable::default());
    let breaker = CircuitBreakerLayer::shared(
        CircuitBreakerConfig::default().consecutive_failures(1),
        table.clone(),
    );
    let stack = stacked(&table, breaker.clone(), &hosts);
    hosts.set("a.example", 502);
    let _ = stack.clone().oneshot(get("a.example")).await;
    assert_eq!(breaker.state(&uri("a.example")), CircuitState::Open);
    assert_eq!(table.len(), 1);
    table.close(&uri("a.example"), Instant::now() + secs(10));
    assert_eq!(table.len(), 1, "one entry for the gate and the circuit");
    assert!(table.closed_until(&uri("a.example")).is_some());
    assert_eq!(breaker.state(&uri("a.example")), CircuitState::Open);
    // Another host, another entry.
    table.close(&uri("b.example"), Instant::now() + secs(10));
    assert_eq!(table.len(), 2);

    let before = keys();
    let res = stack.clone().oneshot(get("c.example")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(keys() - before, 1, "one hash for the whole request");
}

/// The table never holds more than its entries; a host that needs an entry
/// evicts the closed circuit due for release soonest, never an open one
/// while a closed one is there; a success never evicts an entry in use.
#[tokio::test(start_paused = true)]
async fn the_table_is_bounded_and_evicts_what_matters_least() {
    assert!(matches!(
        HostTable::try_new(0).unwrap_err().kind(),
        ErrorKind::Config
    ));
    assert!(matches!(
        HostTable::try_new((1 << 24) + 1).unwrap_err().kind(),
        ErrorKind::Config
    ));
    let hosts = Hosts::default();
    let table = Arc::new(HostTable::new(3));
    assert_eq!(table.max_entries(), 3, "not rounded to a power of two");
    let breaker = CircuitBreakerLayer::shared(
        CircuitBreakerConfig::default().consecutive_failures(2),
        table.clone(),
    );
    let svc: Svc = ServiceBuilder::new()
        .layer(breaker.clone())
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(hosts.service())
        .boxed_clone();
    let call = |host: &str| svc.clone().oneshot(get(host));
    let now = Instant::now();
    table.close(&uri("a.example"), now + secs(10));
    table.close(&uri("b.example"), now + secs(1));
    hosts.set("c.example", 502);
    call("c.example").await.unwrap();
    call("c.example").await.unwrap();
    assert_eq!(breaker.state(&uri("c.example")), CircuitState::Open);
    assert_eq!(table.len(), 3);

    // d's failure evicts b, whose gate opens soonest.
    hosts.set("d.example", 502);
    call("d.example").await.unwrap();
    assert_eq!(table.len(), 3);
    assert!(table.closed_until(&uri("b.example")).is_none());
    assert!(table.closed_until(&uri("a.example")).is_some());

    // Successes to other hosts take no entry in use.
    for n in 0..100 {
        call(&format!("h{n}.example")).await.unwrap();
    }
    assert_eq!(table.len(), 3);
    assert!(table.closed_until(&uri("a.example")).is_some());

    // e's failure evicts a closed circuit (a: its gate opens in 10 s,
    // before d's failure leaves the window), not c's open one.
    hosts.set("e.example", 502);
    call("e.example").await.unwrap();
    assert_eq!(table.len(), 3);
    assert!(table.closed_until(&uri("a.example")).is_none());
    assert_eq!(breaker.state(&uri("c.example")), CircuitState::Open);
    assert!(matches!(
        call("c.example").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    ));

    // Many failing hosts: never more than three entries.
    for n in 0..50 {
        hosts.set(&format!("f{n}.example"), 503);
        let _ = call(&format!("f{n}.example")).await;
        assert!(table.len() <= 3);
    }
}

/// A run of failures is forgotten once its failures have left the window
/// (the entry goes with them): failures further apart than the sampling
/// duration are not "in a row".
#[tokio::test(start_paused = true)]
async fn a_run_is_forgotten_when_its_failures_leave_the_window() {
    let hosts = Hosts::default();
    let table = Arc::new(HostTable::default());
    let cfg = CircuitBreakerConfig::default()
        .consecutive_failures(3)
        .minimum_throughput(1000);
    let breaker = CircuitBreakerLayer::shared(cfg, table.clone());
    let svc: Svc = ServiceBuilder::new()
        .layer(breaker.clone())
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(hosts.service())
        .boxed_clone();
    let at = uri("a.example");
    hosts.set("a.example", 502);
    for _ in 0..2 {
        svc.clone().oneshot(get("a.example")).await.unwrap();
    }
    tokio::time::advance(secs(31)).await;
    svc.clone().oneshot(get("a.example")).await.unwrap();
    assert_eq!(breaker.state(&at), CircuitState::Closed, "a new run of 1");
    svc.clone().oneshot(get("a.example")).await.unwrap();
    assert_eq!(breaker.state(&at), CircuitState::Closed);
    svc.clone().oneshot(get("a.example")).await.unwrap();
    assert_eq!(breaker.state(&at), CircuitState::Open, "3 in a row");
}

/// While the table is idle a success is recorded nowhere, so a host's
/// ratio window starts at its first failure; while some host of the table
/// has an entry, every host's successes are counted.
#[tokio::test(start_paused = true)]
async fn the_ratio_window_starts_at_the_first_failure_of_an_idle_table() {
    let cfg = || {
        CircuitBreakerConfig::default()
            .consecutive_failures(0)
            .minimum_throughput(10)
    };
    let hosts = Hosts::default();
    let table = Arc::new(HostTable::default());
    let svc = layered(&table, cfg(), &hosts);
    let call = |host: &str| svc.clone().oneshot(get(host));
    for _ in 0..100 {
        call("a.example").await.unwrap();
    }
    hosts.set("a.example", 502);
    for _ in 0..10 {
        call("a.example").await.unwrap();
    }
    let breaker_state = |t: &Arc<HostTable>, host: &str| {
        // The state as the breaker over `t` reports it.
        let i = t.find(HostRef::of(&uri(host)).key());
        i.map(|i| state_of(t.entry(i).circuit.state.load(Ordering::Acquire)))
    };
    assert_eq!(breaker_state(&table, "a.example"), Some(OPEN), "10 of 10");

    // Busy: b has an entry, so a's successes count.
    let table = Arc::new(HostTable::default());
    let svc = layered(&table, cfg(), &hosts);
    let call = |host: &str| svc.clone().oneshot(get(host));
    hosts.set("a.example", 200);
    hosts.set("b.example", 502);
    call("b.example").await.unwrap();
    for _ in 0..100 {
        call("a.example").await.unwrap();
    }
    hosts.set("a.example", 502);
    for _ in 0..10 {
        call("a.example").await.unwrap();
    }
    assert_eq!(
        breaker_state(&table, "a.example"),
        Some(CLOSED),
        "10 of 110"
    );
}

/// A table keeps one breaker's circuits.
#[test]
fn a_table_keeps_one_breakers_circuits() {
    let table = Arc::new(HostTable::default());
    let _first = CircuitBreakerLayer::shared(CircuitBreakerConfig::default(), table.clone());
    let err = CircuitBreakerLayer::try_shared(CircuitBreakerConfig::default(), table).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config), "{err}");
}

/// Parallel calls over a small table, half the hosts failing: the count of
/// entries in use always matches the entries counted, never exceeds the
/// table, and returns to zero once the hosts recover and their failures
/// have left the window. (Real time, bounded: 4,000 calls, then two
/// waits of a few tens of milliseconds that a slow machine only lengthens.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_in_use_stays_exact_under_parallel_churn() {
    let hosts = Hosts::default();
    let table = Arc::new(HostTable::new(8));
    let cfg = CircuitBreakerConfig::default()
        .minimum_throughput(5)
        .sampling_duration(Duration::from_millis(50))
        .break_duration(Duration::from_millis(20));
    let svc = layered(&table, cfg, &hosts);
    let name = |n: u64| format!("{}.example", "h".repeat(1 + (n % 24) as usize));
    for n in 0..24 {
        if n % 2 == 0 {
            hosts.set(&name(n), 503);
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..8u64 {
        let (svc, table) = (svc.clone(), table.clone());
        tasks.spawn(async move {
            for n in 0..500u64 {
                let _ = svc.clone().oneshot(get(&name(n + t))).await;
                assert!(table.len() <= 8);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let live = |t: &HostTable| {
        t.entries
            .iter()
            .filter(|e| e.live.load(Ordering::SeqCst))
            .count()
    };
    assert_eq!(table.len(), live(&table));

    // Recovery: every host answers; each open circuit probes and closes.
    for n in 0..24 {
        hosts.set(&name(n), 200);
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    for n in 0..24 {
        let _ = svc.clone().oneshot(get(&name(n))).await;
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    svc.clone().oneshot(get(&name(1))).await.unwrap();
    assert_eq!(table.len(), live(&table));
    assert!(table.is_empty(), "{table:?}");
}
