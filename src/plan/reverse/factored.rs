//! A block's partials summed per row of one of its leaves without the
//! joined rows, where the partial is a product of a factor of that leaf's
//! row and a factor of the other leaves' (a contraction).
//!
//! Below a matrix product `SELECT x.n, w.h, sum(x.v * w.val) FROM x JOIN w
//! ON x.d = w.d GROUP BY x.n, w.h`, the pass over the block `x ⋈ w` sends
//! each joined row the adjoint `ā(n, h)` of its group, and the partial of
//! `w.val` at that row is `ā(n, h) · x.v`: summed per row of `w`, that is
//! `Xᵀ·Ā`. Written as it comes, the pass builds all N·D·H joined rows (and
//! joins them to the adjoints) before summing them per row of `w`. Since
//! the partial is `D_T(t) · D_O(o, ā)` — a factor of the target leaf's row
//! `t` times a factor of the row `o` of the other leaves joined (the rest)
//! and the adjoints —, its sum per row `t` is `D_T(t) · S(K(t), g_T(t))`,
//! where
//!
//! ```text
//! S(k, gₜ) = Σ D_O(o, ā)  over the rows o of the rest with K(o) = k,
//!                          joined to the adjoints ā of the groups (gₜ, g_O(o))
//! ```
//!
//! is a `sum` of products over a join of the rest and the adjoints,
//! grouped by the join keys `K` and the target's group keys — a
//! contraction, which [`crate::exec::contraction`] runs without the joined
//! rows — and the target rows then meet one row of `S` each. Where no
//! group key reads the rest (a layer `GROUP BY x.n` whose weights have one
//! output), the adjoint is a factor of the target's row: its rows meet
//! their adjoints, and `S(k)` sums the rest's factors per join key alone
//! (else the rest's rows would be crossed with every adjoint). With more
//! than two leaves — matrix factorization's `r ⋈ u ⋈ v` — the rest is the
//! join of the others, the adjoints joined first to the leaf their keys
//! read: for `u`, `S(i, k) = Σ ā(i, j) · v(j, k)` over `r ⋈ ā`, each row
//! meeting the rows of `v` of its item (a contraction of the ratings with
//! `v`, never the ratings times the factors).
//!
//! A partial that is zero unless a condition on the target's row holds —
//! a `relu`'s, `CASE WHEN s > 0 THEN ā · w.val ELSE 0 END`, with the
//! engine's NULL guards around it — is summed the same way inside its
//! condition: per target row, `CASE WHEN s > 0 THEN Σ ā · w.val ELSE 0
//! END`, the `ELSE` being what the rows' zeros sum to (NULL where every
//! row's guards are NULL, as summing them would give). The backward pass
//! of a `relu` layer's input is then the contraction `Ā · Wᵀ`, not the
//! rows of `h ⋈ w` (a network's hidden layer: 100,000 joined rows per step
//! of the benchmark's network).
//!
//! Exactly the rows of the joined form: a row of `S` exists only where a
//! joined row does; NULL join keys never match (unless the join says `IS
//! NOT DISTINCT FROM`) and NULL group keys are one group; a factor that is
//! NULL drops the products it is in (a NULL `D_T(t)` every product of `t`,
//! as a NULL partial sends no gradient); duplicate rows count as often as
//! they occur. Only sums are reassociated (`Σ a·b = a·Σ b`), as a matrix
//! product's kernels do. Anything else — an outer join, a condition or a
//! factor that reads both the target and the rest (other than an equality
//! of an expression of each), a partial that is not a product of `Float64`
//! factors, anything volatile — is passed as it comes.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DFSchema, NullEquality, ScalarValue, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::expr::Case;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    lit, BinaryExpr, Expr, ExprSchemable, Filter, JoinType, LogicalPlan, Operator, Projection,
};

use super::backward::{aggregate, sum};
use super::block::Leaf;
use crate::plan::{columns, join_nulls_equal};
use crate::reserved::{Placeholder, GRADIENT};

/// One leaf of a block: its rows and the conditions on them alone.
struct Side {
    qualifier: TableReference,
    rows: LogicalPlan,
    filters: Vec<Expr>,
}

