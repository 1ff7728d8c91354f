//! Derivative rules for aggregate functions: the rule table the analyzer uses
//! to differentiate *through* an aggregate (`grad(avg(loss), w)`, with `w`
//! constant within each group).
//!
//! A rule receives the aggregate call and the derivatives `dgᵢ` of its
//! arguments (row-wise expressions), and returns the derivative of the
//! aggregate as an expression over new aggregate calls of the same group,
//! which inherit the call's `FILTER`:
//!
//! | aggregate | derivative |
//! |---|---|
//! | `sum(g)` | `sum(dg)` |
//! | `avg(g)` | `avg(dg)` |
//! | `count(…)` | `0` |
//! | `tensor_sum(g)` / `tensor_avg(g)` | `tensor_sum(dg)` / `tensor_avg(dg)` (elementwise) |
//! | `var_samp(g)` / `var_pop(g)` | `2·covar_samp(g, dg)` / `2·covar_pop(g, dg)` |
//! | `stddev(g)` / `stddev_pop(g)` | `covar_samp(g, dg) / stddev(g)` / `covar_pop(g, dg) / stddev_pop(g)` |
//! | `covar_samp(a, b)` / `covar_pop(a, b)` | `covar(da, b) + covar(a, db)` (same kind) |
//! | `max(g)` / `min(g)` | `sum(dg where g = m) / count(g = m)`, `m` the group's max / min (NaN where it is NaN) |
//! | `corr(a, b)` | `dc/√(vₐ·v_b) − corr·(dvₐ/vₐ + dv_b/v_b)/2` over the pairs (below) |
//!
//! The variance rules use `Σ(g − ḡ) = 0`: `d var_pop = (2/n)·Σ(g − ḡ)·dg =
//! 2·covar_pop(g, dg)`, computed with DataFusion's numerically stable
//! covariance. Rows where `g` is NULL are skipped by both sides alike (the
//! derivative is NULL exactly where `g` is). For `max` and `min`, `m` is a
//! window function over the group (`max(g) OVER (PARTITION BY keys)`) that
//! the analyzer computes below the aggregate; ties share the derivative evenly.
//!
//! `corr(a, b) = c / √(vₐ·v_b)` with `c = covar_pop(a, b)` and `vₐ`, `v_b`
//! the population variances, all over the rows where both `a` and `b` are
//! not NULL (as DataFusion's `corr` pairs them): `dc` is the covariance
//! product rule and `dvₐ = 2·covar_pop(a, da)` over those rows. Where `corr`
//! is NULL (fewer than two pairs, or a constant side) the derivative is too:
//! its second term multiplies by `corr`.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::functions::math::expr_fn::isnan;
use datafusion::functions_aggregate::average::avg_udaf;
use datafusion::functions_aggregate::correlation::corr_udaf;
use datafusion::functions_aggregate::covariance::{covar_pop_udaf, covar_samp_udaf};
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::functions_aggregate::stddev::{stddev_pop_udaf, stddev_udaf};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction, WindowFunctionParams};
use datafusion::logical_expr::{
    cast, when, AggregateUDF, Expr, ExprFunctionExt, WindowFunctionDefinition,
};

use super::num;
use crate::error::GradError;
use crate::tensor;

/// One call of an aggregate, with the derivatives of its arguments.
#[derive(Debug)]
pub struct AggregateCall<'a> {
    over: Over<'a>,
    derivatives: Vec<Expr>,
}

/// Where an aggregate is computed.
#[derive(Debug)]
enum Over<'a> {
    /// In an aggregation grouped by these keys.
    Group(&'a AggregateFunction, &'a [Expr]),
    /// As a window function.
    Window(&'a WindowFunction),
}

impl<'a> AggregateCall<'a> {
    /// `call` in an aggregation grouped by `group`, whose argument `i` has
    /// derivative `derivatives[i]`.
    pub fn new(call: &'a AggregateFunction, group: &'a [Expr], derivatives: Vec<Expr>) -> Self {
        Self {
            over: Over::Group(call, group),
            derivatives,
        }
    }

    /// The aggregate window function `call`, whose argument `i` has
    /// derivative `derivatives[i]`.
    pub fn window(call: &'a WindowFunction, derivatives: Vec<Expr>) -> Self {
        Self {
            over: Over::Window(call),
            derivatives,
        }
    }

    /// Argument `i` of the call.
    pub fn arg(&self, i: usize) -> Expr {
        match self.over {
            Over::Group(call, _) => call.params.args[i].clone(),
            Over::Window(call) => call.params.args[i].clone(),
        }
    }

