//! One reading of an outcome over real sockets (issue 20): `kind()` says
//! what failed, and `RetryStop` says why the retry loop gave up, read the
//! same way on an `Err` (`Error::retry_stop`) and on an `Ok` response
//! (`RetryStop::of`).

use std::time::Duration;

use rebound::{Attempts, Backoff, Client, Error, ErrorKind, RetryStop};
use rebound_test::fault::{refused_addr, Action, FaultServer};

const BOUND: Duration = Duration::from_secs(20);

fn client() -> Client {
    Client::builder()
        .backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ))
        .max_attempts(3)
        .build()
        .unwrap()
}

/// The two answers, whatever the outcome's shape.
fn gave_up<B>(outcome: &Result<http::Response<B>, Error>) -> (Option<RetryStop>, u32) {
    match outcome {
        Ok(res) => (
            RetryStop::of(res.extensions()),
            Attempts::of(res.extensions()),
        ),
        Err(err) => (err.retry_stop(), err.attempts()),
    }
}

#[tokio::test]
async fn gave_up_reads_the_same_on_a_response_and_on_an_error() {
    tokio::time::timeout(BOUND, async {
        let server = FaultServer::builder()
            .route("/ok", [Action::status(200)])
            .default(Action::status(503))
            .start()
            .await;
        let client = client();

        // Three 503s: the last response, Ok, with why the loop stopped.
        let outcome = client.get(server.url("/busy")).await;
        assert_eq!(outcome.as_ref().unwrap().status(), 503);
        assert_eq!(gave_up(&outcome), (Some(RetryStop::Attempts), 3));

        // Three refused connections: the last error, with the same answer.
        let addr = refused_addr().unwrap();
        let outcome = client.get(format!("http://{addr}/x")).await;
        let err = outcome.as_ref().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
        assert_eq!(gave_up(&outcome), (Some(RetryStop::Attempts), 3));
        assert_eq!(err.retry_stop(), RetryStop::of(err.extensions()));

        // A success: no stop, one attempt.
        let outcome = client.get(server.url("/ok")).await;
        assert_eq!(gave_up(&outcome), (None, 1));

        // A request sent once: the loop stopped on its count.
        let outcome = client.get(server.url("/once")).attempts(1).await;
        assert_eq!(gave_up(&outcome), (Some(RetryStop::Attempts), 1));
    })
    .await
    .expect("within the bound")
}

/// The deprecated predicates are thin aliases of the kind and the stop.
#[test]
#[allow(deprecated)]
fn the_deprecated_predicates_agree_with_the_kind() {
    type Predicate = fn(&Error) -> bool;
    let kinds: [(ErrorKind, Predicate); 14] = [
        (
            ErrorKind::Timeout(rebound::TimeoutStage::Headers),
            Error::is_timeout,
        ),
        (ErrorKind::Connect, Error::is_connect),
        (ErrorKind::Tls, Error::is_tls),
        (ErrorKind::Body, Error::is_body),
        (ErrorKind::BodyTooLarge, Error::is_body_too_large),
        (ErrorKind::Decode, Error::is_decode),
        (ErrorKind::Status, Error::is_status),
        (ErrorKind::Cancelled, Error::is_cancelled),
        (ErrorKind::Closed, Error::is_closed),
        (ErrorKind::Rejected, Error::is_rejected),
        (ErrorKind::Throttled, Error::is_throttled),
        (ErrorKind::CircuitOpen, Error::is_circuit_open),
        (ErrorKind::Ambiguous, Error::is_ambiguous),
        (ErrorKind::Config, Error::is_config),
    ];
    for (i, (kind, _)) in kinds.iter().enumerate() {
        let err = Error::new(*kind);
        for (j, (_, is)) in kinds.iter().enumerate() {
            assert_eq!(is(&err), i == j, "{kind:?} vs predicate {j}");
        }
    }
    let mut err = Error::new(ErrorKind::Connect);
    err.extensions_mut().insert(RetryStop::Budget);
    assert!(err.is_budget_exhausted() && !err.is_attempts_exhausted());
}