/// A block's rows that are an inner join of its leaves (at most 64).
struct Leaves {
    sides: Vec<Side>,
    /// The join's key pairs (as written, either way round) and whether
    /// NULL matches NULL (`IS NOT DISTINCT FROM`).
    pairs: Vec<(Expr, Expr, bool)>,
    /// The conditions over several leaves that are not such pairs.
    conditions: Vec<Expr>,
}

/// Where an expression's columns come from.
#[derive(Debug, Clone, Copy, Default)]
struct Reads {
    /// Columns of each leaf, by its bit.
    leaves: u64,
    /// The seed relation's columns (unqualified).
    seed: bool,
    /// Columns of anything else.
    other: bool,
}

impl Reads {
    fn of(e: &Expr, sides: &[Side]) -> Reads {
        let mut reads = Reads::default();
        for c in e.column_refs() {
            match &c.relation {
                Some(q) => match sides.iter().position(|s| s.qualifier == *q) {
                    Some(i) => reads.leaves |= 1 << i,
                    None => reads.other = true,
                },
                None => reads.seed = true,
            }
        }
        reads
    }

    /// Whether it reads leaves among `leaves` (at least one) and nothing
    /// else.
    fn only(self, leaves: u64) -> bool {
        self.leaves != 0 && self.leaves & !leaves == 0 && !self.seed && !self.other
    }
}

impl Leaves {
    /// `rows` as leaves joined, or `None`.
    fn of(rows: &LogicalPlan, leaf: &impl Fn(&TableReference) -> bool) -> Option<Leaves> {
        let mut leaves = Leaves {
            sides: vec![],
            pairs: vec![],
            conditions: vec![],
        };
        leaves.take(rows, leaf)?;
        // A volatile condition holds per joined row, not per leaf's row.
        let volatile = leaves
            .pairs
            .iter()
            .any(|(a, b, _)| a.is_volatile() || b.is_volatile());
        if volatile || leaves.conditions.iter().any(Expr::is_volatile) || leaves.sides.len() > 64 {
            return None;
        }
        // The conditions on one leaf go with it.
        let mut across = vec![];
        for c in std::mem::take(&mut leaves.conditions) {
            let reads = Reads::of(&c, &leaves.sides);
            match reads.leaves.count_ones() == 1 && reads.only(reads.leaves) {
                true => leaves.sides[reads.leaves.trailing_zeros() as usize]
                    .filters
                    .push(c),
                false => across.push(c),
            }
        }
        leaves.conditions = across;
        Some(leaves)
    }

    /// Collects the leaves, key pairs and conditions of `plan`.
    fn take(&mut self, plan: &LogicalPlan, leaf: &impl Fn(&TableReference) -> bool) -> Option<()> {
        match plan {
            LogicalPlan::Filter(f) => {
                self.conditions
                    .extend(split_conjunction(&f.predicate).into_iter().cloned());
                self.take(&f.input, leaf)
            }
            LogicalPlan::Join(j) if j.join_type == JoinType::Inner && !j.null_aware => {
                self.take(&j.left, leaf)?;
                self.take(&j.right, leaf)?;
                let nulls_match = j.null_equality == NullEquality::NullEqualsNull;
                let on =
                    j.on.iter()
                        .map(|(a, b)| (a.clone(), b.clone(), nulls_match));
                self.pairs.extend(on);
                // The condition not yet split into keys (as the SQL planner
                // leaves it): its equalities across the target and the rest
                // are keys too.
                self.conditions
                    .extend(j.filter.iter().flat_map(split_conjunction).cloned());
                Some(())
            }
            LogicalPlan::SubqueryAlias(s) if leaf(&s.alias) => {
                self.sides.push(Side {
                    qualifier: s.alias.clone(),
                    rows: plan.clone(),
                    filters: vec![],
                });
                Some(())
            }
            _ => None,
        }
    }

    /// The pair `(a, b)` as a condition.
    fn condition((a, b, nulls_match): &(Expr, Expr, bool)) -> Expr {
        let op = match nulls_match {
            true => Operator::IsNotDistinctFrom,
            false => Operator::Eq,
        };
        Expr::BinaryExpr(BinaryExpr::new(
            Box::new(a.clone()),
            op,
            Box::new(b.clone()),
        ))
    }
}

