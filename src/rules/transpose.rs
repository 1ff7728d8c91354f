//! Transpose rules for aggregate functions: what relational reverse mode
//! ([`crate::plan::reverse`]) sends back from a group's adjoint to each of
//! the group's rows.
//!
//! For an aggregate `a = agg(g₁ … gₙ)` over a group, a rule gives the partial
//! `∂a/∂g(row)` of each argument at one row, as an expression over the row's
//! argument values and *group statistics*: aggregates over the same group
//! ([`TransposeCall::group`]), which the plan rewrite computes per group and
//! joins back to the rows by the group keys. A row's adjoint is then the
//! group's adjoint times that partial. The rules agree with the forward rules
//! of [`super::aggregate`]:
//!
//! | aggregate | `∂a/∂g(row)` |
//! |---|---|
//! | `sum(g)` | `1` |
//! | `avg(g)` | `1 / count(g)` |
//! | `count(…)` | none (piecewise constant) |
//! | `tensor_sum(g)` / `tensor_avg(g)` | `1` / `1 / count(g)`, the same at every element (a scalar scaling the group's adjoint tensor) |
//! | `max(g)` / `min(g)` | `[g = m] / count(g = m)`, `m` the group's max / min: exact ties split evenly, as JAX does; NaN where `m` is NaN |
//! | `var_pop(g)` / `var(g)` | `2·(g − ḡ) / n` / `2·(g − ḡ) / (n − 1)` |
//! | `stddev_pop(g)` / `stddev(g)` | `(g − ḡ) / (n·σ)` / `(g − ḡ) / ((n − 1)·s)` |
//!
//! with `n = count(g)` and `ḡ = avg(g)`. A row where `g` is NULL sends
//! nothing back (its partial times a NULL derivative is NULL, which the
//! final `sum` skips), as the aggregate skips it. A `FILTER (WHERE c)` is
//! applied to the statistics and multiplies the partial by `[c]`.
//!
//! ```
//! use datafusion_grad::rules::transpose::transpose_rule;
//! use datafusion::functions_aggregate::{average::avg_udaf, first_last::first_value_udaf};
//! assert!(transpose_rule(&avg_udaf()).is_some());
//! assert!(transpose_rule(&first_value_udaf()).is_none()); // refused, never 0
//! ```

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::functions_aggregate::average::avg_udaf;
use datafusion::functions_aggregate::count::count_udaf;
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::functions_aggregate::stddev::{stddev_pop_udaf, stddev_udaf};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{when, AggregateUDF, Expr};

use datafusion::arrow::datatypes::DataType;
use datafusion::functions::math::expr_fn::isnan;
use datafusion::logical_expr::cast;

use super::num;
use crate::reserved::Placeholder;

/// One aggregate call being transposed: its arguments, and the group
/// statistics its rule asks for.
#[derive(Debug)]
pub struct TransposeCall<'a> {
    call: &'a AggregateFunction,
    stats: &'a mut Vec<Expr>,
}

impl<'a> TransposeCall<'a> {
    /// The call `call`; the statistics it asks for are added to `stats`
    /// (shared by the calls of one aggregation, so each is computed once).
    pub fn new(call: &'a AggregateFunction, stats: &'a mut Vec<Expr>) -> Self {
        Self { call, stats }
    }

    /// Argument `i` of the call.
    pub fn arg(&self, i: usize) -> Expr {
        self.call.params.args[i].clone()
    }

    /// `udaf(args)` over the rows of the call's group (and its `FILTER`), as
    /// the column `__dfgrad_stat{k}` (`k` its place in the shared list) that
    /// each row sees. Its `args` may use
    /// statistics asked for before (e.g. the ties of a maximum).
    pub fn group(&mut self, udaf: Arc<AggregateUDF>, args: Vec<Expr>) -> Expr {
        let args = match &self.call.params.filter {
            Some(filter) => args
                .into_iter()
                .map(|a| when(filter.as_ref().clone(), a).end())
                .collect::<Result<_>>()
                .expect("a CASE with one branch"),
            None => args,
        };
        let stat = Expr::AggregateFunction(AggregateFunction::new_udf(
            udaf,
            args,
            false,
            None,
            vec![],
            None,
        ));
        let k = match self.stats.iter().position(|s| *s == stat) {
            Some(k) => k,
            None => {
                self.stats.push(stat);
                self.stats.len() - 1
            }
        };
        Placeholder::Stat.column(k)
    }

