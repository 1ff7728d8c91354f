//! The backward pass over a loss's plan: blocks from the top down, each
//! relational operator replaced by its transpose.
//!
//! A pass over a block (see [`super::block`]) is given a [`Seed`]: the
//! block's output rows weighted by adjoints, `F = Σᵢ āᵢ(row)·vᵢ(row)`
//! summed over the rows, where `vᵢ` are values of the row and `āᵢ` comes
//! from above (1 for the loss column at the top; a group's adjoint times
//! its aggregate's transpose partial below an aggregate, joined to the rows
//! by the group keys). The engine differentiates `F` at each row with
//! respect to the columns of the block's leaves (one reverse sweep,
//! shared subexpressions), and the partials are summed per leaf row:
//! - a parameter scan: per parameter row, by the row's identity columns:
//!   the gradient's contribution;
//! - an aggregate: per group, by its keys: the adjoints of its outputs,
//!   which seed the pass over the aggregate's input through the transpose
//!   rules of [`crate::rules::transpose`] (group statistics joined back);
//! - a scalar subquery: one adjoint, seeding the pass over its plan.
//!
//! So a join's transpose is the join itself (the partials of a joined row
//! go to both of its sides, and are summed per side's row), a filter's is
//! the filter (rows dropped get nothing), a `UNION ALL`'s is the split into
//! branches, and a table read several times gets the sum over its reads.
//! An aggregate read several times (a CTE of groups joined by several
//! blocks) is passed through once, after every aggregate that reads it,
//! with the group adjoints of its reads summed ([`Backward::run`]).

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, Column, ScalarValue, TableReference};
use datafusion::error::Result;
use datafusion::functions_aggregate::count::count_udaf;
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::{
    cast, lit, Aggregate, Expr, ExprFunctionExt, ExprSchemable, Filter, JoinType, LogicalPlan,
    LogicalPlanBuilder, Projection, SubqueryAlias, Window, WindowFunctionDefinition,
};

use super::block::{Alternative, Blocks, Leaf, LeafKind};
use super::factored::{self, PerRow, Scaled};
use super::Contributions;
use crate::engine::{differentiate, Seed as Sweep};
use crate::error::{fail, GradError};
use crate::plan::shared::{share, unshared};
use crate::plan::{columns, join_nulls_equal, unalias};
use crate::reserved::{Placeholder, GRADIENT, SEED, STATS};
use crate::rules::transpose::{transpose_rule, TransposeCall};
use crate::rules::{num, Rules};
use crate::tensor::{self, Shape};

/// The adjoints a pass over a plan starts from.
pub(super) struct Seed {
    /// The relation of group adjoints and statistics (columns
    /// `__dfgrad_key{j}`, `__dfgrad_adj{i}`, `__dfgrad_stat{k}`), and the
    /// keys (expressions over the plan's output) its rows join by; `None`:
    /// one adjoint for all rows.
    pub relation: Option<(LogicalPlan, Vec<Expr>)>,
    /// `(vᵢ, āᵢ)`: a value of the plan's output row, and its adjoint over
    /// the row and the relation's columns.
    pub terms: Vec<(Expr, Expr)>,
}

/// One backward pass, collecting the gradient's contributions.
pub(super) struct Backward<'a> {
    blocks: Blocks<'a>,
    variable: usize,
    identity: &'a [usize],
    rules: &'a Rules,
    /// Per reached parameter scan: `(__dfgrad_key{j}…, __dfgrad_gradient)`,
    /// a row per row of the block, or sums met by the rows (summed per
    /// parameter row by the caller).
    pub contributions: Contributions,
    /// The aggregates reached and not yet passed through: each with its
    /// height and the group adjoints of every read of it.
    pending: Vec<Pending>,
}

/// An aggregate the pass has reached, and the adjoints of its reads so far.
struct Pending {
    /// The aggregate (its shared node, equal at every read).
    plan: LogicalPlan,
    /// How many aggregates deep it is: every aggregate that reads it is
    /// higher.
    height: usize,
    /// Per read: the group adjoints (keys, then `__dfgrad_adj{i}`) and
    /// the outputs `i` they are of.
    reads: Vec<(LogicalPlan, Vec<usize>)>,
}