/// The factors of the product `e`, each `Float64`; `None` where `e` is not
/// such a product. A NULL guard `CASE WHEN c IS NULL THEN NULL ELSE e END`
/// is the factor `CASE WHEN c IS NULL THEN NULL ELSE 1.0 END` times `e`'s;
/// where `c` is itself such a product (the engine tests a whole term
/// `ā · relu(s) · w` that has a `CASE` in it), one such factor per factor
/// of `c`: a product of floats is NULL exactly where one of its factors is,
/// so the guards' product is NULL on the same rows, and each guard reads
/// one side alone. Where `gate` is given (and still empty), one factor may
/// be a [`Gate`] — `CASE WHEN c THEN e ELSE 0.0 END` (or `CASE WHEN c THEN
/// 0.0 ELSE e END`), the derivative of a `relu` or another piecewise
/// function: `e`'s factors go into the gate, not into `out`.
fn factors(
    e: &Expr,
    schema: &DFSchema,
    out: &mut Vec<Expr>,
    mut gate: Option<&mut Option<Gate>>,
) -> Result<Option<()>> {
    let float = e.get_type(schema)? == DataType::Float64;
    if let Expr::Case(Case {
        expr: None,
        when_then_expr,
        else_expr: Some(otherwise),
    }) = e
    {
        if let Some(tested) = null_tested(when_then_expr).filter(|_| float) {
            let mut parts = vec![];
            if factors(tested, schema, &mut parts, None)?.is_none() {
                parts = vec![tested.clone()];
            }
            for part in parts {
                out.push(guard(part));
            }
            return factors(otherwise, schema, out, gate);
        }
        if let Some(slot) = gate.as_deref_mut().filter(|g| g.is_none() && float) {
            if let Some((when, then)) = gated(when_then_expr, otherwise) {
                // (Else the `CASE` is one factor, as any other.)
                let mut inner = vec![];
                if factors(&then, schema, &mut inner, None)?.is_some() {
                    *slot = Some(Gate {
                        when,
                        inner,
                        whole: e.clone(),
                    });
                    return Ok(Some(()));
                }
            }
        }
    }
    match e {
        Expr::Alias(a) => factors(&a.expr, schema, out, gate),
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Multiply,
            right,
        }) if float => {
            if factors(left, schema, out, gate.as_deref_mut())?.is_none() {
                return Ok(None);
            }
            factors(right, schema, out, gate)
        }
        // The engine's unit factor: nothing to multiply by.
        Expr::Literal(ScalarValue::Float64(Some(one)), _) if *one == 1.0 => Ok(Some(())),
        e if float => {
            out.push(e.clone());
            Ok(Some(()))
        }
        _ => Ok(None),
    }
}

/// The NULL guard `CASE WHEN e IS NULL THEN NULL ELSE 1.0 END`: NULL where
/// `e` is, else 1 (recognised by [`guarded`]).
fn guard(e: Expr) -> Expr {
    null_or(e, 1.0)
}

/// `e` of a NULL guard made by [`guard`], or `None`.
fn guarded(f: &Expr) -> Option<&Expr> {
    match f {
        Expr::Case(Case {
            expr: None,
            when_then_expr,
            else_expr: Some(one),
        }) if matches!(one.as_ref(), Expr::Literal(ScalarValue::Float64(Some(v)), _) if *v == 1.0) => {
            null_tested(when_then_expr)
        }
        _ => None,
    }
}

/// `CASE WHEN e IS NULL THEN NULL ELSE value END`.
fn null_or(e: Expr, value: f64) -> Expr {
    Expr::Case(Case::new(
        None,
        vec![(
            Box::new(e.is_null()),
            Box::new(lit(ScalarValue::Float64(None))),
        )],
        Some(Box::new(lit(value))),
    ))
}

/// The factor of a product that is zero unless a condition holds:
/// `CASE WHEN when THEN Π inner ELSE 0.0 END`. Summed over the rows that
/// meet a target row, where `when` reads the target alone, it is
/// `CASE WHEN when THEN Π inner_T · Σ (Π outer_O · Π inner_O) ELSE Σ (Π
/// outer_O · 0.0) END` (times `Π outer_T`) — the sum of zeros is 0, or NULL
/// where every product around the gate is, as each row's zero would give.
struct Gate {
    /// The condition (NULL: not met).
    when: Expr,
    /// The factors of the value where it holds.
    inner: Vec<Expr>,
    /// The gate as written (a factor of one side where all of it reads that
    /// side).
    whole: Expr,
}

