//! Variables from outside the query's rows: a column of the outer query (a
//! marker inside a subquery) or a prepared statement's parameter.
//!
//! ```sql
//! -- d/dx avg(g.w · x) = avg(g.w), for every row of t
//! SELECT t.x, (SELECT avg(grad(g.w * t.x, t.x)) FROM g) FROM t;
//! SELECT t.x, (SELECT grad(avg(g.w * t.x), t.x) FROM g) FROM t;
//! -- d/dw of the mean squared error at the parameter's value
//! PREPARE step(DOUBLE) AS SELECT grad(avg(power(x * $1 - y, 2)), $1) FROM t;
//! EXECUTE step(0.5);
//! ```
//!
//! Inside the subquery `t.x` is an `OuterReferenceColumn`, constant over the
//! subquery's rows (and so within each of its groups); a parameter `$1` is
//! constant over the whole statement (DataFusion 55 optimizes a `PREPARE`d
//! statement with its parameters in place and substitutes them at
//! `EXECUTE`). The engine works over a schema's columns, so each such
//! variable is *localized*: replaced by a placeholder column (qualified
//! `__dfgrad_outer{k}`, with the variable's name and type) added to the
//! schema, differentiated like any column, and put back in the result.
//! Whether DataFusion can then run a subquery depends on the result:
//! `avg(g.w)` above is uncorrelated, `avg(2 · g.w · t.x)` is not (see
//! `src/plan/analyzer/subqueries.rs`).
//!
//! A parameter read inside a subquery of `f` is refused (the subquery
//! would count as a constant).

use std::sync::Arc;

use datafusion::arrow::datatypes::FieldRef;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::engine::call::{as_marker, MarkerKind};
use crate::error::{fail, ErrorKind};
use crate::reserved::outer_qualifier;

/// A marker call's arguments with its outer variables replaced by
/// placeholder columns, and the schema that has them.
// pub for the tests in tests/unit/plan_free_variables.rs
#[doc(hidden)]
pub struct Localized {
    /// The arguments, over [`Localized::schema`].
    pub args: Vec<Expr>,
    /// The schema extended with one field per placeholder.
    pub schema: DFSchema,
    /// Each placeholder column and the variable it stands for.
    outer: Vec<(Column, Expr)>,
}

/// Whether `e` is a variable from outside the rows: an outer reference, or a
/// parameter.
pub(crate) fn is_outer_variable(e: &Expr) -> bool {
    matches!(e, Expr::OuterReferenceColumn(..) | Expr::Placeholder(_))
}

/// The name of the outer variable `e` (its column's, or the parameter's
/// `$1`), for error messages and struct fields.
pub(crate) fn outer_name(e: &Expr) -> String {
    match e {
        Expr::OuterReferenceColumn(_, c) => c.name.clone(),
        Expr::Placeholder(p) => p.id.clone(),
        e => e.to_string(),
    }
}

/// The outer variables a marker call of `kind` differentiates with respect to.
pub(crate) fn outer_variables(kind: MarkerKind, args: &[Expr]) -> Vec<Expr> {
    kind.wrt_positions(args.len())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| args.get(p).filter(|a| is_outer_variable(a)).cloned())
        .collect()
}

/// Whether `e` holds a marker call with an outer variable.
pub(crate) fn has_outer_variable(e: &Expr) -> bool {
    e.exists(|e| {
        Ok(as_marker(e).is_some_and(|call| !outer_variables(call.kind(), call.args).is_empty()))
    })
    .unwrap_or(false)
}

/// Whether `a` and `b` are the same outer variable (the field an outer
/// reference or a parameter carries is not compared).
pub(crate) fn same_outer(a: &Expr, b: &Expr) -> bool {
    match (a, b) {
        (Expr::OuterReferenceColumn(_, x), Expr::OuterReferenceColumn(_, y)) => x == y,
        (Expr::Placeholder(x), Expr::Placeholder(y)) => x.id == y.id,
        _ => false,
    }
}