impl<'a> Backward<'a> {
    /// A pass for the parameter relation `parameter`, differentiating with
    /// respect to its column `variable`, its rows told apart by the columns
    /// `identity`.
    /// `constants`: subplans read as data ([`Blocks::with_constants`]).
    pub fn new(
        parameter: &'a LogicalPlan,
        variable: usize,
        identity: &'a [usize],
        constants: &'a [LogicalPlan],
        rules: &'a Rules,
    ) -> Self {
        Self {
            blocks: Blocks::new(parameter).with_constants(constants),
            variable,
            identity,
            rules,
            contributions: Contributions::default(),
            pending: Vec::new(),
        }
    }

    /// The whole backward pass from the loss `plan`, seeded by `seed`. An
    /// aggregate read several times (a CTE of groups that several blocks
    /// join) is passed through once, with the adjoints of all its reads
    /// summed, after every aggregate that reads it: highest first.
    pub fn run(&mut self, plan: &LogicalPlan, seed: &Seed) -> Result<()> {
        self.pass(plan, seed)?;
        while let Some(k) = (0..self.pending.len()).max_by_key(|&k| self.pending[k].height) {
            let Pending { plan, reads, .. } = self.pending.swap_remove(k);
            let LogicalPlan::Aggregate(a) = unshared(&plan) else {
                unreachable!("an aggregate leaf")
            };
            // Shared: the passes of other gradients of the same loss in
            // the statement reach equal adjoints, computed once.
            let (adjoints, indexes) = summed(reads, a.group_expr.len())?;
            self.through_aggregate(a, share(adjoints), &indexes)?;
        }
        Ok(())
    }

    /// The pass over `plan` from `seed`.
    fn pass(&mut self, plan: &LogicalPlan, seed: &Seed) -> Result<()> {
        for alt in self.blocks.flatten(plan)? {
            self.block(plan, alt, seed)?;
        }
        Ok(())
    }

