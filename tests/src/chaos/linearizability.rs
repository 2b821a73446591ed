//! A linearizability checker for a register, in the manner of Wing & Gong with Lowe's
//! memoization (what Porcupine and Knossos do): a depth-first search for an order of the
//! operations that respects real time (an operation that returned before another was invoked
//! comes first) and the register's sequential behaviour, memoizing each (set of operations
//! already ordered, register value) reached so that no configuration is explored twice.
//!
//! A write whose outcome is unknown (a timeout, a 5xx) has no return time: it may take effect
//! at any moment after its invocation, or never. A failed read tells nothing and is left out.

use std::collections::{HashMap, HashSet};

/// What one operation on the register did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Wrote this value.
    Write(String),
    /// Read this value.
    Read(String),
}

/// One operation of the recorded history: invoked at `invoke`, returned at `complete` (both
/// in nanoseconds from any common origin), `None` when the outcome is unknown.
#[derive(Clone, Debug)]
pub struct Operation {
    pub client: usize,
    pub invoke: u64,
    pub complete: Option<u64>,
    pub kind: Kind,
}

/// The checker's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order exists; `stuck_at` is the operation (index into the input) the longest
    /// partial order found could not place, and `ordered` how many operations it had placed.
    NotLinearizable {
        stuck_at: usize,
        ordered: usize,
    },
    /// The search ran out of its step budget before deciding.
    Unknown,
}