    /// The derivative of argument `i`.
    pub fn derivative(&self, i: usize) -> Expr {
        self.derivatives[i].clone()
    }

    /// `udaf(args)` over the same rows as the call (its `FILTER`; for a
    /// window function, its window).
    pub fn aggregate(&self, udaf: Arc<AggregateUDF>, args: Vec<Expr>) -> Expr {
        match self.over {
            Over::Group(call, _) => Expr::AggregateFunction(AggregateFunction::new_udf(
                udaf,
                args,
                false,
                call.params.filter.clone(),
                vec![],
                None,
            )),
            Over::Window(call) => Expr::from(WindowFunction {
                fun: WindowFunctionDefinition::AggregateUDF(udaf),
                params: WindowFunctionParams {
                    args,
                    null_treatment: None,
                    distinct: false,
                    ..call.params.clone()
                },
            }),
        }
    }

    /// `udaf(args)` over the rows of the call's group, as a window function
    /// seen by each row (e.g. the group's maximum next to every value).
    pub fn over_group(&self, udaf: Arc<AggregateUDF>, args: Vec<Expr>) -> Result<Expr> {
        let (call, group) = match self.over {
            Over::Group(call, group) => (call, group),
            Over::Window(call) => {
                return Err(GradError::non_differentiable(
                    call.fun.name(),
                    "as a window function its derivative would need the extreme of every \
                     row's own window; use it in a GROUP BY aggregate",
                )
                .into())
            }
        };
        let args = match &call.params.filter {
            Some(filter) => args
                .into_iter()
                .map(|a| when(filter.as_ref().clone(), a).end())
                .collect::<Result<_>>()?,
            None => args,
        };
        Expr::from(WindowFunction::new(
            WindowFunctionDefinition::AggregateUDF(udaf),
            args,
        ))
        .partition_by(group.to_vec())
        .build()
    }
}

/// A derivative rule for one aggregate function.
pub type AggregateRule = fn(&AggregateCall) -> Result<Expr>;

/// The aggregate rules, by function name (aliases are looked up too).
pub const AGGREGATE_RULES: &[(&str, AggregateRule)] = &[
    (
        "sum",
        |c| Ok(c.aggregate(sum_udaf(), vec![c.derivative(0)])),
    ),
    (
        "avg",
        |c| Ok(c.aggregate(avg_udaf(), vec![c.derivative(0)])),
    ),
    ("count", |_| Ok(num(0.0))),
    ("tensor_sum", |c| {
        Ok(c.aggregate(tensor_aggregate("tensor_sum"), vec![c.derivative(0)]))
    }),
    ("tensor_avg", |c| {
        Ok(c.aggregate(tensor_aggregate("tensor_avg"), vec![c.derivative(0)]))
    }),
    ("var", |c| Ok(num(2.0) * covariance(c, covar_samp_udaf()))),
    (
        "var_pop",
        |c| Ok(num(2.0) * covariance(c, covar_pop_udaf())),
    ),
    ("stddev", |c| {
        Ok(covariance(c, covar_samp_udaf()) / c.aggregate(stddev_udaf(), vec![c.arg(0)]))
    }),
    ("stddev_pop", |c| {
        Ok(covariance(c, covar_pop_udaf()) / c.aggregate(stddev_pop_udaf(), vec![c.arg(0)]))
    }),
    ("covar_samp", |c| {
        Ok(covariance_product(c, covar_samp_udaf()))
    }),
    ("covar_pop", |c| Ok(covariance_product(c, covar_pop_udaf()))),
    ("max", |c| extreme(c, max_udaf())),
    ("min", |c| extreme(c, min_udaf())),
    ("corr", correlation),
];

/// The tensor aggregate `name` (`tensor_sum`, `tensor_avg`).
fn tensor_aggregate(name: &str) -> Arc<AggregateUDF> {
    let udaf = tensor::aggregates()
        .into_iter()
        .find(|a| a.name() == name)
        .expect("a tensor aggregate");
    Arc::new(udaf)
}

