//! Table tests of the parsers: the providers' documented examples, the
//! draft's examples, and a bad-input table.

use super::*;

const NOW_SECS: u64 = 1_700_000_000; // 2023-11-14T22:13:20Z

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(NOW_SECS)
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_static(v));
    }
    h
}

fn q(limit: Option<u64>, remaining: Option<u64>, reset_ms: Option<u64>, p: Precision) -> Quota {
    Quota {
        limit,
        remaining,
        reset: reset_ms.map(Duration::from_millis),
        precision: p,
        window: None,
    }
}

use Precision::{Milliseconds as Ms, Seconds as S};

#[test]
fn documented_examples() {
    struct Case {
        name: &'static str,
        headers: &'static [(&'static str, &'static str)],
        dimension: Dimension,
        want: Quota,
    }
    let cases = [
        // The draft's examples (-10, and -09's token names).
        Case {
            name: "ietf: one policy",
            headers: &[
                ("ratelimit-policy", "\"default\";q=100;w=10"),
                ("ratelimit", "\"default\";r=50;t=30"),
            ],
            dimension: Dimension::Requests,
            want: Quota {
                window: Some(Duration::from_secs(10)),
                ..q(Some(100), Some(50), Some(30_000), S)
            },
        },
        Case {
            name: "ietf: burst and daily, the fewest remaining wins",
            headers: &[
                (
                    "ratelimit-policy",
                    "\"burst\";q=100;w=60, \"daily\";q=1000;w=86400",
                ),
                ("ratelimit", "\"burst\";r=50;t=30, \"daily\";r=20;t=36000"),
            ],
            dimension: Dimension::Requests,
            want: Quota {
                window: Some(Duration::from_secs(86_400)),
                ..q(Some(1000), Some(20), Some(36_000_000), S)
            },
        },
        Case {
            name: "ietf: token names (before -10), split over two lines",
            headers: &[
                ("ratelimit-policy", "burst;q=100;w=60"),
                ("ratelimit-policy", "daily;q=1000;w=86400"),
                ("ratelimit", "burst;r=0;t=10"),
            ],
            dimension: Dimension::Requests,
            want: Quota {
                window: Some(Duration::from_secs(60)),
                ..q(Some(100), Some(0), Some(10_000), S)
            },
        },
        Case {
            name: "ietf: RateLimit without a policy",
            headers: &[("ratelimit", "\"problemPolicy\";r=0;t=10")],
            dimension: Dimension::Requests,
            want: q(None, Some(0), Some(10_000), S),
        },
        Case {
            name: "ietf: a content-bytes policy is skipped",
            headers: &[
                (
                    "ratelimit-policy",
                    "\"bytes\";q=65535;qu=\"content-bytes\";w=10, \"req\";q=10;w=1",
                ),
                ("ratelimit", "\"bytes\";r=0;t=5, \"req\";r=9;t=1"),
            ],
            dimension: Dimension::Requests,
            want: Quota {
                window: Some(Duration::from_secs(1)),
                ..q(Some(10), Some(9), Some(1_000), S)
            },
        },
        Case {
            name: "ietf: a policy alone",
            headers: &[(
                "ratelimit-policy",
                "\"permin\";q=50;w=60, \"perhr\";q=1000;w=3600",
            )],
            dimension: Dimension::Requests,
            want: Quota {
                window: Some(Duration::from_secs(60)),
                ..q(Some(50), None, None, S)
            },
        },
        // Legacy draft fields.
        Case {
            name: "legacy RateLimit-*",
            headers: &[
                ("ratelimit-limit", "100"),
                ("ratelimit-remaining", "42"),
                ("ratelimit-reset", "50"),
            ],
            dimension: Dimension::Requests,
            want: q(Some(100), Some(42), Some(50_000), S),
        },
        Case {
            name: "legacy RateLimit-Limit with an old-draft policy list",
            headers: &[
                ("ratelimit-limit", "10, 10;w=1, 50;w=60"),
                ("ratelimit-remaining", "9"),
            ],
            dimension: Dimension::Requests,
            want: q(Some(10), Some(9), None, S),
        },
        // GitHub's documented headers: epoch seconds.
        Case {
            name: "github x-ratelimit (epoch reset)",
            headers: &[
                ("x-ratelimit-limit", "5000"),
                ("x-ratelimit-remaining", "4999"),
                ("x-ratelimit-used", "1"),
                ("x-ratelimit-reset", "1700000600"),
                ("x-ratelimit-resource", "core"),
            ],
            dimension: Dimension::Requests,
            want: q(Some(5000), Some(4999), Some(600_000), S),
        },
        Case {
            name: "x-ratelimit with a delta reset",
            headers: &[
                ("x-ratelimit-limit", "60"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "17"),
            ],
            dimension: Dimension::Requests,
            want: q(Some(60), Some(0), Some(17_000), S),
        },
        Case {
            name: "x-ratelimit with an epoch in the past",
            headers: &[
                ("x-ratelimit-remaining", "3"),
                ("x-ratelimit-reset", "1600000000"),
            ],
            dimension: Dimension::Requests,
            want: q(None, Some(3), Some(0), S),
        },
        Case {
            name: "x-ratelimit with a fractional delta",
            headers: &[
                ("x-ratelimit-remaining", "3"),
                ("x-ratelimit-reset", "1.25"),
            ],
            dimension: Dimension::Requests,
            want: q(None, Some(3), Some(1_250), Ms),
        },
        // OpenAI's documented example.
        Case {
            name: "openai requests",
            headers: OPENAI,
            dimension: Dimension::Requests,
            want: q(Some(60), Some(59), Some(1_000), Ms),
        },
        Case {
            name: "openai tokens",
            headers: OPENAI,
            dimension: Dimension::Tokens,
            want: q(Some(150_000), Some(149_984), Some(360_000), Ms),
        },
        Case {
            name: "openai milliseconds",
            headers: &[
                ("x-ratelimit-remaining-requests", "1"),
                ("x-ratelimit-reset-requests", "12ms"),
            ],
            dimension: Dimension::Requests,
            want: q(None, Some(1), Some(12), Ms),
        },
        // Azure OpenAI sends remaining counts only.
        Case {
            name: "azure remaining only",
            headers: &[
                ("x-ratelimit-remaining-requests", "119"),
                ("x-ratelimit-remaining-tokens", "119800"),
            ],
            dimension: Dimension::Tokens,
            want: q(None, Some(119_800), None, Ms),
        },
        // Anthropic's documented header names, RFC 3339 resets.
        Case {
            name: "anthropic requests",
            headers: ANTHROPIC,
            dimension: Dimension::Requests,
            want: q(Some(50), Some(49), Some(40_000), S),
        },
        Case {
            name: "anthropic input tokens (a fraction)",
            headers: ANTHROPIC,
            dimension: Dimension::InputTokens,
            want: q(Some(40_000), Some(39_000), Some(1_500), Ms),
        },
        Case {
            name: "anthropic output tokens (an offset)",
            headers: ANTHROPIC,
            dimension: Dimension::OutputTokens,
            want: q(Some(8_000), Some(7_900), Some(60_000), S),
        },
        Case {
            name: "anthropic tokens",
            headers: ANTHROPIC,
            dimension: Dimension::Tokens,
            want: q(Some(48_000), Some(46_900), Some(1_500), Ms),
        },
        // Several families on one response.
        Case {
            name: "openai's milliseconds win over ietf's seconds; the lower remaining wins",
            headers: &[
                ("ratelimit", "\"default\";r=10;t=2"),
                ("x-ratelimit-remaining-requests", "12"),
                ("x-ratelimit-reset-requests", "1.5s"),
            ],
            dimension: Dimension::Requests,
            want: q(None, Some(10), Some(1_500), Ms),
        },
        Case {
            name: "of two resets in seconds, the later",
            headers: &[
                ("ratelimit-remaining", "5"),
                ("ratelimit-reset", "3"),
                ("x-ratelimit-remaining", "7"),
                ("x-ratelimit-reset", "4"),
            ],
            dimension: Dimension::Requests,
            want: q(None, Some(5), Some(4_000), S),
        },
    ];
    for case in cases {
        let reading = read(&headers(case.headers), StatusCode::OK, now());
        assert_eq!(
            reading.get(case.dimension),
            Some(&case.want),
            "{}",
            case.name
        );
    }
}

