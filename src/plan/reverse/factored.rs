//! A block's partials summed per row of one of its two leaves without
//! the joined rows, where the partial is a product of a factor of that
//! leaf's row and a factor of the other side's (a contraction).
//!
//! Below a matrix product `SELECT x.n, w.h, sum(x.v * w.val) FROM x JOIN w
//! ON x.d = w.d GROUP BY x.n, w.h`, the pass over the block `x ⋈ w` sends
//! each joined row the adjoint `ā(n, h)` of its group, and the partial of
//! `w.val` at that row is `ā(n, h) · x.v`: summed per row of `w`, that is
//! `Xᵀ·Ā`. Written as it comes, the pass builds all N·D·H joined rows (and
//! joins them to the adjoints) before summing them per row of `w`. Since
//! the partial is `D_T(t) · D_O(o, ā)` — a factor of the target leaf's row
//! `t` times a factor of the other leaf's row `o` and the adjoints —, its
//! sum per row `t` is `D_T(t) · S(K(t), g_T(t))`, where
//!
//! ```text
//! S(k, gₜ) = Σ D_O(o, ā)  over the rows o of the other leaf with K(o) = k,
//!                          joined to the adjoints ā of the groups (gₜ, g_O(o))
//! ```
//!
//! is a `sum` of products over a join of the other leaf and the adjoints,
//! grouped by the join keys `K` and the target's group keys — a
//! contraction, which [`crate::exec::contraction`] runs without the joined
//! rows — and the target rows then meet one row of `S` each. Where no
//! group key reads the other leaf (a layer `GROUP BY x.n` whose weights
//! have one output), the adjoint is a factor of the target's row: its rows
//! meet their adjoints, and `S(k)` sums the other leaf's factors per join
//! key alone (else the other leaf's rows would be crossed with every
//! adjoint).
//!
//! Exactly the rows of the joined form: a row of `S` exists only where a
//! joined row does; NULL join keys never match (unless the join says `IS
//! NOT DISTINCT FROM`) and NULL group keys are one group; a factor that is
//! NULL drops the products it is in (a NULL `D_T(t)` every product of `t`,
//! as a NULL partial sends no gradient); duplicate rows count as often as
//! they occur. Only sums are reassociated (`Σ a·b = a·Σ b`), as a matrix
//! product's kernels do. Anything else — more than two leaves, an outer
//! join, a condition or a factor that reads both sides, a partial that is
//! not a product of `Float64` factors, anything volatile — is passed as it
//! comes.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DFSchema, NullEquality, ScalarValue, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::expr::Case;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    lit, BinaryExpr, Expr, ExprSchemable, Filter, JoinType, LogicalPlan, Operator, Projection,
};

use super::backward::{aggregate, key_join, sum};
use crate::plan::columns;
use crate::reserved::Placeholder;

/// One side of a block of two leaves: the leaf's rows and the conditions
/// on them alone.
struct Side {
    qualifier: TableReference,
    rows: LogicalPlan,
    filters: Vec<Expr>,
}

/// A block's rows that are an inner join of exactly two leaves.
struct TwoLeaves {
    sides: [Side; 2],
    /// The join's key pairs, each an expression over side 0, one over side
    /// 1, and whether NULL matches NULL (`IS NOT DISTINCT FROM`).
    on: Vec<(Expr, Expr, bool)>,
}

/// Where an expression's columns come from.
#[derive(Debug, Clone, Copy, Default)]
struct Reads {
    /// Columns of the leaf of each side.
    leaf: [bool; 2],
    /// The seed relation's columns (unqualified).
    seed: bool,
    /// Columns of anything else.
    other: bool,
}

impl Reads {
    fn of(e: &Expr, qualifiers: [&TableReference; 2]) -> Reads {
        let mut reads = Reads::default();
        for c in e.column_refs() {
            match &c.relation {
                Some(q) if q == qualifiers[0] => reads.leaf[0] = true,
                Some(q) if q == qualifiers[1] => reads.leaf[1] = true,
                Some(_) => reads.other = true,
                None => reads.seed = true,
            }
        }
        reads
    }

    /// `Some(s)` when it reads the leaf of side `s` and nothing else.
    fn one_leaf(self) -> Option<usize> {
        match (self.leaf, self.seed || self.other) {
            ([true, false], false) => Some(0),
            ([false, true], false) => Some(1),
            _ => None,
        }
    }
}

