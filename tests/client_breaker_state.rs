//! A default client's circuit breaker can be read (issue 20).

use rebound::ErrorKind;
use rebound::{CircuitState, Client};
use rebound_test::fault::refused_addr;

#[tokio::test]
async fn a_default_clients_circuit_state_is_readable() {
    let addr = refused_addr().unwrap();
    let url = format!("http://{addr}/v1");
    let uri: http::Uri = url.parse().unwrap();
    // The default breaker; one attempt per request, so it counts quickly.
    let client = Client::builder().max_attempts(1).build().unwrap();
    assert_eq!(client.circuit_state(&uri), Some(CircuitState::Closed));
    for _ in 0..10 {
        let err = client.get(url.as_str()).await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Connect), "{err}");
    }
    // Ten failed requests in a row: the default opens.
    assert_eq!(client.circuit_state(&uri), Some(CircuitState::Open));
    let err = client.get(url.as_str()).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::CircuitOpen), "{err}");

    let off = Client::builder().circuit_breaker(None).build().unwrap();
    assert_eq!(off.circuit_state(&uri), None);
}