const OPENAI: &[(&str, &str)] = &[
    ("x-ratelimit-limit-requests", "60"),
    ("x-ratelimit-limit-tokens", "150000"),
    ("x-ratelimit-remaining-requests", "59"),
    ("x-ratelimit-remaining-tokens", "149984"),
    ("x-ratelimit-reset-requests", "1s"),
    ("x-ratelimit-reset-tokens", "6m0s"),
];

// NOW is 2023-11-14T22:13:20Z.
const ANTHROPIC: &[(&str, &str)] = &[
    ("anthropic-ratelimit-requests-limit", "50"),
    ("anthropic-ratelimit-requests-remaining", "49"),
    ("anthropic-ratelimit-requests-reset", "2023-11-14T22:14:00Z"),
    ("anthropic-ratelimit-tokens-limit", "48000"),
    ("anthropic-ratelimit-tokens-remaining", "46900"),
    (
        "anthropic-ratelimit-tokens-reset",
        "2023-11-14T22:13:21.500Z",
    ),
    ("anthropic-ratelimit-input-tokens-limit", "40000"),
    ("anthropic-ratelimit-input-tokens-remaining", "39000"),
    (
        "anthropic-ratelimit-input-tokens-reset",
        "2023-11-14T22:13:21.5Z",
    ),
    ("anthropic-ratelimit-output-tokens-limit", "8000"),
    ("anthropic-ratelimit-output-tokens-remaining", "7900"),
    (
        "anthropic-ratelimit-output-tokens-reset",
        "2023-11-15T00:14:20+02:00",
    ),
];

