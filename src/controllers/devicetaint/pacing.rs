//! The eviction pacing (`--device-taint-evictions-per-second`, and per
//! rule `--device-taint-evictions-per-rule-per-second`) as slots handed
//! out in turn: each eviction due is given the earliest time every limiter
//! among its reasons allows, and that time is taken from them at once. The
//! pod is queued for its slot and goes when it comes, without asking
//! again, so a thousand pods held back cost a thousand wake-ups, not a
//! thousand at every token (a limiter that is only asked lets them all
//! wake for each token and all but one go back to sleep).
//!
//! Each limiter is a generic cell rate: `interval` apart on average, with
//! a burst of one second's worth (as before: `ceil(rate)`) after a pause.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Rule limiters kept beyond this many are dropped once idle (back at a
/// full burst, so forgetting them changes nothing).
const RULES_KEPT_IDLE: usize = 64;

/// One limiter.
#[derive(Debug, Clone, Copy)]
struct Pace {
    interval: Duration,
    /// How far ahead of the schedule a burst may run: (burst - 1) slots.
    tolerance: Duration,
    /// When the next slot is due on the schedule (`None`: never used).
    due: Option<Instant>,
}

impl Pace {
    /// A limiter of `rate` per second (fractions allowed); `None` for 0,
    /// a negative or a non-finite rate (no pacing).
    fn new(rate: f64) -> Option<Pace> {
        if !rate.is_finite() || rate <= 0.0 {
            return None;
        }
        let interval = Duration::from_secs_f64(1.0 / rate);
        let burst = rate.ceil().min(f64::from(u32::MAX)) as u32;
        Some(Pace {
            interval,
            tolerance: interval * burst.saturating_sub(1),
            due: None,
        })
    }

    /// The earliest time this limiter allows, from `now`.
    fn earliest(&self, now: Instant) -> Instant {
        match self.due {
            None => now,
            Some(due) => due
                .checked_sub(self.tolerance)
                .map_or(now, |allowed| allowed.max(now)),
        }
    }

    /// Takes the slot at `at` (not earlier than [`Pace::earliest`]).
    fn take(&mut self, at: Instant) {
        let from = self.due.map_or(at, |due| due.max(at));
        self.due = Some(from + self.interval);
    }

    /// A slot taken but not used: the schedule moves back by one, so that
    /// the next asks get it (only while it runs ahead of `now`).
    fn give_back(&mut self, now: Instant) {
        if let Some(due) = self.due.filter(|due| *due > now) {
            self.due = Some(due.checked_sub(self.interval).map_or(now, |d| d.max(now)));
        }
    }

    /// Back at a full burst: as good as new.
    fn idle(&self, now: Instant) -> bool {
        self.due.is_none_or(|due| due <= now)
    }
}

/// Every limiter of the eviction controller.
#[derive(Debug)]
pub(crate) struct Pacing {
    overall: Option<Pace>,
    /// The limiter each rule gets (`None`: rules are not paced).
    per_rule: Option<Pace>,
    rules: HashMap<String, Pace>,
}

impl Pacing {
    /// Limiters of `overall` and `per_rule` evictions per second (0: none).
    pub(crate) fn new(overall: f64, per_rule: f64) -> Pacing {
        Pacing {
            overall: Pace::new(overall),
            per_rule: Pace::new(per_rule),
            rules: HashMap::new(),
        }
    }

    /// The slot for one eviction whose reasons are `rules`, at `now` or
    /// later: the earliest time the overall limiter and each rule's allow,
    /// taken from all of them.
    pub(crate) fn reserve(&mut self, rules: &[String], now: Instant) -> Instant {
        if self.rules.len() > RULES_KEPT_IDLE {
            self.rules.retain(|_, pace| !pace.idle(now));
        }
        let mut slot = self.overall.map_or(now, |pace| pace.earliest(now));
        if let Some(template) = self.per_rule {
            for rule in rules {
                let pace = self.rules.entry(rule.clone()).or_insert(template);
                slot = slot.max(pace.earliest(now));
            }
            for rule in rules {
                if let Some(pace) = self.rules.get_mut(rule) {
                    pace.take(slot);
                }
            }
        }
        if let Some(pace) = &mut self.overall {
            pace.take(slot);
        }
        slot
    }