/// `args` of a marker call of `kind` localized over `schema`; `None` when no
/// variable is an outer variable.
// pub for the tests in tests/unit/plan_free_variables.rs
#[doc(hidden)]
pub fn localize(kind: MarkerKind, args: &[Expr], schema: &DFSchema) -> Result<Option<Localized>> {
    let positions = kind.wrt_positions(args.len())?;
    let mut outer: Vec<(Column, FieldRef, Expr)> = Vec::new();
    for p in positions {
        let v = &args[p];
        if !is_outer_variable(v) || outer.iter().any(|(_, _, o)| same_outer(o, v)) {
            continue;
        }
        let field = match v {
            Expr::OuterReferenceColumn(field, _) => Arc::clone(field),
            Expr::Placeholder(p) => match &p.field {
                Some(field) => Arc::clone(field),
                None => {
                    return fail(
                        ErrorKind::InvalidWrt,
                        format!(
                            "{}: the type of the parameter `{}` is not known; declare it, \
                             e.g. PREPARE q(DOUBLE) AS …",
                            kind.name(),
                            p.id
                        ),
                    )
                }
            },
            _ => unreachable!("is_outer_variable"),
        };
        if let Expr::Placeholder(_) = v {
            refuse_in_subquery(kind, &args[0], v)?;
        }
        let local = Column::new(Some(outer_qualifier(outer.len())), outer_name(v));
        outer.push((local, field, v.clone()));
    }
    if outer.is_empty() {
        return Ok(None);
    }
    let mut extended = schema.clone();
    for (local, field, _) in &outer {
        let field = field.as_ref().clone().with_name(local.name.clone());
        let one = DFSchema::try_from_qualified_schema(
            local.relation.clone().expect("qualified"),
            &datafusion::arrow::datatypes::Schema::new(vec![field]),
        )?;
        extended = extended.join(&one)?;
    }
    let args = args
        .iter()
        .map(|a| {
            a.clone()
                .transform_up(|e| match outer.iter().find(|(_, _, o)| same_outer(o, &e)) {
                    Some((local, _, _)) => Ok(Transformed::yes(Expr::Column(local.clone()))),
                    None => Ok(Transformed::no(e)),
                })
                .map(|t| t.data)
        })
        .collect::<Result<_>>()?;
    Ok(Some(Localized {
        args,
        schema: extended,
        outer: outer.into_iter().map(|(local, _, v)| (local, v)).collect(),
    }))
}

/// Refuses `f` when a subquery in it reads the parameter `v`: the engine
/// takes a subquery as a constant.
fn refuse_in_subquery(kind: MarkerKind, f: &Expr, v: &Expr) -> Result<()> {
    match f.exists(|e| subquery_reads(e, v))? {
        true => fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "{}: a subquery reads the parameter `{v}` it differentiates with respect to; \
                 differentiating through a subquery is supported for columns only: bind the \
                 parameter as a column, e.g. `CROSS JOIN (SELECT {v} AS w) AS p`, and \
                 differentiate with respect to `p.w`",
                kind.name()
            ),
        ),
        false => Ok(()),
    }
}

impl Localized {
    /// `e` (a derivative over [`Localized::schema`]) with the placeholders
    /// put back as the variables they stand for.
    pub fn restore(&self, e: Expr) -> Result<Expr> {
        Ok(e.transform_up(|e| match &e {
            Expr::Column(c) => match self.outer.iter().find(|(local, _)| local == c) {
                Some((_, v)) => Ok(Transformed::yes(v.clone())),
                None => Ok(Transformed::no(e)),
            },
            _ => Ok(Transformed::no(e)),
        })?
        .data)
    }
}

/// Whether `e` is a subquery expression whose plan reads the outer variable `v`.
pub(crate) fn subquery_reads(e: &Expr, v: &Expr) -> Result<bool> {
    match e {
        Expr::ScalarSubquery(s) => plan_reads(&s.subquery, v),
        Expr::Exists(x) => plan_reads(&x.subquery.subquery, v),
        Expr::InSubquery(x) => plan_reads(&x.subquery.subquery, v),
        _ => Ok(false),
    }
}

/// Whether an expression of `plan` (or of its subqueries) reads the outer
/// variable `v`.
pub(crate) fn plan_reads(plan: &LogicalPlan, v: &Expr) -> Result<bool> {
    let mut found = false;
    plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            found |= e.exists(|e| Ok(same_outer(e, v)))?;
        }
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    })?;
    Ok(found)
}
