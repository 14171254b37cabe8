//! Keys the model made up for each attempt of a call: a repeat (joined or replayed) whose
//! key arguments carry values that no earlier request of its record carried. Each such
//! value is counted once (`oncely_key_churn_total` by route and tool, `oncely.key_churn`
//! on its span). The values are remembered by a hash, in memory, for the records this
//! instance saw last: a repeat of a record another instance ran (or one forgotten here)
//! counts its value as made up unless it saw it before.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use oncely_core::RecordId;
use serde_json::Value;

/// How many records' values are remembered.
const REMEMBERED: usize = 4096;

/// The values of the key arguments each remembered record's requests carried.
#[derive(Debug, Default)]
pub(crate) struct MadeKeys {
    inner: Mutex<Remembered>,
}

#[derive(Debug, Default)]
struct Remembered {
    seen: HashMap<RecordId, Vec<u64>>,
    order: VecDeque<RecordId>,
}

/// The hash of the values at `pointers` in `arguments`, `None` when none is present.
pub(crate) fn values_of<'a>(
    arguments: &Value,
    pointers: impl Iterator<Item = &'a str>,
) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut any = false;
    for p in pointers {
        if let Some(v) = arguments.pointer(p) {
            any = true;
            p.hash(&mut h);
            v.to_string().hash(&mut h);
        }
    }
    any.then(|| h.finish())
}

impl MadeKeys {
    /// The values the request that executed `record` carried.
    pub(crate) fn first(&self, record: &RecordId, values: u64) {
        self.seen(record, values);
    }

    /// Whether a repeat of `record` carrying `values` made its key up: none of the
    /// record's requests carried them before. Remembers them.
    pub(crate) fn made_up(&self, record: &RecordId, values: u64) -> bool {
        self.seen(record, values)
    }

    fn seen(&self, record: &RecordId, values: u64) -> bool {
        let mut r = self.inner.lock().expect("made keys lock");
        if let Some(known) = r.seen.get_mut(record) {
            if known.contains(&values) {
                return false;
            }
            known.push(values);
            return true;
        }
        if r.order.len() >= REMEMBERED {
            if let Some(old) = r.order.pop_front() {
                r.seen.remove(&old);
            }
        }
        r.order.push_back(record.clone());
        r.seen.insert(record.clone(), vec![values]);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_repeat_with_the_first_key_is_not_made_up_and_each_new_one_counts_once() {
        let keys = MadeKeys::default();
        let rec = RecordId("rec_1".into());
        let of = |k: &str| {
            values_of(
                &json!({"idempotency_key": k, "amount": 1}),
                ["/idempotency_key"].into_iter(),
            )
            .unwrap()
        };
        keys.first(&rec, of("a"));
        assert!(!keys.made_up(&rec, of("a")));
        assert!(keys.made_up(&rec, of("b")));
        assert!(!keys.made_up(&rec, of("b")), "counted once");
        assert!(
            keys.made_up(&RecordId("rec_2".into()), of("c")),
            "an unknown record"
        );
        assert_eq!(
            values_of(&json!({"amount": 1}), ["/idempotency_key"].into_iter()),
            None
        );
    }
}