impl TwoLeaves {
    /// `rows` as two leaves joined (conditions on one leaf alone above the
    /// join), or `None`.
    fn of(rows: &LogicalPlan, leaf: impl Fn(&TableReference) -> bool) -> Option<TwoLeaves> {
        let mut conditions = vec![];
        let mut plan = rows;
        while let LogicalPlan::Filter(f) = plan {
            conditions.extend(split_conjunction(&f.predicate).into_iter().cloned());
            plan = &f.input;
        }
        let LogicalPlan::Join(j) = plan else {
            return None;
        };
        if j.join_type != JoinType::Inner || j.null_aware {
            return None;
        }
        let side = |p: &LogicalPlan| match p {
            LogicalPlan::SubqueryAlias(s) if leaf(&s.alias) => Some(Side {
                qualifier: s.alias.clone(),
                rows: p.clone(),
                filters: vec![],
            }),
            _ => None,
        };
        let mut sides = [side(&j.left)?, side(&j.right)?];
        let qualifiers = [&sides[0].qualifier, &sides[1].qualifier];
        let schema = j.schema.as_ref();
        // A pair of keys, one over each side, of one type.
        let pair = |a: &Expr, b: &Expr| -> Option<(Expr, Expr)> {
            let same = matches!(
                (a.get_type(schema), b.get_type(schema)),
                (Ok(x), Ok(y)) if x == y
            );
            let sides = (
                Reads::of(a, qualifiers).one_leaf(),
                Reads::of(b, qualifiers).one_leaf(),
            );
            match sides {
                _ if !same => None,
                (Some(0), Some(1)) => Some((a.clone(), b.clone())),
                (Some(1), Some(0)) => Some((b.clone(), a.clone())),
                _ => None,
            }
        };
        let nulls_match = j.null_equality == NullEquality::NullEqualsNull;
        let mut on = Vec::with_capacity(j.on.len());
        for (a, b) in &j.on {
            let (a, b) = pair(a, b)?;
            on.push((a, b, nulls_match));
        }
        // The condition not yet split into keys (as the SQL planner leaves
        // it): equalities between the sides are keys too.
        if let Some(filter) = &j.filter {
            conditions.extend(split_conjunction(filter).into_iter().cloned());
        }
        // A volatile condition holds per joined row, not per side's row.
        if conditions.iter().any(Expr::is_volatile) {
            return None;
        }
        let mut filters: [Vec<Expr>; 2] = [vec![], vec![]];
        for c in conditions {
            match Reads::of(&c, qualifiers).one_leaf() {
                Some(s) => filters[s].push(c),
                None => match &c {
                    Expr::BinaryExpr(BinaryExpr { left, op, right })
                        if matches!(op, Operator::Eq | Operator::IsNotDistinctFrom) =>
                    {
                        let (a, b) = pair(left, right)?;
                        on.push((a, b, *op == Operator::IsNotDistinctFrom));
                    }
                    _ => return None,
                },
            }
        }
        let [f0, f1] = filters;
        sides[0].filters = f0;
        sides[1].filters = f1;
        Some(TwoLeaves { sides, on })
    }
}