    /// An eviction of `rules` that will not use its `slot` (cancelled, the
    /// pod gone): a slot still ahead is given back to every limiter it was
    /// taken from, so that evictions cancelled in their hundreds do not
    /// hold back those that come next. The schedule moves back by one slot
    /// whichever slot it was: one given back from the middle of the line
    /// goes to the next to ask at the time of the line's last, so two may
    /// go together there; over the line as a whole the rate holds.
    pub(crate) fn give_back(&mut self, rules: &[String], slot: Instant, now: Instant) {
        if slot <= now {
            return;
        }
        if let Some(pace) = &mut self.overall {
            pace.give_back(now);
        }
        for rule in rules {
            if let Some(pace) = self.rules.get_mut(rule) {
                pace.give_back(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// Offsets from `start` of the slots handed out, in milliseconds.
    fn slots(pacing: &mut Pacing, asks: &[(&[&str], u64)], start: Instant) -> Vec<u64> {
        asks.iter()
            .map(|(names, at_ms)| {
                let now = start + Duration::from_millis(*at_ms);
                let slot = pacing.reserve(&rules(names), now);
                (slot - start).as_millis() as u64
            })
            .collect()
    }

    #[test]
    fn slots_follow_the_rates_with_a_burst_of_one_second() {
        let start = Instant::now();
        // (case, overall/s, per rule/s, asks (rules, at ms), slots in ms)
        type Row = (
            &'static str,
            f64,
            f64,
            Vec<(&'static [&'static str], u64)>,
            Vec<u64>,
        );
        let rows: Vec<Row> = vec![
            (
                "no pacing: every slot is now",
                0.0,
                0.0,
                vec![(&["a"], 0), (&["a"], 0), (&["a"], 5)],
                vec![0, 0, 5],
            ),
            (
                "5/s per rule: a burst of 5, then 200 ms apart",
                0.0,
                5.0,
                vec![(&["a"], 0); 7],
                vec![0, 0, 0, 0, 0, 200, 400],
            ),
            (
                "rules apart have limiters apart",
                0.0,
                1.0,
                vec![(&["a"], 0), (&["b"], 0), (&["a"], 0), (&["b"], 0)],
                vec![0, 0, 1000, 1000],
            ),
            (
                "the overall limiter binds both rules",
                1.0,
                5.0,
                vec![(&["a"], 0), (&["b"], 0), (&["a"], 0)],
                vec![0, 1000, 2000],
            ),
            (
                "a pod of two rules waits for the later, and takes from both",
                0.0,
                1.0,
                vec![(&["a"], 0), (&["a", "b"], 0), (&["b"], 0)],
                vec![0, 1000, 2000],
            ),
            (
                "after a pause, the burst is back",
                0.0,
                2.0,
                vec![
                    (&["a"], 0),
                    (&["a"], 0),
                    (&["a"], 0),
                    (&["a"], 5000),
                    (&["a"], 5000),
                ],
                vec![0, 0, 500, 5000, 5000],
            ),
            (
                "fractions: 0.5/s is one every 2 s, a burst of one",
                0.5,
                0.0,
                vec![(&[], 0), (&[], 0), (&[], 100)],
                vec![0, 2000, 4000],
            ),
        ];
        for (case, overall, per_rule, asks, want) in rows {
            let mut pacing = Pacing::new(overall, per_rule);
            assert_eq!(slots(&mut pacing, &asks, start), want, "{case}");
        }
    }

    /// A thousand evictions due at once get a thousand distinct slots at
    /// the rate, in the order they asked: each is woken once.
    #[test]
    fn many_at_once_are_lined_up_in_order() {
        let start = Instant::now();
        let mut pacing = Pacing::new(10.0, 0.0);
        let got: Vec<Duration> = (0..1000)
            .map(|_| pacing.reserve(&[], start) - start)
            .collect();
        assert!(got.windows(2).all(|w| w[0] <= w[1]));
        // 10 in the first burst, then 100 ms apart.
        assert_eq!(got[9], Duration::ZERO);
        assert_eq!(got[10], Duration::from_millis(100));
        assert_eq!(got[999], Duration::from_millis(99_000));
    }

    /// Slots given back (evictions cancelled while they waited) go to the
    /// next to ask, for the overall limiter and the rule's alike.
    #[test]
    fn slots_given_back_go_to_the_next() {
        let start = Instant::now();
        let mut pacing = Pacing::new(1.0, 1.0);
        let a = rules(&["a"]);
        let taken: Vec<Instant> = (0..4).map(|_| pacing.reserve(&a, start)).collect();
        assert_eq!(taken[3] - start, Duration::from_secs(3));
        // The last two cancelled at 0.5 s; one used slot (0 s) is not
        // given back.
        let at = start + Duration::from_millis(500);
        pacing.give_back(&a, taken[0], at);
        pacing.give_back(&a, taken[3], at);
        pacing.give_back(&a, taken[2], at);
        let next = pacing.reserve(&a, at);
        assert_eq!(
            next - start,
            Duration::from_secs(2),
            "right after the one still held"
        );
        let other = pacing.reserve(&rules(&["b"]), at);
        assert_eq!(
            other - start,
            Duration::from_secs(3),
            "the overall limiter's next"
        );
    }

    /// Limiters of rules long idle are forgotten; busy ones are kept.
    #[test]
    fn idle_rule_limiters_are_dropped() {
        let start = Instant::now();
        let mut pacing = Pacing::new(0.0, 1.0);
        for i in 0..=RULES_KEPT_IDLE {
            pacing.reserve(&rules(&[&format!("r{i}")]), start);
        }
        // Five slots of "busy" taken at 1.5 s: its schedule runs to 6.5 s.
        for _ in 0..5 {
            pacing.reserve(&rules(&["busy"]), start + Duration::from_millis(1500));
        }
        pacing.reserve(&rules(&["late"]), start + Duration::from_secs(5));
        let mut kept: Vec<&String> = pacing.rules.keys().collect();
        kept.sort();
        assert_eq!(kept, ["busy", "late"]);
    }
}
