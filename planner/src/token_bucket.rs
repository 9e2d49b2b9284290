//! A token-bucket shaper on a host link (`tc ... tbf`), as the benchmarks emulate links.

/// A token-bucket shaper on a host link (`tc ... tbf`): it refills at the link's goodput
/// whenever the link carries no data, up to its burst, and a data collective across hosts
/// goes through at once for as many bytes as it holds (both in payload bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenBucket {
    pub(crate) burst: f64,
    pub(crate) refill: f64,
    pub(crate) tokens: f64,
    /// Seconds the link has carried no data since the bucket was last brought up to date.
    pub(crate) idle: f64,
}

impl TokenBucket {
    /// The credit of a data collective of `bytes` on the link, after `before` more idle
    /// seconds (its latency, the flatten copy), and `after` idle seconds behind it (the
    /// write-back); what it spends is gone from the bucket.
    pub(crate) fn spend(&mut self, bytes: f64, before: f64, after: f64) -> f64 {
        self.tokens = (self.tokens + (self.idle + before) * self.refill).min(self.burst);
        self.idle = after;
        let credit = self.tokens.min(bytes);
        self.tokens -= credit;
        credit
    }
}