/// `max(g)` / `min(g)`: the derivative at the rows that attain it, split
/// evenly among exact ties (as JAX does): `sum(dg where g = m) / count(g =
/// m)`, with `m` the group's extreme seen by each row. A NaN extreme
/// (DataFusion orders NaN above every number) has no derivative: NaN, as
/// JAX gives.
fn extreme(c: &AggregateCall, kind: Arc<AggregateUDF>) -> Result<Expr> {
    let at = c
        .arg(0)
        .eq(c.over_group(Arc::clone(&kind), vec![c.arg(0)])?);
    let value = cast(c.aggregate(kind, vec![c.arg(0)]), DataType::Float64);
    // NaN written as the extreme itself (NaN there), which every export
    // dialect can print (SQLite has no NaN literal).
    when(isnan(value.clone()), value).otherwise(
        c.aggregate(sum_udaf(), vec![when(at.clone(), c.derivative(0)).end()?])
            / c.aggregate(sum_udaf(), vec![when(at, num(1.0)).end()?]),
    )
}

/// `corr(a, b)`: the quotient rule over `covar_pop(a, b) / √(vₐ·v_b)`, every
/// term over the rows where both arguments are not NULL.
fn correlation(c: &AggregateCall) -> Result<Expr> {
    let (a, b) = (c.arg(0), c.arg(1));
    // `x` where the other argument is not NULL: pairs with a NULL are skipped.
    let paired = |x: Expr, other: Expr| when(other.is_not_null(), x).end();
    let cov = |x: Expr, y: Expr| c.aggregate(covar_pop_udaf(), vec![x, y]);
    let var_a = cov(a.clone(), paired(a.clone(), b.clone())?);
    let var_b = cov(b.clone(), paired(b.clone(), a.clone())?);
    let d_cov = covariance_product(c, covar_pop_udaf());
    let d_var_a = num(2.0) * cov(paired(a.clone(), b.clone())?, c.derivative(0));
    let d_var_b = num(2.0) * cov(paired(b.clone(), a.clone())?, c.derivative(1));
    let corr = c.aggregate(corr_udaf(), vec![a, b]);
    let root = datafusion::functions::math::expr_fn::sqrt(var_a.clone() * var_b.clone());
    Ok(d_cov / root - corr * (d_var_a / var_a + d_var_b / var_b) / num(2.0))
}

/// `cov(g, dg)` of the one-argument aggregate `c`.
fn covariance(c: &AggregateCall, kind: Arc<AggregateUDF>) -> Expr {
    c.aggregate(kind, vec![c.arg(0), c.derivative(0)])
}

/// `cov(da, b) + cov(a, db)` of the two-argument aggregate `c`.
fn covariance_product(c: &AggregateCall, kind: Arc<AggregateUDF>) -> Expr {
    c.aggregate(Arc::clone(&kind), vec![c.derivative(0), c.arg(1)])
        + c.aggregate(kind, vec![c.arg(0), c.derivative(1)])
}

/// The aggregates whose derivative is SQL NULL exactly where the aggregate
/// is: they aggregate the arguments' derivatives alone (over the rows where
/// the argument is not NULL), and a derivative is NULL exactly where its
/// argument is.
pub const SAME_NULLS: &[&str] = &["sum", "avg", "max", "min", "tensor_sum", "tensor_avg"];

/// The rules of the aggregates whose gradient with respect to a tensor
/// GROUP BY key `w` is the same aggregate of the rows' gradients (tensors
/// of `w`'s shape): `grad(avg(loss), w)` is `tensor_avg(grad(loss, w))`.
pub const TENSOR_KEY_RULES: &[(&str, AggregateRule)] = &[
    ("sum", |c| {
        Ok(c.aggregate(tensor_aggregate("tensor_sum"), vec![c.derivative(0)]))
    }),
    ("avg", |c| {
        Ok(c.aggregate(tensor_aggregate("tensor_avg"), vec![c.derivative(0)]))
    }),
    ("count", |_| Ok(num(0.0))),
];

/// The rule for the aggregate function `udaf`, by its name or one of its
/// aliases (case-insensitive), and the name it has in the table.
pub fn aggregate_rule(udaf: &AggregateUDF) -> Option<(&'static str, AggregateRule)> {
    lookup(AGGREGATE_RULES, udaf)
}

/// The rule of [`TENSOR_KEY_RULES`] for `udaf`, as [`aggregate_rule`].
pub fn tensor_key_rule(udaf: &AggregateUDF) -> Option<(&'static str, AggregateRule)> {
    lookup(TENSOR_KEY_RULES, udaf)
}

fn lookup(
    table: &'static [(&'static str, AggregateRule)],
    udaf: &AggregateUDF,
) -> Option<(&'static str, AggregateRule)> {
    std::iter::once(udaf.name())
        .chain(udaf.aliases().iter().map(String::as_str))
        .flat_map(|n| table.iter().filter(move |(k, _)| k.eq_ignore_ascii_case(n)))
        .copied()
        .next()
}
