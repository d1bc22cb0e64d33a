//! The depth-first search of one claim's devices over its requests,
//! their alternatives and the node's devices, within a step bound and a
//! wall-clock bound (the allocator prepares its input in `allocator.rs`).

use std::collections::HashSet;

use k8s_openapi::api::resource::v1::DeviceToleration;

use super::inventory::NodeDevice;
use super::selector::AttributeValue;

/// The most devices one claim may be allocated (the API's limit).
pub const MAX_DEVICES_PER_CLAIM: usize = 32;

/// Search steps before giving up on a claim: a bound on CPU per attempt.
pub const MAX_SEARCH_STEPS: usize = 200_000;
/// Wall-clock time before giving up on a claim's search, whatever the
/// steps: a machine slower or busier than expected (a throttled one-CPU
/// pod) still holds a solver thread no longer than this per attempt.
pub const MAX_SEARCH_TIME: std::time::Duration = std::time::Duration::from_secs(1);
/// How many steps go by between looks at the clock.
const STEPS_PER_CLOCK_CHECK: usize = 256;

/// How many devices a request alternative takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Mode {
    Count(usize),
    All,
}

/// One way to satisfy a request: the request itself (`exactly`) or one of
/// its subrequests (`firstAvailable`).
pub(super) struct Alternative {
    /// The name results use: `req` or `req/sub`.
    pub(super) name: String,
    pub(super) class_name: String,
    pub(super) mode: Mode,
    pub(super) admin: bool,
    pub(super) tolerations: Vec<DeviceToleration>,
    /// Indices into the inventory of devices it may take, in order.
    pub(super) candidates: Vec<usize>,
    /// For `All`: every device its selectors match, usable or not.
    pub(super) matching: Vec<usize>,
    pub(super) tally: Tally,
}

/// Why devices were not offered to an alternative, for the failure message.
#[derive(Clone, Debug, Default)]
pub(super) struct Tally {
    pub(super) total: usize,
    pub(super) class_rejected: usize,
    pub(super) request_rejected: usize,
    pub(super) unsupported: usize,
    pub(super) tainted: usize,
    pub(super) in_use: usize,
    pub(super) free: usize,
}

pub(super) struct Request {
    /// The request's own name (the parent of subrequests).
    pub(super) name: String,
    pub(super) alternatives: Vec<Alternative>,
}

pub(super) struct MatchConstraint {
    /// Request names (`req` or `req/sub`) it covers; empty: all.
    pub(super) requests: Vec<String>,
    pub(super) attribute: String,
}

impl MatchConstraint {
    fn covers(&self, alternative: &str) -> bool {
        self.requests.is_empty()
            || self.requests.iter().any(|r| {
                r == alternative
                    || alternative
                        .split_once('/')
                        .is_some_and(|(parent, _)| r == parent)
            })
    }

    fn value_of(&self, device: &NodeDevice) -> Option<AttributeValue> {
        let (domain, id) = super::inventory::qualified(&device.id.driver, &self.attribute);
        device.facts.attributes.get(&domain)?.get(&id).cloned()
    }
}

/// The depth-first search over requests, alternatives and devices.
pub(super) struct Search<'a> {
    pub(super) requests: &'a [Request],
    pub(super) devices: &'a [NodeDevice],
    pub(super) constraints: &'a [MatchConstraint],
    /// The value each constraint is pinned to by the first device it saw.
    pub(super) values: Vec<Option<AttributeValue>>,
    /// Devices this claim has taken so far.
    pub(super) taken: HashSet<usize>,
    /// Per solved request: the alternative chosen and its devices.
    pub(super) chosen: Vec<(usize, Vec<usize>)>,
    pub(super) steps: usize,
    /// When the search gives up ([`MAX_SEARCH_TIME`] after it started).
    pub(super) deadline: std::time::Instant,
    /// Whether it gave up at its deadline: that depends on the machine's
    /// load, not on the claim, so the claim is tried again later instead
    /// of being refused.
    pub(super) timed_out: bool,
}