    /// `partial` where the call's `FILTER` holds, 0 elsewhere.
    fn filtered(&self, partial: Expr) -> Result<Expr> {
        match &self.call.params.filter {
            Some(filter) => when(filter.as_ref().clone(), partial).otherwise(num(0.0)),
            None => Ok(partial),
        }
    }
}

/// A transpose rule: the partial of the aggregate with respect to each
/// argument at one row (`None`: no derivative flows to that argument).
pub type TransposeRule = fn(&mut TransposeCall) -> Result<Vec<Option<Expr>>>;

/// The transpose rules, by function name (aliases are looked up too).
pub const TRANSPOSE_RULES: &[(&str, TransposeRule)] = &[
    ("sum", |c| Ok(vec![Some(c.filtered(num(1.0))?)])),
    ("avg", |c| {
        let n = count(c);
        Ok(vec![Some(c.filtered(num(1.0) / n)?)])
    }),
    ("count", |c| Ok(vec![None; c.call.params.args.len()])),
    // Elementwise, so the same partial at every element: the row's adjoint
    // is the group's scaled.
    ("tensor_sum", |c| Ok(vec![Some(c.filtered(num(1.0))?)])),
    ("tensor_avg", |c| {
        let n = count(c);
        Ok(vec![Some(c.filtered(num(1.0) / n)?)])
    }),
    ("max", |c| extreme(c, max_udaf())),
    ("min", |c| extreme(c, min_udaf())),
    ("var_pop", |c| spread(c, num(2.0), 0.0, None)),
    ("var", |c| spread(c, num(2.0), 1.0, None)),
    ("stddev_pop", |c| {
        let s = c.group(stddev_pop_udaf(), vec![c.arg(0)]);
        spread(c, num(1.0), 0.0, Some(s))
    }),
    ("stddev", |c| {
        let s = c.group(stddev_udaf(), vec![c.arg(0)]);
        spread(c, num(1.0), 1.0, Some(s))
    }),
];

/// `count(g)` over the group, as a Float64.
fn count(c: &mut TransposeCall) -> Expr {
    let n = c.group(count_udaf(), vec![c.arg(0)]);
    cast(n, DataType::Float64)
}

/// `max(g)` / `min(g)`: `[g = m] / count(g = m)`, NaN where `m` is NaN.
///
/// Only exact ties split: the statistic `m` is the group's extreme of the
/// same row values the backward pass compares it with (a maximum is one of
/// its arguments, whatever order the rows come in), so the row that
/// attains it compares equal, ±inf included. A NaN maximum (DataFusion
/// orders NaN above every number) has no derivative: NaN, as JAX gives.
fn extreme(c: &mut TransposeCall, kind: Arc<AggregateUDF>) -> Result<Vec<Option<Expr>>> {
    let m = c.group(kind, vec![c.arg(0)]);
    let at = c.arg(0).eq(m.clone());
    let ties = c.group(sum_udaf(), vec![when(at.clone(), num(1.0)).end()?]);
    // NaN written as the extreme itself (NaN there).
    let nan = cast(m, DataType::Float64);
    let partial = when(isnan(nan.clone()), nan)
        .when(at, num(1.0) / ties)
        .otherwise(num(0.0))?;
    Ok(vec![Some(c.filtered(partial)?)])
}

/// The variance family: `scale·(g − ḡ) / ((n − ddof)·s)`, `s` 1 for a variance.
fn spread(
    c: &mut TransposeCall,
    scale: Expr,
    ddof: f64,
    s: Option<Expr>,
) -> Result<Vec<Option<Expr>>> {
    let mean = c.group(avg_udaf(), vec![c.arg(0)]);
    let n = count(c) - num(ddof);
    let denominator = match s {
        Some(s) => n * s,
        None => n,
    };
    let partial = scale * (c.arg(0) - mean) / denominator;
    Ok(vec![Some(c.filtered(partial)?)])
}

/// The transpose rule for the aggregate function `udaf`, by its name or one
/// of its aliases (case-insensitive).
pub fn transpose_rule(udaf: &AggregateUDF) -> Option<TransposeRule> {
    std::iter::once(udaf.name())
        .chain(udaf.aliases().iter().map(String::as_str))
        .flat_map(|n| {
            TRANSPOSE_RULES
                .iter()
                .filter(move |(k, _)| k.eq_ignore_ascii_case(n))
        })
        .map(|(_, r)| *r)
        .next()
}
