//! The quota's accounting: fixed windows aligned to the server's start, a
//! pure function of the time elapsed since then (no clock, no I/O), so it
//! is tested without sockets.

use std::collections::VecDeque;
use std::time::Duration;

use http::StatusCode;

use super::headers::{Dim, Reading};

/// What a request costs, read from its headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cost {
    /// Checked against the token quota at admission.
    pub(crate) est_total: u64,
    pub(crate) est_input: u64,
    pub(crate) est_output: u64,
    /// Charged once admitted.
    pub(crate) total: u64,
    pub(crate) input: u64,
    pub(crate) output: u64,
}

/// The configured limits.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    pub(crate) window: Duration,
    pub(crate) requests: Option<u64>,
    pub(crate) tokens: Option<u64>,
    pub(crate) input: Option<u64>,
    pub(crate) output: Option<u64>,
    /// Requests per period, and the period.
    pub(crate) daily: Option<(u64, Duration)>,
}

/// The counters of one window. Windows are numbered from 0 at the
/// server's start; only windows that received a request are kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowStats {
    /// The window's number: window `i` covers `[i·W, (i+1)·W)` after the
    /// server started.
    pub index: u64,
    /// Requests received in it (well-formed ones: a request with a
    /// malformed cost header counts in no window).
    pub received: u64,
    /// Requests admitted (answered 200).
    pub accepted: u64,
    /// Requests refused with a 429 (by this window's quota or the daily
    /// one).
    pub rejected: u64,
    /// Tokens charged in it (the actual cost of the admitted requests).
    pub tokens_used: u64,
    /// Input tokens charged in it.
    pub input_tokens_used: u64,
    /// Output tokens charged in it.
    pub output_tokens_used: u64,
}

/// One request as the [`QuotaServer`](super::QuotaServer) decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaRecord {
    /// Its position among the requests received, from 0.
    pub index: u64,
    /// When it arrived, since the server started (`tokio::time`).
    pub at: Duration,
    /// The window it arrived in.
    pub window: u64,
    /// `200`, `429`, or `400` (a malformed cost header).
    pub status: StatusCode,
    /// Whether the daily quota refused it.
    pub daily: bool,
    /// The token estimate it was admitted (or refused) on.
    pub tokens_estimated: u64,
    /// The tokens charged (0 unless admitted).
    pub tokens_charged: u64,
}

/// Totals since start, and the windows kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaSnapshot {
    /// Every request received, malformed ones included:
    /// `received == accepted + rejected + bad_requests`.
    pub received: u64,
    /// Requests admitted (200).
    pub accepted: u64,
    /// Requests refused (429), daily refusals included.
    pub rejected: u64,
    /// Of `rejected`, those the daily quota refused.
    pub rejected_daily: u64,
    /// Requests answered 400 for a malformed cost header.
    pub bad_requests: u64,
    /// Tokens charged since start.
    pub tokens_used: u64,
    /// Input tokens charged since start.
    pub input_tokens_used: u64,
    /// Output tokens charged since start.
    pub output_tokens_used: u64,
    /// The windows that received requests, oldest first, the current one
    /// last; at most the cap of kept windows (the oldest go first).
    pub windows: Vec<WindowStats>,
    /// Windows dropped from `windows` by the cap.
    pub windows_dropped: u64,
    /// Requests not kept in the records by the cap (they are counted
    /// everywhere else).
    pub records_dropped: u64,
}

/// The decision on one request.
#[derive(Debug)]
pub(crate) struct Decision {
    pub(crate) status: StatusCode,
    pub(crate) daily: bool,
    pub(crate) reading: Reading,
}

pub(crate) struct Ledger {
    limits: Limits,
    current: WindowStats,
    history: VecDeque<WindowStats>,
    max_windows: usize,
    day: u64,
    day_used: u64,
    totals: QuotaSnapshot,
    records: Vec<QuotaRecord>,
    max_records: usize,
}

fn index_of(elapsed: Duration, window: Duration) -> u64 {
    let i = elapsed.as_nanos() / window.as_nanos().max(1);
    u64::try_from(i).unwrap_or(u64::MAX)
}

/// Time from `elapsed` to the end of its window.
fn reset_of(elapsed: Duration, window: Duration) -> Duration {
    let w = window.as_nanos().max(1);
    let left = w - elapsed.as_nanos() % w;
    Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX))
}

impl Ledger {
    pub(crate) fn new(limits: Limits, max_records: usize, max_windows: usize) -> Self {
        Ledger {
            limits,
            current: WindowStats::default(),
            history: VecDeque::new(),
            max_windows: max_windows.max(1),
            day: 0,
            day_used: 0,
            totals: QuotaSnapshot::default(),
            records: Vec::new(),
            max_records,
        }
    }

