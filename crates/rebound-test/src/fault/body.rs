//! The body bytes of a scripted response, cut into paced chunks; shared by
//! the HTTP/1.1 writer and the HTTP/2 body.

use std::time::Duration;

use bytes::Bytes;

use super::action::{BodySource, End, Reply};

/// The largest write: big enough for fast large bodies, small enough that a
/// 20 MiB body never sits in memory.
const MAX_CHUNK: usize = 64 * 1024;
/// The largest write when trickling.
const MAX_TRICKLE_CHUNK: u64 = 16 * 1024;

/// Yields the body bytes the script wants sent (up to its stall, truncation
/// or reset point), paced if asked.
#[derive(Debug)]
pub(crate) struct BodyPlan {
    source: Bytes,
    /// `source` is a filler block to repeat, not the body itself.
    filler: bool,
    /// Bytes to send before the ending.
    limit: u64,
    sent: u64,
    chunk: usize,
    interval: Option<Duration>,
}

impl BodyPlan {
    pub(crate) fn new(reply: &Reply) -> Self {
        let total = reply.body.len();
        let limit = match reply.end {
            End::Complete => total,
            End::Stall(n) | End::Truncate(n) | End::Reset(n) => n.min(total),
        };
        let (chunk, interval) = match reply.rate {
            Some(rate) => {
                let chunk = (rate / 10).clamp(1, MAX_TRICKLE_CHUNK);
                let interval = Duration::from_secs_f64(chunk as f64 / rate as f64);
                (chunk as usize, Some(interval))
            }
            None => (MAX_CHUNK, None),
        };
        let (source, filler) = match &reply.body {
            BodySource::Bytes(b) => (b.clone(), false),
            BodySource::Filler(_) => {
                let block = (limit as usize).min(chunk);
                (Bytes::from(vec![b'x'; block]), true)
            }
        };
        BodyPlan {
            source,
            filler,
            limit,
            sent: 0,
            chunk,
            interval,
        }
    }

    /// Whether every byte to send before the ending has been handed out.
    pub(crate) fn is_done(&self) -> bool {
        self.sent >= self.limit
    }

    /// The next chunk to write, after waiting for the pace; `None` when the
    /// bytes to send before the ending have all been handed out.
    pub(crate) async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.sent >= self.limit {
            return None;
        }
        if let Some(interval) = self.interval {
            if self.sent > 0 {
                tokio::time::sleep(interval).await;
            }
        }
        let n = (self.limit - self.sent).min(self.chunk as u64) as usize;
        let chunk = if self.filler {
            self.source.slice(..n)
        } else {
            let start = self.sent as usize;
            self.source.slice(start..start + n)
        };
        self.sent += n as u64;
        Some(chunk)
    }
}
