//! Which NULL tests a derivative needs.
//!
//! A derivative must be SQL NULL exactly where `f` (or a tangent/cotangent)
//! is. Testing `f IS NULL` on every row costs a second evaluation of parts of
//! `f` (and, through an aggregate, a whole extra aggregate), so the test is
//! left out where the derivative is NULL there anyway: where `f` can only be
//! NULL through some nullable leaves (columns, …) and only through strict
//! operations (arithmetic, math functions), and the derivative reaches every
//! one of those leaves through strict operations too. Where the derivative
//! covers only some of the leaves, the others are tested (`y IS NULL` for
//! `d/dx (x·v + y) = v`) rather than `f` itself: the same rows, without
//! evaluating `f` again, and without reading a leaf the derivative does not
//! need (an outer column in a subquery). Leaves are tracked as bits of a
//! mask; with more than 64 of them every test is kept.

use datafusion::common::HashMap;

use super::graph::{NodeId, NodeMap};
use super::primitive::is_strict;
use super::workspace::Workspace;

/// Most leaves tested one by one in place of `f IS NULL`.
const MAX_LEAF_TESTS: u32 = 4;

/// The NULL tests a derivative of one `f` may need.
pub(crate) struct Nulls {
    /// `f`'s root when `f` may be NULL, with the mask of the leaves it is NULL
    /// through (`None`: `f` may also be NULL otherwise, so it is always tested).
    f: Option<(NodeId, Option<u64>)>,
    /// The nullable seeds, each with its own bit (0: always tested).
    seeds: Vec<(NodeId, u64)>,
    /// The node of each bit.
    leaves: Vec<NodeId>,
    /// For each node of the derivatives, the leaves it is surely NULL with.
    masks: NodeMap<u64>,
}

impl Nulls {
    /// The tests for `outputs`, derivatives of `f` (its root, when nullable)
    /// with the nullable seeds `seeds`; `like` pairs a seed with a value it is
    /// NULL exactly where (see [`Workspace::nulls_like`]).
    pub(crate) fn new(
        ws: &mut Workspace,
        f: Option<NodeId>,
        seeds: &[NodeId],
        like: &[(NodeId, NodeId)],
        outputs: &[NodeId],
    ) -> Self {
        let mut nulls = Self {
            f: None,
            seeds: Vec::new(),
            leaves: Vec::new(),
            masks: NodeMap::default(),
        };
        if f.is_none() && seeds.is_empty() {
            return nulls;
        }
        let mut bits: HashMap<NodeId, u64> = HashMap::new();
        let mut bit = |id: NodeId| -> Option<u64> {
            let next = bits.len();
            match bits.get(&id) {
                Some(b) => Some(*b),
                None if next < 64 => {
                    bits.insert(id, 1 << next);
                    Some(1 << next)
                }
                None => None,
            }
        };
        if let Some(root) = f {
            let mut mask = Some(0u64);
            for n in ws.graph().reachable(&[root]) {
                if !ws.nullable(n) {
                    continue;
                }
                if ws.graph().args(n).is_empty() {
                    mask = mask.zip(bit(n)).map(|(m, b)| m | b);
                } else if !is_strict(ws.graph().shell(n)) {
                    mask = None;
                }
            }
            nulls.f = Some((root, mask));
        }
        nulls.seeds = seeds.iter().map(|&s| (s, bit(s).unwrap_or(0))).collect();
        nulls.leaves = vec![f.unwrap_or_default(); bits.len()];
        for (&n, &b) in &bits {
            nulls.leaves[b.trailing_zeros() as usize] = n;
        }
        let mut own: HashMap<NodeId, u64> = bits.clone();
        for &(seed, value) in like {
            if let Some(b) = bits.get(&value) {
                *own.entry(seed).or_default() |= b;
            }
        }
        let g = ws.graph();
        for n in g.reachable(outputs) {
            let mut mask = own.get(&n).copied().unwrap_or(0);
            if is_strict(g.shell(n)) {
                mask = g.args(n).iter().fold(mask, |m, a| m | nulls.masks[a]);
            }
            nulls.masks.insert(n, mask);
        }
        nulls
    }

    /// The nodes whose `IS NULL` the derivative `d` must be tested for.
    pub(crate) fn needed(&self, d: NodeId) -> Vec<NodeId> {
        let covered = self.masks.get(&d).copied().unwrap_or(0);
        let mut out = Vec::new();
        if let Some((root, mask)) = self.f {
            match mask.map(|m| m & !covered) {
                Some(0) => {}
                // f is NULL exactly where one of these leaves is
                Some(open) if open.count_ones() <= MAX_LEAF_TESTS => out.extend(
                    (0..64)
                        .filter(|b| open & (1 << b) != 0)
                        .map(|b| self.leaves[b]),
                ),
                _ => out.push(root),
            }
        }
        for &(seed, b) in &self.seeds {
            if b == 0 || b & !covered != 0 {
                out.push(seed);
            }
        }
        out
    }
}