/// Name, status, headers, the pause in ms, the word on retrying.
type PauseCase = (
    &'static str,
    StatusCode,
    &'static [(&'static str, &'static str)],
    Option<u64>,
    Option<bool>,
);

#[test]
fn pauses_and_should_retry() {
    let cases: &[PauseCase] = &[
        (
            "retry-after on 429",
            StatusCode::TOO_MANY_REQUESTS,
            &[("retry-after", "3")],
            Some(3_000),
            None,
        ),
        (
            "retry-after on 200 is no pause",
            StatusCode::OK,
            &[("retry-after", "3")],
            None,
            None,
        ),
        (
            "retry-after as an HTTP-date",
            StatusCode::TOO_MANY_REQUESTS,
            &[("retry-after", "Tue, 14 Nov 2023 22:13:30 GMT")],
            Some(10_000),
            None,
        ),
        (
            "a 503's retry-after is its request's, not the quota's",
            StatusCode::SERVICE_UNAVAILABLE,
            &[("retry-after", "Tue, 14 Nov 2023 22:13:30 GMT")],
            None,
            None,
        ),
        (
            "azure retry-after-ms wins over retry-after",
            StatusCode::TOO_MANY_REQUESTS,
            &[("retry-after", "3"), ("retry-after-ms", "2500")],
            Some(2_500),
            None,
        ),
        (
            "x-ms-retry-after-ms",
            StatusCode::TOO_MANY_REQUESTS,
            &[("x-ms-retry-after-ms", "750")],
            Some(750),
            None,
        ),
        (
            "x-should-retry true",
            StatusCode::OK,
            &[("x-should-retry", "true")],
            None,
            Some(true),
        ),
        (
            "x-should-retry false",
            StatusCode::CONFLICT,
            &[("x-should-retry", "false")],
            None,
            Some(false),
        ),
    ];
    for (name, status, pairs, ms, should) in cases {
        let reading = read(&headers(pairs), *status, now());
        assert_eq!(reading.retry_after, ms.map(Duration::from_millis), "{name}");
        assert_eq!(reading.should_retry, *should, "{name}");
    }
}