/// `(c, e)` of `CASE WHEN c THEN e ELSE 0.0 END`, or of `CASE WHEN c THEN
/// 0.0 ELSE e END` as `(c IS NOT TRUE, e)` (`e` where `c` is false or NULL).
fn gated(when_then: &[(Box<Expr>, Box<Expr>)], otherwise: &Expr) -> Option<(Expr, Expr)> {
    let zero = |e: &Expr| {
        matches!(e, Expr::Literal(ScalarValue::Float64(Some(z)), _)
            if *z == 0.0 && z.is_sign_positive())
    };
    let [(when, then)] = when_then else {
        return None;
    };
    match () {
        _ if zero(otherwise) && !zero(then) => Some((when.as_ref().clone(), then.as_ref().clone())),
        _ if zero(then) && !zero(otherwise) => {
            Some((when.as_ref().clone().is_not_true(), otherwise.clone()))
        }
        _ => None,
    }
}

/// `c` of a NULL guard's branch `WHEN c IS NULL THEN NULL`, or `None`.
fn null_tested(when_then: &[(Box<Expr>, Box<Expr>)]) -> Option<&Expr> {
    match when_then {
        [(when, then)] if matches!(then.as_ref(), Expr::Literal(v, _) if v.is_null()) => {
            match when.as_ref() {
                Expr::IsNull(tested) => Some(tested),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `factors` multiplied (1.0 for none).
fn product(factors: Vec<Expr>) -> Expr {
    factors.into_iter().reduce(|a, b| a * b).unwrap_or(lit(1.0))
}

/// Which part of a contraction a factor reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The target leaf's row (or the adjoints, where they meet it).
    Target,
    /// The other leaves' rows (or the adjoints, where they meet them).
    Rest,
}

/// A partial `Π mine · Π theirs`, or `Π mine · Π theirs ·` a gate.
struct Split {
    mine: Expr,
    theirs: Expr,
    gate: Option<SplitGate>,
}

/// A [`Gate`] whose condition reads the target's row: `CASE WHEN when
/// THEN mine · Σ theirs ELSE` the zeros `END` per target row.
struct SplitGate {
    when: Expr,
    /// The target's factors in the gate.
    mine: Expr,
    /// The rest's factors outside the gate and in it.
    theirs: Expr,
    zeros: Zeros,
}

/// What the rest's factors outside a gate times 0 sum to over the rows that
/// meet a target row.
enum Zeros {
    /// No such factor: 0.
    None,
    /// NULL guards of every factor of the rest's in the gate: NULL where
    /// the gate's sum is (no row's factors all non-NULL), else 0.
    WhereSummed,
    /// Anything else: summed (their product times 0.0).
    Summed(Expr),
}

impl Zeros {
    /// The zeros of a gate with the rest's factors `outside` it and
    /// `inside` it.
    fn of(outside: &[Expr], inside: &[Expr]) -> Zeros {
        if outside.is_empty() {
            return Zeros::None;
        }
        let guarded: Vec<&Expr> = outside.iter().filter_map(guarded).collect();
        match guarded.len() == outside.len() && inside.iter().all(|f| guarded.contains(&f)) {
            true => Zeros::WhereSummed,
            false => Zeros::Summed(product(outside.to_vec())),
        }
    }
}

/// A block's partials summed per row of its target leaf.
pub(super) enum PerRow {
    /// The target's rows, each with its partials' sums as columns.
    Rows(LogicalPlan),
    /// The one partial's sums keyed by the target's identity: each target
    /// row meets at most one of them (see [`summed_per_row`]).
    Scaled(Scaled),
}

/// The sums of a partial of the parameter rows keyed by their identity,
/// each met by the row of its identity and multiplied by a factor of that
/// row: the contribution `factor(t) · sum` of every row `t` that a sum's
/// keys name (a row named by none, or whose factor is NULL, gets nothing;
/// a NULL sum sends nothing). A group join adds them up without the join
/// (see [`super::group_join`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub(crate) struct Scaled {
    /// Columns `__dfgrad_key{j}` (the identity columns' values, in the
    /// identity's order, of their types; one row per identity at most),
    /// then the sum `__dfgrad_gradient`.
    pub sums: LogicalPlan,
    /// The factor, a `Float64` expression over the target's row (over the
    /// block leaf's columns as [`summed_per_row`] gives it).
    pub factor: Expr,
}

/// The rows of the leaf `target` of the block whose rows are `rows` (the
/// leaves' join, before the seed's), with column `names[n]` the sum of the
/// partial `partials[n]` over the block's rows that hold it — partials over
/// `rows` joined to the seed relation `seed` (group adjoints and keys,
/// joined to the rows by `seed_keys`: equal, NULL equal to NULL) — or
/// `None` where the block is not such a contraction (see the [module
/// docs](self)). `is_leaf` tells a block leaf's qualifier.
///
/// Where `identity` is given (the target is the parameter relation, told
/// apart by those of its columns), there is one partial, and the sums'
/// keys are exactly the identity columns (bare, each once, of the same
/// types), the sums come as [`PerRow::Scaled`]: keyed by the identity and
/// a factor of the target's row (its conditions on itself folded in as
/// `CASE WHEN … THEN factor END`), which is what the rows joined to the
/// sums would give, row for row.
pub(super) fn summed_per_row(
    rows: &LogicalPlan,
    target: &TableReference,
    seed: Option<(&LogicalPlan, &[Expr])>,
    partials: &[(String, Expr)],
    identity: Option<&[usize]>,
    is_leaf: impl Fn(&TableReference) -> bool,
) -> Result<Option<PerRow>> {
    let Some(leaves) = Leaves::of(rows, &is_leaf) else {
        return Ok(None);
    };
    let sides = &leaves.sides;
    if sides.len() < 2 {
        return Ok(None);
    }
    let Some(t) = sides.iter().position(|s| s.qualifier == *target) else {
        return Ok(None);
    };
    let mine_bit = 1u64 << t;
    let others_bits = (u64::MAX >> (64 - sides.len())) & !mine_bit;
    // Each condition: on the target, on the rest, or a key pair between
    // them (the rest's expression first).
    let (mut on_mine, mut on_others) = (sides[t].filters.clone(), vec![]);
    let mut on: Vec<(Expr, Expr, bool)> = vec![];
    let pairs = leaves.pairs.iter().map(Leaves::condition);
    for c in pairs.chain(leaves.conditions.iter().cloned()) {
        let reads = Reads::of(&c, sides);
        if reads.only(mine_bit) {
            on_mine.push(c);
        } else if reads.only(others_bits) {
            on_others.push(c);
        } else {
            let Some((theirs, mine, nulls_match)) = key_pair(&c, sides, others_bits, mine_bit)
            else {
                return Ok(None);
            };
            if theirs.get_type(rows.schema())? != mine.get_type(rows.schema())? {
                return Ok(None);
            }
            on.push((theirs, mine, nulls_match));
        }
    }
    // The schema the partials are over: the rows joined to the seed.
    let seeded = match seed {
        Some((relation, _)) => relation.schema().join(rows.schema())?,
        None => rows.schema().as_ref().clone(),
    };
    // The seed's keys by the side they read.
    let (mut seed_on_mine, mut seed_on_others) = (vec![], vec![]);
    if let Some((_, keys)) = seed {
        for (j, k) in keys.iter().enumerate() {
            let reads = Reads::of(k, sides);
            match () {
                _ if reads.only(mine_bit) => seed_on_mine.push((k.clone(), j)),
                _ if reads.only(others_bits) => seed_on_others.push((k.clone(), j)),
                _ => return Ok(None),
            }
        }
    }
    // The seed joins the rest where some of its keys are there (the sums
    // then run over the rest's rows and the adjoints), else the target's
    // rows (its adjoints are then a factor of the target's).
    let seed_with_others = !seed_on_others.is_empty();
    // Each partial as the target's factors and the rest's.
    let side = |f: &Expr| -> Option<Part> {
        let reads = Reads::of(f, sides);
        let on_target = reads.leaves & mine_bit != 0 || (reads.seed && !seed_with_others);
        let on_rest = reads.leaves & others_bits != 0 || (reads.seed && seed_with_others);
        match (on_target, on_rest) {
            _ if reads.other => None,
            (true, true) => None,
            (true, false) => Some(Part::Target),
            (false, _) => Some(Part::Rest),
        }
    };
    let mut split = Vec::with_capacity(partials.len());
    for (_, partial) in partials {
        let (mut all, mut gate) = (vec![], None);
        if partial.is_volatile() || factors(partial, &seeded, &mut all, Some(&mut gate))?.is_none()
        {
            return Ok(None);
        }
        // A gate that reads one side is a factor of that side.
        if let Some(g) = gate.take() {
            match side(&g.whole) {
                Some(_) => all.push(g.whole),
                None => gate = Some(g),
            }
        }
        let (mut mine, mut theirs) = (vec![], vec![]);
        for f in all {
            match side(&f) {
                Some(Part::Target) => mine.push(f),
                Some(Part::Rest) => theirs.push(f),
                None => return Ok(None),
            }
        }
        let gate = match gate {
            None => None,
            Some(g) => {
                // The condition on the target's row alone (or on none).
                if g.when.column_refs().is_empty() || side(&g.when) == Some(Part::Target) {
                    let (mut inner_mine, mut inner_theirs) = (vec![], vec![]);
                    for f in g.inner {
                        match side(&f) {
                            Some(Part::Target) => inner_mine.push(f),
                            Some(Part::Rest) => inner_theirs.push(f),
                            None => return Ok(None),
                        }
                    }
                    let zeros = Zeros::of(&theirs, &inner_theirs);
                    let theirs = product(theirs.iter().cloned().chain(inner_theirs).collect());
                    Some(SplitGate {
                        when: g.when,
                        mine: product(inner_mine),
                        theirs,
                        zeros,
                    })
                } else {
                    return Ok(None);
                }
            }
        };
        split.push(Split {
            mine: product(mine),
            theirs: product(theirs),
            gate,
        });
    }
    // The rest's rows that can join: their own conditions, and keys not
    // NULL where NULL matches nothing (then every key pair can match NULL
    // to NULL: the rest has none).
    let unmatched = on.iter().filter(|p| !p.2);
    on_others.extend(unmatched.map(|p| p.0.clone().is_not_null()));
    let mut mine = filtered(sides[t].rows.clone(), on_mine.clone())?;
    let seed_join = |rows: LogicalPlan, keys: &[(Expr, usize)]| -> Result<LogicalPlan> {
        let (relation, _) = seed.expect("a seed");
        let on = keys
            .iter()
            .map(|(k, j)| (k.clone(), Placeholder::Key.column(*j)))
            .collect();
        // NULL equal to NULL, as the groups' keys; the rows whose keys NULL
        // must not match were dropped before.
        join_nulls_equal(rows, relation.clone(), on, JoinType::Inner)
    };
    // The rest joined: the seed first with the leaf its keys read (the
    // sums' rows are then that leaf's joined to the adjoints, each meeting
    // the other leaves' rows of its keys), then the leaves in turn, each
    // with the conditions its rows complete.
    let seed_leaf = match seed_on_others
        .iter()
        .map(|(k, _)| Reads::of(k, sides).leaves)
        .reduce(|a, b| a | b)
    {
        Some(bits) if bits.count_ones() == 1 => Some(bits.trailing_zeros() as usize),
        _ => None,
    };
    let mut order: Vec<usize> = (0..sides.len()).filter(|&i| i != t).collect();
    if let Some(first) = seed_leaf {
        order.retain(|&i| i != first);
        order.insert(0, first);
    }
    let mut joined_bits = 0u64;
    let mut other: Option<LogicalPlan> = None;
    for i in order {
        joined_bits |= 1 << i;
        let (now, later): (Vec<Expr>, Vec<Expr>) = std::mem::take(&mut on_others)
            .into_iter()
            .partition(|c| Reads::of(c, sides).leaves & !joined_bits == 0);
        on_others = later;
        let next = match other {
            None => {
                let conditions = sides[i].filters.iter().cloned().chain(now).collect();
                filtered(sides[i].rows.clone(), conditions)?
            }
            Some(plan) => {
                // Its equalities with the leaves before as keys, NULL equal
                // to NULL (the keys under `=` not NULL: filtered before),
                // as every join built here: DataFusion's optimizer
                // flattens inner joins under one NULL rule.
                let before = joined_bits & !(1 << i);
                let (mut keys, mut rest) = (vec![], vec![]);
                let (mut left, mut right) = (vec![], sides[i].filters.clone());
                let schema = rows.schema();
                for c in now {
                    let pair = key_pair(&c, sides, before, 1 << i).filter(|(a, b, _)| {
                        matches!(
                            (a.get_type(schema), b.get_type(schema)), (Ok(x), Ok(y)) if x == y)
                    });
                    match pair {
                        Some((a, b, nulls_match)) => {
                            if !nulls_match {
                                left.push(a.clone().is_not_null());
                                right.push(b.clone().is_not_null());
                            }
                            keys.push((a, b));
                        }
                        // An `=` that DataFusion may still take for a key
                        // of these joins: its sides not NULL, as it says.
                        None => {
                            if let Expr::BinaryExpr(BinaryExpr {
                                left: a,
                                op: Operator::Eq,
                                right: b,
                            }) = &c
                            {
                                rest.push(a.as_ref().clone().is_not_null());
                                rest.push(b.as_ref().clone().is_not_null());
                            }
                            rest.push(c);
                        }
                    }
                }
                let leaf = filtered(sides[i].rows.clone(), right)?;
                let joined = join_nulls_equal(filtered(plan, left)?, leaf, keys, JoinType::Inner)?;
                filtered(joined, rest)?
            }
        };
        other = Some(match seed_leaf == Some(i) {
            true => seed_join(next, &seed_on_others)?,
            false => next,
        });
    }
    let mut other = other.expect("two leaves or more");
    if seed.is_some() {
        match seed_with_others {
            true if seed_leaf.is_none() => other = seed_join(other, &seed_on_others)?,
            true => {}
            false => mine = seed_join(mine, &seed_on_mine)?,
        }
    }
    // The target's keys into S: the join keys, and the target's group keys
    // where the seed is summed with the rest.
    let seed_on_mine = match seed_with_others {
        true => seed_on_mine,
        false => vec![],
    };
    // S: the rest's factors summed per join key and target group.
    let mut groups: Vec<Expr> = on.iter().map(|p| p.0.clone()).collect();
    groups.extend(
        seed_on_mine
            .iter()
            .map(|(_, j)| Placeholder::Key.column(*j)),
    );
    // Each partial's sums: the rest's factors (outside a gate and in it),
    // and where a gate's zeros need one, the zeros. Two sums may be the
    // same expression (`1.0` where a side has no value of its own): the
    // second is named apart.
    let mut named = HashSet::new();
    let mut sums = vec![];
    let mut add = |total: Expr| {
        let k = sums.len();
        let name = total.schema_name().to_string();
        sums.push(match named.insert(name) {
            true => total,
            false => total.alias(Placeholder::Contracted.name(k)),
        });
        k
    };
    let at: Vec<(usize, Option<usize>)> = split
        .iter()
        .map(|s| match &s.gate {
            None => (add(sum(s.theirs.clone())), None),
            Some(g) => {
                let summed = add(sum(g.theirs.clone()));
                let zeros = match &g.zeros {
                    Zeros::Summed(outside) => Some(add(sum(outside.clone() * lit(0.0)))),
                    _ => None,
                };
                (summed, zeros)
            }
        })
        .collect();
    let contracted = aggregate(other, groups, sums)?;
    let names = contracted
        .schema()
        .columns()
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let at = on.len() + seed_on_mine.len();
            let name = match i < at {
                true => Placeholder::JoinKey.name(i),
                false => Placeholder::Contracted.name(i - at),
            };
            Expr::Column(c).alias(name)
        })
        .collect();
    let contracted = LogicalPlan::Projection(Projection::try_new(names, Arc::new(contracted))?);
    if let Some(identity) = identity.filter(|_| {
        split.len() == 1 && split[0].gate.is_none() && (seed.is_none() || seed_with_others)
    }) {
        let keys: Vec<Expr> = (on.iter().map(|p| p.1.clone()))
            .chain(seed_on_mine.iter().map(|(k, _)| k.clone()))
            .collect();
        let seed_types = seed_on_mine
            .iter()
            .map(|(k, j)| Ok((k, Placeholder::Key.column(*j).get_type(&seeded)?)));
        let same_types = seed_types
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .all(|(k, t)| k.get_type(rows.schema()).is_ok_and(|kt| kt == t));
        if let Some(order) = identity_order(&keys, target, identity).filter(|_| same_types) {
            let mut exprs: Vec<Expr> = order
                .iter()
                .enumerate()
                .map(|(j, &i)| {
                    Placeholder::JoinKey
                        .column(i)
                        .alias(Placeholder::Key.name(j))
                })
                .collect();
            exprs.push(Placeholder::Contracted.column(0).alias(GRADIENT));
            let sums = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(contracted))?);
            let factor = split.remove(0).mine;
            let factor = match conjunction(on_mine) {
                Some(c) => Expr::Case(Case::new(
                    None,
                    vec![(Box::new(c), Box::new(factor))],
                    Some(Box::new(lit(ScalarValue::Float64(None)))),
                )),
                None => factor,
            };
            return Ok(Some(PerRow::Scaled(Scaled { sums, factor })));
        }
    }
    // The target's rows, each meeting its row of S.
    let keys = on.iter().map(|p| p.1.clone());
    let keys = keys.chain(seed_on_mine.iter().map(|(k, _)| k.clone()));
    let on = keys
        .enumerate()
        .map(|(i, k)| (k, Placeholder::JoinKey.column(i)))
        .collect();
    let met = join_nulls_equal(mine, contracted, on, JoinType::Inner)?;
    let mut exprs = columns(&sides[t].rows);
    for (((name, _), s), (summed, zeros)) in partials.iter().zip(split).zip(at) {
        let summed = Placeholder::Contracted.column(summed);
        let per_row = match s.gate {
            None => summed,
            Some(g) => {
                let zeros = match (g.zeros, zeros) {
                    (Zeros::None, _) => lit(0.0),
                    (Zeros::WhereSummed, _) => null_or(summed.clone(), 0.0),
                    (Zeros::Summed(_), Some(k)) => Placeholder::Contracted.column(k),
                    (Zeros::Summed(_), None) => unreachable!("the zeros summed"),
                };
                Expr::Case(Case::new(
                    None,
                    vec![(Box::new(g.when), Box::new(g.mine * summed))],
                    Some(Box::new(zeros)),
                ))
            }
        };
        exprs.push((s.mine * per_row).alias(name));
    }
    Ok(Some(PerRow::Rows(LogicalPlan::Projection(
        Projection::try_new(exprs, Arc::new(met))?,
    ))))
}