    /// The pass over one alternative of the block of `plan`.
    fn block(&mut self, plan: &LogicalPlan, alt: Alternative, seed: &Seed) -> Result<()> {
        let targets: Vec<usize> = alt
            .leaves
            .iter()
            .copied()
            .filter(|&k| self.blocks.leaves[k].kind != LeafKind::Data)
            .collect();
        if targets.is_empty() || seed.terms.is_empty() {
            return Ok(());
        }
        let schema = plan.schema();
        let outputs = &alt.outputs;
        let over_rows = |e: &Expr| -> Result<Expr> {
            Ok(e.clone()
                .transform_up(|e| match &e {
                    Expr::Column(c) => match schema.maybe_index_of_column(c) {
                        Some(i) => Ok(Transformed::yes(outputs[i].clone())),
                        None => Ok(Transformed::no(e)),
                    },
                    _ => Ok(Transformed::no(e)),
                })?
                .data)
        };
        let mut rows = alt.rows.clone();
        let mut seed_keys = vec![];
        if let Some((relation, keys)) = &seed.relation {
            seed_keys = keys.iter().map(over_rows).collect::<Result<Vec<_>>>()?;
            let pairs = (seed_keys.iter().enumerate())
                .map(|(j, k)| (Placeholder::Key.column(j), k.clone()))
                .collect();
            // The adjoints (one per group) on the build side, the rows
            // (as many as the group's inputs) probing them.
            rows = join_nulls_equal(relation.clone(), rows, pairs, JoinType::Inner)?;
        }
        // The adjoints as columns: constants to the engine.
        let mut exprs = columns(&rows);
        let mut f: Option<Expr> = None;
        let mut adjoints = Vec::with_capacity(seed.terms.len());
        for (i, (value, adjoint)) in seed.terms.iter().enumerate() {
            adjoints.push(over_rows(adjoint)?);
            exprs.push(adjoints[i].clone().alias(Placeholder::Term.name(i)));
            let t = value.get_type(schema.as_ref())?;
            let term = inner(Placeholder::Term.column(i), over_rows(value)?, &t);
            f = Some(match f {
                Some(f) => f + term,
                None => term,
            });
        }
        let f = f.expect("a term");
        let weighted = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(rows))?);
        // The columns differentiated, per target leaf.
        let mut wrt: Vec<Column> = Vec::new();
        let mut spans = Vec::with_capacity(targets.len());
        for &k in &targets {
            let leaf = &self.blocks.leaves[k];
            let start = wrt.len();
            let indexes: Vec<usize> = match leaf.kind {
                LeafKind::Parameter => vec![self.variable],
                _ => (0..leaf.plan.schema().fields().len())
                    // Integer values (counts, keys) are piecewise constant.
                    .filter(|&i| {
                        let t = leaf.plan.schema().field(i).data_type();
                        t.is_floating() || t.is_decimal() || Shape::is_tensor_type(t)
                    })
                    .collect(),
            };
            if indexes.is_empty() {
                continue;
            }
            for &i in &indexes {
                let Expr::Column(c) = leaf.column(i) else {
                    unreachable!("a leaf column")
                };
                wrt.push(c);
            }
            spans.push((k, start, indexes));
        }
        if wrt.is_empty() {
            return Ok(());
        }
        let derivative = differentiate(&f, &wrt, Sweep::Grad, weighted.schema(), self.rules)?;
        let mut exprs = columns(&weighted);
        for (n, d) in derivative.exprs.iter().enumerate() {
            exprs.push(d.clone().alias(Placeholder::Partial.name(n)));
        }
        let partials = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(weighted))?);
        let seed_relation = (seed.relation.as_ref()).map(|(r, _)| (r, seed_keys.as_slice()));
        for (k, start, indexes) in spans {
            let leaf = self.blocks.leaves[k].clone();
            // Summed over the other leaves first where the block is a
            // contraction; else every row of the block.
            let floats = indexes
                .iter()
                .all(|&i| leaf.plan.schema().field(i).data_type() == &DataType::Float64);
            let contracted = match floats && alt.leaves.len() >= 2 {
                true => {
                    let of = |n: usize| -> Result<(String, Expr)> {
                        let d = Placeholder::Term.fill(derivative.exprs[n].clone(), &adjoints)?;
                        Ok((Placeholder::Partial.name(n), d))
                    };
                    let partials = (start..start + indexes.len())
                        .map(of)
                        .collect::<Result<Vec<_>>>()?;
                    let is_leaf = |q: &TableReference| {
                        alt.leaves
                            .iter()
                            .any(|&l| self.blocks.leaves[l].qualifier == *q)
                    };
                    let identity = (leaf.kind == LeafKind::Parameter).then_some(self.identity);
                    factored::summed_per_row(
                        &alt.rows,
                        &leaf.qualifier,
                        seed_relation,
                        &partials,
                        identity,
                        is_leaf,
                    )?
                }
                false => None,
            };
            // Summed per target row, each target row is there once.
            let once = matches!(contracted, Some(PerRow::Rows(_)));
            let there = match contracted {
                Some(PerRow::Rows(rows)) => rows,
                Some(PerRow::Scaled(Scaled { sums, factor })) => {
                    // The factor over the parameter relation's own columns.
                    let relation = leaf.plan.schema().columns();
                    let factor = factor
                        .transform_up(|e| match &e {
                            Expr::Column(c) if c.relation.as_ref() == Some(&leaf.qualifier) => {
                                match Leaf::index_of(&leaf.qualifier, c) {
                                    Some(i) => {
                                        Ok(Transformed::yes(Expr::Column(relation[i].clone())))
                                    }
                                    None => internal_err!("a leaf column: {c}"),
                                }
                            }
                            _ => Ok(Transformed::no(e)),
                        })?
                        .data;
                    self.contributions.scaled.push(Scaled { sums, factor });
                    continue;
                }
                None => LogicalPlan::Filter(Filter::try_new(
                    leaf.present().is_not_null(),
                    Arc::new(partials.clone()),
                )?),
            };
            let partial = |n: usize| {
                let t = leaf.plan.schema().field(indexes[n]).data_type();
                total(Placeholder::Partial.column(start + n), t)
            };
            match leaf.kind {
                LeafKind::Parameter => {
                    // Summed per parameter row with the other contributions.
                    let mut exprs: Vec<Expr> = self
                        .identity
                        .iter()
                        .enumerate()
                        .map(|(j, &i)| leaf.column(i).alias(Placeholder::Key.name(j)))
                        .collect();
                    exprs.push(Placeholder::Partial.column(start).alias(GRADIENT));
                    let there =
                        LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(there))?);
                    self.contributions.plans.push(there);
                }
                LeafKind::Subquery => {
                    let summed = aggregate(there, vec![], vec![partial(0)])?;
                    let relation = rename(&summed, 0, &[&Placeholder::Adjoint.name(0)])?;
                    let value = Expr::Column(leaf.plan.schema().columns()[0].clone());
                    let seed = Seed {
                        relation: Some((relation, vec![])),
                        terms: vec![(value, Placeholder::Adjoint.column(0))],
                    };
                    self.pass(&leaf.plan, &seed)?;
                }
                LeafKind::Aggregate => {
                    let LogicalPlan::Aggregate(a) = unshared(&leaf.plan) else {
                        unreachable!("an aggregate leaf")
                    };
                    let nkeys = a.group_expr.len();
                    let keys: Vec<Expr> = (0..nkeys).map(|j| leaf.column(j)).collect();
                    let summed = match own_rows(a, &alt, once, &there, start, indexes.len())? {
                        // Each group's one row: its partials are its sums.
                        true => {
                            let mut exprs = keys;
                            exprs.extend(
                                (0..indexes.len()).map(|n| Placeholder::Partial.column(start + n)),
                            );
                            LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(there))?)
                        }
                        false => {
                            let sums = (0..indexes.len()).map(partial).collect();
                            aggregate(there, keys, sums)?
                        }
                    };
                    let names: Vec<String> = indexes
                        .iter()
                        .map(|&i| Placeholder::Adjoint.name(i))
                        .collect();
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    let adjoints = rename(&summed, nkeys, &names)?;
                    self.defer(&leaf.plan, adjoints, indexes)?;
                }
                LeafKind::Data => unreachable!("data leaves are not targets"),
            }
        }
        Ok(())
    }

    /// Records a read of the aggregate `plan` with group adjoints
    /// `adjoints` of its outputs `indexes`, to be passed through by
    /// [`Self::run`].
    fn defer(
        &mut self,
        plan: &LogicalPlan,
        adjoints: LogicalPlan,
        indexes: Vec<usize>,
    ) -> Result<()> {
        match self.pending.iter_mut().find(|p| p.plan == *plan) {
            Some(p) => p.reads.push((adjoints, indexes)),
            None => self.pending.push(Pending {
                plan: plan.clone(),
                height: height(plan)?,
                reads: vec![(adjoints, indexes)],
            }),
        }
        Ok(())
    }

    /// The pass into the input of the aggregate `a`, given the adjoints of
    /// its outputs `indexes` per group (`adjoints`: keys, then
    /// `__dfgrad_adj{i}`).
    fn through_aggregate(
        &mut self,
        a: &Aggregate,
        adjoints: LogicalPlan,
        indexes: &[usize],
    ) -> Result<()> {
        if matches!(a.group_expr.as_slice(), [Expr::GroupingSet(_)]) {
            return fail(
                crate::error::ErrorKind::NeedsPlanContext,
                "the loss reads the parameter rows through GROUPING SETS, ROLLUP or CUBE, which \
                 relational reverse mode does not differentiate through; write one GROUP BY per \
                 grouping and UNION ALL them",
            );
        }
        let nkeys = a.group_expr.len();
        let mut stats: Vec<Expr> = Vec::new();
        let mut terms: Vec<(Expr, Expr)> = Vec::new();
        for &i in indexes {
            let adjoint = Placeholder::Adjoint.column(i);
            let t = a.schema.field(i).data_type();
            if i < nkeys {
                // A group key used as a value: split evenly among its rows.
                let n = count_rows(&mut stats);
                let share = match Shape::is_tensor_type(t) {
                    true => scaled(adjoint, num(1.0) / n, t),
                    false => adjoint / n,
                };
                terms.push((unalias(&a.group_expr[i]).clone(), share));
                continue;
            }
            let Expr::AggregateFunction(call) = unalias(&a.aggr_expr[i - nkeys]) else {
                return fail(
                    crate::error::ErrorKind::NeedsPlanContext,
                    format!(
                        "unexpected aggregate expression `{}`",
                        a.aggr_expr[i - nkeys]
                    ),
                );
            };
            let name = call.func.name().to_string();
            if call.params.distinct {
                return Err(GradError::non_differentiable(
                    &format!("{name}(DISTINCT …)"),
                    "relational reverse mode has no transpose for an aggregate over distinct \
                     values (which rows count depends on the values)",
                )
                .into());
            }
            let Some(rule) = transpose_rule(&call.func) else {
                return Err(GradError::non_differentiable(
                    &name,
                    "this aggregate has no transpose rule for relational reverse mode (the \
                     derivative with respect to a table's rows); sum, avg, count, max, min, \
                     var, var_pop, stddev and stddev_pop have one",
                )
                .into());
            };
            let mut transpose = TransposeCall::new(call, &mut stats);
            let partials = rule(&mut transpose)?;
            for (arg, partial) in call.params.args.iter().zip(partials) {
                if let Some(p) = partial {
                    terms.push((arg.clone(), scaled(adjoint.clone(), p, t)));
                }
            }
        }
        let relation = with_stats(a, adjoints, indexes, stats)?;
        let keys = a.group_expr.iter().map(|e| unalias(e).clone()).collect();
        self.pass(
            &a.input,
            &Seed {
                relation: Some((relation, keys)),
                terms,
            },
        )
    }
}