impl Search<'_> {
    pub(super) fn solve(&mut self, request: usize) -> Result<bool, String> {
        if request == self.requests.len() {
            return Ok(true);
        }
        // The API's limit is on the whole claim, across requests.
        let room = MAX_DEVICES_PER_CLAIM - self.chosen.iter().map(|(_, d)| d.len()).sum::<usize>();
        for (a, alt) in self.requests[request].alternatives.iter().enumerate() {
            let found = match alt.mode {
                Mode::Count(n) if n > room || n > alt.candidates.len() => false,
                Mode::All if alt.matching.len() > room => false,
                Mode::Count(n) => self.pick(request, a, n, 0, &mut Vec::new())?,
                Mode::All => self.take_all(request, a)?,
            };
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn step(&mut self) -> Result<(), String> {
        self.steps += 1;
        if self.steps > MAX_SEARCH_STEPS {
            return Err(format!(
                "no allocation found within {MAX_SEARCH_STEPS} search steps; simplify the claim's \
                 requests and constraints"
            ));
        }
        if self.steps.is_multiple_of(STEPS_PER_CLOCK_CHECK)
            && std::time::Instant::now() >= self.deadline
        {
            self.timed_out = true;
            return Err(format!(
                "no allocation found within {} ms of search ({} steps); tried again later",
                MAX_SEARCH_TIME.as_millis(),
                self.steps
            ));
        }
        Ok(())
    }

    /// Picks `left` more devices for alternative `a` of `request`, from
    /// candidate position `start` on (combinations, not permutations).
    fn pick(
        &mut self,
        request: usize,
        a: usize,
        left: usize,
        start: usize,
        picked: &mut Vec<usize>,
    ) -> Result<bool, String> {
        if left == 0 {
            self.chosen.push((a, picked.clone()));
            if self.solve(request + 1)? {
                return Ok(true);
            }
            self.chosen.pop();
            return Ok(false);
        }
        let alt = &self.requests[request].alternatives[a];
        for pos in start..alt.candidates.len() {
            if alt.candidates.len() - pos < left {
                break;
            }
            self.step()?;
            let device = alt.candidates[pos];
            let Some(saved) = self.take(&alt.name, device) else {
                continue;
            };
            picked.push(device);
            if self.pick(request, a, left - 1, pos + 1, picked)? {
                return Ok(true);
            }
            picked.pop();
            self.give_back(device, saved);
        }
        Ok(false)
    }

    /// `All`: every matching device, each usable, at least one.
    fn take_all(&mut self, request: usize, a: usize) -> Result<bool, String> {
        let alt = &self.requests[request].alternatives[a];
        if alt.matching.is_empty()
            || alt.matching.len() != alt.candidates.len()
            || alt.matching.len() > MAX_DEVICES_PER_CLAIM
        {
            return Ok(false);
        }
        let before = self.values.clone();
        let mut taken = Vec::new();
        for &device in &alt.candidates {
            self.step()?;
            if self.taken.contains(&device) {
                self.undo_all(&taken, before);
                return Ok(false);
            }
            if self.take(&alt.name, device).is_none() {
                return Err(format!(
                    "request {}: cannot add device {} because a claim constraint would not be satisfied",
                    alt.name, self.devices[device].id
                ));
            }
            taken.push(device);
        }
        self.chosen.push((a, taken.clone()));
        if self.solve(request + 1)? {
            return Ok(true);
        }
        self.chosen.pop();
        self.undo_all(&taken, before);
        Ok(false)
    }

    fn undo_all(&mut self, taken: &[usize], values: Vec<Option<AttributeValue>>) {
        for device in taken {
            self.taken.remove(device);
        }
        self.values = values;
    }

    /// Takes `device` for the alternative named `name` if the claim does not
    /// hold it yet and every constraint covering `name` allows it; returns
    /// the constraint values to restore when giving it back.
    fn take(&mut self, name: &str, device: usize) -> Option<Vec<Option<AttributeValue>>> {
        if self.taken.contains(&device) {
            return None;
        }
        let saved = self.values.clone();
        for (i, constraint) in self.constraints.iter().enumerate() {
            if !constraint.covers(name) {
                continue;
            }
            let Some(value) = constraint.value_of(&self.devices[device]) else {
                self.values = saved;
                return None;
            };
            match &self.values[i] {
                Some(pinned) if *pinned != value => {
                    self.values = saved;
                    return None;
                }
                Some(_) => {}
                None => self.values[i] = Some(value),
            }
        }
        self.taken.insert(device);
        Some(saved)
    }

    fn give_back(&mut self, device: usize, saved: Vec<Option<AttributeValue>>) {
        self.taken.remove(&device);
        self.values = saved;
    }
}

#[cfg(test)]
mod search_bounds {
    use super::*;

    /// A search past its wall-clock deadline gives up at the next look at
    /// the clock, long before its step bound.
    #[test]
    fn a_search_gives_up_at_its_deadline() {
        let mut search = Search {
            requests: &[],
            devices: &[],
            constraints: &[],
            values: Vec::new(),
            taken: HashSet::new(),
            chosen: Vec::new(),
            steps: 0,
            deadline: std::time::Instant::now(),
            timed_out: false,
        };
        let mut refusal = None;
        for _ in 0..STEPS_PER_CLOCK_CHECK {
            if let Err(e) = search.step() {
                refusal = Some(e);
                break;
            }
        }
        let refusal = refusal.expect("refused within one clock check");
        assert!(refusal.contains("ms of search"), "{refusal}");
        assert!(search.timed_out, "a time-out, not a refusal of the claim");
        assert_eq!(search.steps, STEPS_PER_CLOCK_CHECK);
    }
}