/// For each identity column (in `identity`'s order), the position among
/// `keys` of the target's column that is it, where `keys` are exactly the
/// identity columns of the leaf `target`, bare and each once; else `None`.
fn identity_order(
    keys: &[Expr],
    target: &TableReference,
    identity: &[usize],
) -> Option<Vec<usize>> {
    if keys.len() != identity.len() {
        return None;
    }
    let mut order = vec![None; identity.len()];
    for (position, key) in keys.iter().enumerate() {
        let Expr::Column(c) = key else {
            return None;
        };
        let i = Leaf::index_of(target, c)?;
        let j = identity.iter().position(|&x| x == i)?;
        if order[j].replace(position).is_some() {
            return None;
        }
    }
    order.into_iter().collect()
}

/// The condition `c` as a key pair — an expression over the leaves
/// `left` (bits), one over the leaves `right`, and whether NULL matches
/// NULL — where it is `=` or `IS NOT DISTINCT FROM` of such expressions.
fn key_pair(c: &Expr, sides: &[Side], left: u64, right: u64) -> Option<(Expr, Expr, bool)> {
    let Expr::BinaryExpr(BinaryExpr {
        left: a,
        op,
        right: b,
    }) = c
    else {
        return None;
    };
    if !matches!(op, Operator::Eq | Operator::IsNotDistinctFrom) {
        return None;
    }
    let (ra, rb) = (Reads::of(a, sides), Reads::of(b, sides));
    let (l, r) = match () {
        _ if ra.only(left) && rb.only(right) => (a, b),
        _ if ra.only(right) && rb.only(left) => (b, a),
        _ => return None,
    };
    Some((
        l.as_ref().clone(),
        r.as_ref().clone(),
        *op == Operator::IsNotDistinctFrom,
    ))
}

/// `rows` kept where every one of `conditions` holds.
fn filtered(rows: LogicalPlan, conditions: Vec<Expr>) -> Result<LogicalPlan> {
    Ok(match conjunction(conditions) {
        Some(c) => LogicalPlan::Filter(Filter::try_new(c, Arc::new(rows))?),
        None => rows,
    })
}