#[test]
fn bad_input_is_ignored() {
    // Each is ignored: no quota (or no pause, no word) for that header.
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("negative remaining", &[("x-ratelimit-remaining", "-1")]),
        ("non-numeric remaining", &[("ratelimit-remaining", "lots")]),
        (
            "huge remaining",
            &[("ratelimit-remaining", "99999999999999999999999")],
        ),
        (
            "remaining over 2^63",
            &[("ratelimit-remaining", "9223372036854775808")],
        ),
        (
            "duplicated remaining",
            &[("ratelimit-remaining", "5"), ("ratelimit-remaining", "6")],
        ),
        (
            "comma-joined remaining",
            &[("x-ratelimit-remaining", "5, 6")],
        ),
        (
            "fraction in a count",
            &[("x-ratelimit-remaining-requests", "1.5")],
        ),
        (
            "space in a count",
            &[("x-ratelimit-remaining-tokens", "1 5")],
        ),
        ("empty", &[("anthropic-ratelimit-requests-remaining", "")]),
        ("negative reset", &[("ratelimit-reset", "-5")]),
        ("huge delta reset", &[("ratelimit-reset", "999999999")]),
        (
            "epoch reset years away",
            &[("x-ratelimit-reset", "4102444800")],
        ),
        (
            "huge epoch",
            &[("x-ratelimit-reset", "99999999999999999999")],
        ),
        (
            "go duration without unit",
            &[("x-ratelimit-reset-requests", "5")],
        ),
        (
            "go duration negative",
            &[("x-ratelimit-reset-requests", "-1s")],
        ),
        (
            "go duration bad unit",
            &[("x-ratelimit-reset-tokens", "5d")],
        ),
        (
            "go duration huge",
            &[("x-ratelimit-reset-tokens", "99999999h")],
        ),
        (
            "go duration overflow",
            &[("x-ratelimit-reset-tokens", "999999999999999999999h")],
        ),
        (
            "go duration lone dot",
            &[("x-ratelimit-reset-tokens", ".s")],
        ),
        (
            "rfc3339 without zone",
            &[("anthropic-ratelimit-tokens-reset", "2023-11-14T22:14:00")],
        ),
        (
            "rfc3339 bad day",
            &[("anthropic-ratelimit-tokens-reset", "2023-02-30T22:14:00Z")],
        ),
        (
            "rfc3339 bad hour",
            &[("anthropic-ratelimit-tokens-reset", "2023-11-14T24:14:00Z")],
        ),
        (
            "rfc3339 junk",
            &[("anthropic-ratelimit-tokens-reset", "tomorrow, probably")],
        ),
        (
            "rfc3339 years away",
            &[("anthropic-ratelimit-tokens-reset", "2099-01-01T00:00:00Z")],
        ),
        ("ietf: no r", &[("ratelimit", "\"default\";t=5")]),
        ("ietf: negative r", &[("ratelimit", "\"default\";r=-5;t=5")]),
        ("ietf: decimal r", &[("ratelimit", "\"default\";r=5.5;t=5")]),
        ("ietf: string r", &[("ratelimit", "\"default\";r=\"5\"")]),
        (
            "ietf: 16 digits",
            &[("ratelimit", "\"default\";r=1234567890123456")],
        ),
        (
            "ietf: unterminated string",
            &[("ratelimit", "\"default;r=5")],
        ),
        ("ietf: trailing comma", &[("ratelimit", "\"a\";r=5,")]),
        ("ietf: inner list", &[("ratelimit", "(\"a\" \"b\");r=5")]),
        ("ietf: integer as name", &[("ratelimit", "5;r=5")]),
        ("ietf: bad pk", &[("ratelimit", "\"a\";r=5;pk=:abc")]),
        (
            "ietf: garbage after a member",
            &[("ratelimit", "\"a\";r=5 junk")],
        ),
        ("ietf: huge t", &[("ratelimit", "\"a\";r=5;t=999999999999")]),
        ("ietf: upper-case key", &[("ratelimit", "\"a\";R=5")]),
        ("retry-after-ms negative", &[("retry-after-ms", "-5")]),
        ("x-should-retry maybe", &[("x-should-retry", "maybe")]),
        (
            "x-should-retry duplicated",
            &[("x-should-retry", "true"), ("x-should-retry", "false")],
        ),
    ];
    for (name, pairs) in cases {
        let h = headers(pairs);
        let reading = read(&h, StatusCode::TOO_MANY_REQUESTS, now());
        let said = reading
            .quotas()
            .any(|(_, q)| q.remaining.is_some() || q.reset.is_some());
        assert!(!said, "{name}: {reading:?}");
        assert_eq!(reading.retry_after, None, "{name}");
        assert_eq!(reading.should_retry, None, "{name}");
    }
}

#[test]
fn a_bad_header_spoils_only_itself() {
    let h = headers(&[
        ("x-ratelimit-remaining-requests", "oops"),
        ("x-ratelimit-reset-requests", "2s"),
        ("x-ratelimit-remaining-tokens", "100"),
    ]);
    let r = read(&h, StatusCode::OK, now());
    assert_eq!(
        r.get(Dimension::Requests),
        Some(&q(None, None, Some(2_000), Ms))
    );
    assert_eq!(r.get(Dimension::Tokens).unwrap().remaining, Some(100));
}

