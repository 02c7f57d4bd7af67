//! Client-side throttling as a tower layer: a host that refuses everything
//! is shed locally; the shed error and its event carry no secret.

use std::convert::Infallible;

use http::{Request, Response, StatusCode};
use rebound_core::annotations::{Sent, Verdict};
use rebound_core::throttle::{ClientThrottle, ClientThrottleLayer, ThrottleProbability};
use rebound_core::ErrorKind;
use rebound_test::capture::Capture;
use tower::{service_fn, ServiceBuilder, ServiceExt};

const SECRET: &str = "s3cr3t-XYZZY";

#[tokio::test(start_paused = true)]
async fn a_shed_attempt_is_not_sent_and_names_no_secret() {
    let capture = Capture::new();
    let _guard = capture.set_default();
    let layer = ClientThrottleLayer::try_new(ClientThrottle::default().seed(3)).unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: Request<()>| async {
            let mut res = Response::new(());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            Ok::<_, Infallible>(res)
        }));
    let url = format!("https://alice:{SECRET}@api.example.com/v1?api_key={SECRET}");
    let mut shed = None;
    for _ in 0..50 {
        let req = Request::get(url.as_str()).body(()).unwrap();
        if let Err(err) = svc.clone().oneshot(req).await {
            shed = Some(err);
        }
    }
    let err = shed.expect("a host that accepts nothing gets shed");
    assert_eq!(err.kind(), ErrorKind::ClientThrottled);
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    assert!(matches!(
        err.extensions().get::<Verdict>(),
        Some(Verdict::Fatal { .. })
    ));
    assert!(err.extensions().get::<ThrottleProbability>().unwrap().0 > 0.5);
    let text = format!("{err} {err:?}");
    assert!(!text.contains(SECRET) && !text.contains("alice"), "{text}");
    assert!(capture.count("attempt shed by client-side throttling") > 0);
    assert_eq!(capture.count(SECRET), 0, "{}", capture.text());
    assert_eq!(capture.count("alice"), 0, "{}", capture.text());
}
