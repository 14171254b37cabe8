//! Puts the lines of one or several logs in time order, in bounded memory.
//!
//! Each input keeps a small reorder buffer: a line is released once the input has shown a
//! line at least `reorder` later than it (or the buffer is full, or the input ended), so
//! modest disorder inside one file (several workers writing one log) is undone. The
//! inputs are then merged by time, so logs of several gateway instances that each cover
//! the same day read as one day, and consecutive files (`mon.log tue.log`) read in turn.
//! A line later than that is released as soon as it is read; the detector counts it as
//! out of order and still judges it.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use crate::input::Input;
use crate::line::{LineReader, Request};
use crate::parse::{self, Lines};

/// A request and where it was read.
#[derive(Debug)]
pub(crate) struct Located {
    pub(crate) req: Request,
    /// Index into the inputs.
    pub(crate) file: u32,
    /// 1-based line number in that input.
    pub(crate) line: u64,
}

/// A line that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreadable {
    pub(crate) file: u32,
    pub(crate) line: u64,
    pub(crate) reason: String,
}

/// Most lines one input holds back while waiting for earlier ones.
const MAX_PENDING: usize = 1 << 18;

struct Pending {
    ts: i64,
    seq: u64,
    item: Located,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.ts, self.seq) == (other.ts, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.ts, self.seq).cmp(&(other.ts, other.seq))
    }
}

/// Lines waiting to be released, earliest first. Lines that come in order (nearly all)
/// are appended to a run in O(1); only those earlier than the run's last go to a heap.
#[derive(Default)]
struct Held {
    run: VecDeque<Pending>,
    late: BinaryHeap<Reverse<Pending>>,
}

impl Held {
    fn push(&mut self, p: Pending) {
        match self.run.back() {
            Some(last) if p < *last => self.late.push(Reverse(p)),
            _ => self.run.push_back(p),
        }
    }

    fn peek(&self) -> Option<&Pending> {
        match (self.run.front(), self.late.peek()) {
            (Some(a), Some(Reverse(b))) => Some(if b < a { b } else { a }),
            (a, b) => a.or(b.map(|Reverse(b)| b)),
        }
    }

    fn pop(&mut self) -> Option<Pending> {
        let from_late = match (self.run.front(), self.late.peek()) {
            (Some(a), Some(Reverse(b))) => b < a,
            (None, Some(_)) => true,
            _ => false,
        };
        if from_late {
            self.late.pop().map(|Reverse(p)| p)
        } else {
            self.run.pop_front()
        }
    }

    fn len(&self) -> usize {
        self.run.len() + self.late.len()
    }
}

struct Source {
    lines: Lines,
    index: u32,
    pending: Held,
    newest: i64,
    done: bool,
}

/// The merged, time-ordered stream of requests of all inputs.
pub(crate) struct Merged {
    sources: Vec<Source>,
    heads: BinaryHeap<Reverse<(i64, u64, usize)>>,
    reorder_ms: i64,
    seq: u64,
    started: bool,
}

impl Merged {
    pub(crate) fn new(inputs: Vec<Input>, reader: LineReader, reorder_ms: i64) -> Merged {
        let sources = parse::start(inputs, reader)
            .into_iter()
            .enumerate()
            .map(|(i, lines)| Source {
                lines,
                index: i as u32,
                pending: Held::default(),
                newest: i64::MIN,
                done: false,
            })
            .collect();
        Merged {
            sources,
            heads: BinaryHeap::new(),
            reorder_ms,
            seq: 0,
            started: false,
        }
    }

    /// The next request in time order; lines that cannot be read go to `unreadable`.
    pub(crate) fn next(&mut self, unreadable: &mut dyn FnMut(Unreadable)) -> Option<Located> {
        if !self.started {
            self.started = true;
            for s in 0..self.sources.len() {
                self.refill(s, unreadable);
            }
        }
        let Reverse((_, _, s)) = self.heads.pop()?;
        let next = self.sources[s]
            .pending
            .pop()
            .expect("a source with a head has a pending line");
        self.refill(s, unreadable);
        Some(next.item)
    }