/// How many aggregates deep `plan` is (in subqueries too).
fn height(plan: &LogicalPlan) -> Result<usize> {
    let plan = unshared(plan);
    let mut h = 0;
    for input in plan.inputs() {
        h = h.max(height(input)?);
    }
    plan.apply_subqueries(|s| {
        h = h.max(height(s)?);
        Ok(TreeNodeRecursion::Jump)
    })?;
    Ok(h + usize::from(matches!(plan, LogicalPlan::Aggregate(_))))
}

/// The group adjoints of several reads of one aggregate (each: keys, then
/// `__dfgrad_adj{i}` for its outputs `i`) summed per group, for the union
/// of their outputs (returned, in order).
fn summed(
    mut reads: Vec<(LogicalPlan, Vec<usize>)>,
    nkeys: usize,
) -> Result<(LogicalPlan, Vec<usize>)> {
    if reads.len() == 1 {
        return Ok(reads.remove(0));
    }
    let mut indexes: Vec<usize> = reads.iter().flat_map(|(_, i)| i.clone()).collect();
    indexes.sort_unstable();
    indexes.dedup();
    // Each adjoint's type, as a read that has it gives it.
    let types: Vec<DataType> = indexes
        .iter()
        .map(|&i| {
            let (adjoints, _) = reads
                .iter()
                .find(|(_, own)| own.contains(&i))
                .expect("read");
            let name = Placeholder::Adjoint.name(i);
            let field = adjoints.schema().field_with_unqualified_name(&name)?;
            Ok(field.data_type().clone())
        })
        .collect::<Result<_>>()?;
    let mut all: Option<LogicalPlan> = None;
    for (adjoints, own) in reads {
        let mut exprs: Vec<Expr> = (0..nkeys).map(|j| Placeholder::Key.column(j)).collect();
        for (&i, t) in indexes.iter().zip(&types) {
            exprs.push(match own.contains(&i) {
                true => Placeholder::Adjoint.column(i),
                false => {
                    let none = ScalarValue::try_from(t)?;
                    Expr::Literal(none, None).alias(Placeholder::Adjoint.name(i))
                }
            });
        }
        let read = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(adjoints))?);
        all = Some(match all {
            None => read,
            Some(all) => LogicalPlanBuilder::from(all).union(read)?.build()?,
        });
    }
    let keys = (0..nkeys).map(|j| Placeholder::Key.column(j)).collect();
    let sums = indexes
        .iter()
        .zip(&types)
        .map(|(&i, t)| total(Placeholder::Adjoint.column(i), t))
        .collect();
    let grouped = aggregate(all.expect("several reads"), keys, sums)?;
    let names: Vec<String> = indexes
        .iter()
        .map(|&i| Placeholder::Adjoint.name(i))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Ok((rename(&grouped, nkeys, &names)?, indexes))
}