/// Checks `history` of one register that holds `initial` before any write. `budget` bounds
/// the configurations explored.
pub fn check_register(initial: &str, history: &[Operation], budget: usize) -> Verdict {
    // A write of unknown outcome whose value nobody read can be left out: if the rest has an
    // order, it goes last (a write always succeeds); and placing it never helps a read.
    let read_values: HashSet<&str> = history
        .iter()
        .filter_map(|op| match &op.kind {
            Kind::Read(value) => Some(value.as_str()),
            Kind::Write(_) => None,
        })
        .collect();
    let mut kept: Vec<(usize, &Operation)> = history
        .iter()
        .enumerate()
        .filter(|(_, op)| match (&op.kind, op.complete) {
            (Kind::Write(value), None) => read_values.contains(value.as_str()),
            _ => true,
        })
        .collect();
    kept.sort_by_key(|(_, op)| op.invoke);
    let n = kept.len();
    if n == 0 {
        return Verdict::Linearizable;
    }

    // Values interned: the register's state is a small integer.
    let mut values: HashMap<String, u32> = HashMap::new();
    let mut intern = |value: &str| -> u32 {
        let next = values.len() as u32;
        *values.entry(value.to_string()).or_insert(next)
    };
    let initial_state = intern(initial);
    struct Op {
        invoke: u64,
        complete: u64,
        write: bool,
        value: u32,
        known: bool,
    }
    let ops: Vec<Op> = kept
        .iter()
        .map(|(_, op)| {
            let (write, value) = match &op.kind {
                Kind::Write(value) => (true, value.as_str()),
                Kind::Read(value) => (false, value.as_str()),
            };
            Op {
                invoke: op.invoke,
                complete: op.complete.unwrap_or(u64::MAX),
                write,
                value: intern(value),
                known: op.complete.is_some(),
            }
        })
        .collect();
    let known_total = ops.iter().filter(|op| op.known).count();

    let words = n.div_ceil(64);
    let is_set = |set: &[u64], i: usize| set[i / 64] & (1 << (i % 64)) != 0;
    // The operations that may come next: not yet ordered, invoked before every remaining
    // operation returned (ops are sorted by invocation, so the scan stops early).
    let candidates = |set: &[u64]| -> Vec<usize> {
        let mut min_complete = u64::MAX;
        let mut out = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if is_set(set, i) {
                continue;
            }
            if op.invoke > min_complete {
                break;
            }
            min_complete = min_complete.min(op.complete);
            out.push(i);
        }
        // Ops pushed before min_complete fell may have been invoked after it: filter again.
        out.retain(|i| ops[*i].invoke <= min_complete);
        out
    };

    struct Frame {
        set: Vec<u64>,
        state: u32,
        known_done: usize,
        candidates: Vec<usize>,
        next: usize,
    }
    let root = vec![0u64; words];
    let mut stack = vec![Frame {
        candidates: candidates(&root),
        set: root,
        state: initial_state,
        known_done: 0,
        next: 0,
    }];
    let mut seen: HashSet<(Vec<u64>, u32)> = HashSet::new();
    let mut steps = 0usize;
    let mut deepest = (0usize, 0usize); // (ordered, the op it could not place)
    while let Some(frame) = stack.last_mut() {
        if frame.next == frame.candidates.len() {
            let ordered = frame.set.iter().map(|w| w.count_ones() as usize).sum();
            if ordered >= deepest.0 {
                let first_left = (0..n).find(|i| !is_set(&frame.set, *i)).unwrap_or(0);
                deepest = (ordered, first_left);
            }
            stack.pop();
            continue;
        }
        let i = frame.candidates[frame.next];
        frame.next += 1;
        let op = &ops[i];
        let state = if op.write {
            op.value
        } else if op.value == frame.state {
            frame.state
        } else {
            continue;
        };
        let known_done = frame.known_done + usize::from(op.known);
        if known_done == known_total {
            // What is left are writes of unknown outcome: they go last.
            return Verdict::Linearizable;
        }
        let mut set = frame.set.clone();
        set[i / 64] |= 1 << (i % 64);
        if !seen.insert((set.clone(), state)) {
            continue;
        }
        steps += 1;
        if steps > budget {
            return Verdict::Unknown;
        }
        stack.push(Frame {
            candidates: candidates(&set),
            set,
            state,
            known_done,
            next: 0,
        });
    }
    Verdict::NotLinearizable {
        stuck_at: kept[deepest.1].0,
        ordered: deepest.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(client: usize, invoke: u64, complete: Option<u64>, value: &str) -> Operation {
        Operation {
            client,
            invoke,
            complete,
            kind: Kind::Write(value.into()),
        }
    }

    fn read(client: usize, invoke: u64, complete: u64, value: &str) -> Operation {
        Operation {
            client,
            invoke,
            complete: Some(complete),
            kind: Kind::Read(value.into()),
        }
    }

    const BUDGET: usize = 1_000_000;

    #[test]
    fn a_sequential_history_is_linearizable() {
        let history = [
            read(0, 0, 1, "init"),
            write(0, 2, Some(3), "a"),
            read(1, 4, 5, "a"),
            write(1, 6, Some(7), "b"),
            read(0, 8, 9, "b"),
        ];
        assert_eq!(
            check_register("init", &history, BUDGET),
            Verdict::Linearizable
        );
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        // The read overlaps both writes: it may see either, and the later read sees "b".
        let history = [
            write(0, 0, Some(10), "a"),
            write(1, 1, Some(11), "b"),
            read(2, 2, 12, "a"),
            read(2, 13, 14, "b"),
        ];
        assert_eq!(
            check_register("init", &history, BUDGET),
            Verdict::Linearizable
        );
    }

    #[test]
    fn a_stale_read_is_rejected() {
        // "b" was written after "a" returned; a read invoked after "b" returned sees "a".
        let history = [
            write(0, 0, Some(1), "a"),
            write(0, 2, Some(3), "b"),
            read(1, 4, 5, "a"),
        ];
        assert!(matches!(
            check_register("init", &history, BUDGET),
            Verdict::NotLinearizable { stuck_at: 2, .. }
        ));
    }

    #[test]
    fn a_value_read_back_and_forth_is_rejected() {
        // Reads that see "b" then "a" again, with no write of "a" in between.
        let history = [
            write(0, 0, Some(10), "a"),
            write(1, 0, Some(10), "b"),
            read(2, 11, 12, "b"),
            read(3, 13, 14, "a"),
        ];
        assert!(matches!(
            check_register("init", &history, BUDGET),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn a_value_never_written_is_rejected() {
        let history = [write(0, 0, Some(1), "a"), read(1, 2, 3, "z")];
        assert!(matches!(
            check_register("init", &history, BUDGET),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn a_write_of_unknown_outcome_may_take_effect_late_or_never() {
        // The timed-out write of "x" is seen long after it was invoked: allowed.
        let late = [
            write(0, 0, None, "x"),
            read(1, 5, 6, "init"),
            read(1, 100, 101, "x"),
        ];
        assert_eq!(check_register("init", &late, BUDGET), Verdict::Linearizable);
        // Never seen: allowed too.
        let never = [write(0, 0, None, "x"), read(1, 5, 6, "init")];
        assert_eq!(
            check_register("init", &never, BUDGET),
            Verdict::Linearizable
        );
        // But not before it was invoked.
        let early = [read(1, 0, 1, "x"), write(0, 5, None, "x")];
        assert!(matches!(
            check_register("init", &early, BUDGET),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn a_long_history_of_overlapping_clients_is_checked_quickly() {
        // Three clients, each writing then reading its own value, overlapping in pairs.
        let mut history = Vec::new();
        let mut t = 0;
        for round in 0..2000 {
            let value = format!("v{round}");
            history.push(write(round % 3, t, Some(t + 3), &value));
            history.push(read((round + 1) % 3, t + 1, t + 5, &value));
            t += 4;
        }
        assert_eq!(
            check_register("init", &history, BUDGET),
            Verdict::Linearizable
        );
    }
}