    /// Moves to the window (and day) `elapsed` falls in.
    fn roll(&mut self, elapsed: Duration) {
        let index = index_of(elapsed, self.limits.window);
        if index != self.current.index {
            if self.current.received > 0 {
                if self.history.len() + 1 >= self.max_windows {
                    self.history.pop_front();
                    self.totals.windows_dropped += 1;
                }
                self.history.push_back(self.current);
            }
            self.current = WindowStats {
                index,
                ..WindowStats::default()
            };
        }
        if let Some((_, period)) = self.limits.daily {
            let day = index_of(elapsed, period);
            if day != self.day {
                self.day = day;
                self.day_used = 0;
            }
        }
    }

    fn record(&mut self, record: QuotaRecord) {
        if self.records.len() < self.max_records {
            self.records.push(record);
        } else {
            self.totals.records_dropped += 1;
        }
    }

    /// A request with a malformed cost header: counted, in no window.
    pub(crate) fn bad_request(&mut self, elapsed: Duration) {
        let index = self.totals.received;
        self.totals.received += 1;
        self.totals.bad_requests += 1;
        self.record(QuotaRecord {
            index,
            at: elapsed,
            window: index_of(elapsed, self.limits.window),
            status: StatusCode::BAD_REQUEST,
            daily: false,
            tokens_estimated: 0,
            tokens_charged: 0,
        });
    }