/// Whether the partials `start..start + count` over `rows` (the block
/// `alt`'s rows, where they read the aggregate `a`) summed per group of
/// `a` are the partials themselves: the block reads `a` alone (its rows
/// are `a`'s, filtered, each joined to at most one row of a seed that has
/// one row per key) or `rows` are `a`'s rows each once (`once`: summed per
/// row of `a` over the block, see `factored`), `a` has plain group keys
/// (one output row per group; not grouping sets, and not none: an aggregate
/// without groups gives a row of NULLs for no rows), and the partials are
/// `Float64` (their sums' type).
fn own_rows(
    a: &Aggregate,
    alt: &Alternative,
    once: bool,
    rows: &LogicalPlan,
    start: usize,
    count: usize,
) -> Result<bool> {
    if (alt.leaves.len() != 1 && !once)
        || a.group_expr.is_empty()
        || a.group_expr
            .iter()
            .any(|e| matches!(e, Expr::GroupingSet(_)))
    {
        return Ok(false);
    }
    for n in start..start + count {
        if Placeholder::Partial.column(n).get_type(rows.schema())? != DataType::Float64 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `count(*)` over the group, as a Float64 statistic.
fn count_rows(stats: &mut Vec<Expr>) -> Expr {
    let stat = Expr::AggregateFunction(AggregateFunction::new_udf(
        count_udaf(),
        vec![lit(1)],
        false,
        None,
        vec![],
        None,
    ));
    let k = match stats.iter().position(|s| *s == stat) {
        Some(k) => k,
        None => {
            stats.push(stat);
            stats.len() - 1
        }
    };
    cast(Placeholder::Stat.column(k), DataType::Float64)
}

/// The seed relation of `a`'s input: the group adjoints with the group
/// statistics the transpose rules asked for joined to them (a statistic
/// that reads another, like the ties of a maximum, over a window of the
/// first).
fn with_stats(
    a: &Aggregate,
    adjoints: LogicalPlan,
    indexes: &[usize],
    stats: Vec<Expr>,
) -> Result<LogicalPlan> {
    if stats.is_empty() {
        return Ok(adjoints);
    }
    let nkeys = a.group_expr.len();
    let keys: Vec<Expr> = a.group_expr.iter().map(|e| unalias(e).clone()).collect();
    let reads_stat = |e: &Expr| {
        e.exists(|e| Ok(matches!(e, Expr::Column(c) if Placeholder::Stat.claims(c))))
            .unwrap_or(false)
    };
    // First-level statistics that a second-level one reads, as windows.
    let second: Vec<bool> = stats.iter().map(reads_stat).collect();
    let mut input = a.input.as_ref().clone();
    if second.contains(&true) {
        let mut windows = Vec::new();
        for (k, s) in stats.iter().enumerate() {
            if second[k] {
                continue;
            }
            let Expr::AggregateFunction(call) = s else {
                unreachable!("a statistic is an aggregate")
            };
            windows.push(
                Expr::from(WindowFunction::new(
                    WindowFunctionDefinition::AggregateUDF(Arc::clone(&call.func)),
                    call.params.args.clone(),
                ))
                .partition_by(keys.clone())
                .build()?
                .alias(Placeholder::Stat.name(k)),
            );
        }
        input = LogicalPlan::Window(Window::try_new(windows, Arc::new(input))?);
    }
    let aggregates: Vec<Expr> = stats
        .iter()
        .enumerate()
        .map(|(k, s)| match second.contains(&true) && !second[k] {
            // Already per group as a window: any row's value.
            true => Expr::AggregateFunction(AggregateFunction::new_udf(
                datafusion::functions_aggregate::min_max::max_udaf(),
                vec![Placeholder::Stat.column(k)],
                false,
                None,
                vec![],
                None,
            ))
            .alias(Placeholder::Stat.name(k)),
            false => s.clone().alias(Placeholder::Stat.name(k)),
        })
        .collect();
    let grouped = aggregate(input, keys, aggregates)?;
    let names: Vec<String> = (0..stats.len())
        .map(|k| Placeholder::Stat.name(k))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let stats_rel = alias(rename(&grouped, nkeys, &names)?, STATS)?;
    let seed = alias(adjoints, SEED)?;
    let qualified = |q: &str, name: String| Expr::Column(Column::new(Some(q), name));
    let pairs = (0..nkeys)
        .map(|j| {
            (
                qualified(SEED, Placeholder::Key.name(j)),
                qualified(STATS, Placeholder::Key.name(j)),
            )
        })
        .collect();
    // Without group keys the statistics are one row (an aggregate without
    // groups always has it): the seed's rows each meet it, as the left join
    // pairs them, by a cross join (a left join without keys is a nested
    // loop).
    let join_type = match nkeys {
        0 => JoinType::Inner,
        _ => JoinType::Left,
    };
    let joined = join_nulls_equal(seed, stats_rel, pairs, join_type)?;
    let mut exprs: Vec<Expr> = (0..nkeys)
        .map(|j| qualified(SEED, Placeholder::Key.name(j)).alias(Placeholder::Key.name(j)))
        .collect();
    exprs.extend(indexes.iter().map(|&i| {
        qualified(SEED, Placeholder::Adjoint.name(i)).alias(Placeholder::Adjoint.name(i))
    }));
    exprs.extend(
        (0..stats.len())
            .map(|k| qualified(STATS, Placeholder::Stat.name(k)).alias(Placeholder::Stat.name(k))),
    );
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(joined),
    )?))
}

