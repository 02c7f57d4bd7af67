//! Tests of the pacing engine, on paused time.

use super::*;
use crate::ratelimit::parse::Quota;

const URI: &str = "https://api.example/v1/chat";

fn uri() -> Uri {
    URI.parse().unwrap()
}

fn pacer(config: PacerConfig) -> Arc<Pacer> {
    Arc::new(Pacer::new(config.jitter_seed(7)))
}

fn reading(d: Dimension, limit: Option<u64>, remaining: u64, reset_ms: u64) -> Reading {
    let mut r = Reading::default();
    r.merge(
        d,
        Quota {
            limit,
            remaining: Some(remaining),
            reset: Some(Duration::from_millis(reset_ms)),
            precision: Precision::Milliseconds,
            window: None,
        },
    );
    r
}

/// Send one request through the pacer and record `said` as its answer.
fn exchange(p: &Arc<Pacer>, said: &Reading) {
    let now = Instant::now();
    let mut t = p.ticket(None);
    assert_eq!(p.admit(now, &uri(), &mut t, None), Admit::Go);
    p.record(now, &uri(), t, StatusCode::OK, said);
}

#[tokio::test(start_paused = true)]
async fn plenty_tracks_nothing() {
    let p = pacer(PacerConfig::new());
    for left in (500..1000).rev() {
        exchange(&p, &reading(Dimension::Requests, Some(1000), left, 60_000));
    }
    assert_eq!(p.hosts(), 0);
    assert_eq!(p.left(&uri(), Dimension::Requests), None);
    // Requests in flight are counted, and uncounted when answered.
    assert_eq!(p.inflight[0].load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn spreads_the_end_of_the_quota_over_the_window() {
    let p = pacer(PacerConfig::new());
    // 10 left of 100 (the spread zone), the reset in 10 s.
    exchange(&p, &reading(Dimension::Requests, Some(100), 10, 10_000));
    assert_eq!(p.hosts(), 1);
    let now = Instant::now();
    let mut slots = Vec::new();
    let mut tickets = Vec::new();
    for _ in 0..10 {
        let mut t = p.ticket(None);
        match p.admit(now, &uri(), &mut t, None) {
            Admit::Go => slots.push(Duration::ZERO),
            Admit::Wait(at) => slots.push(at - now),
            other => panic!("{other:?}"),
        }
        tickets.push(t);
    }
    // The remaining requests evenly over the time left: one a second.
    assert_eq!(slots[0], Duration::ZERO);
    for (k, slot) in slots.iter().enumerate() {
        assert_eq!(*slot, Duration::from_secs(k as u64));
    }
    for w in slots.windows(2) {
        assert!(w[1] > w[0], "{slots:?}");
    }
    assert!(
        *slots.last().unwrap() < Duration::from_secs(10),
        "{slots:?}"
    );
    // The quota is out: the next waits for the reset.
    let mut t = p.ticket(None);
    match p.admit(now, &uri(), &mut t, None) {
        Admit::Later(at) => assert!(at - now >= Duration::from_secs(10)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn releases_waiters_at_the_reset_with_jitter() {
    let p = pacer(PacerConfig::new().release_jitter(Duration::from_millis(200)));
    exchange(&p, &reading(Dimension::Requests, Some(100), 0, 2_000));
    let now = Instant::now();
    let reset = now + Duration::from_secs(2);
    let mut times = Vec::new();
    for _ in 0..20 {
        let mut t = p.ticket(None);
        match p.admit(now, &uri(), &mut t, None) {
            Admit::Later(at) => times.push(at),
            other => panic!("{other:?}"),
        }
    }
    for at in &times {
        assert!(*at >= reset && *at <= reset + Duration::from_millis(200));
    }
    times.sort();
    times.dedup();
    assert!(times.len() > 15, "jittered, not all at once: {times:?}");

    // At the reset the window rolls: the limit, less what is in flight.
    tokio::time::advance(Duration::from_millis(2_100)).await;
    let mut t = p.ticket(None);
    assert_eq!(p.admit(Instant::now(), &uri(), &mut t, None), Admit::Go);
    // 100 less this one.
    assert_eq!(p.left(&uri(), Dimension::Requests), Some(99));
}

#[tokio::test(start_paused = true)]
async fn a_wait_is_bounded_by_the_deadline() {
    let p = pacer(PacerConfig::new().release_jitter(Duration::ZERO));
    exchange(&p, &reading(Dimension::Requests, Some(100), 0, 5_000));
    let now = Instant::now();
    let reset = now + Duration::from_secs(5);
    let mut t = p.ticket(None);
    assert_eq!(
        p.admit(now, &uri(), &mut t, Some(now + Duration::from_secs(3))),
        Admit::Exhausted {
            reset,
            dimension: Dimension::Requests
        }
    );
    assert_eq!(
        p.admit(now, &uri(), &mut t, Some(now + Duration::from_secs(10))),
        Admit::Later(reset)
    );
    // Without a deadline, max_wait bounds it: a daily quota fails fast.
    let daily = pacer(PacerConfig::new());
    exchange(
        &daily,
        &reading(Dimension::Requests, Some(1000), 0, 86_400_000),
    );
    let mut t = daily.ticket(None);
    assert!(matches!(
        daily.admit(now, &uri(), &mut t, None),
        Admit::Exhausted { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn spreading_never_fails_a_request_with_quota() {
    let p = pacer(PacerConfig::new());
    exchange(&p, &reading(Dimension::Requests, Some(100), 2, 10_000));
    let now = Instant::now();
    let mut a = p.ticket(None);
    assert_eq!(p.admit(now, &uri(), &mut a, None), Admit::Go);
    // Its slot (5 s) is past this one's deadline (1 s): it goes now.
    let mut b = p.ticket(None);
    assert_eq!(
        p.admit(now, &uri(), &mut b, Some(now + Duration::from_secs(1))),
        Admit::Go
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_wins_over_the_headers() {
    let p = pacer(PacerConfig::new().release_jitter(Duration::ZERO));
    let mut said = reading(Dimension::Requests, Some(100), 50, 1_000);
    said.retry_after = Some(Duration::from_secs(3));
    let now = Instant::now();
    let mut t = p.ticket(None);
    p.admit(now, &uri(), &mut t, None);
    p.record(now, &uri(), t, StatusCode::TOO_MANY_REQUESTS, &said);
    let mut t = p.ticket(None);
    assert_eq!(
        p.admit(now, &uri(), &mut t, None),
        Admit::Later(now + Duration::from_secs(3))
    );
}

#[tokio::test(start_paused = true)]
async fn in_flight_requests_count_against_what_is_left() {
    let p = pacer(PacerConfig::new().spread_fraction(0.0));
    let now = Instant::now();
    // Five requests go out while nothing is tracked...
    let mut flying: Vec<_> = (0..5)
        .map(|_| {
            let mut t = p.ticket(None);
            assert_eq!(p.admit(now, &uri(), &mut t, None), Admit::Go);
            t
        })
        .collect();
    // ...then the first answer says 5 are left: the 4 others will take 4.
    let first = flying.remove(0);
    p.record(
        now,
        &uri(),
        first,
        StatusCode::OK,
        &reading(Dimension::Requests, Some(100), 5, 10_000),
    );
    assert_eq!(p.left(&uri(), Dimension::Requests), Some(1));
    let mut t = p.ticket(None);
    assert_eq!(p.admit(now, &uri(), &mut t, None), Admit::Go);
    let mut u = p.ticket(None);
    assert!(matches!(
        p.admit(now, &uri(), &mut u, None),
        Admit::Later(_)
    ));
    // An out-of-order answer that says more is left does not raise it.
    let late = flying.remove(0);
    p.record(
        now,
        &uri(),
        late,
        StatusCode::OK,
        &reading(Dimension::Requests, Some(100), 9, 10_000),
    );
    assert_eq!(p.left(&uri(), Dimension::Requests), Some(0));
}

#[tokio::test(start_paused = true)]
async fn token_costs_are_reserved_and_corrected() {
    let p = pacer(PacerConfig::new().release_jitter(Duration::ZERO));
    let cost = Cost::tokens(600);
    let now = Instant::now();
    // 1,000 tokens left of 10,000: within the spread zone, tracked.
    let mut t = p.ticket(Some(&cost));
    p.admit(now, &uri(), &mut t, None);
    p.record(
        now,
        &uri(),
        t,
        StatusCode::OK,
        &reading(Dimension::Tokens, Some(10_000), 1_000, 30_000),
    );
    assert_eq!(p.left(&uri(), Dimension::Tokens), Some(1_000));

    let mut a = p.ticket(Some(&cost));
    assert!(matches!(
        p.admit(now, &uri(), &mut a, None),
        Admit::Go | Admit::Wait(_)
    ));
    assert_eq!(p.left(&uri(), Dimension::Tokens), Some(400));
    // 400 left: a second estimate of 600 waits for the reset.
    let mut b = p.ticket(Some(&cost));
    assert_eq!(
        p.admit(now, &uri(), &mut b, None),
        Admit::Later(now + Duration::from_secs(30))
    );
    // The first used 300: the server says 700 left, and the estimate's
    // reservation is settled.
    p.record(
        now,
        &uri(),
        a,
        StatusCode::OK,
        &reading(Dimension::Tokens, Some(10_000), 700, 30_000),
    );
    assert_eq!(p.left(&uri(), Dimension::Tokens), Some(700));
    assert!(matches!(
        p.admit(now, &uri(), &mut b, None),
        Admit::Go | Admit::Wait(_)
    ));
    assert_eq!(p.left(&uri(), Dimension::Tokens), Some(100));
    // A caller's correction from the body: it used 200 of its 600.
    p.correct(&uri(), &cost, &Cost::tokens(200));
    assert_eq!(p.left(&uri(), Dimension::Tokens), Some(500));
    drop(b);
    assert_eq!(p.inflight[1].load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_ticket_gives_its_reservation_back() {
    let p = pacer(PacerConfig::new());
    exchange(&p, &reading(Dimension::Requests, Some(100), 5, 10_000));
    let mut t = p.ticket(None);
    p.admit(Instant::now(), &uri(), &mut t, None);
    assert_eq!(p.inflight[0].load(Ordering::Relaxed), 1);
    drop(t);
    assert_eq!(p.inflight[0].load(Ordering::Relaxed), 0);
    let state = p.lock();
    let host = state.hosts.values().next().unwrap();
    assert_eq!(host.parts[0].dims[0].inflight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_host_is_forgotten_when_its_quota_is_plenty_again() {
    let p = pacer(PacerConfig::new());
    exchange(&p, &reading(Dimension::Requests, Some(100), 3, 1_000));
    assert_eq!(p.hosts(), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    exchange(&p, &reading(Dimension::Requests, Some(100), 99, 60_000));
    assert_eq!(p.hosts(), 0);
}

#[tokio::test(start_paused = true)]
async fn other_hosts_never_wait() {
    let p = pacer(PacerConfig::new());
    exchange(&p, &reading(Dimension::Requests, Some(100), 0, 10_000));
    let other: Uri = "https://elsewhere.example/".parse().unwrap();
    let mut t = p.ticket(None);
    assert_eq!(p.admit(Instant::now(), &other, &mut t, None), Admit::Go);
}

#[tokio::test(start_paused = true)]
async fn absurd_readings_do_not_panic() {
    let p = pacer(PacerConfig::new());
    let mut r = Reading::default();
    for d in Dimension::ALL {
        r.merge(
            d,
            Quota {
                limit: Some(u64::MAX),
                remaining: Some(u64::MAX),
                reset: Some(Duration::MAX),
                precision: Precision::Seconds,
                window: Some(Duration::MAX),
            },
        );
    }
    r.retry_after = Some(Duration::MAX);
    exchange(&p, &r);
    let mut zero = Reading::default();
    zero.merge(
        Dimension::Requests,
        Quota {
            limit: Some(0),
            remaining: Some(0),
            reset: Some(Duration::ZERO),
            precision: Precision::Seconds,
            window: Some(Duration::ZERO),
        },
    );
    let now = Instant::now();
    let mut t = p.ticket(Some(&Cost::ai(u64::MAX, u64::MAX)));
    let _ = p.admit(now, &uri(), &mut t, Some(now));
    p.record(now, &uri(), t, StatusCode::OK, &zero);
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut t = p.ticket(Some(&Cost::tokens(u64::MAX)));
    let _ = p.admit(Instant::now(), &uri(), &mut t, None);
}

#[tokio::test(start_paused = true)]
async fn partitions_are_kept_apart() {
    let p = pacer(PacerConfig::new().release_jitter(Duration::ZERO));
    let mut a = reading(Dimension::Requests, Some(100), 0, 10_000);
    a.partition = Some(1);
    exchange(&p, &a);
    // The host's last answer names partition 2, with plenty left: its
    // requests go, partition 1's quota is kept.
    let mut b = reading(Dimension::Requests, Some(100), 8, 10_000);
    b.partition = Some(2);
    let now = Instant::now();
    let mut t = p.ticket(None);
    assert!(matches!(
        p.admit(now, &uri(), &mut t, None),
        Admit::Later(_)
    ));
    p.record(now, &uri(), t, StatusCode::OK, &b);
    let mut t = p.ticket(None);
    assert!(matches!(
        p.admit(now, &uri(), &mut t, None),
        Admit::Go | Admit::Wait(_)
    ));
    let state = p.lock();
    assert_eq!(state.hosts.values().next().unwrap().parts.len(), 2);
}

#[test]
fn config_is_checked() {
    assert!(Pacer::try_new(PacerConfig::new().spread_fraction(1.5)).is_err());
    assert!(Pacer::try_new(PacerConfig::new().spread_fraction(f64::NAN)).is_err());
    assert!(Pacer::try_new(PacerConfig::new().max_hosts(0)).is_err());
    assert!(Pacer::try_new(PacerConfig::new().max_wait(Duration::from_secs(1 << 40))).is_err());
    assert!(
        Pacer::try_new(PacerConfig::new().release_jitter(Duration::from_secs(1 << 40))).is_err()
    );
}