    /// Admits or refuses a request arriving `elapsed` after start, and
    /// says what its response reports.
    pub(crate) fn admit(&mut self, elapsed: Duration, cost: Cost) -> Decision {
        self.roll(elapsed);
        let l = &self.limits;
        let c = &self.current;
        let daily_out = l.daily.is_some_and(|(q, _)| self.day_used >= q);
        let fits = |limit: Option<u64>, used: u64, need: u64| {
            limit.is_none_or(|q| used.saturating_add(need) <= q)
        };
        let window_out = !(l.requests.is_none_or(|q| c.accepted < q)
            && fits(l.tokens, c.tokens_used, cost.est_total)
            && fits(l.input, c.input_tokens_used, cost.est_input)
            && fits(l.output, c.output_tokens_used, cost.est_output));
        let accepted = !daily_out && !window_out;

        let index = self.totals.received;
        self.totals.received += 1;
        self.current.received += 1;
        if accepted {
            self.totals.accepted += 1;
            self.current.accepted += 1;
            self.day_used += 1;
            self.current.tokens_used += cost.total;
            self.current.input_tokens_used += cost.input;
            self.current.output_tokens_used += cost.output;
            self.totals.tokens_used += cost.total;
            self.totals.input_tokens_used += cost.input;
            self.totals.output_tokens_used += cost.output;
        } else {
            self.totals.rejected += 1;
            self.current.rejected += 1;
            if daily_out {
                self.totals.rejected_daily += 1;
            }
        }
        let window = self.current.index;
        let status = if accepted {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        self.record(QuotaRecord {
            index,
            at: elapsed,
            window,
            status,
            daily: daily_out,
            tokens_estimated: cost.est_total,
            tokens_charged: if accepted { cost.total } else { 0 },
        });

        let mut reading = self.reading(elapsed);
        if !accepted {
            reading.retry_after = Some(match (daily_out, self.limits.daily) {
                (true, Some((_, period))) => reset_of(elapsed, period),
                _ => reset_of(elapsed, self.limits.window),
            });
        }
        Decision {
            status,
            daily: daily_out,
            reading,
        }
    }

    /// What the quota looks like at `elapsed` (after the current request's
    /// charge); `wall` is filled in by the caller.
    fn reading(&self, elapsed: Duration) -> Reading {
        let l = &self.limits;
        let c = &self.current;
        let reset = reset_of(elapsed, l.window);
        let dim = |limit: Option<u64>, used: u64| {
            limit.map(|limit| Dim {
                limit,
                remaining: limit.saturating_sub(used),
                reset,
                window: l.window,
            })
        };
        Reading {
            requests: dim(l.requests, c.accepted),
            tokens: dim(l.tokens, c.tokens_used),
            input: dim(l.input, c.input_tokens_used),
            output: dim(l.output, c.output_tokens_used),
            daily: l.daily.map(|(limit, period)| Dim {
                limit,
                remaining: limit.saturating_sub(self.day_used),
                reset: reset_of(elapsed, period),
                window: period,
            }),
            retry_after: None,
            wall: std::time::UNIX_EPOCH,
        }
    }

    pub(crate) fn snapshot(&self) -> QuotaSnapshot {
        let mut snap = self.totals.clone();
        snap.windows = self.history.iter().copied().collect();
        if self.current.received > 0 {
            snap.windows.push(self.current);
        }
        snap
    }

    pub(crate) fn records(&self) -> Vec<QuotaRecord> {
        self.records.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_millis(100);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn limits() -> Limits {
        Limits {
            window: W,
            requests: Some(3),
            tokens: None,
            input: None,
            output: None,
            daily: None,
        }
    }

    #[test]
    fn fixed_windows_aligned_to_start() {
        let mut l = Ledger::new(limits(), 100, 100);
        let free = Cost::default();
        let statuses: Vec<u16> = [0, 10, 20, 30, 99, 100, 150]
            .into_iter()
            .map(|t| l.admit(ms(t), free).status.as_u16())
            .collect();
        assert_eq!(statuses, [200, 200, 200, 429, 429, 200, 200]);
        let d = l.admit(ms(160), free);
        assert_eq!(d.status, 200);
        let r = d.reading.requests.unwrap();
        assert_eq!((r.limit, r.remaining, r.reset), (3, 0, ms(40)));
        let refused = l.admit(ms(170), free);
        assert_eq!(refused.reading.retry_after, Some(ms(30)));

        let snap = l.snapshot();
        assert_eq!((snap.received, snap.accepted, snap.rejected), (9, 6, 3));
        let per: Vec<_> = snap
            .windows
            .iter()
            .map(|w| (w.index, w.accepted, w.rejected))
            .collect();
        assert_eq!(per, [(0, 3, 2), (1, 3, 1)]);
        // An empty window in between is not kept.
        l.admit(ms(450), free);
        assert_eq!(l.snapshot().windows.last().unwrap().index, 4);
        assert_eq!(l.snapshot().windows.len(), 3);
    }

    #[test]
    fn tokens_admit_on_the_estimate_and_charge_the_actual() {
        let mut l = Ledger::new(
            Limits {
                requests: None,
                tokens: Some(100),
                ..limits()
            },
            100,
            100,
        );
        let cost = |est, actual| Cost {
            est_total: est,
            total: actual,
            ..Cost::default()
        };
        assert_eq!(l.admit(ms(0), cost(60, 30)).status, 200);
        // 30 used: 60 more fits, 80 does not.
        assert_eq!(l.admit(ms(1), cost(80, 80)).status, 429);
        let d = l.admit(ms(2), cost(60, 90));
        assert_eq!(d.status, 200);
        // Over-use shows as nothing left, not a negative count.
        assert_eq!(d.reading.tokens.unwrap().remaining, 0);
        assert_eq!(l.snapshot().tokens_used, 120);
        assert_eq!(l.admit(ms(100), cost(100, 100)).status, 200);
        // An estimate above the whole quota never fits.
        assert_eq!(l.admit(ms(200), cost(101, 1)).status, 429);
    }

    #[test]
    fn input_and_output_buckets_apart() {
        let mut l = Ledger::new(
            Limits {
                requests: None,
                input: Some(10),
                output: Some(5),
                ..limits()
            },
            100,
            100,
        );
        let cost = |i, o| Cost {
            est_input: i,
            input: i,
            est_output: o,
            output: o,
            ..Cost::default()
        };
        assert_eq!(l.admit(ms(0), cost(8, 1)).status, 200);
        assert_eq!(l.admit(ms(1), cost(3, 0)).status, 429);
        assert_eq!(l.admit(ms(2), cost(2, 4)).status, 200);
        assert_eq!(l.admit(ms(3), cost(0, 1)).status, 429);
        let snap = l.snapshot();
        assert_eq!((snap.input_tokens_used, snap.output_tokens_used), (10, 5));
    }

    #[test]
    fn daily_quota_refuses_until_the_day_ends() {
        let day = Duration::from_secs(3600);
        let mut l = Ledger::new(
            Limits {
                daily: Some((4, day)),
                ..limits()
            },
            100,
            100,
        );
        let free = Cost::default();
        for t in [0, 1, 2, 100] {
            assert_eq!(l.admit(ms(t), free).status, 200);
        }
        let d = l.admit(ms(200), free);
        assert_eq!(d.status, 429);
        assert!(d.daily);
        assert_eq!(d.reading.retry_after, Some(day - ms(200)));
        assert_eq!(d.reading.daily.unwrap().remaining, 0);
        // The window's own quota is plenty, the day's is not.
        assert_eq!(d.reading.requests.unwrap().remaining, 3);
        assert_eq!(l.admit(day, free).status, 200);
        assert_eq!(l.snapshot().rejected_daily, 1);
    }

    #[test]
    fn records_and_windows_are_capped() {
        let mut l = Ledger::new(limits(), 5, 3);
        for t in 0..20 {
            l.admit(ms(t * 100), Cost::default());
        }
        assert_eq!(l.records().len(), 5);
        let snap = l.snapshot();
        assert_eq!(snap.records_dropped, 15);
        assert_eq!(snap.windows.len(), 3);
        assert_eq!(snap.windows_dropped, 17);
        assert_eq!(snap.windows.last().unwrap().index, 19);
        assert_eq!(snap.received, 20);
    }
}
