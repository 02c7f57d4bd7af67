//! No secret leaks, whatever fails: the whole fault matrix runs with a
//! secret planted in the `Authorization` header, an `x-api-key` header, the
//! query (`?api_key=...`), the URL's userinfo and the POST body, under a
//! subscriber that captures every span, field and message at TRACE for
//! every target (hyper-util's pool, h2, and rustls through the `log`
//! bridge included). The secret must appear zero times in the logs and in
//! every error's `Display` and `Debug`.

mod support;

use support::{assert_no_task_left, run_matrix, Secrets, SECRET};

use rebound_test::capture::Capture;

/// The Basic credentials the transport makes from `user:SECRET@`.
fn basic_credentials() -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("user:{SECRET}");
    let mut out = String::new();
    for chunk in input.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn the_secret_never_appears_in_logs_or_errors() {
    // rustls logs through `log`; forward it to tracing (process-wide, once).
    tracing_log::LogTracer::init().expect("the only logger of this test binary");
    let capture = Capture::new();
    let _guard = capture.set_default();

    // With an explicit Authorization header (the userinfo is then dropped),
    // then without one (the userinfo becomes a Basic header).
    let mut reports = run_matrix(Secrets::Planted {
        authorization: true,
    })
    .await;
    reports.extend(
        run_matrix(Secrets::Planted {
            authorization: false,
        })
        .await,
    );
    assert_no_task_left().await;

    let logs = capture.text();
    // The capture saw the stack and the transport below it: otherwise "zero
    // occurrences" would prove nothing.
    for target in ["rebound::trace", "hyper_util"] {
        assert!(
            capture
                .events()
                .iter()
                .any(|e| e.target.starts_with(target))
                || capture.spans().iter().any(|s| s.target.starts_with(target)),
            "nothing captured from {target}"
        );
    }
    // rustls logs through `log`: bridged events carry the original target
    // in a `log.target` field.
    assert!(
        capture.events().iter().any(|e| e
            .field("log.target")
            .is_some_and(|t| t.starts_with("rustls"))),
        "nothing captured from rustls through the log bridge"
    );
    assert!(capture.count("request failed; giving up") > 0);
    assert!(capture.count("retrying") > 0);
    // The requests were named in the logs, without their secrets.
    assert!(capture.count("/fault") > 0);

    let basic = basic_credentials();
    for needle in [SECRET, basic.as_str()] {
        let in_logs = capture.count(needle);
        let leaks: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains(needle))
            .take(5)
            .collect();
        assert_eq!(
            in_logs, 0,
            "{needle} appears {in_logs} time(s) in the logs: {leaks:#?}"
        );
    }

    let mut errors = 0;
    for r in &reports {
        for text in &r.error_texts {
            errors += 1;
            assert!(
                !text.contains(SECRET) && !text.contains(&basic),
                "[{} × {}] an error shows the secret: {text}",
                r.fault.name(),
                r.column.name()
            );
        }
    }
    // Every cell but the 503/429 storms fails with an error.
    assert!(errors > 50, "only {errors} error texts checked");
    println!(
        "secrets: {} cells, {} error texts, {} log lines captured, 0 leaks",
        reports.len(),
        errors,
        logs.lines().count()
    );
}