#[test]
fn non_ascii_and_binary_values_do_not_panic() {
    let mut h = HeaderMap::new();
    for name in [
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-reset",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-tokens-reset",
        "x-should-retry",
    ] {
        h.append(name, HeaderValue::from_bytes(b"\xff\xfe5").unwrap());
    }
    let r = read(&h, StatusCode::OK, now());
    assert!(r.is_empty(), "{r:?}");
}

#[test]
fn partition_keys_tell_partitions_apart() {
    let a = read(
        &headers(&[("ratelimit", "\"peruser\";r=50;t=30;pk=:cHsdsRa894==:")]),
        StatusCode::OK,
        now(),
    );
    let b = read(
        &headers(&[("ratelimit", "\"peruser\";r=50;t=30;pk=:c29tZW9uZWVsc2U=:")]),
        StatusCode::OK,
        now(),
    );
    assert!(a.partition.is_some());
    assert_ne!(a.partition, b.partition);
    // The key on the policy serves when RateLimit has none.
    let c = read(
        &headers(&[
            (
                "ratelimit-policy",
                "\"peruser\";q=100;w=60;pk=:cHsdsRa894==:",
            ),
            ("ratelimit", "\"peruser\";r=50;t=30"),
        ]),
        StatusCode::OK,
        now(),
    );
    assert_eq!(c.partition, a.partition);
}

#[test]
fn go_durations() {
    let cases: &[(&str, Option<u64>)] = &[
        ("0", Some(0)),
        ("0s", Some(0)),
        ("1s", Some(1_000_000_000)),
        ("6m0s", Some(360_000_000_000)),
        ("12ms", Some(12_000_000)),
        ("1h2m3.5s", Some(3_723_500_000_000)),
        ("1.5µs", Some(1_500)),
        ("2us", Some(2_000)),
        ("300ns", Some(300)),
        (".5s", Some(500_000_000)),
        ("20.123456789s", Some(20_123_456_789)),
        ("1m30s", Some(90_000_000_000)),
        ("", None),
        ("s", None),
        ("1", None),
        ("1x", None),
        ("+1s", None),
        ("1s ", None),
        ("1..5s", None),
    ];
    for (text, nanos) in cases {
        assert_eq!(
            parse_go_duration(text),
            nanos.map(Duration::from_nanos),
            "{text:?}"
        );
    }
}

#[test]
fn rfc3339_times() {
    let e = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let cases: &[(&str, Option<(SystemTime, Precision)>)] = &[
        ("1970-01-01T00:00:00Z", Some((e(0), S))),
        ("2000-02-29T00:00:00Z", Some((e(951_782_400), S))),
        ("2023-11-14T22:13:20Z", Some((e(NOW_SECS), S))),
        ("2023-11-14t22:13:20z", Some((e(NOW_SECS), S))),
        ("2023-11-15T00:13:20+02:00", Some((e(NOW_SECS), S))),
        ("2023-11-14T21:13:20-01:00", Some((e(NOW_SECS), S))),
        (
            "2023-11-14T22:13:20.25Z",
            Some((e(NOW_SECS) + Duration::from_millis(250), Ms)),
        ),
        ("2016-12-31T23:59:60Z", Some((e(1_483_228_799), S))),
        ("1969-12-31T23:59:59Z", None),
        ("1900-02-29T00:00:00Z", None),
        ("2023-13-01T00:00:00Z", None),
        ("2023-11-14 22:13:20Z", None),
        ("2023-11-14T22:13:20+2:00", None),
        ("2023-11-14T22:13:20.Z", None),
        ("2023-11-14T22:13:61Z", None),
        ("2023-11-14T22:13:20+24:00", None),
    ];
    for (text, want) in cases {
        assert_eq!(parse_rfc3339(text), *want, "{text:?}");
    }
}

#[test]
fn cached_responses() {
    assert!(is_cached(StatusCode::NOT_MODIFIED, &HeaderMap::new()));
    assert!(is_cached(StatusCode::OK, &headers(&[("age", "30")])));
    assert!(!is_cached(StatusCode::OK, &HeaderMap::new()));
}

#[test]
fn nothing_said_is_an_empty_reading() {
    let h = headers(&[
        ("content-type", "application/json"),
        ("x-request-id", "abc"),
        ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
    ]);
    assert!(read(&h, StatusCode::OK, now()).is_empty());
}