    /// Bytes taken from all inputs so far (compressed bytes for gzip).
    pub(crate) fn consumed(&self) -> u64 {
        self.sources
            .iter()
            .map(|s| s.lines.consumed.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// The inputs' names, by index.
    pub(crate) fn names(&self) -> Vec<String> {
        self.sources.iter().map(|s| s.lines.name.clone()).collect()
    }

    /// Reads from source `s` until its earliest pending line may be released, and offers
    /// that line to the merge.
    fn refill(&mut self, s: usize, unreadable: &mut dyn FnMut(Unreadable)) {
        let source = &mut self.sources[s];
        loop {
            if let Some(min) = source.pending.peek() {
                if source.done
                    || min.ts <= source.newest.saturating_sub(self.reorder_ms)
                    || source.pending.len() >= MAX_PENDING
                {
                    self.heads.push(Reverse((min.ts, min.seq, s)));
                    return;
                }
            } else if source.done {
                return;
            }
            let Some((line, parsed)) = source.lines.next() else {
                source.done = true;
                continue;
            };
            match parsed {
                Ok(req) => {
                    source.newest = source.newest.max(req.ts);
                    self.seq += 1;
                    source.pending.push(Pending {
                        ts: req.ts,
                        seq: self.seq,
                        item: Located {
                            req,
                            file: source.index,
                            line,
                        },
                    });
                }
                Err(reason) => unreadable(Unreadable {
                    file: source.index,
                    line,
                    reason,
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::FieldMap;
    use std::io::Cursor;

    fn input(name: &str, lines: &[&str]) -> Input {
        let text = lines.join("\n");
        Input::from_reader(name, Cursor::new(text.into_bytes())).unwrap()
    }

    fn line(ts: i64, path: &str) -> String {
        format!(r#"{{"ts":{ts},"principal":"p","method":"POST","path":"{path}"}}"#)
    }

    fn drain(m: &mut Merged) -> (Vec<(i64, u32, u64)>, Vec<Unreadable>) {
        let mut bad = Vec::new();
        let mut out = Vec::new();
        while let Some(l) = m.next(&mut |u| bad.push(u)) {
            out.push((l.req.ts, l.file, l.line));
        }
        (out, bad)
    }

    #[test]
    fn files_covering_the_same_time_are_merged_and_local_disorder_is_undone() {
        // Timestamps in milliseconds (>= 1e11).
        let t = |s: i64| 1_762_423_200_000 + s * 1000;
        let a = [
            line(t(0), "/a"),
            line(t(20), "/a"),
            line(t(10), "/a"),
            line(t(40), "/a"),
        ];
        let b = [line(t(5), "/b"), line(t(30), "/b")];
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let b: Vec<&str> = b.iter().map(String::as_str).collect();
        let mut m = Merged::new(
            vec![input("a", &a), input("b", &b)],
            LineReader::new(&FieldMap::default(), &[]),
            60_000,
        );
        let (out, bad) = drain(&mut m);
        assert!(bad.is_empty());
        let ts: Vec<i64> = out.iter().map(|o| (o.0 - t(0)) / 1000).collect();
        assert_eq!(ts, [0, 5, 10, 20, 30, 40]);
        assert_eq!(out[2], (t(10), 0, 3));
        assert_eq!(out[1], (t(5), 1, 1));
    }

    #[test]
    fn unreadable_lines_keep_their_numbers_and_do_not_stop_the_stream() {
        let ok = line(1_762_423_200_000, "/x");
        let mut m = Merged::new(
            vec![input("a", &[&ok, "{broken", "", &ok, "[]"])],
            LineReader::new(&FieldMap::default(), &[]),
            0,
        );
        let (out, bad) = drain(&mut m);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].2, 4);
        let lines: Vec<u64> = bad.iter().map(|u| u.line).collect();
        assert_eq!(lines, [2, 5]);
        assert!(bad[0].reason.starts_with("not a JSON object"));
    }

    #[test]
    fn held_lines_come_out_earliest_first_whatever_the_order_in() {
        let pending = |ts: i64, seq: u64| Pending {
            ts,
            seq,
            item: Located {
                req: Request {
                    ts,
                    duration_ms: 0,
                    units: None,
                    names: crate::line::Names::new("p", "GET", "/"),
                    key: crate::canon::RequestKey(0),
                    idempotency_key: None,
                },
                file: 0,
                line: seq,
            },
        };
        let mut held = Held::default();
        let order = [5, 6, 2, 7, 7, 1, 9, 3, 8, 0, 4];
        for (seq, ts) in order.iter().enumerate() {
            held.push(pending(*ts, seq as u64));
        }
        assert_eq!(held.len(), order.len());
        assert!(held.late.len() >= 5, "the stragglers went to the heap");
        assert_eq!(held.peek().map(|p| p.ts), Some(0));
        let mut out = Vec::new();
        while let Some(p) = held.pop() {
            out.push((p.ts, p.seq));
        }
        let mut sorted = out.clone();
        sorted.sort();
        assert_eq!(out, sorted);
        assert_eq!(
            out[7..9],
            [(7, 3), (7, 4)],
            "equal times keep their reading order"
        );
    }
}
