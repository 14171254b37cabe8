//! Sampling: whether a request's span is recorded and exported ([`Sample`]), and the
//! parent-based ratio sampler oncely's tracer has by default ([`ParentOrRatio`]).

use super::context::TraceParent;

/// Decides whether a server span is recorded and exported (an OpenTelemetry sampler: the
/// binary's is the SDK's, as `OTEL_TRACES_SAMPLER` names it). Called once per request,
/// with the trace id (the caller's, or a new one) and the caller's span when the trace
/// is continued; the request's children share its decision.
pub trait Sample: Send + Sync + 'static {
    /// Whether the span named `name` in trace `trace_id` is sampled.
    fn sample(&self, trace_id: [u8; 16], parent: Option<&TraceParent>, name: &str) -> bool;
}

/// A parent-based ratio sampler: a continued trace keeps its caller's sampled flag; a new
/// one is sampled when the last 8 bytes of its id, as a number, are below the threshold
/// (`u64::MAX` samples all, 0 none).
#[derive(Debug, Clone, Copy)]
pub struct ParentOrRatio {
    threshold: u64,
}

impl ParentOrRatio {
    /// Samples `ratio` (0 to 1) of new traces.
    pub fn new(ratio: f64) -> ParentOrRatio {
        let threshold = if ratio >= 1.0 {
            u64::MAX
        } else if ratio > 0.0 {
            (ratio * u64::MAX as f64) as u64
        } else {
            0
        };
        ParentOrRatio { threshold }
    }
}

impl Sample for ParentOrRatio {
    fn sample(&self, trace_id: [u8; 16], parent: Option<&TraceParent>, _: &str) -> bool {
        match parent {
            Some(p) => p.sampled,
            None => {
                let low = u64::from_be_bytes(trace_id[8..].try_into().expect("8 bytes"));
                self.threshold == u64::MAX || low < self.threshold
            }
        }
    }
}