/// `sum(e)`.
pub(super) fn sum(e: Expr) -> Expr {
    Expr::AggregateFunction(AggregateFunction::new_udf(
        sum_udaf(),
        vec![e],
        false,
        None,
        vec![],
        None,
    ))
}

/// `⟨a, v⟩` for values of type `t`: their product, or for tensors the sum
/// of their elementwise product.
pub(crate) fn inner(a: Expr, v: Expr, t: &DataType) -> Expr {
    match Shape::is_tensor_type(t) {
        true => tensor::call("tensor_total", vec![tensor::call("tensor_mul", vec![a, v])]),
        false => a * v,
    }
}

/// The adjoint `a` of a value of type `t` scaled by the number `p`.
fn scaled(a: Expr, p: Expr, t: &DataType) -> Expr {
    match Shape::is_tensor_type(t) {
        true => tensor::call("scale", vec![a, p]),
        false => a * p,
    }
}

/// The sum over a group of `e`, of type `t`: `sum`, or `tensor_sum` for
/// tensors.
fn total(e: Expr, t: &DataType) -> Expr {
    match Shape::is_tensor_type(t) {
        true => tensor::aggregate_call("tensor_sum", e),
        false => sum(e),
    }
}

/// `input` grouped by `keys`, with `aggregates`.
pub(super) fn aggregate(
    input: LogicalPlan,
    keys: Vec<Expr>,
    aggregates: Vec<Expr>,
) -> Result<LogicalPlan> {
    Ok(LogicalPlan::Aggregate(Aggregate::try_new(
        Arc::new(input),
        keys,
        aggregates,
    )?))
}

/// `plan`'s first `nkeys` columns renamed `__dfgrad_key{j}` and the rest `names`.
pub(super) fn rename(plan: &LogicalPlan, nkeys: usize, names: &[&str]) -> Result<LogicalPlan> {
    let exprs = plan
        .schema()
        .columns()
        .into_iter()
        .enumerate()
        .map(|(i, c)| match i < nkeys {
            true => Expr::Column(c).alias(Placeholder::Key.name(i)),
            false => Expr::Column(c).alias(names[i - nkeys]),
        })
        .collect();
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(plan.clone()),
    )?))
}

/// `plan` under the qualifier `name`.
fn alias(plan: LogicalPlan, name: &str) -> Result<LogicalPlan> {
    Ok(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
        Arc::new(plan),
        name,
    )?))
}