/// The factors of the product `e`, each `Float64`; `None` where `e` is not
/// such a product. A NULL guard `CASE WHEN c IS NULL THEN NULL ELSE e END`
/// is the factor `CASE WHEN c IS NULL THEN NULL ELSE 1.0 END` times `e`'s.
fn factors(e: &Expr, schema: &DFSchema, out: &mut Vec<Expr>) -> Result<Option<()>> {
    let float = e.get_type(schema)? == DataType::Float64;
    match e {
        Expr::Alias(a) => factors(&a.expr, schema, out),
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Multiply,
            right,
        }) if float => {
            if factors(left, schema, out)?.is_none() {
                return Ok(None);
            }
            factors(right, schema, out)
        }
        Expr::Case(Case {
            expr: None,
            when_then_expr,
            else_expr: Some(otherwise),
        }) if float
            && matches!(when_then_expr.as_slice(), [(when, then)]
                if matches!(when.as_ref(), Expr::IsNull(_))
                && matches!(then.as_ref(), Expr::Literal(v, _) if v.is_null())) =>
        {
            let guard = when_then_expr[0].0.clone();
            out.push(Expr::Case(Case::new(
                None,
                vec![(guard, Box::new(lit(ScalarValue::Float64(None))))],
                Some(Box::new(lit(1.0))),
            )));
            factors(otherwise, schema, out)
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

/// `factors` multiplied (1.0 for none).
fn product(factors: Vec<Expr>) -> Expr {
    factors.into_iter().reduce(|a, b| a * b).unwrap_or(lit(1.0))
}

/// The rows of the leaf `target` of the block whose rows are `rows` (the
/// leaves' join, before the seed's), with column `names[n]` the sum of the
/// partial `partials[n]` over the block's rows that hold it — partials over
/// `rows` joined to the seed relation `seed` (group adjoints and keys,
/// joined to the rows by `seed_keys`: equal, NULL equal to NULL) — or
/// `None` where the block is not such a contraction (see the [module
/// docs](self)). `is_leaf` tells a block leaf's qualifier.
pub(super) fn summed_per_row(
    rows: &LogicalPlan,
    target: &TableReference,
    seed: Option<(&LogicalPlan, &[Expr])>,
    partials: &[(String, Expr)],
    is_leaf: impl Fn(&TableReference) -> bool,
) -> Result<Option<LogicalPlan>> {
    let Some(two) = TwoLeaves::of(rows, is_leaf) else {
        return Ok(None);
    };
    let t = match &two.sides {
        [a, _] if a.qualifier == *target => 0,
        [_, b] if b.qualifier == *target => 1,
        _ => return Ok(None),
    };
    let o = 1 - t;
    let qualifiers = [&two.sides[0].qualifier, &two.sides[1].qualifier];
    // The schema the partials are over: the rows joined to the seed.
    let seeded = match seed {
        Some((relation, _)) => relation.schema().join(rows.schema())?,
        None => rows.schema().as_ref().clone(),
    };
    // The seed's keys by the side they read.
    let (mut seed_on_target, mut seed_on_other) = (vec![], vec![]);
    if let Some((_, keys)) = seed {
        for (j, k) in keys.iter().enumerate() {
            match Reads::of(k, qualifiers).one_leaf() {
                Some(s) if s == t => seed_on_target.push((k.clone(), j)),
                Some(_) => seed_on_other.push((k.clone(), j)),
                None => return Ok(None),
            }
        }
    }
    // The seed joins the other side where some of its keys are there (the
    // sums then run over the other side's rows and the adjoints), else the
    // target's rows (its adjoints are then a factor of the target's).
    let seed_side = match seed_on_other.is_empty() {
        true => t,
        false => o,
    };
    // Each partial as (the target's factor, the other side's).
    let mut split = Vec::with_capacity(partials.len());
    for (_, partial) in partials {
        let mut all = vec![];
        if partial.is_volatile() || factors(partial, &seeded, &mut all)?.is_none() {
            return Ok(None);
        }
        let (mut mine, mut theirs) = (vec![], vec![]);
        for f in all {
            let reads = Reads::of(&f, qualifiers);
            let on_target = reads.leaf[t] || (reads.seed && seed_side == t);
            let on_other = reads.leaf[o] || (reads.seed && seed_side == o);
            match (on_target, on_other) {
                _ if reads.other => return Ok(None),
                (true, true) => return Ok(None),
                (true, false) => mine.push(f),
                (false, _) => theirs.push(f),
            }
        }
        split.push((product(mine), product(theirs)));
    }
    let pick = |pair: &(Expr, Expr, bool), s: usize| match s {
        0 => pair.0.clone(),
        _ => pair.1.clone(),
    };
    // The other side's rows that can join: its own conditions, and keys
    // not NULL where NULL matches nothing (then every key pair can match
    // NULL to NULL: the other side has none).
    let mut conditions = two.sides[o].filters.clone();
    let unmatched = two.on.iter().filter(|p| !p.2);
    conditions.extend(unmatched.map(|p| pick(p, o).is_not_null()));
    let mut other = filtered(two.sides[o].rows.clone(), conditions)?;
    let mut mine = filtered(two.sides[t].rows.clone(), two.sides[t].filters.clone())?;
    if let Some((relation, _)) = seed {
        let (rows, keys) = match seed_side == o {
            true => (&mut other, &seed_on_other),
            false => (&mut mine, &seed_on_target),
        };
        let on = keys
            .iter()
            .map(|(k, j)| (k.clone(), Placeholder::Key.column(*j)))
            .collect();
        // NULL equal to NULL, as the groups' keys; the rows whose keys NULL
        // must not match were dropped before.
        *rows = key_join(rows.clone(), relation.clone(), on, JoinType::Inner)?;
    }
    // The target's keys into S: the join keys, and the target's group keys
    // where the seed is summed with the other side.
    let seed_on_target = match seed_side == o {
        true => seed_on_target,
        false => vec![],
    };
    // S: the other side's factors summed per join key and target group.
    let mut groups: Vec<Expr> = two.on.iter().map(|p| pick(p, o)).collect();
    groups.extend(
        seed_on_target
            .iter()
            .map(|(_, j)| Placeholder::Key.column(*j)),
    );
    let sums = split
        .iter()
        .map(|(_, theirs)| sum(theirs.clone()))
        .collect();
    let contracted = aggregate(other, groups, sums)?;
    let names = contracted
        .schema()
        .columns()
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let at = two.on.len() + seed_on_target.len();
            let name = match i < at {
                true => Placeholder::JoinKey.name(i),
                false => Placeholder::Contracted.name(i - at),
            };
            Expr::Column(c).alias(name)
        })
        .collect();
    let contracted = LogicalPlan::Projection(Projection::try_new(names, Arc::new(contracted))?);
    // The target's rows, each meeting its row of S.
    let keys = two.on.iter().map(|p| pick(p, t));
    let keys = keys.chain(seed_on_target.iter().map(|(k, _)| k.clone()));
    let on = keys
        .enumerate()
        .map(|(i, k)| (k, Placeholder::JoinKey.column(i)))
        .collect();
    let met = key_join(mine, contracted, on, JoinType::Inner)?;
    let mut exprs = columns(&two.sides[t].rows);
    for (n, ((name, _), (mine, _))) in partials.iter().zip(split).enumerate() {
        exprs.push((mine * Placeholder::Contracted.column(n)).alias(name));
    }
    Ok(Some(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(met),
    )?)))
}

/// `rows` kept where every one of `conditions` holds.
fn filtered(rows: LogicalPlan, conditions: Vec<Expr>) -> Result<LogicalPlan> {
    Ok(match conjunction(conditions) {
        Some(c) => LogicalPlan::Filter(Filter::try_new(c, Arc::new(rows))?),
        None => rows,
    })
}
